"""Finds and loads libgvmalloc.so with ctypes, and declares the C ABI (gvm.h).

The library is looked for, in order:
  1. $GVMALLOC_LIBRARY: the path of the library file (when set, nothing else is tried);
  2. next to this package: the package directory, then the directories above it
     (an install puts the package in <prefix>/<libdir>/python/gvmalloc, two
     levels below <prefix>/<libdir>/libgvmalloc.so);
  3. the lib directory of the install prefix, written into _install_paths.py
     by `cmake --install`.
Failing all of these, LibraryNotFound names every place it looked.

PyTorch's CUDAPluggableAllocator dlopen()s the library by path; it must be the
same file this module loaded, so that both see one allocator: library_path()
is that path.

gvmalloc's PyTorch backend, libgvmalloc_torch.so, is found the same way
(find_torch_backend): $GVMALLOC_TORCH_LIBRARY, else first beside the
libgvmalloc.so that was loaded (the build writes and installs it there), then
the places above.
"""

import ctypes
import os
import threading

_NAMES = ("libgvmalloc.so", "libgvmalloc.so.0")
TORCH_BACKEND_NAMES = ("libgvmalloc_torch.so",)

# gvm_status values (gvm.h), in order.
STATUS_NAMES = (
    "GVM_OK",
    "GVM_ERROR_INVALID_ARGUMENT",
    "GVM_ERROR_OUT_OF_MEMORY",
    "GVM_ERROR_DRIVER",
    "GVM_ERROR_NO_DRIVER",
    "GVM_ERROR_CONFIG",
    "GVM_ERROR_NOT_INITIALIZED",
    "GVM_ERROR_ALREADY_INITIALIZED",
    "GVM_ERROR_INTERNAL",
)
OK = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_OUT_OF_MEMORY = 2
ERROR_NOT_INITIALIZED = 6
ERROR_ALREADY_INITIALIZED = 7


class LibraryNotFound(ImportError):
    """libgvmalloc.so was not found; the message lists every place looked in."""


class GvmError(RuntimeError):
    """A gvmalloc call failed. `status` is the gvm_status name, the message says why."""

    def __init__(self, status, message):
        self.status = status
        super().__init__("%s: %s" % (status, message))


class OutOfMemoryError(GvmError, MemoryError):
    """GVM_ERROR_OUT_OF_MEMORY: the device could not supply the memory."""


def _install_libdir():
    try:
        from . import _install_paths  # written by cmake --install
    except ImportError:
        return None
    return getattr(_install_paths, "LIBDIR", None)


def candidates(environ=None, package_dir=None, install_libdir=None, names=_NAMES,
               env_var="GVMALLOC_LIBRARY", first_dirs=()):
    """The library paths to try, in order, and whether the first is from the environment.

    names: the file names to look for in each directory; env_var: the variable
    that, when set, is the only candidate; first_dirs: directories looked in
    before the package's. Pure (looks at no file), so that the search order can
    be tested.
    """
    environ = os.environ if environ is None else environ
    env = environ.get(env_var)
    if env:
        return [env], True
    package_dir = package_dir or os.path.dirname(os.path.abspath(__file__))
    dirs = list(first_dirs) + [package_dir]
    d = package_dir
    for _ in range(3):
        d = os.path.dirname(d)
        dirs.append(d)
    if install_libdir:
        dirs.append(install_libdir)
    paths = []
    for d in dirs:
        for name in names:
            p = os.path.join(d, name)
            if p not in paths:
                paths.append(p)
    return paths, False


def _find(paths, from_env, env_var, filename, not_found_help, title=None, error=None):
    error = error or LibraryNotFound
    title = title or filename
    if from_env:
        p = paths[0]
        if os.path.isfile(p):
            return os.path.realpath(p)
        if os.path.isdir(p):
            raise error(
                "gvmalloc: %s is set to %r, which is a directory; set it to "
                "the library file (e.g. %s)" % (env_var, p, os.path.join(p, filename)))
        raise error(
            "gvmalloc: %s is set to %r, which does not exist; set it to the "
            "path of %s, or unset it to search next to the package" % (env_var, p, filename))
    for p in paths:
        if os.path.isfile(p):
            return os.path.realpath(p)
    raise error("gvmalloc: %s not found. Looked in:\n  %s\n%s"
                % (title, "\n  ".join(paths), not_found_help))


def find_library(environ=None, package_dir=None, install_libdir=None):
    """The path of libgvmalloc.so, or LibraryNotFound naming where it looked."""
    if install_libdir is None:
        install_libdir = _install_libdir()
    paths, from_env = candidates(environ, package_dir, install_libdir)
    return _find(paths, from_env, "GVMALLOC_LIBRARY", _NAMES[0],
                 "Set GVMALLOC_LIBRARY to the library's path (a build tree has it at "
                 "<build>/allocator/libgvmalloc.so), or install gvmalloc with cmake --install.")


class TorchBackendNotFound(LibraryNotFound):
    """libgvmalloc_torch.so (gvmalloc's PyTorch backend) was not found or not built."""


