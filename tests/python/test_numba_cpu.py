"""gvmalloc.numba without a GPU: the module without numba, the frees from
finalizers (gvmalloc._stream_frees) over the simulated driver, and, where numba
is installed, the EMM plugin itself on a stand-in numba context (device 0 of a
simulated H200). The GPU run is tests/python/test_numba_gpu.py."""

import gc
import io
import os
import sys
import unittest
from contextlib import redirect_stderr

import _support  # noqa: F401  (puts the package on sys.path)
import gvmalloc
from gvmalloc._stream_frees import StreamFrees

MiB = 1 << 20
NEEDS_LIBRARY = unittest.skipUnless(
    os.environ.get("GVMALLOC_LIBRARY"),
    "GVMALLOC_LIBRARY is not set (tools/python-tests.sh and CTest set it)")
HAVE_NUMBA_CUDA = _support.have("numba") and _support.have("numba.cuda")


class WithoutNumba(unittest.TestCase):
    @unittest.skipIf(_support.have("numba"), "numba is installed here")
    def test_numba_module_without_numba_says_so(self):
        with self.assertRaisesRegex(ImportError, "gvmalloc.numba needs Numba's CUDA target"):
            import gvmalloc.numba  # noqa: F401


class NumpyAliases(unittest.TestCase):
    """The shim the Numba GPU workload applies (tests/python/_numpy_aliases.py),
    on stand-in numpy modules: what NumPy 2.5 lacks is set back, a NumPy that
    still has it is left alone."""

    def test_a_removed_alias_is_restored_and_said(self):
        import types
        import _numpy_aliases

        def vstack(arrays):
            return ("vstack", arrays)

        np25 = types.SimpleNamespace(vstack=vstack)
        self.assertEqual(_numpy_aliases.restore(np25), ["numpy.row_stack = numpy.vstack"])
        self.assertIs(np25.row_stack, vstack)
        self.assertEqual(_numpy_aliases.restore(np25), [], "a second call has nothing to do")

    def test_a_numpy_that_has_it_is_left_alone(self):
        import types
        import _numpy_aliases
        own = object()
        np24 = types.SimpleNamespace(vstack=lambda a: a, row_stack=own)
        self.assertEqual(_numpy_aliases.restore(np24), [])
        self.assertIs(np24.row_stack, own)


class Simulated(unittest.TestCase):
    def setUp(self):
        self.saved_conf = os.environ.pop("GVM_CONF", None)
        if gvmalloc.is_initialized():
            gvmalloc.shutdown()
        gvmalloc.init_simulated("h200", 1)

    def tearDown(self):
        if gvmalloc.is_initialized():
            gvmalloc.shutdown()
        if self.saved_conf is not None:
            os.environ["GVM_CONF"] = self.saved_conf

    def frees(self):
        return gvmalloc.device_stats(0)["frees"]


@NEEDS_LIBRARY
class StreamFreesOnTheSimulator(Simulated):
    def test_a_free_happens_at_once_on_the_block_stream(self):
        q = StreamFrees()
        p = gvmalloc.malloc(MiB)
        q.free(p, MiB, 0, 0)
        self.assertEqual(self.frees(), 1)
        self.assertEqual(gvmalloc.memory_allocated(0), 0)

    def test_deferred_frees_wait_for_the_outermost_deferral(self):
        q = StreamFrees()
        blocks = [gvmalloc.malloc(MiB) for _ in range(3)]
        keep = object()
        with q.deferred():
            q.free(blocks[0], MiB, 0, 0, keepalive=keep)
            with q.deferred():
                q.free(blocks[1], MiB, 0, 0)
            self.assertEqual(q.pending, 2)  # the inner deferral ended: still held
            self.assertEqual(self.frees(), 0)
            q.free(blocks[2], MiB, 0, 0)
        self.assertEqual(q.pending, 0)
        self.assertEqual(self.frees(), 3)

    def test_flush_frees_what_is_held_even_inside_a_deferral(self):
        q = StreamFrees()
        p = gvmalloc.malloc(MiB)
        with q.deferred():
            q.free(p, MiB, 0, 0)
            q.flush()
            self.assertEqual(self.frees(), 1)
        self.assertEqual(self.frees(), 1)

    def test_a_failed_free_says_so_on_stderr_and_raises_nothing(self):
        q = StreamFrees()
        p = gvmalloc.malloc(MiB)
        q.free(p, MiB, 0, 0)
        err = io.StringIO()
        with redirect_stderr(err):
            q.free(p, MiB, 0, 0)  # a double free, as from a finalizer
        self.assertIn("gvmalloc: free of 0x%x (%d bytes, device 0) failed: " % (p, MiB),
                      err.getvalue())
        self.assertIn("GVM_ERROR_INVALID_ARGUMENT", err.getvalue())
        self.assertEqual(self.frees(), 1)

    def test_a_free_after_shutdown_is_quiet(self):
        q = StreamFrees()
        p = gvmalloc.malloc(MiB)
        gvmalloc.shutdown()
        err = io.StringIO()
        with redirect_stderr(err):
            q.free(p, MiB, 0, 0)
        self.assertEqual(err.getvalue(), "")


