"""gvmalloc inside PyTorch (docs/pytorch.md).

Two ways in:
  enable()      every CUDA tensor of the process comes from gvmalloc
                (torch.cuda.memory.change_current_allocator); call it before the
                first CUDA tensor is created.
  mem_pool()    a torch.cuda.MemPool whose segments come from gvmalloc, for the
                allocations made under torch.cuda.use_mem_pool(pool); the rest
                of the program keeps PyTorch's allocator.
and scratch_tensor(): a tensor in a device's peer scratch buffer, which the
peers admitted by the peer policy may read directly (docs/peer-access.md).
"""

import math
import os
import sys
import threading
import weakref

try:
    import torch as _torch
except ImportError as _e:  # pragma: no cover - depends on the machine
    raise ImportError("gvmalloc.torch needs PyTorch, which could not be imported (%s); "
                      "install torch, or use gvmalloc without it" % _e) from _e

import gvmalloc as _gvm
from gvmalloc import _lib

__all__ = ["enable", "is_enabled", "pluggable_allocator", "mem_pool", "scratch_tensor",
           "record_stream"]

_TOO_LATE = ("gvmalloc.torch.enable(): PyTorch's CUDA allocator is already in use in this "
             "process (%s), and PyTorch cannot change its allocator once it has started. "
             "Call gvmalloc.torch.enable() before the first CUDA tensor is created (first "
             "thing after import torch), or use gvmalloc.torch.mem_pool() for part of a "
             "program.")

_lock = threading.Lock()
_enabled = None  # (CUDAPluggableAllocator, conf) once enable() has succeeded


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


def enable(conf=None):
    """Makes gvmalloc PyTorch's CUDA allocator for the rest of the process.

    conf: GVM_CONF text ("key:value,...", docs/config.md) applied over GVM_CONF;
    it is also written back into os.environ["GVM_CONF"] so that child processes
    (DataLoader workers, spawned ranks) run with the same configuration.
    The allocator starts here, so a bad config raises GvmError now rather than
    failing the first allocation. Calling enable() again is a no-op (with a
    different conf it is an error). Returns the CUDAPluggableAllocator.

    Raises RuntimeError when PyTorch's allocator is already in use.
    """
    global _enabled
    with _lock:
        if _enabled is not None:
            if conf is not None and conf != _enabled[1]:
                raise RuntimeError("gvmalloc.torch.enable(): already enabled with conf %r; "
                                   "the configuration cannot change while it runs (asked: %r)"
                                   % (_enabled[1], conf))
            return _enabled[0]
        why = _cuda_memory_in_use()
        if why is not None:
            raise RuntimeError(_TOO_LATE % why)
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
        allocator = pluggable_allocator()
        try:
            _torch.cuda.memory.change_current_allocator(allocator)
        except RuntimeError as e:
            raise RuntimeError(_TOO_LATE % ("torch: %s" % e)) from e
        _enabled = (allocator, conf)
        return allocator


def mem_pool(conf=None, **kwargs):
    """A torch.cuda.MemPool backed by gvmalloc; use it with torch.cuda.use_mem_pool(pool).

    PyTorch's caching allocator still manages the pool's blocks; gvmalloc supplies
    its segments. When the pool dies (or torch.cuda.empty_cache() empties it), the
    segments go back to gvmalloc and their memory to the driver.
    conf: as for enable(); applies only if gvmalloc is not running yet.
    kwargs: passed to torch.cuda.MemPool (use_on_oom, no_split, ...).
    """
    _gvm.ensure_initialized(conf)
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

    PyTorch's Tensor.record_stream does not reach a CUDAPluggableAllocator; this does,
    for tensors from enable() and from scratch_tensor().
    """
    ptr = tensor.untyped_storage().data_ptr()
    _gvm.record_stream(ptr, stream.cuda_stream, stream.device.index)
