#!/usr/bin/env python3
"""Prints, as Markdown, what tools/replay-peers.sh measured: peak reserved /
peak live and ns per operation of each trace under gvmalloc and each peer,
and whether gvmalloc is below the best peer.

  python3 tools/replay-peers-report.py RESULTS_DIR [--peers traces/peers.csv]

--peers merges the peers' figures of RESULTS_DIR's traces into that CSV (the
file gvm-replay reads its peers from, tools/bench-all.sh its traces): rows of
those traces are replaced, every other row kept, each new row dated by its
JSON's modification time (UTC) and named by the GPU the JSON names. For new
traces copied into traces/, so that bench-all replays them from then on.
"""
import datetime
import glob
import json
import os
import sys

ALLOCATORS = ["gvmalloc", "torch", "torch_expandable", "async"]
# replay-peers.sh's file prefix -> the allocator's name in peers.csv
PEER_NAMES = {"torch": "torch", "torch_expandable": "torch_expandable", "async": "cudaMallocAsync"}
CSV_HEADER = "trace,allocator,ratio,ns_per_op,measured"


def load(path):
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else d[0]


def peer_rows(res, traces):
    """peers.csv rows (without the newline) of every peer replay of `traces` in res."""
    rows = []
    for t in traces:
        for prefix, name in PEER_NAMES.items():
            path = os.path.join(res, f"{prefix}-{t}.json")
            d = load(path)
            if not d or not d.get("ratio"):
                continue
            day = datetime.datetime.fromtimestamp(os.path.getmtime(path), datetime.timezone.utc)
            ns = d.get("ns_per_op")
            rows.append("%s,%s,%.3f,%s,%s (1× %s)" % (t, name, d["ratio"], "%.0f" % ns if ns else "",
                                                        day.strftime("%Y-%m-%d"),
                                                        d.get("device", "?")))
    return rows


def merge_peers(csv_path, res, traces):
    with open(csv_path) as f:
        lines = f.read().splitlines()
    if CSV_HEADER not in lines:
        raise SystemExit("replay-peers-report: %s has no header line %r" % (csv_path, CSV_HEADER))
    new = peer_rows(res, traces)
    if not new:
        raise SystemExit("replay-peers-report: no peer replay in %s to merge" % res)
    replaced = {r.split(",", 1)[0] for r in new}
    head = lines[:lines.index(CSV_HEADER) + 1]
    kept = [l for l in lines[len(head):] if l and l.split(",", 1)[0] not in replaced]
    with open(csv_path, "w") as f:
        # Grouped by trace (a stable sort: each trace's rows keep their order).
        f.write("\n".join(head + sorted(kept + new, key=lambda l: l.split(",", 1)[0])) + "\n")
    return len(new)


def main():
    args = sys.argv[1:]
    csv_path = None
    if "--peers" in args:
        i = args.index("--peers")
        if i + 1 == len(args):
            raise SystemExit("replay-peers-report: --peers needs the CSV to merge into\n" + __doc__)
        csv_path = args[i + 1]
        del args[i:i + 2]
    if len(args) != 1:
        raise SystemExit(__doc__)
    res = args[0]
    traces = sorted(os.path.basename(p)[len("gvmalloc-"):-len(".json")]
                    for p in glob.glob(os.path.join(res, "gvmalloc-*.json")))
    print("| trace | " + " | ".join(ALLOCATORS) + " | below the best peer | ns/op (same order) |")
    print("|---" * (len(ALLOCATORS) + 3) + "|")
    for t in traces:
        rows = {a: load(os.path.join(res, f"{a}-{t}.json")) for a in ALLOCATORS}
        ratio = {a: r["ratio"] for a, r in rows.items() if r}
        peers = [v for a, v in ratio.items() if a != "gvmalloc"]
        verdict = "—"
        if "gvmalloc" in ratio and peers:
            best = min(peers)
            verdict = "yes" if ratio["gvmalloc"] < best else f"**no** ({best:.3f})"
        cells = [f"{ratio[a]:.3f}" if a in ratio else "—" for a in ALLOCATORS]
        ns = [f"{rows[a]['ns_per_op']:.0f}" if rows[a] else "—" for a in ALLOCATORS]
        print(f"| {t} | " + " | ".join(cells) + f" | {verdict} | " + " / ".join(ns) + " |")
    if csv_path:
        n = merge_peers(csv_path, res, traces)
        print("replay-peers-report: %d rows of %d traces merged into %s" % (n, len(traces), csv_path))


if __name__ == "__main__":
    main()
