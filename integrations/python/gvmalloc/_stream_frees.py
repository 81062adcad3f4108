"""Frees of gvmalloc blocks from finalizers, ordered on each block's stream,
with a deferral that holds them back (numba's defer_cleanup).

A framework that frees from a garbage-collector finalizer cannot take an error
and does not know the stream: StreamFrees remembers it for each block and
frees there (gvm_free), writes a failure to stderr in one line, and while
deferred() is active queues the frees and runs them when the outermost
deferral ends. Needs no framework: gvmalloc.numba builds on it, and the CPU
tests run it over the simulated driver.
"""

import contextlib
import sys
import threading

from . import _lib


class StreamFrees:
    def __init__(self):
        self._lock = threading.Lock()
        self._depth = 0
        self._pending = []  # (ptr, size, device, stream, keepalive)

    def free(self, ptr, size, device, stream, keepalive=None):
        """Frees the block at `ptr` (`size` bytes, as allocated) on `stream` (an
        int handle, 0: the legacy default stream), now or when the deferral ends.
        `keepalive` (e.g. the stream's owner) is held until the block is freed."""
        with self._lock:
            if self._depth:
                self._pending.append((ptr, size, device, stream, keepalive))
                return
        self._free_now(ptr, size, device, stream)

    @property
    def pending(self):
        """How many frees wait for the deferral to end."""
        with self._lock:
            return len(self._pending)

    @contextlib.contextmanager
    def deferred(self):
        """No block is freed while this is active (it nests)."""
        with self._lock:
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                ready = self._pending if self._depth == 0 else []
                if ready:
                    self._pending = []
            for ptr, size, device, stream, _ in ready:
                self._free_now(ptr, size, device, stream)

    def flush(self):
        """Frees what is pending now, deferral or not (numba's reset)."""
        with self._lock:
            ready, self._pending = self._pending, []
        for ptr, size, device, stream, _ in ready:
            self._free_now(ptr, size, device, stream)

    @staticmethod
    def _free_now(ptr, size, device, stream):
        lib = _lib.load()
        if not lib.gvm_is_initialized():
            return  # gvmalloc.shutdown() took every block back already
        status = lib.gvm_free(ptr, size, device, stream or None)
        if status != _lib.OK:
            # Called from a finalizer: an exception would be lost, so say it here.
            err = _lib.error(status)
            sys.stderr.write("gvmalloc: free of 0x%x (%d bytes, device %d) failed: %s\n"
                             % (ptr, size, device, err))
