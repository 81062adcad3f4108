#!/usr/bin/env python3
"""tools/replay-peers-report.py: the table of a results directory, and --peers,
which merges that directory's peer figures into a peers.csv: rows of its traces
replaced, every other row and the comment lines kept in place, a file without
the header refused. Usage: replay_peers_report_test.py PATH/TO/replay-peers-report.py"""
import json
import os
import subprocess
import sys
import tempfile

HEADER = "trace,allocator,ratio,ns_per_op,measured"


def write_json(path, ratio, ns, device="GPU X"):
    with open(path, "w") as f:
        json.dump({"ratio": ratio, "ns_per_op": ns, "device": device}, f)


def main():
    script = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        res = os.path.join(tmp, "res")
        os.makedirs(res)
        # trace "new": every allocator; trace "old": replayed again, one peer only
        write_json(os.path.join(res, "gvmalloc-new.json"), 1.010, 150)
        write_json(os.path.join(res, "torch-new.json"), 1.5, 400)
        write_json(os.path.join(res, "torch_expandable-new.json"), 1.02, 450)
        write_json(os.path.join(res, "async-new.json"), 1.1, 900)
        write_json(os.path.join(res, "gvmalloc-old.json"), 1.05, 150)
        write_json(os.path.join(res, "torch-old.json"), 1.25, 300)
        csv = os.path.join(tmp, "peers.csv")
        kept = ["# a comment", HEADER,
                "keep,torch,2.000,100,2026-01-01 (1× H)",
                "old,torch,9.999,1,2026-01-01 (1× H)",
                "old,cudaMallocAsync,8.888,2,2026-01-01 (1× H)",
                "zzz,torch,1.100,100,2026-01-01 (1× H)"]
        with open(csv, "w") as f:
            f.write("\n".join(kept) + "\n")

        r = subprocess.run([sys.executable, script, res], capture_output=True, text=True)
        if r.returncode != 0 or "| new | 1.010 | 1.500 | 1.020 | 1.100 | yes |" not in r.stdout:
            failures.append("the table: %r %r" % (r.stdout, r.stderr))
        if "| old | 1.050 | 1.250 | — | — | yes |" not in r.stdout:
            failures.append("a trace with one peer: %r" % r.stdout)

        r = subprocess.run([sys.executable, script, res, "--peers", csv], capture_output=True,
                           text=True)
        lines = open(csv).read().splitlines()
        if r.returncode != 0 or "4 rows of 2 traces merged" not in r.stdout:
            failures.append("--peers: %r %r" % (r.stdout, r.stderr))
        if lines[:3] != ["# a comment", HEADER, "keep,torch,2.000,100,2026-01-01 (1× H)"]:
            failures.append("the comment, header and an untouched trace stay first: %r" % lines)
        body = [l.rsplit(",", 1)[0] for l in lines[2:]]
        want = ["keep,torch,2.000,100",
                "new,torch,1.500,400", "new,torch_expandable,1.020,450",
                "new,cudaMallocAsync,1.100,900",
                "old,torch,1.250,300",
                "zzz,torch,1.100,100"]
        if body != want:
            failures.append("rows: %r, want %r" % (body, want))
        if not any(l.startswith("new,torch,") and l.endswith("(1× GPU X)") for l in lines):
            failures.append("the GPU named in the JSON: %r" % lines)
        if any("9.999" in l or "8.888" in l for l in lines):
            failures.append("the old trace's earlier rows must go: %r" % lines)

        r = subprocess.run([sys.executable, script, res, "--peers"], capture_output=True, text=True)
        if r.returncode == 0 or "--peers needs the CSV" not in r.stderr or "Traceback" in r.stderr:
            failures.append("--peers without a file: %r" % r.stderr)

        bad = os.path.join(tmp, "bad.csv")
        with open(bad, "w") as f:
            f.write("not,a,peers,file\n")
        r = subprocess.run([sys.executable, script, res, "--peers", bad], capture_output=True,
                           text=True)
        if r.returncode == 0 or "has no header line" not in r.stderr + r.stdout:
            failures.append("a CSV without the header: %r %r" % (r.stdout, r.stderr))
        if open(bad).read() != "not,a,peers,file\n":
            failures.append("a refused CSV must be left as it was")
    for f in failures:
        print("FAIL:", f)
    if failures:
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
