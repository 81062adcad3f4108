"""gvmalloc inside PyTorch (docs/pytorch.md).

Two ways in:
  enable()      every CUDA tensor of the process comes from gvmalloc; call it
                before the first CUDA tensor is created. By default this is
                gvmalloc's PyTorch backend (libgvmalloc_torch.so, a complete
                PyTorch CUDA allocator: record_stream, CUDA graphs, MemPool,
                memory statistics and snapshots, torch.OutOfMemoryError);
                enable(backend="pluggable") is the older route through
                torch.cuda.memory.CUDAPluggableAllocator, which loses most of that.
  mem_pool()    a torch.cuda.MemPool whose memory comes from gvmalloc, for the
                allocations made under torch.cuda.use_mem_pool(pool).
and scratch_tensor(): a tensor in a device's peer scratch buffer, which the
peers admitted by the peer policy may read directly (docs/peer-access.md).
"""

import math
import os
import sys
import threading
import warnings
import weakref

try:
    import torch as _torch
except ImportError as _e:  # pragma: no cover - depends on the machine
    raise ImportError("gvmalloc.torch needs PyTorch, which could not be imported (%s); "
                      "install torch, or use gvmalloc without it" % _e) from _e

import gvmalloc as _gvm
from gvmalloc import _lib, _torch_backend
# The allocations of a block of the program as a gvmalloc trace, whichever
# allocator serves it (docs/replay.md).
from gvmalloc.record_trace import RecordTraceError, record_trace

__all__ = ["enable", "is_enabled", "backend", "backend_info", "pluggable_allocator", "mem_pool",
           "scratch_tensor", "record_stream", "record_trace", "RecordTraceError", "PLUGGABLE_LOSES"]

_TOO_LATE = ("gvmalloc.torch.enable(): PyTorch's CUDA allocator is already in use in this "
             "process (%s), and PyTorch cannot change its allocator once it has started. "
             "Call gvmalloc.torch.enable() before the first CUDA tensor is created (first "
             "thing after import torch), or use gvmalloc.torch.mem_pool() for part of a "
             "program.")

# What a program loses with enable(backend="pluggable"), PyTorch's
# CUDAPluggableAllocator handing gvmalloc only malloc and free.
PLUGGABLE_LOSES = (
    "Tensor.record_stream is ignored (a block is reused while another stream still reads it)",
    "CUDA graphs (torch.cuda.graph, make_graphed_callables, torch.compile "
    "mode=\"reduce-overhead\") fail during capture",
    "torch.backends.cudnn.benchmark=True raises (no cacheInfo)",
    "torch.cuda.memory_stats / memory_reserved / max_memory_allocated / memory_summary / "
    "memory._snapshot report nothing",
    "running out of memory is not raised as torch.OutOfMemoryError",
    "set_per_process_memory_fraction, empty_cache and reset_peak_memory_stats do nothing",
)

_lock = threading.Lock()
_enabled = None  # (backend name, conf, handle) once enable() has succeeded


def pluggable_allocator(for_pool=False):
    """A torch.cuda.memory.CUDAPluggableAllocator over libgvmalloc.so.

    for_pool: the free is gvm_torch_pool_free, which returns the device's cached
    memory to the driver: PyTorch's caching allocator frees a pool's segments only
    when it empties the pool, so they are not wanted back soon.
    """
    free_fn = "gvm_torch_pool_free" if for_pool else "gvm_torch_free"
    return _torch.cuda.memory.CUDAPluggableAllocator(_gvm.library_path(), "gvm_torch_malloc",
                                                     free_fn)


def _cuda_memory_in_use():
    """Why PyTorch's allocator cannot be replaced any more, or None if it seems it can."""
    if not _torch.cuda.is_initialized():
        return None
    try:
        used = [(d, _torch.cuda.memory_allocated(d)) for d in range(_torch.cuda.device_count())]
    except RuntimeError:  # another pluggable allocator, without stats: let the swap decide
        return None
    used = [(d, n) for d, n in used if n > 0]
    if not used:
        return None
    return ", ".join("%d bytes allocated on cuda:%d" % (n, d) for d, n in used)


def is_enabled():
    return _enabled is not None


