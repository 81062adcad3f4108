"""record_trace(path): the allocations of a block of a live program, as a gvmalloc trace.

    import gvmalloc.torch
    with gvmalloc.torch.record_trace("step.trace.gz"):
        train_step()
    # then: build/bench/gvm-replay step.trace.gz

It asks the allocator that serves the program for its history (PyTorch's
torch.cuda.memory._record_memory_history, which PyTorch's own caching allocator
and gvmalloc's native backend both implement), takes the snapshot on the way
out and writes one device's allocations and frees in gvmalloc's trace format
(docs/replay.md), with what the allocator reserved over the block
(gvmalloc.snapshot does the conversion). Only allocation history is recorded,
no stacks, so the block runs at nearly its own speed. Recording is switched
off again on exit, also when the block raises.
"""

import contextlib
import os

from . import snapshot

__all__ = ["record_trace", "RecordTraceError"]


def source_label(path):
    """What the trace's first line says it came from: the file's name only, so
    that no directory of the recording machine travels with the file."""
    return "record_trace(%r)" % os.path.basename(path)


class RecordTraceError(RuntimeError):
    """The allocator cannot record a history, or the block left nothing to write."""


def _torch():
    try:
        import torch
    except ImportError as e:
        raise RecordTraceError("record_trace needs PyTorch (import torch failed: %s)" % e) from None
    if not torch.cuda.is_available():
        raise RecordTraceError("record_trace needs a CUDA device (torch.cuda.is_available() is False)")
    return torch


@contextlib.contextmanager
def record_trace(path, device=None, max_entries=10_000_000):
    """Records the allocations inside the `with` block into the trace file `path`.

    device: the CUDA device whose allocations are written (default: the
    current one). max_entries: the history's capacity; a block with more
    events keeps only the last ones (the trace then says how many frees it
    had to leave out). Raises RecordTraceError when the allocator cannot
    record (gvmalloc.torch.enable()'s pluggable route cannot: PyTorch does
    not pass history requests to a pluggable allocator), and
    gvmalloc.snapshot.SnapshotError when the block allocated nothing there.
    """
    torch = _torch()
    dev = torch.cuda.current_device() if device is None else int(device)
    try:
        torch.cuda.memory._record_memory_history(
            enabled="all", context=None, stacks="python", max_entries=max_entries, clear_history=True)
    except (RuntimeError, TypeError) as e:
        raise RecordTraceError(
            "the allocator serving this program cannot record an allocation history (%s); "
            "record_trace works with PyTorch's own allocator and with gvmalloc's native backend, "
            "not with the CUDAPluggableAllocator route of gvmalloc.torch.enable()" % e) from None
    try:
        yield
        torch.cuda.synchronize(dev)
        snap = torch.cuda.memory._snapshot(dev)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    conv = snapshot.convert(snap, dev, source=source_label(path))
    conv.write(path)
