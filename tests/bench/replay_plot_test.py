#!/usr/bin/env python3
"""tools/replay_plot.py: one line, never a traceback. With matplotlib a PNG is
written; without it the line says so. A bad input file is named.
Usage: replay_plot_test.py PATH/TO/replay_plot.py"""
import json
import os
import subprocess
import sys
import tempfile


def main():
    script = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        rows = [{"trace": "t%d" % i, "ratio": 1.0 + i / 100,
                 "peers": {"torch": {"ratio": 1.9}, "torch_expandable": {"ratio": 1.08},
                           "cudaMallocAsync": {"ratio": 1.07}}} for i in range(3)]
        good = os.path.join(tmp, "r.json")
        with open(good, "w") as f:
            json.dump(rows, f)
        png = os.path.join(tmp, "out.png")
        r = subprocess.run([sys.executable, script, good, png], capture_output=True, text=True)
        try:
            import matplotlib  # noqa: F401
            have = True
        except ImportError:
            have = False
        if have:
            if r.returncode != 0 or not os.path.getsize(png) or png not in r.stdout:
                failures.append("no plot written: %r %r" % (r.stdout, r.stderr))
        elif r.returncode != 0 or "no matplotlib" not in r.stdout:
            failures.append("without matplotlib it must say so: %r %r" % (r.stdout, r.stderr))
        if "Traceback" in r.stderr:
            failures.append("a traceback: " + r.stderr)
        bad = os.path.join(tmp, "bad.json")
        with open(bad, "w") as f:
            f.write("{not json")
        r = subprocess.run([sys.executable, script, bad, png], capture_output=True, text=True)
        if r.returncode != 1 or "cannot read " + bad not in r.stdout or "Traceback" in r.stderr:
            failures.append("bad input: %r %r" % (r.stdout, r.stderr))
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print("all checks passed" + ("" if have else " (matplotlib absent: the no-plot line checked)"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
