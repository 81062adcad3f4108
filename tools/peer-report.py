#!/usr/bin/env python3
"""Writes the Results section of docs/peer-access.md from a GPU run's files.

  tools/peer-report.py --bench gvm-bench-peer.json [--ctest ctest-gpu.xml]
                       [--env environment.log] [--doc docs/peer-access.md]

gvm-bench-peer.json: `gvm-bench-peer --benchmark_repetitions=5
--benchmark_report_aggregates_only=true --benchmark_format=json` (tools/gpu-suite.sh
writes it). ctest-gpu.xml: the JUnit file of the gpu-labelled tests (gpu-suite.sh
keeps it in its logs). With --doc, the section between "## Results" and the next
"## " heading is replaced in place; without, it is printed. Every figure comes
from those files: nothing here is typed by hand.
"""
import argparse
import json
import re
import xml.etree.ElementTree as ET


def medians(path):
    d = json.load(open(path))
    out = {}
    for b in d["benchmarks"]:
        if b.get("aggregate_name") == "median":
            out[b["run_name"]] = b
    return d.get("context", {}), out


def find(m, prefix):
    for k, v in m.items():
        if k.startswith(prefix):
            return v
    return None


def fmt(x, digits=1):
    return "—" if x is None else ("%.*f" % (digits, x))


def reports(ctest_xml):
    """key=value blocks printed by the GPU tests, by test name."""
    res = {}
    for tc in ET.parse(ctest_xml).getroot().iter("testcase"):
        text = tc.findtext("system-out") or ""
        kv = dict(l.split("=", 1) for l in text.splitlines() if re.match(r"^[A-Za-z_0-9]+=", l))
        failed = tc.find("failure") is not None or tc.get("status") == "fail"
        res[tc.get("name")] = (kv, failed)
    return res


def section(bench, ctest, env):
    ctx, m = medians(bench)
    lines = ["## Results", ""]
    driver = ""
    if env:
        t = open(env).read()
        mm = re.search(r"Driver Version: ([0-9.]+)", t)
        driver = mm.group(1) if mm else ""
    lines.append("Measured on two NVIDIA H200 (NVLink NV18) with driver %s, %s; medians of %s "
                 "repetitions of `gvm-bench-peer` (run by `tools/gpu-suite.sh`); this section is "
                 "written by `tools/peer-report.py` from that run's files."
                 % (driver or "(see environment.log)", ctx.get("date", "?")[:10],
                    next(iter(m.values())).get("repetitions", "?") if m else "?"))
    lines.append("")
    lines.append("| peer copy, device 0 → device 1 | 256 MiB GB/s | 1 GiB GB/s |")
    lines.append("|---|---|---|")
    g = {}
    for label, name in (("(a) gvmalloc scratch, direct, no global access", "BM_peer_copy_scratch"),
                        ("(b) global peer access (`cuMemAlloc`)", "BM_peer_copy_global"),
                        ("(c) staged, no peer access", "BM_peer_copy_staged")):
        a = find(m, name + "/268435456")
        b = find(m, name + "/1073741824")
        g[name] = (a and a.get("GB/s"), b and b.get("GB/s"))
        lines.append("| %s | %s | %s |" % (label, fmt(g[name][0]), fmt(g[name][1])))
    sa, ga = g["BM_peer_copy_scratch"], g["BM_peer_copy_global"]
    if sa[1] and ga[1]:
        lines.append("")
        lines.append("Through the scratch, with global peer access never enabled: %.1f%% of the "
                     "global-peer-access bandwidth at 1 GiB (%.1f%% at 256 MiB); the target is ≥ 95%%."
                     % (100 * sa[1] / ga[1], 100 * sa[0] / ga[0]))
    lines += ["", "| grant a fresh scratch chunk | ms per chunk | ms per GiB | of which cuMemSetAccess (ms) |",
              "|---|---|---|---|"]
    for mib in (2, 16, 64, 256, 1024):
        b = find(m, "BM_grant_chunk/MiB:%d/" % mib)
        lines.append("| %s | %s | %s | %s |" % ("1 GiB" if mib == 1024 else "%d MiB" % mib,
                                                fmt(b and b.get("ms_per_chunk"), 2),
                                                fmt(b and b.get("ms_per_GiB"), 1),
                                                fmt(b and b.get("grant_ms"), 2)))
    lines += ["", "| policy switch, n MiB live per device | revoke (fence + PROT_NONE) ms | grant (fence + grant) ms | "
              "baseline enable (sync + cuCtxEnablePeerAccess ×2) ms | baseline disable (sync + cuCtxDisablePeerAccess ×2) ms |",
              "|---|---|---|---|---|"]
    for mib in (256, 1024):
        p = find(m, "BM_policy_switch/MiB:%d/" % mib)
        t = find(m, "BM_global_toggle/MiB:%d/" % mib)
        lines.append("| %s | %s | %s | %s | %s |" % ("1 GiB" if mib == 1024 else "%d MiB" % mib,
                                                     fmt(p and p.get("revoke_ms"), 2), fmt(p and p.get("grant_ms"), 2),
                                                     fmt(t and t.get("enable_ms"), 2), fmt(t and t.get("disable_ms"), 2)))
    lines += ["", "| fence before a scratch trim, unrelated streams busy for 20 ms | `scratch_fence:devices`: trim ms | `scratch_fence:tracked`: trim ms |",
              "|---|---|---|"]
    for busy in (0, 1, 4):
        d = find(m, "BM_fence/tracked:0/busy:%d/" % busy)
        t = find(m, "BM_fence/tracked:1/busy:%d/" % busy)
        lines.append("| %d | %s | %s |" % (busy, fmt(d and d.get("trim_ms"), 2), fmt(t and t.get("trim_ms"), 2)))
    if ctest:
        r = reports(ctest)
        lines += ["", "| GPU test | result |", "|---|---|"]
        for name, (kv, failed) in sorted(r.items()):
            if "PeerEngineGpuTest" in name:
                mode = name.rsplit("/", 1)[-1]
                lines.append("| engine scenario, %s | %s: %s iterations, work queued at %s/200 revokes, %s/200 trims; "
                             "%s wrong words, %s control failures, cuCtxEnablePeerAccess calls %s, final syncs %s / %s |"
                             % (mode, "FAILED" if failed else "passed", kv.get("iterations_done"),
                                kv.get("pending_at_revoke"), kv.get("pending_at_trim"), kv.get("wrong_words"),
                                kv.get("control_failures"), kv.get("cuCtxEnablePeerAccess_calls"),
                                kv.get("final_sync_0"), kv.get("final_sync_1")))
        for name, (kv, failed) in sorted(r.items()):
            if kv.get("scenario") and kv.get("fenced"):
                lines.append("| %s, %s (%s) | %s: work queued %s; change %s, then sync %s, later calls %s |"
                             % (kv["scenario"], "fenced" if kv["fenced"] == "yes" else "unfenced", name,
                                "FAILED" if failed else "passed", kv.get("pending_before_change"),
                                kv.get("change"), kv.get("sync"), kv.get("later")))
    lines.append("")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--ctest")
    ap.add_argument("--env")
    ap.add_argument("--doc")
    a = ap.parse_args()
    text = section(a.bench, a.ctest, a.env)
    if not a.doc:
        print(text)
        return
    doc = open(a.doc).read()
    start = doc.index("## Results")
    end = doc.find("\n## ", start + 3)
    doc = doc[:start] + text + (doc[end + 1:] if end >= 0 else "")
    open(a.doc, "w").write(doc)


if __name__ == "__main__":
    main()
