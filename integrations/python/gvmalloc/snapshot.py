"""PyTorch memory snapshots as gvmalloc allocation traces.

A snapshot is what `torch.cuda.memory._dump_snapshot("x.pickle")` writes (or
`torch.cuda.memory._snapshot()` returns): a pickle of builtins - a dict with
"segments" (what the allocator held at the end), "device_traces" (per device,
the history recorded since `torch.cuda.memory._record_memory_history()`:
actions alloc, free_requested, free_completed, segment_alloc, segment_free,
segment_map, segment_unmap, snapshot, oom; each with addr, size, stream,
time_us) and "allocator_settings". This module reads one without importing
torch and turns one device's history into gvmalloc's trace format
(docs/replay.md): `a <id> <bytes> <stream>` / `f <id> <stream>`.

    from gvmalloc import snapshot
    snap = snapshot.load("x.pickle")            # SnapshotError when it is not one
    conv = snapshot.convert(snap, device=None)  # the device with the most events
    conv.write("x.trace.gz")
    conv.pytorch                                # what PyTorch reserved over that history

Loading never builds arbitrary objects: the unpickler refuses every class
reference, so a pickle that names one (not a snapshot) cannot run code.

Conversion rules:
  - alloc       `a`: a new id for the address, the recorded size (the request)
  - free_requested  `f` of the block at that address, on the recorded stream
    (free_completed, which follows once the block's stream events are done,
    is the allocator's business, not the program's; old histories that have
    only "free" or "free_completed" use those instead)
  - segment_*   not events of the program: they give PyTorch's reserved bytes
    over time (pytorch.peak_reserved_bytes)
  - a free of an address the history never allocated (allocated before the
    recording began) is left out and counted
"""

import gzip
import io
import pickle

__all__ = ["SnapshotError", "load", "loads", "convert", "Conversion", "HOW_TO_RECORD"]

HOW_TO_RECORD = (
    "record one with torch.cuda.memory._record_memory_history(max_entries=1000000) "
    "before the work and torch.cuda.memory._dump_snapshot(\"x.pickle\") after it")

_FREES = ("free_requested", "free", "free_completed")
_RESERVE = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


class SnapshotError(ValueError):
    """Not a usable PyTorch memory snapshot; the message says why."""


class _BuiltinsOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(
            "it refers to %s.%s; a memory snapshot holds only dicts, lists, strings and "
            "numbers, so it is not read (nothing of it was run)" % (module, name))

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("it uses persistent ids; a memory snapshot does not")


def loads(data, source="<bytes>"):
    """The snapshot in `data` (pickle bytes, optionally gzip). SnapshotError if not one."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise SnapshotError("%s: gzip error: %s" % (source, e)) from None
    if not data:
        raise SnapshotError("%s: empty file, not a memory snapshot" % source)
    if data[:1] != b"\x80":
        # _dump_snapshot pickles with protocol 2 or later, which starts so.
        raise SnapshotError("%s: not a PyTorch memory snapshot: not a pickle (no pickle "
                            "protocol marker at its start)" % source)
    try:
        snap = _BuiltinsOnly(io.BytesIO(data)).load()
    except EOFError:
        raise SnapshotError("%s: truncated: the pickle ends before its data does "
                            "(an interrupted _dump_snapshot or copy?)" % source) from None
    except pickle.UnpicklingError as e:
        msg = str(e)
        if "truncated" in msg:
            raise SnapshotError("%s: truncated: %s" % (source, msg)) from None
        raise SnapshotError("%s: not a PyTorch memory snapshot: %s" % (source, msg)) from None
    except (ValueError, TypeError, IndexError, KeyError, OverflowError, MemoryError) as e:
        raise SnapshotError("%s: not a PyTorch memory snapshot (bad pickle: %s)" % (source, e)) from None
    if not isinstance(snap, dict) or "segments" not in snap:
        raise SnapshotError("%s: not a PyTorch memory snapshot: a pickle of %s without "
                            "'segments' and 'device_traces'" % (source, type(snap).__name__))
    return snap


def load(path):
    """The snapshot in the file `path` (what _dump_snapshot wrote)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise SnapshotError("%s: cannot read: %s" % (path, e.strerror or e)) from None
    return loads(data, path)


class Conversion:
    """One device's history as trace lines, and what PyTorch reserved meanwhile."""

    def __init__(self, source, device):
        self.source = source
        self.device = device
        self.lines = []
        self.streams = set()
        self.allocations = 0
        self.frees = 0
        self.unmatched_frees = 0   # freed, allocated before the history began
        self.skipped = 0           # zero-byte allocations and unreadable entries
        self.peak_live_bytes = 0
        self.end_live_bytes = 0
        self.pytorch = {}

    def text(self):
        head = [
            "# gvmalloc trace of %s, device %d (tools/snapshot_to_trace.py)" % (self.source, self.device),
            "# %d allocations, %d frees on %d stream(s); peak live %d bytes" % (
                self.allocations, self.frees, len(self.streams), self.peak_live_bytes),
        ]
        if self.pytorch.get("peak_reserved_bytes") is not None:
            head.append("# %s reserved at most %d bytes over this history (%s)" % (
                "gvmalloc's PyTorch backend" if self.pytorch.get("gvmalloc") else "PyTorch",
                self.pytorch["peak_reserved_bytes"], self.pytorch["allocator"]))
        return "\n".join(head + self.lines) + "\n"

    def write(self, path):
        data = self.text().encode()
        if path.endswith(".gz"):
            data = gzip.compress(data, mtime=0)
        with open(path, "wb") as f:
            f.write(data)