def find_torch_backend(environ=None, package_dir=None, install_libdir=None, beside=None):
    """The path of libgvmalloc_torch.so: $GVMALLOC_TORCH_LIBRARY, else beside the file
    `beside` (the loaded libgvmalloc.so), then where libgvmalloc.so is looked for.
    TorchBackendNotFound naming every place looked in and how to build it."""
    if install_libdir is None:
        install_libdir = _install_libdir()
    first = [os.path.dirname(beside)] if beside else []
    paths, from_env = candidates(environ, package_dir, install_libdir, TORCH_BACKEND_NAMES,
                                 "GVMALLOC_TORCH_LIBRARY", first)
    return _find(paths, from_env, "GVMALLOC_TORCH_LIBRARY", TORCH_BACKEND_NAMES[0],
                 "It is built with gvmalloc when python3 can import torch at configure time "
                 "(cmake then says \"gvmalloc's PyTorch backend: built for torch <version>\", "
                 "else why it was skipped): cmake --build <build> --target gvmalloc_torch. "
                 "Or set GVMALLOC_TORCH_LIBRARY to its path, or use "
                 "gvmalloc.torch.enable(backend=\"pluggable\").",
                 title=TORCH_BACKEND_NAMES[0] + " (gvmalloc's PyTorch backend)",
                 error=TorchBackendNotFound)


_P = ctypes.c_void_p
_SIZE = ctypes.c_size_t
_SSIZE = ctypes.c_ssize_t
_INT = ctypes.c_int
_STATUS = ctypes.c_int
_STR = ctypes.c_char_p


_CTYPES = {"int": ctypes.c_int, "size_t": ctypes.c_size_t, "uint64_t": ctypes.c_uint64}


def device_stats_type(lib):
    """gvm_device_stats_t as a ctypes Structure, built from the library's own
    table (gvm_device_stats_schema: allocator/include/gvm/device_stats_fields.h),
    so that the Python view has exactly the library's fields."""
    global _DEVICE_STATS
    if _DEVICE_STATS is None:
        fields = []
        for line in lib.gvm_device_stats_schema().decode().splitlines():
            ctype, name = line.split(" ", 2)[:2]
            fields.append((name, _CTYPES[ctype]))
        _DEVICE_STATS = type("DeviceStats", (ctypes.Structure,), {
            "_fields_": fields,
            "to_dict": lambda self: {n: getattr(self, n) for n, _ in self._fields_},
        })
    return _DEVICE_STATS


_DEVICE_STATS = None


# name: (restype, argtypes)
_PROTOTYPES = {
    "gvm_init": (_STATUS, [_STR]),
    "gvm_init_simulated": (_STATUS, [_STR, _INT, _STR]),
    "gvm_shutdown": (_STATUS, []),
    "gvm_is_initialized": (_INT, []),
    "gvm_malloc": (_P, [_SIZE, _INT, _P]),
    "gvm_free": (_STATUS, [_P, _SIZE, _INT, _P]),
    "gvm_device_stats_schema": (_STR, []),
    "gvm_record_stream": (_STATUS, [_P, _P]),
    "gvm_forget_stream": (_STATUS, [_P]),
    "gvm_scratch_malloc": (_P, [_SIZE, _INT, _P]),
    "gvm_record_stream_on": (_STATUS, [_P, _P, _INT]),
    "gvm_set_peer_policy": (_STATUS, [_STR]),
    "gvm_peer_policy": (_STR, [_INT, _INT]),
    "gvm_peer_copy": (_STATUS, [_P, _INT, _P, _INT, _SIZE, _P]),
    "gvm_trim": (_STATUS, [_INT]),
    "gvm_torch_malloc": (_P, [_SSIZE, _INT, _P]),
    "gvm_torch_free": (None, [_P, _SSIZE, _INT, _P]),
    "gvm_torch_pool_free": (None, [_P, _SSIZE, _INT, _P]),
    "gvm_cupy_malloc": (ctypes.c_ssize_t, [ctypes.c_ssize_t, _SIZE, _INT]),
    "gvm_cupy_free": (None, [ctypes.c_ssize_t, ctypes.c_ssize_t, _INT]),
    "gvm_last_error": (_STR, []),
    "gvm_last_status": (_STATUS, []),
    "gvm_clear_last_error": (None, []),
    "gvm_status_name": (_STR, [_STATUS]),
    "gvm_stats_json": (_STATUS, [ctypes.c_char_p, _SIZE, ctypes.POINTER(_SIZE)]),
    "gvm_device_stats": (_STATUS, [_INT, _P]),  # a device_stats_type(lib) instance
}

_lock = threading.Lock()
_lib = None
_path = None


def load():
    """The loaded library (ctypes.CDLL); loads it on first use."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = find_library()
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                raise LibraryNotFound("gvmalloc: found %s but could not load it: %s" % (path, e))
            missing = [n for n in _PROTOTYPES if not hasattr(lib, n)]
            if missing:
                raise LibraryNotFound(
                    "gvmalloc: %s lacks %s: it is older than this Python package; "
                    "rebuild and reinstall gvmalloc" % (path, ", ".join(missing)))
            for name, (restype, argtypes) in _PROTOTYPES.items():
                f = getattr(lib, name)
                f.restype = restype
                f.argtypes = argtypes
            _path = path
            _lib = lib
    return _lib


def library_path():
    """The path of the loaded libgvmalloc.so (loads it first)."""
    load()
    return _path


def error(status=None):
    """The GvmError for the calling thread's last failure (status: a known status)."""
    lib = load()
    if status is None:
        status = lib.gvm_last_status()
    name = lib.gvm_status_name(status).decode()
    message = (lib.gvm_last_error() or b"").decode(errors="replace")
    cls = OutOfMemoryError if status == ERROR_OUT_OF_MEMORY else GvmError
    return cls(name, message or "(no message)")


def check(status):
    """Raises the GvmError for a failed status; returns None on GVM_OK."""
    if status != OK:
        raise error(status)
