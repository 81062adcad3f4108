#!/usr/bin/env python3
"""Prints, as Markdown, what tools/replay-peers.sh measured: peak reserved /
peak live and ns per operation of each trace under gvmalloc and each peer,
and whether gvmalloc is below the best peer.

  python3 tools/replay-peers-report.py RESULTS_DIR
"""
import glob
import json
import os
import sys

ALLOCATORS = ["gvmalloc", "torch", "torch_expandable", "async"]


def load(path):
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else d[0]


def main():
    res = sys.argv[1]
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


if __name__ == "__main__":
    main()