def backend():
    """"native" (gvmalloc's PyTorch backend), "pluggable", or None before enable()."""
    return None if _enabled is None else _enabled[0]


def backend_info():
    """The native backend's library, the torch it was built for and whether it is
    installed; None unless enable() loaded it."""
    return _torch_backend.info()


def _start(conf):
    """Starts gvmalloc with `conf` over GVM_CONF (written back for child processes)."""
    if conf is not None and _gvm.is_initialized():
        raise RuntimeError("gvmalloc.torch.enable(conf=%r): gvmalloc is already running "
                           "(started by an earlier gvmalloc call), so conf cannot apply; "
                           "pass it to the first gvmalloc call instead" % conf)
    saved = os.environ.get("GVM_CONF")
    if conf is not None:
        os.environ["GVM_CONF"] = _gvm.merge_conf(saved, conf)
    try:
        _gvm.ensure_initialized()
    except BaseException:
        if conf is not None:  # leave the environment as it was
            if saved is None:
                os.environ.pop("GVM_CONF", None)
            else:
                os.environ["GVM_CONF"] = saved
        raise


def enable(conf=None, backend="native"):
    """Makes gvmalloc PyTorch's CUDA allocator for the rest of the process.

    conf: GVM_CONF text ("key:value,...", docs/config.md) applied over GVM_CONF;
    it is also written back into os.environ["GVM_CONF"] so that child processes
    (DataLoader workers, spawned ranks) run with the same configuration.
    The allocator starts here, so a bad config raises GvmError now rather than
    failing the first allocation.

    backend: "native" (the default), gvmalloc's PyTorch backend, libgvmalloc_torch.so,
    built with gvmalloc for the installed torch; or "pluggable", PyTorch's
    CUDAPluggableAllocator over the C ABI, which needs no build against torch but
    loses what PLUGGABLE_LOSES lists (a warning says so).

    Calling enable() again with the same arguments is a no-op; with another conf or
    backend it is an error. Returns None for "native", the CUDAPluggableAllocator for
    "pluggable".

    Raises RuntimeError when PyTorch's allocator is already in use,
    gvmalloc.TorchBackendNotFound when the backend is not built,
    gvmalloc.torch_backend errors (TorchVersionMismatch naming both versions) when
    it was built for another torch.
    """
    global _enabled
    if backend not in ("native", "pluggable"):
        raise ValueError("gvmalloc.torch.enable(backend=%r): backend is \"native\" or "
                         "\"pluggable\"" % (backend,))
    with _lock:
        if _enabled is not None:
            if backend != _enabled[0]:
                raise RuntimeError("gvmalloc.torch.enable(backend=%r): already enabled with "
                                   "backend %r; PyTorch's allocator cannot change while it runs"
                                   % (backend, _enabled[0]))
            if conf is not None and conf != _enabled[1]:
                raise RuntimeError("gvmalloc.torch.enable(): already enabled with conf %r; "
                                   "the configuration cannot change while it runs (asked: %r)"
                                   % (_enabled[1], conf))
            return _enabled[2]
        if backend == "native":
            if _torch.cuda.is_initialized():
                raise RuntimeError(_TOO_LATE % "CUDA has started")
            _start(conf)
            try:
                _torch_backend.install(_torch.__version__, _gvm.library_path())
            except _torch_backend.TooLate as e:
                raise RuntimeError(_TOO_LATE % e) from e
            _enabled = ("native", conf, None)
            return None
        warnings.warn("gvmalloc.torch.enable(backend=\"pluggable\"): PyTorch's "
                      "CUDAPluggableAllocator gives gvmalloc only malloc and free, so: "
                      + "; ".join(PLUGGABLE_LOSES) + ". The native backend (the default) "
                      "has all of it.", RuntimeWarning, stacklevel=2)
        why = _cuda_memory_in_use()
        if why is not None:
            raise RuntimeError(_TOO_LATE % why)
        _start(conf)
        allocator = pluggable_allocator()
        try:
            _torch.cuda.memory.change_current_allocator(allocator)
        except RuntimeError as e:
            raise RuntimeError(_TOO_LATE % ("torch: %s" % e)) from e
        _enabled = ("pluggable", conf, allocator)
        return allocator


