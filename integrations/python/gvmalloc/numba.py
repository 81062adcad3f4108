"""gvmalloc inside Numba's CUDA target (docs/numba.md).

    import gvmalloc.numba
    gvmalloc.numba.enable()              # before the first CUDA array
    d = numba.cuda.to_device(a)          # device memory now comes from gvmalloc

enable() installs GvmallocMemoryManager, an External Memory Management (EMM)
plugin, through numba.cuda.set_memory_manager; NUMBA_CUDA_MEMORY_MANAGER=
gvmalloc.numba does the same from the environment.

Streams. Numba's memalloc(size) is told no stream, and nothing tells the
allocator which streams later use the memory. So every block is ordered on one
stream, chosen when it is allocated: the one named with
`with gvmalloc.numba.stream(s):` on this thread, else the legacy default stream.
Its free (from numba's finalizer, when the last array over it is gone) is
ordered on that same stream: gvmalloc reuses the block at once for that stream
and for any other only behind an event. Work on another stream must be named
with record_stream(array, stream). numba.cuda.stream() makes blocking streams,
which the legacy default stream waits for, so a block of the default stream
also waits for kernels queued on them before its next user on the default
stream runs (docs/numba.md, "Streams", says where that is not enough).
"""

import contextlib
import ctypes
import threading
import weakref

try:
    from numba import cuda as _cuda
    from numba.cuda.cudadrv import driver as _driver
except ImportError as _e:  # pragma: no cover - depends on the machine
    raise ImportError("gvmalloc.numba needs Numba's CUDA target (numba with numba-cuda), which "
                      "could not be imported (%s); install numba-cuda, or use gvmalloc without "
                      "it" % _e) from _e

import gvmalloc as _gvm
from gvmalloc import _lib
from gvmalloc._stream_frees import StreamFrees

__all__ = ["enable", "stream", "record_stream", "GvmallocMemoryManager", "INTERFACE_VERSION"]

# The EMM interface this plugin implements (numba checks it in set_memory_manager).
INTERFACE_VERSION = 1

# numba's special stream handles (cuda.h: CU_STREAM_LEGACY, CU_STREAM_PER_THREAD).
_CU_STREAM_LEGACY = 0x1
_CU_STREAM_PER_THREAD = 0x2

_local = threading.local()
_enable_lock = threading.Lock()


def _stream_handle(s):
    """The int handle gvmalloc orders on (0: the legacy default stream) for a
    numba Stream, an int handle or None."""
    if s is None:
        return 0
    handle = s if isinstance(s, int) else int(s)
    if handle == _CU_STREAM_LEGACY:
        return 0  # the same stream as handle 0: one key in gvmalloc
    if handle == _CU_STREAM_PER_THREAD:
        raise ValueError(
            "gvmalloc.numba: the per-thread default stream is another stream in every thread, "
            "and gvmalloc orders blocks by stream handle, so it cannot order blocks on it; use a "
            "stream from numba.cuda.stream() or the legacy default stream")
    return handle


@contextlib.contextmanager
def stream(s):
    """Blocks allocated in this thread inside the `with` are ordered on `s` (a
    numba Stream, an int handle, or None for the legacy default stream), and
    freed on it. Keep using such an array on `s`, or name other streams with
    record_stream()."""
    handle = _stream_handle(s)  # refuses a bad stream before anything changes
    previous = getattr(_local, "stream", None)
    _local.stream = (handle, s)
    try:
        yield
    finally:
        _local.stream = previous


def _current_stream():
    return getattr(_local, "stream", None) or (0, None)


def _base_pointer(array):
    """The address of the gvmalloc block under a numba device array (or a view)."""
    gpu_data = getattr(array, "gpu_data", array)
    mem = getattr(gpu_data, "_mem", gpu_data)  # OwnedPointer -> our AutoFreePointer
    value = getattr(mem, "device_pointer_value", None)
    if value is None:
        raise TypeError("gvmalloc.numba.record_stream: expected a numba device array, got %r"
                        % (array,))
    return int(value)


def record_stream(array, s):
    """The memory of `array` (a numba device array from gvmalloc) is also used
    on stream `s`: its free waits for the work queued there up to the free."""
    _lib.check(_lib.load().gvm_record_stream(_base_pointer(array), _stream_handle(s) or None))


def _device_pointer(address):
    # numba-cuda turns a c_void_p into its CUdeviceptr; older numba keeps it.
    return ctypes.c_void_p(address)


