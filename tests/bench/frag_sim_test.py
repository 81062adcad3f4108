#!/usr/bin/env python3
"""tools/frag_sim.py on a trace made so that a request fits exactly into the
free end of one chunk and the free start of another: with STITCH=peak the
model makes it of those two (no new byte), without it the best fit grows.
Also: the oracle of lifetimes (STITCH_LIFE) and the guess from a size's history
(STITCH_GUESS), the trace's comment lines read past, and a bad STITCH refused.
Usage: frag_sim_test.py PATH/TO/frag_sim.py"""
import os
import subprocess
import sys
import tempfile

M = 1 << 20
# Chunk 1 [0, 4 MiB) ends up holding 1 MiB live then 3 free; chunk 3
# [8, 12 MiB) 3 free then 1 live (block 6, placed in its last granule's
# rest); chunk 2 stays live. A 6 MiB request then finds holes of 3 MiB only.
TRACE = """# a comment, as record_trace writes them
a 1 %d 0
a 2 %d 0
a 3 %d 0
a 6 %d 0
f 1 0
a 4 %d 0
f 3 0
a 7 %d 0
f 7 0
a 8 %d 0
""" % (4 * M, 4 * M, 3 * M, 1 * M, 1 * M, 6 * M, 3 * M)


def run(script, trace, stitch=None, **more):
    env = dict(os.environ)
    for k in ("STITCH", "STITCH_KEEP", "STITCH_LIFE", "STITCH_GUESS"):
        env.pop(k, None)
    if stitch is not None:
        env["STITCH"] = stitch
    env.update(more)
    return subprocess.run([sys.executable, script, trace, "128", "-1"], capture_output=True,
                          text=True, env=env)


def main():
    script = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "t.trace")
        with open(trace, "w") as f:
            f.write(TRACE)
        # Without stitching: 4 + 4 + 4 MiB of chunks, then 6 MiB more for
        # block 7, against 12 MiB live at most.
        r = run(script, trace)
        want = "peak reserved / peak live 1.5000, chunks made 4, released 0"
        if r.returncode != 0 or want not in r.stdout or "stitch" in r.stdout:
            failures.append("plain: %r %r" % (r.stdout, r.stderr))
        # Stitched: block 7 takes chunk 1's free end and chunk 3's free
        # start; nothing is made for it, and its free gives both back
        # (block 8 then fits into one of them without a growth).
        r = run(script, trace, "peak")
        want = ("peak reserved / peak live 1.0000, chunks made 3, released 0; "
                "stitch peak: 1 blocks stitched, 6 driver calls for their second mappings")
        if r.returncode != 0 or want not in r.stdout:
            failures.append("stitch: %r %r" % (r.stdout, r.stderr))
        # Block 7 is freed at the next event: the oracle of lifetimes lets
        # it be stitched; the guess from its size's history does not (no
        # block of 6 MiB was freed before it).
        r = run(script, trace, "peak", STITCH_LIFE="1")
        if r.returncode != 0 or want not in r.stdout:
            failures.append("STITCH_LIFE=1: %r %r" % (r.stdout, r.stderr))
        r = run(script, trace, "peak", STITCH_GUESS="10")
        if r.returncode != 0 or "peak reserved / peak live 1.5000" not in r.stdout:
            failures.append("STITCH_GUESS=10: %r %r" % (r.stdout, r.stderr))
        r = run(script, trace, "everywhere")
        if r.returncode == 0 or "STITCH: peak or all" not in r.stderr:
            failures.append("bad STITCH: %r %r" % (r.stdout, r.stderr))
    for f in failures:
        print("FAIL", f)
    if failures:
        print("frag_sim: %d failures" % len(failures))
        return 1
    print("frag_sim: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