def mem_pool(conf=None, **kwargs):
    """A torch.cuda.MemPool whose memory comes from gvmalloc; use it with
    torch.cuda.use_mem_pool(pool).

    With the native backend enabled, a plain torch.cuda.MemPool() is already
    gvmalloc's (one of its private pools), and that is what this returns.
    Otherwise PyTorch's caching allocator manages the pool's blocks and gvmalloc
    supplies its segments (CUDAPluggableAllocator); when the pool dies (or
    torch.cuda.empty_cache() empties it), the segments go back to gvmalloc and
    their memory to the driver.
    conf: as for enable(); applies only if gvmalloc is not running yet.
    kwargs: passed to torch.cuda.MemPool (use_on_oom, no_split, ...).
    """
    _gvm.ensure_initialized(conf)
    if backend() == "native":
        return _torch.cuda.MemPool(**kwargs)
    return _torch.cuda.MemPool(pluggable_allocator(for_pool=True).allocator(), **kwargs)


class _ScratchBlock:
    """Owns one scratch block; exposes it to torch.as_tensor as raw bytes.

    torch.as_tensor keeps this object alive as long as the tensor's storage, so
    the block is freed (by the weakref.finalize below, which runs exactly once)
    when the last view of the tensor is gone.
    """

    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "strides": None,
            "version": 2,  # no "stream": the block is ready on the current stream
        }


def _free_scratch(ptr, nbytes, device, stream):
    lib = _lib.load()
    if lib.gvm_is_initialized() and lib.gvm_free(ptr, nbytes, device, stream) != _lib.OK:
        sys.stderr.write("gvmalloc: freeing a scratch tensor failed: %s\n"
                         % lib.gvm_last_error().decode(errors="replace"))


def scratch_tensor(shape, dtype=None, device=None):
    """A tensor in `device`'s peer scratch buffer (gvm_scratch_malloc), uninitialised.

    The peers that the peer policy admits may read and write it directly. Its
    memory is freed when the tensor (and every view of it) is gone, ordered on the
    stream that was current at creation; when another stream (of any device) uses
    it, call record_stream(tensor, stream) first. Starts gvmalloc on the real
    driver if it is not running (it can serve scratch tensors alongside PyTorch's
    own allocator).
    """
    dtype = _torch.float32 if dtype is None else dtype
    shape = (int(shape),) if isinstance(shape, int) else tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError("scratch_tensor: negative dimension in %r" % (shape,))
    index = _gvm._device_index(device)
    cuda = _torch.device("cuda", index)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return _torch.empty(shape, dtype=dtype, device=cuda)
    _gvm.ensure_initialized()
    stream = _torch.cuda.current_stream(cuda).cuda_stream
    ptr = _gvm.scratch_malloc(nbytes, index, stream)
    owner = _ScratchBlock(ptr, nbytes)
    done = weakref.finalize(owner, _free_scratch, ptr, nbytes, index, stream)
    done.atexit = False  # at exit the process's memory goes anyway
    try:
        with _torch.cuda.device(index):
            raw = _torch.as_tensor(owner, device=cuda)
        if raw.data_ptr() != ptr or raw.device != cuda:
            raise RuntimeError("scratch_tensor: torch.as_tensor copied the block (got %s at "
                               "0x%x, expected %s at 0x%x)" % (raw.device, raw.data_ptr(), cuda,
                                                               ptr))
    except BaseException:
        del owner
        done()  # frees now (no-op if already run)
        raise
    del owner
    return raw.view(dtype).view(shape)


def record_stream(tensor, stream):
    """The gvmalloc block under `tensor` is also used on `stream` (a torch.cuda.Stream,
    of any device): its free waits for that stream's work queued so far.

    With the native backend Tensor.record_stream does this itself (for tensors
    from PyTorch's allocator); this is for scratch_tensor() tensors, and for
    enable(backend="pluggable"), where Tensor.record_stream never reaches gvmalloc.
    """
    ptr = tensor.untyped_storage().data_ptr()
    _gvm.record_stream(ptr, stream.cuda_stream, stream.device.index)
