#!/usr/bin/env python3
"""On a GPU: one small PyTorch run recorded two ways, for tests/python/test_snapshot_cpu.py.

  OUT=dir tools/gpu-snapshot-pair.sh        (or: python3 tools/gpu-snapshot-pair.py DIR)

A few steps of a small convolutional net and an MLP with varying batch sizes,
one of them with a copy on a side stream, run inside gvmalloc.record_trace
(which writes DIR/paired_record.trace.gz on the way out); just before the block
ends, torch.cuda.memory._dump_snapshot writes DIR/paired_snapshot.pickle of the
same history. The CPU test checks that both read to the same events. Also
writes DIR/paired_replay.txt: gvm-replay --snapshot on the pickle when the
binary is given as GVM_REPLAY (what a user sees). Prints what it wrote.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integrations", "python"))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "gpu-snapshot-pair")
    os.makedirs(out, exist_ok=True)
    import torch
    from gvmalloc.record_trace import record_trace

    torch.manual_seed(0)
    dev = torch.device("cuda", 0)
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32),
                               torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 3, padding=1),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                               torch.nn.Linear(64, 10)).to(dev)
    mlp = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                              torch.nn.Linear(4096, 1024)).to(dev)
    opt = torch.optim.AdamW(list(conv.parameters()) + list(mlp.parameters()), lr=1e-3)
    side = torch.cuda.Stream()
    snap_path = os.path.join(out, "paired_snapshot.pickle")
    trace_path = os.path.join(out, "paired_record.trace.gz")
    with record_trace(trace_path):
        for step, batch in enumerate((8, 32, 16, 64, 24, 48)):
            x = torch.randn(batch, 3, 64 + 16 * (step % 3), 64, device=dev)
            y = torch.randint(0, 10, (batch,), device=dev)
            loss = torch.nn.functional.cross_entropy(conv(x), y)
            h = torch.randn(batch * 4, 1024, device=dev)
            loss = loss + mlp(h).square().mean()
            if step == 2:
                with torch.cuda.stream(side):
                    staged = torch.empty(batch * 4, 1024, device=dev)
                    staged.copy_(h, non_blocking=True)
                torch.cuda.current_stream().wait_stream(side)
                h.record_stream(side)
                loss = loss + staged.mean()
                del staged
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            del x, y, h, loss
        torch.cuda.synchronize()
        torch.cuda.memory._dump_snapshot(snap_path)
    print("wrote %s (%d bytes) and %s (%d bytes)" % (
        snap_path, os.path.getsize(snap_path), trace_path, os.path.getsize(trace_path)))
    replay = os.environ.get("GVM_REPLAY")
    if replay and os.path.exists(replay):
        r = subprocess.run([replay, "--snapshot", snap_path], capture_output=True, text=True)
        with open(os.path.join(out, "paired_replay.txt"), "w") as f:
            f.write(r.stdout + r.stderr)
        print(r.stdout + r.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
