"""gvmalloc for Python: the virtual-memory GPU allocator behind PyTorch and CuPy.

    import gvmalloc.torch
    gvmalloc.torch.enable()          # before the first CUDA tensor (the native backend)
    ...
    gvmalloc.stats()["devices"][0]["peak_reserved_bytes"]

The allocator is one per process, in libgvmalloc.so (found as _lib.py says).
This module wraps its C ABI (gvm.h; docs/c-api.md): lifecycle, statistics,
trimming, peer policy. gvmalloc.torch, gvmalloc.cupy and gvmalloc.numba plug it
into the frameworks (docs/pytorch.md, docs/cupy.md, docs/numba.md). Importing this package loads
nothing: the library is loaded by the first call that needs it.
"""

import ctypes
import json

from . import _lib
from ._lib import GvmError, LibraryNotFound, OutOfMemoryError, TorchBackendNotFound, library_path
from ._torch_backend import TorchBackendError, TorchVersionMismatch

__all__ = [
    "GvmError", "LibraryNotFound", "OutOfMemoryError", "TorchBackendNotFound",
    "TorchBackendError", "TorchVersionMismatch", "library_path",
    "init", "init_simulated", "shutdown", "is_initialized", "ensure_initialized",
    "malloc", "free", "scratch_malloc", "record_stream", "forget_stream",
    "stats", "memory_snapshot", "device_stats", "memory_reserved", "max_memory_reserved",
    "memory_allocated", "max_memory_allocated", "empty_cache",
    "set_peer_policy", "peer_policy", "peer_copy", "merge_conf",
]


def merge_conf(base, override):
    """GVM_CONF text with `override`'s items after `base`'s (the last key wins)."""
    parts = [p.strip() for p in (base or "", override or "") if p and p.strip()]
    return ",".join(parts)


def _cstr(s):
    if s is None:
        return None
    if not isinstance(s, str):
        raise TypeError("expected a str or None, got %s" % type(s).__name__)
    return s.encode()


# ---- lifecycle ---------------------------------------------------------------------


def init(conf=None):
    """Starts the allocator on the real CUDA driver; `conf` ("key:value,...") over GVM_CONF."""
    _lib.check(_lib.load().gvm_init(_cstr(conf)))


def init_simulated(profile="h200", device_count=1, conf=None):
    """Starts the allocator on the CPU simulation (tests and demos without a GPU)."""
    _lib.check(_lib.load().gvm_init_simulated(_cstr(profile), int(device_count), _cstr(conf)))


def shutdown():
    """Returns all memory to the driver; every pointer it gave out dies."""
    _lib.check(_lib.load().gvm_shutdown())


def is_initialized():
    return bool(_lib.load().gvm_is_initialized())


def ensure_initialized(conf=None):
    """Starts the allocator on the real driver unless one runs. Returns True if it started one."""
    lib = _lib.load()
    if lib.gvm_is_initialized():
        return False
    status = lib.gvm_init(_cstr(conf))
    if status == _lib.ERROR_ALREADY_INITIALIZED:  # another thread was first
        return False
    _lib.check(status)
    return True


# ---- raw blocks (for tests and for code that manages its own pointers) -------------


def malloc(size, device=0, stream=0):
    """A block of `size` bytes on `device`, ordered on `stream` (an int handle). Returns its address."""
    p = _lib.load().gvm_malloc(int(size), int(device), int(stream) or None)
    if not p:
        raise _lib.error()
    return p


def free(ptr, size=0, device=0, stream=0):
    """Returns a block from malloc / scratch_malloc (size 0: unknown, not checked)."""
    _lib.check(_lib.load().gvm_free(int(ptr) or None, int(size), int(device), int(stream) or None))


def scratch_malloc(size, device=0, stream=0):
    """A block in `device`'s peer scratch buffer (docs/peer-access.md). Free it with free()."""
    p = _lib.load().gvm_scratch_malloc(int(size), int(device), int(stream) or None)
    if not p:
        raise _lib.error()
    return p


def record_stream(ptr, stream, stream_device=None):
    """The block at `ptr` is also used on `stream` (of `stream_device`, if another device)."""
    lib = _lib.load()
    if stream_device is None:
        _lib.check(lib.gvm_record_stream(int(ptr) or None, int(stream) or None))
    else:
        _lib.check(lib.gvm_record_stream_on(int(ptr) or None, int(stream) or None,
                                            int(stream_device)))


def _stream_handle(stream):
    """The handle of a stream given as an int, a torch.cuda.Stream (or ExternalStream:
    .cuda_stream), a CuPy stream (.ptr) or a Numba stream (int())."""
    for attr in ("cuda_stream", "ptr"):
        handle = getattr(stream, attr, None)
        if handle is not None:
            return int(handle)
    try:
        return int(stream)
    except (TypeError, ValueError):
        raise TypeError("expected a stream handle (int) or a stream object of torch, CuPy or "
                        "Numba, got %r" % (stream,)) from None