def _device_traces(snap, source):
    traces = snap.get("device_traces")
    if not isinstance(traces, list) or not any(isinstance(t, list) and t for t in traces):
        raise SnapshotError("%s has no allocation history (device_traces is empty): the "
                            "snapshot was taken without recording; %s" % (source, HOW_TO_RECORD))
    return traces


def devices_with_history(snap, source="<snapshot>"):
    """Devices whose history has at least one alloc, with their event counts."""
    out = {}
    for d, t in enumerate(_device_traces(snap, source)):
        n = sum(1 for e in t if isinstance(e, dict) and e.get("action") == "alloc") if isinstance(t, list) else 0
        if n:
            out[d] = len(t)
    return out


_GVM_SETTINGS = "gvmalloc GVM_CONF:"


def _pytorch_figures(snap, device, history, end_reserved):
    settings = snap.get("allocator_settings") or {}
    expandable = bool(settings.get("expandable_segments")) if isinstance(settings, dict) else False
    conf = settings.get("PYTORCH_CUDA_ALLOC_CONF", "") if isinstance(settings, dict) else ""
    net = 0
    peak = 0
    seen = False
    for e in history:
        sign = _RESERVE.get(e.get("action"))
        if sign is None:
            continue
        seen = True
        net += sign * int(e.get("size") or 0)
        peak = max(peak, net)
    # What was reserved before the history began: what is reserved at the end
    # minus what the history added.
    before = max(end_reserved - net, 0)
    # gvmalloc's backend answers _snapshot() with its configuration in the
    # settings' configuration string: the run was gvmalloc's, not PyTorch's
    # caching allocator's (integrations/torch/src/memory_layout.cpp).
    gvm = isinstance(conf, str) and conf.startswith(_GVM_SETTINGS)
    if gvm:
        name = "gvmalloc's PyTorch backend (%s)" % conf[len("gvmalloc "):]
    else:
        name = "PyTorch's caching allocator, expandable_segments %s%s" % (
            "on" if expandable else "off", (", PYTORCH_CUDA_ALLOC_CONF=" + conf) if conf else "")
    return {
        "allocator": name,
        "gvmalloc": gvm,
        "expandable_segments": expandable and not gvm,
        "peak_reserved_bytes": before + peak if seen or end_reserved else None,
        "end_reserved_bytes": end_reserved,
        "reserved_before_history": before,
    }


def convert(snap, device=None, source="<snapshot>"):
    """Device `device`'s history (None: the one with the most events) as a Conversion."""
    traces = _device_traces(snap, source)
    have = devices_with_history(snap, source)
    if not have:
        raise SnapshotError("%s: the history holds no allocation on any device; %s" % (source, HOW_TO_RECORD))
    if device is None:
        device = max(have, key=lambda d: have[d])
    elif device not in have:
        raise SnapshotError("%s: no allocation history for device %d (devices with one: %s)" % (
            source, device, ", ".join(str(d) for d in sorted(have))))
    history = traces[device]
    has_requested = any(isinstance(e, dict) and e.get("action") == "free_requested" for e in history)
    free_action = "free_requested" if has_requested else next(
        (a for a in _FREES if any(isinstance(e, dict) and e.get("action") == a for e in history)), None)
    c = Conversion(source, device)
    live = {}   # address -> (id, size, stream)
    next_id = 0
    now = 0
    for e in history:
        if not isinstance(e, dict):
            c.skipped += 1
            continue
        action = e.get("action")
        try:
            addr = int(e.get("addr"))
            size = int(e.get("size") or 0)
            stream = int(e.get("stream") or 0)
        except (TypeError, ValueError):
            c.skipped += 1
            continue
        if stream < 0:
            stream &= (1 << 64) - 1
        if action == "alloc":
            if size <= 0:
                c.skipped += 1
                continue
            if addr in live:  # allocated twice without a free in between: a lost free
                old = live.pop(addr)
                c.lines.append("f %d %d" % (old[0], old[2]))
                now -= old[1]
                c.frees += 1
            live[addr] = (next_id, size, stream)
            c.lines.append("a %d %d %d" % (next_id, size, stream))
            next_id += 1
            c.allocations += 1
            c.streams.add(stream)
            now += size
            c.peak_live_bytes = max(c.peak_live_bytes, now)
        elif action == free_action:
            block = live.pop(addr, None)
            if block is None:
                c.unmatched_frees += 1
                continue
            c.lines.append("f %d %d" % (block[0], stream))
            c.streams.add(stream)
            c.frees += 1
            now -= block[1]
    c.end_live_bytes = now
    end_reserved = 0
    for s in snap.get("segments") or []:
        if isinstance(s, dict) and s.get("device", device) == device:
            end_reserved += int(s.get("total_size") or 0)
    c.pytorch = _pytorch_figures(snap, device, history, end_reserved)
    if c.allocations == 0:
        raise SnapshotError("%s: device %d's history has no allocation to replay" % (source, device))
    return c
