"""gvmalloc inside CuPy (docs/cupy.md).

enable() makes gvmalloc CuPy's device memory allocator. By default it is a
Python function that reads CuPy's current stream on every allocation, so each
block is ordered on the stream that asked for it (gvm_cupy_malloc takes the
stream as its `param`). enable(route="cfunction") uses CuPy's
CFunctionAllocator instead: no Python on the allocation path, but the stream is
fixed when enable() runs.
"""

import threading
import weakref

try:
    import cupy as _cupy
except ImportError as _e:  # pragma: no cover - depends on the machine
    raise ImportError("gvmalloc.cupy needs CuPy, which could not be imported (%s); "
                      "install cupy-cuda13x, or use gvmalloc without it" % _e) from _e

import ctypes

import gvmalloc as _gvm
from gvmalloc import _lib

__all__ = ["enable", "disable", "malloc"]

_lock = threading.Lock()
_previous = None  # CuPy's allocator before enable()
_cfunction = None  # the CFunctionAllocator of route="cfunction", kept alive


class _Block:
    """The owner CuPy keeps alive for one block; its finalizer frees it exactly once."""

    __slots__ = ("__weakref__",)


def malloc(size):
    """CuPy's allocator interface: a MemoryPointer to `size` bytes on the current
    device, ordered on CuPy's current stream, freed on that stream when CuPy drops it."""
    if size == 0:
        return _cupy.cuda.MemoryPointer(_cupy.cuda.memory.Memory(0), 0)
    lib = _lib.load()
    device = _cupy.cuda.runtime.getDevice()
    stream_obj = _cupy.cuda.get_current_stream()
    stream = stream_obj.ptr
    ptr = lib.gvm_cupy_malloc(stream, size, device)
    if not ptr:
        err = _lib.error()
        if isinstance(err, _lib.OutOfMemoryError):
            # CuPy's own type, so that CuPy code which frees caches and retries on
            # OutOfMemoryError does so here too.
            raise _cupy.cuda.memory.OutOfMemoryError(
                size, _gvm.memory_allocated(device)) from err
        raise err
    owner = _Block()
    # The finalizer holds the Stream object: CuPy destroys a stream when its
    # object dies, and gvmalloc may use a stream's handle until told it is
    # gone (gvm_forget_stream), so a stream outlives the blocks freed on it.
    weakref.finalize(owner, _free, lib, stream_obj, ptr, device).atexit = False
    _watch(lib, stream_obj)
    return _cupy.cuda.MemoryPointer(_cupy.cuda.UnownedMemory(ptr, size, owner, device), 0)


def _free(lib, stream_obj, ptr, device):
    lib.gvm_cupy_free(stream_obj.ptr, ptr, device)


_watched = {}  # id(stream object) -> its finalizer, for streams CuPy destroys


def _watch(lib, stream_obj):
    """gvm_forget_stream(handle) when CuPy's Stream object dies (CuPy destroys the
    stream then): a later stream with the same handle is then a new stream to
    gvmalloc. The null and per-thread streams are never destroyed."""
    handle = stream_obj.ptr
    if handle in (0, 1, 2) or id(stream_obj) in _watched:
        return
    try:
        f = weakref.finalize(stream_obj, _forget, lib, handle, id(stream_obj))
    except TypeError:  # a stream object without weak references: nothing to hook
        return
    f.atexit = False
    _watched[id(stream_obj)] = f


def _forget(lib, handle, key):
    _watched.pop(key, None)
    lib.gvm_forget_stream(handle)


def enable(route="stream", conf=None):
    """Makes gvmalloc CuPy's allocator. route: "stream" (the default; see the module
    docstring) or "cfunction". conf: GVM_CONF text, if gvmalloc is not running yet.
    Returns the allocator function given to cupy.cuda.set_allocator."""
    global _previous, _cfunction
    if route not in ("stream", "cfunction"):
        raise ValueError("gvmalloc.cupy.enable: route must be 'stream' or 'cfunction', not %r"
                         % (route,))
    with _lock:
        _gvm.ensure_initialized(conf)
        if _previous is None:
            get = getattr(_cupy.cuda, "get_allocator", None)
            _previous = get() if get is not None else _cupy.get_default_memory_pool().malloc
        if route == "stream":
            _cfunction = None
            _cupy.cuda.set_allocator(malloc)
            return malloc
        lib = _lib.load()

        def addr(f):
            return ctypes.cast(f, ctypes.c_void_p).value

        _cfunction = _cupy.cuda.memory.CFunctionAllocator(
            _cupy.cuda.get_current_stream().ptr, addr(lib.gvm_cupy_malloc),
            addr(lib.gvm_cupy_free), lib)
        _cupy.cuda.set_allocator(_cfunction.malloc)
        return _cfunction.malloc


def disable():
    """Gives CuPy back the allocator it had before enable(). Blocks already given
    out stay valid and go back to gvmalloc when CuPy drops them."""
    global _previous, _cfunction
    with _lock:
        if _previous is not None:
            _cupy.cuda.set_allocator(_previous)
            _previous = None
        _cfunction = None
