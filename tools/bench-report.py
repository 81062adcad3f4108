#!/usr/bin/env python3
"""tools/bench-report.py: docs/benchmarks.md (and plots) from a bench-all run.

    tools/bench-report.py [RESULTS] [--out FILE] [--img DIR] [--no-plots]
                          [--readme README.md] [--peers traces/peers.csv]
    tools/bench-report.py --traces-from TABLE.json --readme README.md

--peers rewrites traces/peers.csv with the peers' ratios and times of this
run's traces-*.json. --traces-from takes `gvm-replay --json` without a trace
(gvmalloc's figures, on a GPU or the simulated H200, and the peers' recorded
ones it carries) and replaces only the README's shipped-traces block.

RESULTS is the directory tools/bench-all.sh wrote (default bench-out), or its
bench-results.tgz. Every figure in the output comes from those files; none is
typed here. Plots need matplotlib; without it the tables are written and the
report says the plots were skipped.

Files read (all optional; a missing one leaves its section saying so):
  env.json                  machine, driver, date, command (bench-all.sh)
  alloc*.json               gvm-bench-alloc (Google Benchmark JSON)
  mt*.json                  gvm-bench-mt
  growth*.json              gvm-bench-growth
  peer*.json                gvm-bench-peer
  replay-*.json             gvm-replay / gvm-replay-baseline --json (the GPT-2 section)
  traces-IMPL-TRACE.json    the same for every shipped trace (IMPL: gvmalloc, torch,
                            torch_expandable, async)
  timeline-*.csv            their --timeline output
"""
import argparse
import csv
import glob
import json
import os
import re
import sys
import tarfile
import tempfile

GVM = "gvm_cuda"
# Column order of the allocators in every table; others follow, sorted.
ORDER = [GVM, "torch", "torch_expandable", "cudaMallocAsync", "cudaMalloc", "gvm_sim_h200"]
REPLAY_GVM = "gvmalloc"
# PyTorch's own peak reserved / peak allocated on the shipped GPT-2 trace
# (docs/measurements.md, "PyTorch's allocator on real workloads"): the replay through c10 should land near.
TORCH_TRACE_RATIO = {"torch": 1.945, "torch_expandable": 1.079}
TORCH_RATIO_TOLERANCE = 0.05
GROWTH_TARGET = 2.0  # growth (or trim) time / driver time, from the issue

TO_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


def order_key(name):
    return (ORDER.index(name), "") if name in ORDER else (len(ORDER), name)


# --- reading ------------------------------------------------------------------------


def load_json(path, problems):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        problems.append("%s: unreadable (%s)" % (os.path.basename(path), e))
        return None


def bench_results(directory, pattern, problems):
    """Google Benchmark results of the files matching pattern: the medians
    where repetitions were run, otherwise the single runs. Returns
    (list of dicts with 'run', 'ns' and the raw entry, contexts)."""
    out, contexts = [], []
    for path in sorted(glob.glob(os.path.join(directory, pattern))):
        d = load_json(path, problems)
        if not isinstance(d, dict) or "benchmarks" not in d:
            continue
        contexts.append(d.get("context", {}))
        entries = d["benchmarks"]
        medians = [b for b in entries if b.get("aggregate_name") == "median"]
        picked = medians or [b for b in entries if b.get("run_type", "iteration") == "iteration"]
        for b in picked:
            run = b.get("run_name") or b["name"]
            if b.get("error_occurred"):
                out.append({"run": run, "error": b.get("error_message", "error"), "raw": b})
                continue
            ns = b.get("real_time", 0.0) * TO_NS.get(b.get("time_unit", "ns"), 1.0)
            out.append({"run": run, "ns": ns, "raw": b})
    # Errors appear once per benchmark; with repetitions there is no median
    # for them, so they come from the iteration entries above only if nothing
    # else matched. Collect them from every entry too.
    return out, contexts


def errors_of(directory, pattern, problems):
    errs = {}
    for path in sorted(glob.glob(os.path.join(directory, pattern))):
        d = load_json(path, problems)
        if isinstance(d, dict):
            for b in d.get("benchmarks", []):
                if b.get("error_occurred"):
                    errs[b.get("run_name") or b["name"]] = b.get("error_message", "error")
    return errs


def strip_suffixes(run):
    return re.sub(r"/(real_time|manual_time|iterations:\d+|repeats:\d+)", "", run)


# --- formatting ---------------------------------------------------------------------


def fmt_ns(ns):
    if ns is None:
        return "—"
    if ns >= 1e6:
        return "%.3g ms" % (ns / 1e6)
    if ns >= 1e3:
        return "%.3g µs" % (ns / 1e3)
    return "%.3g ns" % ns


