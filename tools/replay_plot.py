#!/usr/bin/env python3
"""Draws gvm-replay's table over the shipped traces: peak reserved / peak live of
gvmalloc beside the peers' recorded figures, one group of bars per trace.

  tools/replay_plot.py RESULTS.json OUT.png

RESULTS.json is `gvm-replay --json` without a trace (a list, one object per
trace, each with "ratio" and "peers"). gvm-replay runs this itself after its
table; it prints one line: where the plot went, or why there is none
(no matplotlib) - never a traceback for a missing module.
"""
import json
import sys

PEERS = [("torch", "PyTorch"), ("torch_expandable", "PyTorch expandable segments"),
         ("cudaMallocAsync", "cudaMallocAsync")]
LABEL = "plot           "


def main():
    if len(sys.argv) != 3:
        print("usage: replay_plot.py RESULTS.json OUT.png", file=sys.stderr)
        return 2
    try:
        with open(sys.argv[1]) as f:
            rows = json.load(f)
        if not isinstance(rows, list) or not all("ratio" in r and "trace" in r for r in rows):
            raise ValueError("expected a list of traces with 'trace' and 'ratio'")
    except (OSError, ValueError) as e:
        print(LABEL + "none: cannot read %s (%s)" % (sys.argv[1], e))
        return 1
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(LABEL + "none: python3 has no matplotlib (pip install matplotlib to draw one)")
        return 0
    names = [r["trace"] for r in rows]
    series = [("gvmalloc (this run)", [r["ratio"] for r in rows])]
    for key, label in PEERS:
        series.append((label, [r.get("peers", {}).get(key, {}).get("ratio", 0) for r in rows]))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series):
        xs = [k + (i - (len(series) - 1) / 2) * width for k in range(len(names))]
        ax.bar(xs, [max(v - 1.0, 0.0) for v in values], width, bottom=1.0, label=label)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names)
    ax.set_ylabel("peak reserved / peak live")
    ax.set_title("gvmalloc beside the peers on the shipped traces (peers recorded on one H200)")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(sys.argv[2], dpi=110)
    except OSError as e:
        print(LABEL + "none: cannot write %s (%s)" % (sys.argv[2], e.strerror or e))
        return 1
    print(LABEL + sys.argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