class _Device:
    id = 0


class _Context:
    """What the plugin reads of numba's Context: its device (and a weakref)."""

    device = _Device()


@NEEDS_LIBRARY
@unittest.skipUnless(HAVE_NUMBA_CUDA, "numba (with numba.cuda) is not installed")
class PluginOnAStandInContext(Simulated):
    def setUp(self):
        super().setUp()
        import gvmalloc.numba as gn
        self.gn = gn
        self.context = _Context()
        self.mm = gn.GvmallocMemoryManager(context=self.context)

    def test_numba_accepts_the_plugin(self):
        from numba import cuda
        from numba.cuda.cudadrv import driver
        self.assertEqual(self.gn.GvmallocMemoryManager(context=None).interface_version, 1)
        cuda.set_memory_manager(self.gn.GvmallocMemoryManager)
        cuda.set_memory_manager(driver.NumbaCUDAMemoryManager)  # back to numba's own

    def test_an_allocation_lives_while_a_reference_or_a_view_does(self):
        owned = self.mm.memalloc(3 * MiB)
        self.assertEqual(gvmalloc.device_stats(0)["allocations"], 1)
        self.assertEqual(owned.size, 3 * MiB)
        view = owned.view(MiB)
        self.assertEqual(view.device_pointer_value, owned.device_pointer_value + MiB)
        del owned
        gc.collect()
        self.assertEqual(self.frees(), 0)  # the view keeps the block
        del view
        gc.collect()
        self.assertEqual(self.frees(), 1)
        self.assertEqual(len(self.mm.allocations), 0)

    def test_defer_cleanup_holds_the_frees_back(self):
        owned = self.mm.memalloc(MiB)
        with self.mm.defer_cleanup():
            del owned
            gc.collect()
            self.assertEqual(self.frees(), 0)
        self.assertEqual(self.frees(), 1)

    def test_reset_frees_everything_and_trims(self):
        kept = self.mm.memalloc(8 * MiB)  # noqa: F841  (reset frees it under us, as numba's does)
        self.mm.reset()
        gc.collect()
        self.assertEqual(self.frees(), 1)
        self.assertEqual(gvmalloc.memory_reserved(0), 0)

    def test_out_of_memory_is_numbas_cuda_error(self):
        from numba.cuda.cudadrv import driver
        gvmalloc.shutdown()
        gvmalloc.init_simulated("h200", 1, "max_reserved:64MiB")
        with self.assertRaises(driver.CudaAPIError) as cm:
            self.mm.memalloc(128 * MiB)
        self.assertIsInstance(cm.exception.__cause__, gvmalloc.OutOfMemoryError)

    def test_ipc_is_refused_with_the_reason(self):
        owned = self.mm.memalloc(MiB)
        with self.assertRaisesRegex(NotImplementedError, "cuIpcGetMemHandle cannot export"):
            self.mm.get_ipc_handle(owned)

    def test_the_per_thread_default_stream_is_refused(self):
        with self.assertRaisesRegex(ValueError, "per-thread default stream"):
            with self.gn.stream(0x2):
                pass
        with self.gn.stream(None):  # the legacy default stream
            self.mm.memalloc(MiB)
        with self.gn.stream(0x1):  # CU_STREAM_LEGACY: the same stream
            self.mm.memalloc(MiB)
        gc.collect()
        self.assertEqual(gvmalloc.device_stats(0)["allocations"], 2)

    def test_a_dead_numba_stream_is_forgotten(self):
        class Stream:  # what gvmalloc reads of a numba Stream: int(s) is its handle
            def __init__(self, h):
                self.h = h

            def __int__(self):
                return self.h

        s = Stream(0x1234)
        with self.gn.stream(s):
            owned = self.mm.memalloc(8 * MiB)
        p = owned.device_pointer_value
        del owned
        gc.collect()  # freed on s; s is still alive: its block is its own again
        with self.gn.stream(s):
            again = self.mm.memalloc(8 * MiB)
        self.assertEqual(again.device_pointer_value, p)
        del again
        gc.collect()
        before = gvmalloc.device_stats(0)["cross_stream_waits"]
        del s
        gc.collect()  # numba destroys the stream: gvmalloc forgets its handle
        with self.gn.stream(Stream(0x1234)):  # a new stream with the same handle
            third = self.mm.memalloc(8 * MiB)
        self.assertEqual(third.device_pointer_value, p)
        self.assertEqual(gvmalloc.device_stats(0)["cross_stream_waits"] - before, 1)

    def test_stats_are_gvmallocs(self):
        keep = self.mm.memalloc(MiB)  # noqa: F841
        self.assertEqual(self.mm.memory_stats()["live_bytes"], gvmalloc.memory_allocated(0))
        self.assertGreaterEqual(self.mm.memory_stats()["live_bytes"], MiB)


if __name__ == "__main__":
    unittest.main()