def fmt_bytes(n):
    n = int(n)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return "%d %s" % (n // size, unit)
    return "%d B" % n


def fmt_ratio(x):
    return "—" if x is None else "%.2f×" % x


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        lines.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(lines)


def cell(value_ns, base_ns):
    """A time with its ratio to gvmalloc's (baseline / gvm: > 1 = gvm faster)."""
    if value_ns is None:
        return "—"
    if base_ns and value_ns and base_ns > 0:
        return "%s (%s)" % (fmt_ns(value_ns), fmt_ratio(value_ns / base_ns))
    return fmt_ns(value_ns)


# --- sections -----------------------------------------------------------------------


def section_pair(res, errs):
    data = {}
    for r in res:
        m = re.match(r"BM_pair/([^/]+)/(\d+)$", strip_suffixes(r["run"]))
        if m and "ns" in r:
            data.setdefault(m.group(1), {})[int(m.group(2))] = r["ns"]
    out = ["## Alloc + free pair, by size (gvm-bench-alloc BM_pair)", ""]
    if not data:
        out.append("No results" + skipped_note(errs, "BM_pair") + ".")
        return out, data
    impls = sorted(data, key=order_key)
    sizes = sorted({s for d in data.values() for s in d})
    rows = []
    for s in sizes:
        base = data.get(GVM, {}).get(s)
        rows.append([fmt_bytes(s)] +
                    [cell(data[i].get(s), None if i == GVM else base) for i in impls])
    out.append("Median wall time of one allocate + free, warm. In brackets: that time "
               "÷ gvm_cuda's (above 1× = gvmalloc is faster).")
    out.append("")
    out.append(table(["size"] + impls, rows))
    out += ["", skipped_list(errs, "BM_pair")]
    return out, data


def parse_mixed(res):
    """BM_mixed (warm: after one untimed pass of the plan) and BM_mixed_first_pass
    (that pass, from a fresh allocator): ns per operation by allocator, and
    gvmalloc's driver calls per operation, for each."""
    data, first, calls, first_calls = {}, {}, {}, {}
    for r in res:
        m = re.match(r"BM_mixed(_first_pass)?/([^/]+)$", strip_suffixes(r["run"]))
        if m and "ns" in r:
            per_op = r["raw"].get("time_per_op")
            ns = per_op * 1e9 if per_op else r["ns"] / 2
            (first if m.group(1) else data)[m.group(2)] = ns
            if r["raw"].get("driver_calls_per_op") is not None:
                (first_calls if m.group(1) else calls)[m.group(2)] = r["raw"]["driver_calls_per_op"]
    return data, first, calls, first_calls


def section_mixed(res, errs):
    data, first, calls, first_calls = parse_mixed(res)
    out = ["## Mixed workload (gvm-bench-alloc BM_mixed)", ""]
    if not data:
        out.append("No results" + skipped_note(errs, "BM_mixed") + ".")
        return out, data, first
    base = data.get(GVM)
    first_base = first.get(GVM)
    impls = sorted(set(data) | set(first), key=order_key)

    def per_1000(d, i):
        return ("%.3g" % (d[i] * 1000)) if i in d else "—"

    rows = []
    for i in impls:
        row = [i, cell(data.get(i), None if i == GVM else base)]
        if calls:
            row.append(per_1000(calls, i))
        if first:
            row.append(cell(first.get(i), None if i == GVM else first_base))
            if first_calls:
                row.append(per_1000(first_calls, i))
        rows.append(row)
    head = ["allocator", "time per op"] + (["driver calls per 1000 ops"] if calls else [])
    if first:
        head += ["first pass: time per op"] + (["its driver calls per 1000 ops"] if first_calls else [])
    out.append("1000 live blocks, 256 B–64 MiB log-uniform, a plan of 65,536 steps repeated; "
               "one op = one allocate or one free. Timed warm, after one untimed pass of the plan"
               + ("; the first pass from a fresh allocator (its growth to the working set) "
                  "timed apart (BM_mixed_first_pass)" if first else "")
               + ". In brackets: ÷ gvm_cuda's." +
               (" Driver calls: gvmalloc's own in the timed loop (growths and the "
                "releases before them), per 1000 operations; the others' are inside "
                "the CUDA runtime." if calls or first_calls else ""))
    out.append("")
    out.append(table(head, rows))
    out += ["", skipped_list(errs, "BM_mixed")]
    return out, data, first


def section_threads(res, errs):
    data = {}
    for r in res:
        m = re.match(r"BM_threads/([^/]+)/threads:(\d+)$", strip_suffixes(r["run"]))
        if m and "ns" in r and "items_per_second" in r["raw"]:
            data.setdefault(m.group(1), {})[int(m.group(2))] = r["raw"]["items_per_second"]
    out = ["## Threads scaling (gvm-bench-mt BM_threads)", ""]
    if not data:
        out.append("No results" + skipped_note(errs, "BM_threads") + ".")
        return out, data
    impls = sorted(data, key=order_key)
    threads = sorted({t for d in data.values() for t in d})
    rows = []
    for t in threads:
        base = data.get(GVM, {}).get(t)
        row = [str(t)]
        for i in impls:
            v = data[i].get(t)
            if v is None:
                row.append("—")
            elif base and i != GVM:
                row.append("%.3g M (%s)" % (v / 1e6, fmt_ratio(base / v)))
            else:
                row.append("%.3g M" % (v / 1e6))
        rows.append(row)
    out.append("Aggregate operations per second of all threads (millions; each thread on "
               "its own stream, 100 live blocks of 256 B–4 MiB). In brackets: gvm_cuda's "
               "rate ÷ that allocator's (above 1× = gvmalloc is faster).")
    out.append("")
    out.append(table(["threads"] + impls, rows))
    out += ["", skipped_list(errs, "BM_threads")]
    return out, data


def section_growth(res, errs):
    rows, data, missed = [], [], []
    for r in res:
        m = re.match(r"BM_growth/([^/]+)/chunk_mib:(\d+)/gib:(\d+)$", strip_suffixes(r["run"]))
        if not m or "ns" not in r:
            continue
        raw = r["raw"]
        data.append((m.group(1), int(m.group(2)), int(m.group(3)), raw))
    out = ["## Growth and trim vs driver time (gvm-bench-growth BM_growth)", ""]
    if not data:
        out.append("No results" + skipped_note(errs, "BM_growth") + ".")
        return out, data, missed
    data.sort(key=lambda x: (order_key(x[0]), x[1], x[2]))
    for impl, chunk, gib, raw in data:
        g, gd = raw.get("grow_ms"), raw.get("grow_driver_ms")
        t, td = raw.get("trim_ms"), raw.get("trim_driver_ms")
        gr = g / gd if g and gd else None
        tr = t / td if t and td else None
        for what, x in (("grow", gr), ("trim", tr)):
            if impl == GVM and x is not None and x > GROWTH_TARGET:
                missed.append("%s %d GiB with %d MiB chunks: %s / driver = %.2f" %
                              (what, gib, chunk, what, x))
        rows.append([impl, "%d MiB" % chunk, "%d GiB" % gib,
                     "%.3g" % g if g is not None else "—", "%.3g" % gd if gd is not None else "—",
                     fmt_ratio(gr), "%.3g" % t if t is not None else "—",
                     "%.3g" % td if td is not None else "—", fmt_ratio(tr),
                     "%d" % raw.get("chunks_mapped", 0)])
    out.append("A fresh allocator grows from empty to the target in 256 MiB blocks, then "
               "trims back; times in ms, the driver's share from Allocator::stats().driver. "
               "Target: time ÷ driver time ≤ %g. gvm_sim_h200 rows time the simulator, "
               "not a GPU." % GROWTH_TARGET)
    out.append("")
    out.append(table(["impl", "max chunk", "target", "grow ms", "driver ms", "grow/driver",
                      "trim ms", "driver ms", "trim/driver", "chunks"], rows))
    out += ["", skipped_list(errs, "BM_growth")]
    return out, data, missed


def section_replay(directory, problems):
    data = {}
    for path in sorted(glob.glob(os.path.join(directory, "replay-*.json"))):
        d = load_json(path, problems)
        if not isinstance(d, dict) or "ratio" not in d:
            continue
        data[d.get("impl", REPLAY_GVM)] = d
    out = ["## GPT-2 trace replay (gvm-replay, gvm-replay-baseline)", ""]
    notes = []
    if not data:
        out.append("No replay results.")
        return out, data, notes
    base = data.get(REPLAY_GVM, {})
    rows = []
    for impl in sorted(data, key=lambda n: (n != REPLAY_GVM, order_key(n))):
        d = data[impl]
        ns = d.get("ns_per_op")
        ratio_vs = (ns / base["ns_per_op"]) if base.get("ns_per_op") and ns else None
        mem_vs = (d["ratio"] / base["ratio"]) if base.get("ratio") and d.get("ratio") else None
        rows.append([impl, "%.3f" % d["ratio"], fmt_ratio(mem_vs) if impl != REPLAY_GVM else "—",
                     "%.2f" % (d.get("peak_reserved_bytes", 0) / 2**30),
                     "%.2f" % (d.get("peak_live_bytes", 0) / 2**30),
                     fmt_ns(ns), fmt_ratio(ratio_vs) if impl != REPLAY_GVM else "—"])
        if impl in TORCH_TRACE_RATIO:
            want = TORCH_TRACE_RATIO[impl]
            if abs(d["ratio"] - want) > TORCH_RATIO_TOLERANCE * want:
                notes.append(
                    "%s replayed to %.3f reserved/live, not PyTorch's own %.3f on this trace "
                    "(more than %d%% apart): the replay sees only raw_alloc_with_stream "
                    "requests, without the tensors' size rounding, the autograd stream "
                    "uses and the process's other allocations behind the recorded figure."
                    % (impl, d["ratio"], want, TORCH_RATIO_TOLERANCE * 100))
            else:
                notes.append("%s replayed to %.3f reserved/live, within %d%% of PyTorch's own "
                             "%.3f on this trace." % (impl, d["ratio"], TORCH_RATIO_TOLERANCE * 100,
                                                      want))
    first = next(iter(data.values()))
    out.append("Trace %s: %s events. ratio = peak reserved ÷ peak live (sampled after every "
               "event); ns/op = median wall time per allocate or free. \"vs gvmalloc\" = that "
               "allocator's figure ÷ gvmalloc's." % (os.path.basename(first.get("trace", "?")),
                                                     first.get("events", "?")))
    out.append("")
    out.append(table(["allocator", "ratio", "vs gvmalloc", "peak reserved GiB",
                      "peak live GiB", "ns/op", "vs gvmalloc"], rows))
    if notes:
        out += [""] + ["- " + n for n in notes]
    return out, data, notes


PEER_COLUMNS = [("torch", "PyTorch"), ("torch_expandable", "PyTorch expandable"),
                ("cudaMallocAsync", "cudaMallocAsync")]


def traces_from_results(directory, problems):
    """{trace: {impl: replay JSON}} from traces-IMPL-TRACE.json files."""
    out = {}
    for path in sorted(glob.glob(os.path.join(directory, "traces-*.json"))):
        d = load_json(path, problems)
        if not isinstance(d, dict) or "ratio" not in d:
            continue
        name = os.path.basename(d.get("trace", "?")).replace(".trace.gz", "")
        out.setdefault(name, {})[d.get("impl", REPLAY_GVM)] = d
    return out


def traces_from_table(path, problems):
    """The same shape from gvm-replay --json without a trace (peers as recorded)."""
    rows = load_json(path, problems)
    out = {}
    for r in rows if isinstance(rows, list) else []:
        entry = {REPLAY_GVM: r}
        for impl, p in (r.get("peers") or {}).items():
            entry[impl] = dict(p, recorded=True)
        out[r.get("trace", "?")] = entry
    return out


def traces_table(traces, on_gpu):
    """Markdown: every shipped trace, gvmalloc beside the peers."""
    head = ["trace", "gvmalloc"] + [label for _, label in PEER_COLUMNS] + ["below the best peer",
                                                                            "driver calls"]
    rows = []
    for name in sorted(traces):
        t = traces[name]
        g = t.get(REPLAY_GVM, {})
        peers = [t.get(k, {}).get("ratio") for k, _ in PEER_COLUMNS]
        known = [p for p in peers if p]
        best = min(known) if known else None
        verdict = "—" if not (best and g.get("ratio")) else (
            "yes" if g["ratio"] < best else "**no** (%.3f)" % best)
        rows.append([name, "%.3f" % g["ratio"] if g.get("ratio") else "—"] +
                    ["%.3f" % p if p else "—" for p in peers] +
                    [verdict, str(g.get("driver_calls", "—"))])
    out = ["Peak reserved ÷ peak live on every shipped trace (`traces/`), lower is better.", ""]
    out.append(table(head, rows))
    trows = []
    for name in sorted(traces):
        t = traces[name]
        g = t.get(REPLAY_GVM, {})
        cells = [name, fmt_ns(g.get("ns_per_op"))]
        if on_gpu:
            for k, _ in PEER_COLUMNS:
                ns = t.get(k, {}).get("ns_per_op")
                cells.append(fmt_ns(ns) if ns else "not measured")
        trows.append(cells)
    if on_gpu:
        out += ["", "Time per allocate or free (median wall time):", ""]
        out.append(table(["trace", "gvmalloc"] + [label for _, label in PEER_COLUMNS], trows))
    else:
        out += ["", "Time per allocate or free: gvmalloc's CPU time on the simulated driver, not a "
                "GPU figure, so the peers' GPU times are not set beside it (a GPU run of "
                "`tools/bench-all.sh` measures all of them side by side):", ""]
        out.append(table(["trace", "gvmalloc (CPU, simulated driver)"], trows))
    return out


def section_traces(traces):
    out = ["## Every shipped trace (gvm-replay, gvm-replay-baseline)", ""]
    if not traces:
        return out + ["Not in this run."]
    on_gpu = any(t.get(REPLAY_GVM, {}).get("driver") == "cuda" for t in traces.values())
    return out + traces_table(traces, on_gpu)


def write_peers(path, traces, env):
    when = "%s (%s)" % (str(env.get("date", "?"))[:10], env.get("gpu", "?"))
    lines = ["# Peers' figures on the shipped traces: peak reserved / peak live and wall time per",
             "# allocate or free, each replaying the trace with gvm-replay-baseline on the GPU named",
             "# (traces/README.md). Written by tools/bench-report.py --peers from one bench-all run;",
             "# traces added later merged in by tools/replay-peers-report.py --peers.",
             "trace,allocator,ratio,ns_per_op,measured"]
    for name in sorted(traces):
        for k, _ in PEER_COLUMNS:
            d = traces[name].get(k)
            if d and d.get("ratio"):
                ns = d.get("ns_per_op")
                lines.append("%s,%s,%.3f,%s,%s" % (name, k, d["ratio"], "%.0f" % ns if ns else "", when))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def replace_block(path, tag, lines):
    text = open(path).read()
    b, e = "<!-- %s:begin -->" % tag, "<!-- %s:end -->" % tag
    if b not in text or e not in text:
        raise SystemExit("bench-report: %s has no %s ... %s block" % (path, b, e))
    i, j = text.index(b), text.index(e)
    text = text[:i] + "\n".join([b, ""] + lines + ["", e]) + text[j + len(e):]
    open(path, "w").write(text)


def section_peer(res, errs):
    out = ["## Peer access (gvm-bench-peer)", ""]
    rows = []
    for r in res:
        if "ns" not in r:
            continue
        raw = r["raw"]
        counters = ", ".join(
            "%s=%.4g" % (k, v) for k, v in sorted(raw.items())
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in (
                "real_time", "cpu_time", "iterations", "repetitions", "repetition_index",
                "threads", "family_index", "per_family_instance_index"))
        rows.append([strip_suffixes(r["run"]), fmt_ns(r["ns"]), counters])
    if not rows:
        out.append("No results" + skipped_note(errs, "BM_") + ".")
        return out
    out.append(table(["benchmark", "time", "counters"], rows))
    out += ["", skipped_list(errs, "BM_")]
    return out


def skipped_note(errs, prefix):
    n = len([k for k in errs if k.startswith(prefix)])
    return " (%d variants skipped or failed, listed below)" % n if n else ""


def skipped_list(errs, prefix):
    items = sorted((k, v) for k, v in errs.items() if k.startswith(prefix))
    if not items:
        return ""
    # One line per distinct reason keeps 30 "no CUDA device" lines readable.
    by_reason = {}
    for k, v in items:
        by_reason.setdefault(v, []).append(strip_suffixes(k))
    lines = ["Skipped or failed:"]
    for reason, names in by_reason.items():
        shown = ", ".join(names[:4]) + (" and %d more" % (len(names) - 4) if len(names) > 4 else "")
        lines.append("- %s: %s" % (shown, reason))
    return "\n".join(lines)


# --- plots --------------------------------------------------------------------------


def make_plots(directory, img_dir, pair, threads, growth, problems):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    os.makedirs(img_dir, exist_ok=True)
    made = []

    def save(fig, name):
        path = os.path.join(img_dir, name)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)

    if pair:
        fig, ax = plt.subplots(figsize=(7, 4))
        for impl in sorted(pair, key=order_key):
            xs = sorted(pair[impl])
            ax.plot(xs, [pair[impl][x] for x in xs], marker="o", label=impl)
        ax.set(xscale="log", yscale="log", xlabel="bytes", ylabel="ns per alloc+free",
               title="Alloc + free pair")
        ax.legend()
        save(fig, "pair.png")
    if threads:
        fig, ax = plt.subplots(figsize=(7, 4))
        for impl in sorted(threads, key=order_key):
            xs = sorted(threads[impl])
            ax.plot(xs, [threads[impl][x] / 1e6 for x in xs], marker="o", label=impl)
        ax.set(xscale="log", xlabel="threads", ylabel="M ops/s (all threads)",
               title="Threads scaling")
        ax.set_xticks(sorted({x for d in threads.values() for x in d}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.legend()
        save(fig, "threads.png")
    real_growth = [g for g in growth if g[0] == GVM] or growth
    if real_growth:
        fig, ax = plt.subplots(figsize=(7, 4))
        labels = ["%dM/%dG" % (c, g) for _, c, g, _ in real_growth]
        xs = range(len(real_growth))
        ax.bar([x - 0.2 for x in xs], [r.get("grow_ms", 0) for *_, r in real_growth], 0.4,
               label="grow")
        ax.bar([x + 0.2 for x in xs], [r.get("grow_driver_ms", 0) for *_, r in real_growth], 0.4,
               label="driver calls alone")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, rotation=45)
        ax.set(yscale="log", ylabel="ms", xlabel="max chunk / target",
               title="Growth from empty (%s)" % real_growth[0][0])
        ax.legend()
        save(fig, "growth.png")
    timelines = sorted(glob.glob(os.path.join(directory, "timeline-*.csv")))
    if timelines:
        fig, ax = plt.subplots(figsize=(9, 4.5))
        live_drawn = False
        for path in timelines:
            name = os.path.basename(path)[len("timeline-"):-len(".csv")]
            ev, live, res = [], [], []
            try:
                with open(path) as f:
                    for row in csv.DictReader(l for l in f if not l.startswith("#")):
                        ev.append(int(row["event"]))
                        live.append(int(row["live_bytes"]) / 2**30)
                        res.append(int(row["reserved_bytes"]) / 2**30)
            except (OSError, KeyError, ValueError) as e:
                problems.append("%s: unreadable (%s)" % (os.path.basename(path), e))
                continue
            if not live_drawn:
                ax.plot(ev, live, color="black", linewidth=0.8, label="live (requested)")
                live_drawn = True
            ax.plot(ev, res, linewidth=1.0, label="reserved: " + name)
        ax.set(xlabel="event", ylabel="GiB", title="GPT-2 trace: live and reserved bytes")
        ax.legend()
        save(fig, "timeline.png")
    return made


# --- main ---------------------------------------------------------------------------


def issue_targets(pair, mixed, thr, replay, growth, mixed_first=None):
    """The numeric targets of the allocator and benchmark issues, each judged
    from this run's figures: met, missed (with the figure), or not measured."""
    rows = []

    def verdict(ok):
        return "met" if ok else "**missed**"

    g = pair.get(GVM, {})
    small = [s for s in sorted(g) if s <= (1 << 20)]
    if small:
        worst = max(g[s] for s in small)
        rows.append(["cache-hit alloc+free pair ≤ 50 ns (sizes ≤ 1 MiB)",
                     "%s at worst (%s)" % (fmt_ns(worst), ", ".join(
                         "%s %s" % (fmt_bytes(s), fmt_ns(g[s])) for s in small)),
                     verdict(worst <= 50)])
        t = pair.get("torch", {})
        ratios = [t[s] / g[s] for s in small if s in t]
        if ratios:
            rows.append(["cache-hit pair ≥ 15× faster than PyTorch's allocator",
                         "%.1f× to %.1f×" % (min(ratios), max(ratios)), verdict(min(ratios) >= 15)])
    else:
        rows.append(["cache-hit alloc+free pair ≤ 50 ns", "not measured", "—"])
    if g:
        # The heap rebuild's target names no size: every size measured is judged.
        worst_size = max(g, key=lambda s: g[s])
        over = [s for s in sorted(g) if g[s] > 30]
        rows.append(["cache-hit pair ≤ 30 ns (the heap rebuild), every size",
                     "%s at worst (%s)%s" % (fmt_ns(g[worst_size]), fmt_bytes(worst_size),
                                             "; above 30 ns: " + ", ".join(
                                                 "%s %s" % (fmt_bytes(s), fmt_ns(g[s])) for s in over)
                                             if over else ""),
                     verdict(not over)])
    if GVM in mixed:
        first = (mixed_first or {}).get(GVM)
        rows.append(["mixed workload ≤ 100 ns per operation",
                     fmt_ns(mixed[GVM]) + (" warm (its first pass from a fresh allocator: %s)"
                                           % fmt_ns(first) if first is not None else ""),
                     verdict(mixed[GVM] <= 100)])
        if "torch" in mixed:
            r = mixed["torch"] / mixed[GVM]
            rows.append(["mixed workload ≥ 8× faster than PyTorch's allocator", "%.2f×" % r,
                         verdict(r >= 8)])
    tg = thr.get(GVM, {})
    if 1 in tg and 8 in tg:
        r = tg[8] / tg[1]
        rows.append(["8 threads on 8 streams: aggregate ≥ 4× one thread",
                     "%.2f× (%.3g M/s vs %.3g M/s)" % (r, tg[8] / 1e6, tg[1] / 1e6), verdict(r >= 4)])
    if 1 in tg and 16 in tg:
        r = tg[16] / tg[1]
        rows.append(["16 threads on 16 streams: aggregate ≥ 8× one thread",
                     "%.2f× (%.3g M/s vs %.3g M/s)" % (r, tg[16] / 1e6, tg[1] / 1e6), verdict(r >= 8)])
    gv = replay.get(REPLAY_GVM)
    if gv and gv.get("ratio"):
        rows.append(["GPT-2 trace: peak reserved ÷ peak live ≤ 1.03", "%.3f" % gv["ratio"],
                     verdict(gv["ratio"] <= 1.03)])
        te = replay.get("torch_expandable")
        if te and te.get("ratio"):
            rows.append(["GPT-2 trace: below PyTorch with expandable segments",
                         "%.3f vs %.3f" % (gv["ratio"], te["ratio"]), verdict(gv["ratio"] < te["ratio"])])
        tt = replay.get("torch")
        if tt and tt.get("ns_per_op") and gv.get("ns_per_op"):
            rows.append(["GPT-2 trace: time per operation below PyTorch's",
                         "%s vs %s" % (fmt_ns(gv["ns_per_op"]), fmt_ns(tt["ns_per_op"])),
                         verdict(gv["ns_per_op"] < tt["ns_per_op"])])
    big = [x[3] for x in growth if x[0] == GVM and x[2] == 64] if growth else []
    big = [r["grow_ms"] / r["grow_driver_ms"] for r in big
           if r.get("grow_ms") and r.get("grow_driver_ms")]
    if big:
        worst = max(big)
        rows.append(["growth to 64 GiB ≤ 2× the time of its driver calls", "%.2f× at worst" % worst,
                     verdict(worst <= 2)])
    if not rows:
        return []
    return [table(["target (from the issues)", "measured", "verdict"], rows), "",
            "Where a target is missed, `docs/design-notes.md` (\"Known limits\") says what "
            "limits it.", ""]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="?", default="bench-out")
    ap.add_argument("--out", default=None, help="default: docs/benchmarks.md of this checkout")
    ap.add_argument("--img", default=None, help="default: img/ next to --out")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--readme", default=None,
                    help="also replace the block between <!-- numbers:begin --> and "
                         "<!-- numbers:end --> of this file with the headline table, and the "
                         "<!-- traces:begin --> block with the shipped traces' table")
    ap.add_argument("--peers", default=None, help="rewrite this peers.csv from the run")
    ap.add_argument("--traces-from", default=None,
                    help="gvm-replay --json (no trace): only the README's traces block")
    a = ap.parse_args()
    if a.traces_from:
        problems = []
        traces = traces_from_table(a.traces_from, problems)
        if problems or not traces:
            sys.exit("bench-report: %s: %s" % (a.traces_from, "; ".join(problems) or "no traces"))
        if not a.readme:
            sys.exit("bench-report: --traces-from needs --readme")
        on_gpu = any(t.get(REPLAY_GVM, {}).get("driver") == "cuda" for t in traces.values())
        dev = next(iter(traces.values()))[REPLAY_GVM].get("device", "?")
        lines = ["gvmalloc replayed %s (`gvm-replay --json`, %s); the peers' figures as recorded "
                 "on one H200 (`traces/README.md`). Again: `build/bench/gvm-replay --json > t.json && "
                 "tools/bench-report.py --traces-from t.json --readme README.md`." % (
                     "on " + dev if on_gpu else "on a simulated " + dev + ", which makes the same "
                     "decisions as the GPU", "driver cuda" if on_gpu else "driver sim"), ""]
        replace_block(a.readme, "traces", lines + traces_table(traces, on_gpu))
        print("bench-report: wrote the traces table into %s" % a.readme)
        return 0
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out_path = a.out or os.path.join(root, "docs", "benchmarks.md")
    img_dir = a.img or os.path.join(os.path.dirname(os.path.abspath(out_path)), "img")

    directory = a.results
    tmp = None
    if os.path.isfile(directory) and tarfile.is_tarfile(directory):
        tmp = tempfile.TemporaryDirectory()
        with tarfile.open(directory) as t:
            t.extractall(tmp.name)
        directory = tmp.name
    if not os.path.isdir(directory):
        sys.exit("bench-report: no results directory %s (run tools/bench-all.sh)" % directory)

    problems = []
    env = load_json(os.path.join(directory, "env.json"), problems) if os.path.exists(
        os.path.join(directory, "env.json")) else {}
    env = env or {}
    alloc, _ = bench_results(directory, "alloc*.json", problems)
    mt, _ = bench_results(directory, "mt*.json", problems)
    growth_res, _ = bench_results(directory, "growth*.json", problems)
    peer_res, _ = bench_results(directory, "peer*.json", problems)
    e_alloc = errors_of(directory, "alloc*.json", problems)
    e_mt = errors_of(directory, "mt*.json", problems)
    e_growth = errors_of(directory, "growth*.json", problems)
    e_peer = errors_of(directory, "peer*.json", problems)

    pair_md, pair = section_pair(alloc, e_alloc)
    mixed_md, mixed, mixed_first = section_mixed(alloc, e_alloc)
    thr_md, thr = section_threads(mt, e_mt)
    growth_md, growth, growth_missed = section_growth(growth_res, e_growth)
    replay_md, replay, replay_notes = section_replay(directory, problems)
    traces = traces_from_results(directory, problems)
    traces_md = section_traces(traces)
    peer_md = section_peer(peer_res, e_peer) if glob.glob(os.path.join(directory, "peer*.json")) \
        else ["## Peer access (gvm-bench-peer)", "", "Not in this run."]

    plots = None if a.no_plots else make_plots(directory, img_dir, pair, thr, growth, problems)

    md = []
    md.append("# Benchmarks: gvmalloc side by side with PyTorch's allocator and cudaMallocAsync")
    md.append("")
    md.append("<!-- Generated by tools/bench-report.py from the output of tools/bench-all.sh. "
              "Do not edit by hand: rerun both. -->")
    md.append("")
    md.append("Every figure below was measured in one run of `tools/bench-all.sh` (each "
              "baseline in the same binary as gvmalloc) and copied here by "
              "`tools/bench-report.py`; none is typed by hand. Times are medians of the "
              "repetitions the run asked for.")
    md.append("")
    if not (alloc or mt or growth_res or peer_res or replay):
        md.append("**No results yet**: generated from a results directory without any; run "
                  "`tools/bench-all.sh` on the GPU machine, then this script on its output.")
        md.append("")
    md.append("Allocators: `gvm_cuda` (gvmalloc on the CUDA driver), `torch` (PyTorch's "
              "CUDACachingAllocator through `raw_alloc_with_stream` / `raw_delete` of "
              "libc10_cuda), `torch_expandable` (the same with "
              "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, a second run of each "
              "binary), `cudaMallocAsync` (the device's pool, release threshold UINT64_MAX), "
              "`cudaMalloc`, and `gvm_sim_h200` (gvmalloc on a simulated H200: CPU cost only). "
              "CMake builds the torch baseline when `python3 -c 'import torch'` works, from "
              "that package's `include/` and `lib/libc10*.so`; elsewhere those variants are "
              "skipped with the reason.")
    md.append("")
    md.append("| | |")
    md.append("|---|---|")
    for key, label in (("date", "date"), ("host", "machine"), ("gpu", "GPU"),
                       ("driver_version", "NVIDIA driver"), ("cuda_version", "CUDA (driver API)"),
                       ("cpu", "CPU"), ("nproc", "host cores"), ("torch_version", "PyTorch"),
                       ("commit", "commit"), ("command", "command"), ("bench_args", "benchmark flags")):
        value = str(env.get(key, "unknown"))
        if key == "command":
            # The results directory is the measuring machine's path: not the reader's.
            value = " ".join("<results dir>" if w.startswith("/") else w for w in value.split())
        md.append("| %s | %s |" % (label, value.replace("|", "\\|")))
    md.append("")
    md.append("## Targets")
    md.append("")
    md += issue_targets(pair, mixed, thr, replay, growth, mixed_first)
    md.append("- Growth and trim cost at most %g× the driver calls they make (growth table)." %
              GROWTH_TARGET)
    if growth_missed:
        md.append("  **Missed** in %d case(s): %s." % (len(growth_missed), "; ".join(growth_missed)))
    elif any(g[0] == GVM for g in growth):
        md.append("  Met in every measured case.")
    else:
        md.append("  Not measured in this run (no gvm_cuda growth results).")
    md.append("- The replay of PyTorch's allocator reproduces its recorded ratio on the "
              "GPT-2 trace (1.945 default, 1.079 expandable segments, within %d%%)."
              % (TORCH_RATIO_TOLERANCE * 100))
    if not any(k in replay for k in TORCH_TRACE_RATIO):
        md.append("  Not measured in this run.")
    md.append("- gvmalloc reserves less per live byte than each baseline on the trace and "
              "allocates faster than each baseline (ratios above 1× in every table).")
    if replay.get(REPLAY_GVM):
        worse = [k for k, d in replay.items() if k != REPLAY_GVM and d.get("ratio") and
                 d["ratio"] < replay[REPLAY_GVM]["ratio"]]
        if worse:
            md.append("  **Missed** on memory: %s reserved less than gvmalloc (%.3f)." % (
                ", ".join("%s %.3f" % (k, replay[k]["ratio"]) for k in worse),
                replay[REPLAY_GVM]["ratio"]))
        faster = []
        for impl, d in replay.items():
            if impl != REPLAY_GVM and d.get("ns_per_op") and d["ns_per_op"] < replay[
                    REPLAY_GVM].get("ns_per_op", 0):
                faster.append("replay %s %s" % (impl, fmt_ns(d["ns_per_op"])))
        for impl, ns in mixed.items():
            if impl not in (GVM, "gvm_sim_h200") and GVM in mixed and ns < mixed[GVM]:
                faster.append("mixed %s %s" % (impl, fmt_ns(ns)))
        for impl, by_size in pair.items():
            for size, ns in sorted(by_size.items()):
                base = pair.get(GVM, {}).get(size)
                if impl not in (GVM, "gvm_sim_h200") and base and ns < base:
                    faster.append("pair %s %s %s" % (fmt_bytes(size), impl, fmt_ns(ns)))
        if faster:
            md.append("  **Missed** on time: faster than gvmalloc: %s." % "; ".join(faster))
    else:
        md.append("  Not measured in this run (no gvmalloc replay).")
    md.append("")
    for part in (pair_md, mixed_md, thr_md, growth_md, replay_md, traces_md, peer_md):
        md += part + [""]
    md.append("## Plots")
    md.append("")
    if plots is None:
        md.append("Plots skipped: %s." % ("--no-plots" if a.no_plots else
                                          "matplotlib is not installed where the report ran"))
    elif not plots:
        md.append("No plots: no data to draw.")
    else:
        rel = os.path.relpath(img_dir, os.path.dirname(os.path.abspath(out_path)))
        for p in plots:
            md.append("![%s](%s)" % (os.path.basename(p)[:-4], os.path.join(rel,
                                                                          os.path.basename(p))))
            md.append("")
    if problems:
        md += ["", "## Files that could not be read", ""] + ["- " + p for p in sorted(set(problems))]
    md.append("")
    md.append("## How to reproduce")
    md.append("")
    md.append("```")
    md.append("tools/bench-all.sh            # on the GPU machine: builds build-gpu, writes bench-out/")
    md.append("tools/bench-report.py bench-out")
    md.append("```")
    text = "\n".join(l for l in md if l is not None).rstrip() + "\n"
    text = re.sub(r"\n{3,}", "\n\n", text)
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    if a.readme:
        targets = issue_targets(pair, mixed, thr, replay, growth, mixed_first)
        head = ["<!-- numbers:begin -->", "",
                "Measured on %s (%s) with PyTorch %s, %s; generated by `tools/bench-report.py` "
                "from one `tools/bench-all.sh` run. Details, every table and how to measure again: "
                "`docs/benchmarks.md`; peer access: `docs/peer-access.md`." % (
                    env.get("gpu", "?"), env.get("driver_version", "?"),
                    env.get("torch_version", "?"), str(env.get("date", "?"))[:10]), ""]
        head += targets + ["<!-- numbers:end -->"]
        readme = open(a.readme).read()
        b, e = readme.index("<!-- numbers:begin -->"), readme.index("<!-- numbers:end -->")
        readme = readme[:b] + "\n".join(head) + readme[e + len("<!-- numbers:end -->"):]
        open(a.readme, "w").write(readme)
        if traces and "<!-- traces:begin -->" in readme:
            on_gpu = any(t.get(REPLAY_GVM, {}).get("driver") == "cuda" for t in traces.values())
            replace_block(a.readme, "traces", [
                "Measured in the same `tools/bench-all.sh` run (%s): every allocator replaying "
                "each trace on the GPU. Details: `docs/benchmarks.md`." % env.get("gpu", "?"), ""]
                + traces_table(traces, on_gpu))
    if a.peers and traces:
        write_peers(a.peers, traces, env)
        print("bench-report: wrote %s" % a.peers)
    with open(out_path, "w") as f:
        f.write(text)
    print("bench-report: wrote %s%s" % (
        out_path, "" if plots is None else " and %d plot(s) in %s" % (len(plots), img_dir)))
    if plots is None and not a.no_plots:
        print("bench-report: plots skipped (no matplotlib); tables written")
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
