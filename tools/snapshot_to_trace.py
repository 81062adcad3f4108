#!/usr/bin/env python3
"""A PyTorch memory snapshot (with history) as a gvmalloc allocation trace.

  tools/snapshot_to_trace.py x.pickle [-o x.trace.gz] [--device N] [--summary FILE]

x.pickle is what torch.cuda.memory._dump_snapshot wrote after
torch.cuda.memory._record_memory_history(); without that history it is refused
with a line saying how to record one. The trace (default: x.trace.gz beside the
snapshot) replays with `gvm-replay x.trace.gz`; `gvm-replay --snapshot x.pickle`
runs this and replays in one go, beside what PyTorch reserved in the same run.
--summary writes key=value lines (what gvm-replay reads). No torch needed; the
pickle is read without building any object (integrations/python/gvmalloc/snapshot.py).
Exit status: 0, 1 for a snapshot that cannot be used (one line on stderr), 2 usage.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integrations", "python"))
from gvmalloc import snapshot  # noqa: E402  (the package loads nothing on import)


def main():
    p = argparse.ArgumentParser(prog="snapshot_to_trace.py", description=__doc__.split("\n")[0])
    p.add_argument("snapshot")
    p.add_argument("-o", "--out", help="trace file to write (.gz: compressed)")
    p.add_argument("--device", type=int, default=None, help="device (default: the one with most events)")
    p.add_argument("--summary", help="also write key=value lines about the conversion here")
    a = p.parse_args()
    out = a.out or (os.path.splitext(a.snapshot)[0] + ".trace.gz")
    try:
        conv = snapshot.convert(snapshot.load(a.snapshot), a.device, a.snapshot)
        conv.write(out)
    except snapshot.SnapshotError as e:
        print("snapshot_to_trace: %s" % e, file=sys.stderr)
        return 1
    except OSError as e:
        print("snapshot_to_trace: cannot write %s: %s" % (out, e.strerror or e), file=sys.stderr)
        return 1
    pt = conv.pytorch
    print("%s: device %d, %d allocations and %d frees on %d stream(s), peak live %d bytes -> %s" % (
        a.snapshot, conv.device, conv.allocations, conv.frees, len(conv.streams),
        conv.peak_live_bytes, out))
    if conv.unmatched_frees:
        print("note: %d frees of blocks allocated before the history began were left out (the "
              "recording started late or its max_entries was too small)" % conv.unmatched_frees)
    if pt.get("reserved_before_history"):
        print("note: PyTorch already reserved %d bytes when the history began" % pt["reserved_before_history"])
    if a.summary:
        fields = {
            "trace": out, "device": conv.device, "allocations": conv.allocations, "frees": conv.frees,
            "streams": len(conv.streams), "peak_live_bytes": conv.peak_live_bytes,
            "unmatched_frees": conv.unmatched_frees,
            "pytorch_allocator": pt["allocator"],
            # 1: the snapshot is of a run under gvmalloc's own backend, whose figures these are.
            "recorded_by_gvmalloc": 1 if pt["gvmalloc"] else 0,
            "pytorch_peak_reserved_bytes": pt["peak_reserved_bytes"] if pt["peak_reserved_bytes"] is not None else "",
            "pytorch_reserved_before_history": pt["reserved_before_history"],
        }
        try:
            with open(a.summary, "w") as f:
                for k, v in fields.items():
                    f.write("%s=%s\n" % (k, v))
        except OSError as e:
            print("snapshot_to_trace: cannot write %s: %s" % (a.summary, e.strerror or e), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
