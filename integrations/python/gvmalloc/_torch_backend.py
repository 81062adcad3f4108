"""Loading gvmalloc's PyTorch backend, libgvmalloc_torch.so (integrations/torch).

The backend is built against one PyTorch. Its file carries the version it was
built for as the text "gvmalloc-torch-built-for:<torch.__version__>", which is
read here before the library is loaded: loaded into another torch, it could
fail to resolve torch's symbols before anything could tell why. Then
gvm_torch_install() checks the version again and makes the backend PyTorch's
CUDA allocator; that works only before CUDA starts in the process.

Nothing here imports torch (gvmalloc.torch passes torch.__version__ in), so the
checks and their messages are tested on machines without it.
"""

import ctypes
import threading
import warnings

from . import _lib

MARKER = b"gvmalloc-torch-built-for:"

# gvm_torch_install's results (integrations/torch/src/install.cpp).
INSTALLED = 0
VERSION_MISMATCH = 1
TOO_LATE = 2
FAILED = 3


class TorchBackendError(RuntimeError):
    """gvmalloc's PyTorch backend could not be installed; the message says why."""


class TorchVersionMismatch(TorchBackendError):
    """The backend was built for another torch than the one running."""


class TooLate(TorchBackendError):
    """PyTorch's CUDA allocator had started already."""


def built_for(path):
    """The torch.__version__ the backend at `path` was built for; None if the file has no mark."""
    with open(path, "rb") as f:
        data = f.read()
    at = data.find(MARKER)
    if at < 0:
        return None
    end = data.find(b"\0", at)
    if end < 0:
        return None
    return data[at + len(MARKER):end].decode("ascii", errors="replace")


def mismatch_message(path, built, running):
    return ("gvmalloc's PyTorch backend %s was built for torch %s, but this process runs torch "
            "%s: its C++ interface differs between versions. Rebuild gvmalloc with this torch "
            "importable by python3 (cmake finds it there), or call "
            "gvmalloc.torch.enable(backend=\"pluggable\"), which needs no rebuild but loses "
            "record_stream, CUDA graphs and PyTorch's memory statistics" % (path, built, running))


def check_version(path, running):
    """Raises TorchVersionMismatch unless the backend at `path` was built for `running`."""
    built = built_for(path)
    if built is None:
        raise TorchBackendError("gvmalloc: %s carries no torch version mark: it is not gvmalloc's "
                                "PyTorch backend, or it is damaged; rebuild it" % path)
    if built != running:
        raise TorchVersionMismatch(mismatch_message(path, built, running))
    return built


_lock = threading.Lock()
_loaded = None  # (path, ctypes.CDLL)


def _load(path):
    global _loaded
    if _loaded is not None:
        return _loaded[1]
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise TorchBackendError("gvmalloc: found %s but could not load it: %s" % (path, e)) from e
    lib.gvm_torch_built_for.restype = ctypes.c_char_p
    lib.gvm_torch_is_installed.restype = ctypes.c_int
    lib.gvm_torch_install.restype = ctypes.c_int
    lib.gvm_torch_install.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    _loaded = (path, lib)
    return lib


def install(running_version, gvmalloc_library, environ=None):
    """Finds the backend beside `gvmalloc_library` (the loaded libgvmalloc.so), checks that
    it was built for `running_version`, loads it and installs it. Returns its path."""
    with _lock:
        path = _lib.find_torch_backend(environ, beside=gvmalloc_library)
        check_version(path, running_version)
        lib = _load(path)
        buf = ctypes.create_string_buffer(2048)
        status = lib.gvm_torch_install(running_version.encode(), buf, len(buf))
        message = buf.value.decode(errors="replace")
        if status == INSTALLED:
            if message:
                warnings.warn(message, RuntimeWarning, stacklevel=3)
            return path
        if status == VERSION_MISMATCH:
            raise TorchVersionMismatch(message)
        if status == TOO_LATE:
            raise TooLate(message)
        raise TorchBackendError("gvmalloc: installing the PyTorch backend failed: %s" % message)


def info():
    """What the loaded backend says of itself; None before it is loaded."""
    if _loaded is None:
        return None
    path, lib = _loaded
    return {
        "library": path,
        "built_for": lib.gvm_torch_built_for().decode(),
        "installed": bool(lib.gvm_torch_is_installed()),
    }