def forget_stream(stream):
    """The stream is being destroyed (gvm_forget_stream): from now on gvmalloc never
    touches its handle again, waits for what it left through the events it already
    has, and takes a new stream that gets the same handle for a new stream.

    Call it before or right after the stream is destroyed, for a stream gvmalloc has
    seen (any stream its blocks were allocated or recorded on): a torch.cuda.ExternalStream
    or another library's stream that dies while gvmalloc may still record events on
    it. PyTorch's own pooled streams are never destroyed and need nothing
    (docs/pytorch.md, "Streams"). A stream gvmalloc never saw, or a call before the
    allocator started, does nothing.
    """
    handle = _stream_handle(stream)
    lib = _lib.load()
    if not lib.gvm_is_initialized():
        return
    _lib.check(lib.gvm_forget_stream(handle or None))


# ---- statistics --------------------------------------------------------------------

_NOT_RUNNING = '{"devices":[],"driver_calls":{},"driver_totals":{"calls":0,"ns":0},"config":null}'


def memory_snapshot():
    """The stats as JSON text (gvm_stats_json): devices, driver_calls, driver_totals, config.

    Before the allocator starts (PyTorch starts it on the first CUDA
    allocation), the same shape with no devices and "config": null.
    """
    lib = _lib.load()
    if not lib.gvm_is_initialized():
        return _NOT_RUNNING
    needed = ctypes.c_size_t(0)
    # The size grows as driver calls are counted: ask, then copy; retry if it grew.
    for _ in range(8):
        size = max(needed.value, 4096) * 2
        buf = ctypes.create_string_buffer(size)
        status = lib.gvm_stats_json(buf, size, ctypes.byref(needed))
        if status == _lib.OK:
            return buf.value.decode()
        if status != _lib.ERROR_INVALID_ARGUMENT or needed.value <= size:
            raise _lib.error(status)
    raise GvmError("GVM_ERROR_INTERNAL", "gvm_stats_json: the stats kept growing")


def stats():
    """memory_snapshot() as a dict."""
    return json.loads(memory_snapshot())


def _device_index(device):
    """An int device index from None (the current device), an int, "cuda:N" or a torch.device."""
    if device is None:
        import sys
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return torch.cuda.current_device()
        return 0
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind != "cuda":
            raise ValueError("gvmalloc manages CUDA devices, not %r" % device)
        return int(index) if index else _device_index(None)
    kind = getattr(device, "type", None)
    if kind is not None:  # torch.device
        if kind != "cuda":
            raise ValueError("gvmalloc manages CUDA devices, not %r" % (device,))
        return device.index if device.index is not None else _device_index(None)
    raise TypeError("expected a device index, 'cuda:N' or a torch.device, got %r" % (device,))


def device_stats(device=None):
    """The counters of one device (gvm_device_stats) as a dict; zeros before the allocator starts."""
    index = _device_index(device)
    lib = _lib.load()
    s = _lib.device_stats_type(lib)()
    if not lib.gvm_is_initialized():
        s.device = index
        return s.to_dict()
    _lib.check(lib.gvm_device_stats(index, ctypes.byref(s)))
    return s.to_dict()


def memory_reserved(device=None):
    """Bytes mapped on `device` (arena and scratch), like torch.cuda.memory_reserved."""
    return device_stats(device)["reserved_bytes"]


def max_memory_reserved(device=None):
    """The peak of memory_reserved since the allocator started."""
    return device_stats(device)["peak_reserved_bytes"]


def memory_allocated(device=None):
    """Bytes handed out on `device` (requests rounded up), like torch.cuda.memory_allocated."""
    return device_stats(device)["live_bytes"]


def max_memory_allocated(device=None):
    return device_stats(device)["peak_live_bytes"]


def empty_cache(device=None):
    """Returns cached memory to the driver (gvm_trim): of `device`, or every device when None.

    Nothing to do before the allocator starts.
    """
    lib = _lib.load()
    if not lib.gvm_is_initialized():
        return
    _lib.check(lib.gvm_trim(-1 if device is None else _device_index(device)))


# ---- peer access (docs/peer-access.md) --------------------------------------------


def set_peer_policy(policy):
    """"auto", "per_allocation", "global" or "none" for every device pair (fences first)."""
    _lib.check(_lib.load().gvm_set_peer_policy(_cstr(policy)))


def peer_copy(dst, dst_device, src, src_device, size, stream=0):
    """Copies `size` bytes from `src` (of src_device) to `dst` (of dst_device), ordered on
    `stream` (a stream of dst_device): a direct read by dst_device when `src` is in
    src_device's scratch buffer and the policy admits it, staged by the driver otherwise."""
    _lib.check(_lib.load().gvm_peer_copy(int(dst) or None, int(dst_device), int(src) or None,
                                         int(src_device), int(size), int(stream) or None))


def peer_policy(owner, peer):
    """The policy under which `peer` reaches `owner`'s scratch buffer."""
    r = _lib.load().gvm_peer_policy(int(owner), int(peer))
    if r is None:
        raise _lib.error()
    return r.decode()