class GvmallocMemoryManager(_driver.HostOnlyCUDAMemoryManager):
    """Numba's device memory from gvmalloc; host (pinned, mapped) memory stays
    numba's own, through HostOnlyCUDAMemoryManager."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._frees = StreamFrees()

    @property
    def interface_version(self):
        return INTERFACE_VERSION

    @property
    def device(self):
        return self.context.device.id

    def initialize(self):
        # numba calls this each time the context is pushed; starting gvmalloc
        # (GVM_CONF) happens once, on the real driver, in the context numba uses:
        # both take the device's primary context.
        _gvm.ensure_initialized()

    def memalloc(self, size):
        device = self.device
        handle, owner = _current_stream()
        lib = _lib.load()
        ptr = lib.gvm_malloc(size, device, handle or None)
        if not ptr:
            err = _lib.error()
            if isinstance(err, _lib.OutOfMemoryError):
                # numba's own type and code, so that code written for numba's
                # allocator sees the out-of-memory it knows.
                raise _driver.CudaAPIError(_oom_code(), str(err)) from err
            raise err
        if owner is not None and handle != 0:
            _watch(owner, handle)
        frees = self._frees
        allocations = self.allocations

        def finalize():
            allocations.pop(ptr, None)
            # `owner` (the numba Stream) is kept alive until the block is freed.
            frees.free(ptr, size, device, handle, keepalive=owner)

        mem = _driver.AutoFreePointer(weakref.proxy(self.context), _device_pointer(ptr), size,
                                      finalizer=finalize)
        # At interpreter exit the process ends anyway: no free then, into a
        # CUDA context that may already be going.
        fin = getattr(mem, "_finalizer", None)
        if fin is not None:
            fin.atexit = False
        # Numba's own manager does the same: the pointer lives in `allocations`
        # and callers get owned references, counted, so that a view keeps the
        # block alive and the last one dropped frees it.
        allocations[ptr] = mem
        return mem.own()

    def get_memory_info(self):
        """(free, total) of the device: the driver's free memory plus what
        gvmalloc holds cached (mapped, not in use), which it hands out again."""
        free, total = _driver.driver.cuMemGetInfo()
        cached = _gvm.device_stats(self.device)["cached_bytes"] if _gvm.is_initialized() else 0
        return _driver.MemoryInfo(free=int(free) + cached, total=int(total))

    def get_ipc_handle(self, memory):
        raise NotImplementedError(
            "gvmalloc.numba: no IPC handle for gvmalloc memory: its blocks live in ranges "
            "mapped with cuMemCreate/cuMemMap, which cuIpcGetMemHandle cannot export, and "
            "gvmalloc does not share them between processes. Copy the array into memory "
            "from numba's own allocator to share it.")

    def reset(self):
        """numba's context reset: drops every allocation (their blocks are freed,
        deferral or not), then returns gvmalloc's cached memory of the device."""
        super().reset()
        self._frees.flush()
        if _gvm.is_initialized():
            _gvm.empty_cache(self.device)

    @contextlib.contextmanager
    def defer_cleanup(self):
        with super().defer_cleanup():
            with self._frees.deferred():
                yield

    def memory_stats(self):
        """gvmalloc's counters of this device (gvmalloc.device_stats)."""
        return _gvm.device_stats(self.device)


_watched = {}  # id(numba Stream object) -> its finalizer


def _watch(stream_obj, handle):
    """gvm_forget_stream(handle) when the numba Stream object dies (numba destroys
    the stream then; the blocks allocated under it keep it alive until they are
    freed): a later stream with the same handle is then a new stream to
    gvmalloc. An int handle names no object to watch: forget_stream() is the
    caller's to call."""
    if isinstance(stream_obj, int) or id(stream_obj) in _watched:
        return
    try:
        f = weakref.finalize(stream_obj, _forget, handle, id(stream_obj))
    except TypeError:  # no weak references: nothing to hook
        return
    f.atexit = False
    _watched[id(stream_obj)] = f


def _forget(handle, key):
    _watched.pop(key, None)
    if _gvm.is_initialized():
        _lib.load().gvm_forget_stream(handle)


def _oom_code():
    binding = getattr(_driver, "binding", None)
    if binding is not None and hasattr(binding, "CUresult"):
        return binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY
    return 2  # CUDA_ERROR_OUT_OF_MEMORY


# What NUMBA_CUDA_MEMORY_MANAGER=gvmalloc.numba makes numba use.
_numba_memory_manager = GvmallocMemoryManager


def _contexts_with_another_manager():
    """Devices whose numba context exists already and allocates elsewhere."""
    devices = getattr(getattr(_driver, "driver", None), "devices", None) or {}
    found = []
    for dev in list(devices.values()):
        ctx = getattr(dev, "primary_context", None)
        mm = getattr(ctx, "memory_manager", None)
        if ctx is not None and not isinstance(mm, GvmallocMemoryManager):
            found.append(getattr(dev, "id", "?"))
    return found


def enable(conf=None):
    """Makes gvmalloc numba's device allocator, for every CUDA context numba
    makes from now on. Call it before the first CUDA array (numba fixes a
    context's allocator when it makes the context). conf: GVM_CONF text,
    applied if gvmalloc is not running yet. Returns the plugin class."""
    with _enable_lock:
        early = _contexts_with_another_manager()
        if early:
            raise RuntimeError(
                "gvmalloc.numba.enable(): numba already made its CUDA context on device(s) %s "
                "with its own allocator, and keeps it for that context. Call enable() before "
                "the first CUDA array, or set NUMBA_CUDA_MEMORY_MANAGER=gvmalloc.numba."
                % ", ".join(str(d) for d in early))
        _gvm.ensure_initialized(conf)
        _cuda.set_memory_manager(GvmallocMemoryManager)
    return GvmallocMemoryManager

