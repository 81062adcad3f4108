#!/usr/bin/env python3
"""The table of tools/bench-old-vs-new.sh: every round's median, old beside new,
and the median over the rounds.

    tools/bench-old-vs-new.py OUT_DIR [OLD_NAME]

Reads OUT_DIR/{mt,pair}-{old,new}-<round>.json (Google Benchmark JSON with
aggregates). Threads: aggregate operations per second (millions), and new / old;
pairs: ns per allocate+free, and old / new (above 1 = the new one is faster).
"""
import glob
import json
import os
import re
import statistics
import sys


def medians(path, value):
    """{benchmark name without the aggregate suffix: value of its median row}."""
    with open(path) as f:
        data = json.load(f)
    out = {}
    for b in data.get("benchmarks", []):
        if b.get("aggregate_name") == "median":
            out[b["run_name"]] = value(b)
    return out


def rounds(out_dir, kind, which):
    files = glob.glob(os.path.join(out_dir, "%s-%s-*.json" % (kind, which)))
    return sorted(files, key=lambda p: int(re.search(r"-(\d+)\.json$", p).group(1)))


def table(out_dir, kind, value, label, better):
    old = [medians(p, value) for p in rounds(out_dir, kind, "old")]
    new = [medians(p, value) for p in rounds(out_dir, kind, "new")]
    names = sorted({n for r in old + new for n in r}, key=lambda n: [int(x) if x.isdigit() else x
                                                                     for x in re.split(r"(\d+)", n)])
    lines = []
    for name in names:
        o = [r[name] for r in old if name in r]
        n = [r[name] for r in new if name in r]
        if not o or not n:
            lines.append("%-44s (missing in %s)" % (name, "old" if not o else "new"))
            continue
        mo, mn = statistics.median(o), statistics.median(n)
        lines.append("%-44s old %-26s new %-26s median %s %.3g vs %.3g: %s %.2fx" % (
            name, " ".join("%.3g" % v for v in o), " ".join("%.3g" % v for v in n), label, mo, mn,
            better, (mn / mo) if better == "new/old" else (mo / mn)))
    return lines


def main(argv):
    if not argv:
        raise SystemExit(__doc__)
    out_dir = argv[0]
    old_name = argv[1] if len(argv) > 1 else "old"
    order = os.environ.get("GVM_OVN_ORDER", "old new").replace(" ", ", ")
    lines = ["old = %s, new = this tree; each round runs %s" % (old_name, order), "",
             "threads (M operations/s, all threads; higher is better):"]
    lines += table(out_dir, "mt", lambda b: b["items_per_second"] / 1e6, "M/s", "new/old")
    lines += ["", "cache-hit pair (ns per allocate+free) and mixed (ns per two operations); lower is better:"]
    lines += table(out_dir, "pair", lambda b: b["real_time"], "ns", "old/new")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
