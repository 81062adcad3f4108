"""The parts of the Python package that need no GPU: finding and loading the
library, errors, configuration, statistics (over the simulated driver).
Runs under pytest or `python3 -m unittest`; CTest label `python`."""

import ctypes
import os
import subprocess
import sys
import tempfile
import unittest

import _support  # noqa: F401  (puts the package on sys.path)
import gvmalloc
from gvmalloc import _lib, _torch_backend

MiB = 1 << 20

HAVE_LIBRARY = bool(os.environ.get("GVMALLOC_LIBRARY"))
NEEDS_LIBRARY = unittest.skipUnless(
    HAVE_LIBRARY, "GVMALLOC_LIBRARY is not set (tools/python-tests.sh and CTest set it)")


class LibrarySearch(unittest.TestCase):
    def test_environment_variable_is_the_only_candidate(self):
        paths, from_env = _lib.candidates({"GVMALLOC_LIBRARY": "/x/libgvmalloc.so"}, "/p/q/r")
        self.assertTrue(from_env)
        self.assertEqual(paths, ["/x/libgvmalloc.so"])

    def test_next_to_the_package_then_above_it_then_the_install_libdir(self):
        paths, from_env = _lib.candidates({}, "/pre/lib/python/gvmalloc", "/opt/gvm/lib")
        self.assertFalse(from_env)
        self.assertEqual(paths[0], "/pre/lib/python/gvmalloc/libgvmalloc.so")
        self.assertIn("/pre/lib/libgvmalloc.so", paths)
        self.assertLess(paths.index("/pre/lib/python/libgvmalloc.so"),
                        paths.index("/pre/lib/libgvmalloc.so"))
        self.assertEqual(paths[-2:], ["/opt/gvm/lib/libgvmalloc.so", "/opt/gvm/lib/libgvmalloc.so.0"])

    def test_a_missing_file_named_by_the_environment_is_a_clear_error(self):
        with self.assertRaises(_lib.LibraryNotFound) as cm:
            _lib.find_library({"GVMALLOC_LIBRARY": "/nonexistent/libgvmalloc.so"}, "/p")
        self.assertIn("GVMALLOC_LIBRARY", str(cm.exception))
        self.assertIn("/nonexistent/libgvmalloc.so", str(cm.exception))
        self.assertIn("does not exist", str(cm.exception))

    def test_a_directory_named_by_the_environment_is_a_clear_error(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(_lib.LibraryNotFound) as cm:
                _lib.find_library({"GVMALLOC_LIBRARY": d}, "/p")
            self.assertIn("is a directory", str(cm.exception))
            self.assertIn(os.path.join(d, "libgvmalloc.so"), str(cm.exception))

    def test_not_found_names_every_place_looked_in(self):
        with tempfile.TemporaryDirectory() as d:
            pkg = os.path.join(d, "lib", "python", "gvmalloc")
            os.makedirs(pkg)
            libdir = os.path.join(d, "prefix-lib")
            with self.assertRaises(_lib.LibraryNotFound) as cm:
                _lib.find_library({}, pkg, libdir)
            message = str(cm.exception)
            for p in _lib.candidates({}, pkg, libdir)[0]:
                self.assertIn(p, message)
            self.assertIn("GVMALLOC_LIBRARY", message)

    def test_found_next_to_the_package(self):
        with tempfile.TemporaryDirectory() as d:
            pkg = os.path.join(d, "lib", "python", "gvmalloc")
            os.makedirs(pkg)
            lib = os.path.join(d, "lib", "libgvmalloc.so")
            open(lib, "w").close()
            self.assertEqual(_lib.find_library({}, pkg, None), os.path.realpath(lib))

    def test_import_works_without_the_library_and_the_first_call_says_why(self):
        code = ("import gvmalloc\n"
                "try:\n"
                "    gvmalloc.stats()\n"
                "except gvmalloc.LibraryNotFound as e:\n"
                "    print('LNF', e)\n")
        env = dict(os.environ, GVMALLOC_LIBRARY="/nowhere/libgvmalloc.so",
                   PYTHONPATH=_support.PACKAGE_DIR)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("LNF gvmalloc: GVMALLOC_LIBRARY is set to '/nowhere/libgvmalloc.so'",
                      r.stdout)

    @NEEDS_LIBRARY
    def test_a_file_that_is_not_a_library_is_a_clear_error(self):
        with tempfile.NamedTemporaryFile(suffix=".so") as f:
            f.write(b"not an ELF file")
            f.flush()
            code = ("import gvmalloc\n"
                    "try:\n"
                    "    gvmalloc.is_initialized()\n"
                    "except gvmalloc.LibraryNotFound as e:\n"
                    "    print('LNF', e)\n")
            env = dict(os.environ, GVMALLOC_LIBRARY=f.name, PYTHONPATH=_support.PACKAGE_DIR)
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               env=env, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("LNF gvmalloc: found %s but could not load it" % os.path.realpath(f.name),
                      r.stdout)


# The backend built by this build tree (CTest sets both when cmake built it).
TORCH_BACKEND = os.environ.get("GVMALLOC_TORCH_LIBRARY")
TORCH_BACKEND_VERSION = os.environ.get("GVM_TORCH_BUILT_FOR")
# Run by pytest outside CTest (tools/python-tests.sh) neither is set, built or not.
NO_BACKEND = ("no built backend named: CTest sets GVMALLOC_TORCH_LIBRARY and "
              "GVM_TORCH_BUILT_FOR where cmake built one")


def fake_backend(directory, version):
    """A file that carries the backend's version mark and is not a library."""
    path = os.path.join(directory, "libgvmalloc_torch.so")
    with open(path, "wb") as f:
        f.write(b"\x7fELF not really" + _torch_backend.MARKER + version.encode() + b"\0 rest")
    return path


class TorchBackendLoading(unittest.TestCase):
    """Finding libgvmalloc_torch.so and refusing a wrong torch, without torch."""

    def test_the_environment_variable_is_the_only_candidate(self):
        paths, from_env = _lib.candidates({"GVMALLOC_TORCH_LIBRARY": "/x/libgvmalloc_torch.so"},
                                          "/p/q/r", None, _lib.TORCH_BACKEND_NAMES,
                                          "GVMALLOC_TORCH_LIBRARY")
        self.assertTrue(from_env)
        self.assertEqual(paths, ["/x/libgvmalloc_torch.so"])

    def test_beside_the_loaded_libgvmalloc_first(self):
        with tempfile.TemporaryDirectory() as d:
            build = os.path.join(d, "build", "allocator")
            os.makedirs(build)
            lib = os.path.join(build, "libgvmalloc_torch.so")
            open(lib, "w").close()
            pkg = os.path.join(d, "pkg", "gvmalloc")
            os.makedirs(pkg)
            open(os.path.join(pkg, "libgvmalloc_torch.so"), "w").close()
            found = _lib.find_torch_backend({}, pkg, None,
                                            beside=os.path.join(build, "libgvmalloc.so.0.1.0"))
            self.assertEqual(found, os.path.realpath(lib))

    def test_not_built_says_where_it_looked_and_how_to_build_it(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(gvmalloc.TorchBackendNotFound) as cm:
                _lib.find_torch_backend({}, os.path.join(d, "gvmalloc"), None,
                                        beside=os.path.join(d, "libgvmalloc.so"))
        m = str(cm.exception)
        self.assertIn(os.path.join(d, "libgvmalloc_torch.so"), m)
        self.assertIn("--target gvmalloc_torch", m)
        self.assertIn("GVMALLOC_TORCH_LIBRARY", m)
        self.assertIn('backend="pluggable"', m)
        self.assertIsInstance(cm.exception, gvmalloc.LibraryNotFound)

    def test_a_missing_file_named_by_the_environment_is_a_clear_error(self):
        with self.assertRaises(gvmalloc.TorchBackendNotFound) as cm:
            _lib.find_torch_backend({"GVMALLOC_TORCH_LIBRARY": "/nowhere/libgvmalloc_torch.so"})
        self.assertIn("GVMALLOC_TORCH_LIBRARY is set to '/nowhere/libgvmalloc_torch.so', which "
                      "does not exist", str(cm.exception))

    def test_the_version_mark_is_read_without_loading(self):
        with tempfile.TemporaryDirectory() as d:
            path = fake_backend(d, "2.11.0+cu130")
            self.assertEqual(_torch_backend.built_for(path), "2.11.0+cu130")
            other = os.path.join(d, "other.so")
            with open(other, "wb") as f:
                f.write(b"no mark here")
            self.assertIsNone(_torch_backend.built_for(other))
            with self.assertRaisesRegex(gvmalloc.TorchBackendError, "carries no torch version mark"):
                _torch_backend.check_version(other, "2.11.0+cu130")

    def test_another_torch_is_refused_naming_both_versions_before_loading(self):
        with tempfile.TemporaryDirectory() as d:
            path = fake_backend(d, "2.11.0+cu130")
            self.assertEqual(_torch_backend.check_version(path, "2.11.0+cu130"), "2.11.0+cu130")
            with self.assertRaises(gvmalloc.TorchVersionMismatch) as cm:
                # The file is no library: refused before any load is tried.
                _torch_backend.install("2.12.0+cu130", os.path.join(d, "libgvmalloc.so"),
                                       environ={"GVMALLOC_TORCH_LIBRARY": path})
        m = str(cm.exception)
        self.assertIn("built for torch 2.11.0+cu130", m)
        self.assertIn("runs torch 2.12.0+cu130", m)
        self.assertIn('backend="pluggable"', m)

    @unittest.skipUnless(TORCH_BACKEND and TORCH_BACKEND_VERSION, NO_BACKEND)
    def test_the_built_backend_carries_its_torch_version_and_refuses_another(self):
        self.assertEqual(_torch_backend.built_for(TORCH_BACKEND), TORCH_BACKEND_VERSION)
        # Loaded without torch's Python package (libc10 comes by rpath): the
        # library's own check answers too, before anything else happens.
        code = ("import ctypes, sys\n"
                "lib = ctypes.CDLL(sys.argv[1])\n"
                "lib.gvm_torch_built_for.restype = ctypes.c_char_p\n"
                "buf = ctypes.create_string_buffer(1024)\n"
                "rc = lib.gvm_torch_install(b'0.0.1', buf, 1024)\n"
                "print(lib.gvm_torch_built_for().decode(), rc, buf.value.decode())\n")
        r = subprocess.run([sys.executable, "-c", code, TORCH_BACKEND], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        built, rc, message = r.stdout.strip().split(" ", 2)
        self.assertEqual(built, TORCH_BACKEND_VERSION)
        self.assertEqual(int(rc), _torch_backend.VERSION_MISMATCH)
        self.assertIn("built for torch %s" % TORCH_BACKEND_VERSION, message)
        self.assertIn("runs torch 0.0.1", message)


# A stand-in for the torch package with what gvmalloc.torch.enable() touches,
# for its logic on machines without torch (and without a GPU).
FAKE_TORCH = """
__version__ = %(version)r
class _Memory:
    swapped = []
    class CUDAPluggableAllocator:
        def __init__(self, path, malloc_fn, free_fn):
            self.args = (path, malloc_fn, free_fn)
        def allocator(self):
            return self
    @staticmethod
    def change_current_allocator(allocator):
        _Memory.swapped.append(allocator)
class cuda:
    memory = _Memory
    started = %(started)r
    @staticmethod
    def is_initialized():
        return cuda.started
    @staticmethod
    def device_count():
        return 1
    @staticmethod
    def memory_allocated(device):
        return 4096 if cuda.started else 0
"""


@NEEDS_LIBRARY
class EnableLogic(unittest.TestCase):
    """gvmalloc.torch.enable()'s choices and errors, over a stand-in torch and the
    simulated driver (each case in its own interpreter)."""

    def run_case(self, body, version="2.11.0+cu130", started=False, env=None):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "torch"))
            with open(os.path.join(d, "torch", "__init__.py"), "w") as f:
                f.write(FAKE_TORCH % {"version": version, "started": started})
            code = ("import warnings, gvmalloc\n"
                    "gvmalloc.init_simulated('h200', 1)\n"
                    "import gvmalloc.torch as gt\n" + body)
            e = dict(os.environ, PYTHONPATH=os.pathsep.join([d, _support.PACKAGE_DIR]))
            e.pop("GVMALLOC_TORCH_LIBRARY", None)
            e.update(env or {})
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               env=e, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout

    def test_an_unknown_backend_is_refused(self):
        out = self.run_case("try:\n    gt.enable(backend='fast')\n"
                            "except ValueError as e:\n    print('VE', e)\n")
        self.assertIn('VE gvmalloc.torch.enable(backend=\'fast\'): backend is "native" or '
                      '"pluggable"', out)

    def test_native_after_cuda_started_is_too_late(self):
        out = self.run_case("try:\n    gt.enable()\n"
                            "except RuntimeError as e:\n    print('RE', e)\n", started=True)
        self.assertIn("RE gvmalloc.torch.enable(): PyTorch's CUDA allocator is already in use", out)
        self.assertIn("before the first CUDA tensor", out)

    def test_native_without_the_backend_built_says_how_to_get_it(self):
        out = self.run_case("try:\n    gt.enable()\n"
                            "except gvmalloc.TorchBackendNotFound as e:\n    print('NF', e)\n",
                            env={"GVMALLOC_TORCH_LIBRARY": "/nowhere/libgvmalloc_torch.so"})
        self.assertIn("NF gvmalloc: GVMALLOC_TORCH_LIBRARY is set to '/nowhere/libgvmalloc_torch.so'",
                      out)

    def test_pluggable_warns_with_what_it_loses_and_swaps_the_allocator(self):
        out = self.run_case(
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    a = gt.enable(backend='pluggable')\n"
            "print('W', w[0].category.__name__, w[0].message)\n"
            "import torch\n"
            "print('SWAPPED', torch.cuda.memory.swapped == [a], a.args[1:])\n"
            "print('AGAIN', gt.enable(backend='pluggable') is a, gt.backend())\n"
            "try:\n    gt.enable()\n"
            "except RuntimeError as e:\n    print('RE', e)\n")
        self.assertIn("W RuntimeWarning gvmalloc.torch.enable(backend=\"pluggable\")", out)
        for loss in ("record_stream", "CUDA graphs", "cudnn.benchmark", "memory_stats",
                     "torch.OutOfMemoryError"):
            self.assertIn(loss, out)
        self.assertIn("SWAPPED True ('gvm_torch_malloc', 'gvm_torch_free')", out)
        self.assertIn("AGAIN True pluggable", out)
        self.assertIn("RE gvmalloc.torch.enable(backend='native'): already enabled with backend "
                      "'pluggable'", out)

    @unittest.skipUnless(TORCH_BACKEND and TORCH_BACKEND_VERSION, NO_BACKEND)
    def test_native_installs_the_built_backend_and_reports_it(self):
        out = self.run_case(
            "print('RET', gt.enable())\n"
            "info = gt.backend_info()\n"
            "print('INFO', info['installed'], info['built_for'], gt.backend())\n"
            "print('KEYS', sorted(info))\n",
            version=TORCH_BACKEND_VERSION, env={"GVMALLOC_TORCH_LIBRARY": TORCH_BACKEND})
        self.assertIn("RET None", out)
        self.assertIn("INFO True %s native" % TORCH_BACKEND_VERSION, out)
        self.assertIn("KEYS ['built_for', 'installed', 'library']", out)

    @unittest.skipUnless(TORCH_BACKEND and TORCH_BACKEND_VERSION, NO_BACKEND)
    def test_native_refuses_a_backend_built_for_another_torch(self):
        out = self.run_case(
            "try:\n    gt.enable()\n"
            "except gvmalloc.TorchVersionMismatch as e:\n    print('VM', e)\n",
            version="0.0.1", env={"GVMALLOC_TORCH_LIBRARY": TORCH_BACKEND})
        self.assertIn("built for torch %s, but this process runs torch 0.0.1" % TORCH_BACKEND_VERSION,
                      out)


class SemanticsRunner(unittest.TestCase):
    """tests/python/_torch_semantics.py's table, over stand-in cases: a failing case, a
    crash and a timeout are reported as such and the other cases still run; a fresh
    case runs after the others in an interpreter of its own."""

    def test_every_outcome_is_reported_and_the_run_goes_on(self):
        with tempfile.TemporaryDirectory() as out:
            env = dict(os.environ, GVM_SEMANTICS_STANDIN="_semantics_standin",
                       PYTHONPATH=os.pathsep.join([_support.HERE, _support.PACKAGE_DIR]))
            r = subprocess.run([sys.executable, os.path.join(_support.HERE, "_torch_semantics.py"),
                                "table", "--out", out], capture_output=True, text=True, env=env,
                               timeout=120)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)  # something failed
            import json
            with open(os.path.join(out, "torch-semantics.json")) as f:
                listed = json.load(f)
                rows = {row["case"]: row for row in listed}
            with open(os.path.join(out, "torch-semantics.txt")) as f:
                text = f.read()
        self.assertEqual({c: rows[c]["native"]["status"] for c in rows},
                         {c: "pass" for c in rows})
        gvm = {c: rows[c]["gvm"]["status"] for c in rows}
        self.assertEqual(gvm, {"passes": "pass", "fails": "fail", "crashes": "CRASH", "after": "pass",
                               "hangs": "TIMEOUT", "fresh": "pass"})
        self.assertIn("signal SIGSEGV", rows["crashes"]["gvm"]["detail"]["error"])
        self.assertIn("differs under gvm", rows["fails"]["gvm"]["detail"]["error"])
        # The case after the crash ran in a new worker; a fresh case gets its own.
        self.assertNotEqual(rows["after"]["gvm"]["detail"]["pid"], rows["passes"]["gvm"]["detail"]["pid"])
        self.assertNotEqual(rows["fresh"]["gvm"]["detail"]["pid"], rows["after"]["gvm"]["detail"]["pid"])
        # Listed in the cases' order; the fresh case ran after the others (its
        # interpreter was started ahead, while they ran).
        self.assertEqual([row["case"] for row in listed],
                         ["passes", "fresh", "fails", "crashes", "after", "hangs"])
        self.assertGreater(rows["fresh"]["native"]["detail"]["t"],
                           rows["after"]["native"]["detail"]["t"])
        self.assertNotEqual(rows["fresh"]["native"]["detail"]["pid"],
                            rows["passes"]["native"]["detail"]["pid"])
        self.assertRegex(text, r"crashes +pass +CRASH")
        self.assertIn("gvmalloc: 1 CRASH, 1 TIMEOUT, 1 fail, 3 pass", text)


class PureHelpers(unittest.TestCase):
    def test_merge_conf_puts_the_override_last(self):
        self.assertEqual(gvmalloc.merge_conf("a:1, b:2", "b:3"), "a:1, b:2,b:3")
        self.assertEqual(gvmalloc.merge_conf(None, "b:3"), "b:3")
        self.assertEqual(gvmalloc.merge_conf("a:1", None), "a:1")
        self.assertEqual(gvmalloc.merge_conf("", " "), "")

    def test_device_arguments(self):
        class FakeDevice:  # what torch.device looks like to gvmalloc
            def __init__(self, type_, index):
                self.type, self.index = type_, index

        self.assertEqual(gvmalloc._device_index(3), 3)
        self.assertEqual(gvmalloc._device_index("cuda:1"), 1)
        self.assertEqual(gvmalloc._device_index(FakeDevice("cuda", 2)), 2)
        with self.assertRaisesRegex(ValueError, "CUDA devices, not 'cpu'"):
            gvmalloc._device_index("cpu")
        with self.assertRaisesRegex(ValueError, "CUDA devices"):
            gvmalloc._device_index(FakeDevice("cpu", None))
        with self.assertRaisesRegex(TypeError, "device index"):
            gvmalloc._device_index(1.5)

    @unittest.skipIf(_support.have("torch"), "torch is installed here")
    def test_torch_module_without_torch_says_so(self):
        with self.assertRaisesRegex(ImportError, "gvmalloc.torch needs PyTorch"):
            import gvmalloc.torch  # noqa: F401

    @unittest.skipIf(_support.have("cupy"), "cupy is installed here")
    def test_cupy_module_without_cupy_says_so(self):
        with self.assertRaisesRegex(ImportError, "gvmalloc.cupy needs CuPy"):
            import gvmalloc.cupy  # noqa: F401


@NEEDS_LIBRARY
class SimulatedAllocator(unittest.TestCase):
    """The wrappers over the C ABI, on two simulated H200s."""

    def setUp(self):
        self.saved_conf = os.environ.pop("GVM_CONF", None)
        if gvmalloc.is_initialized():
            gvmalloc.shutdown()

    def tearDown(self):
        if gvmalloc.is_initialized():
            gvmalloc.shutdown()
        os.environ.pop("GVM_CONF", None)
        if self.saved_conf is not None:
            os.environ["GVM_CONF"] = self.saved_conf

    def test_stats_before_start_have_the_shape_and_no_devices(self):
        s = gvmalloc.stats()
        self.assertEqual(s["devices"], [])
        self.assertIsNone(s["config"])
        self.assertEqual(gvmalloc.memory_reserved(0), 0)
        self.assertEqual(gvmalloc.max_memory_reserved("cuda:1"), 0)
        gvmalloc.empty_cache()  # nothing to do, no error
        self.assertFalse(gvmalloc.is_initialized())

    def test_stats_follow_allocations_and_empty_cache_returns_memory(self):
        gvmalloc.init_simulated("h200", 2, "max_chunk_size:8MiB")
        p = gvmalloc.malloc(20 * MiB, 1)
        q = gvmalloc.malloc(3 * MiB, 1)
        s = gvmalloc.stats()
        self.assertEqual(len(s["devices"]), 2)
        d1 = s["devices"][1]
        self.assertEqual(d1["device"], 1)
        self.assertEqual(d1["allocations"], 2)
        self.assertGreaterEqual(d1["live_bytes"], 23 * MiB)
        self.assertGreaterEqual(d1["reserved_bytes"], d1["live_bytes"])
        self.assertEqual(s["devices"][0]["reserved_bytes"], 0)
        self.assertIn("max_chunk_size:8MiB", s["config"])
        self.assertGreater(s["driver_totals"]["calls"], 0)
        self.assertIn("cuMemCreate", s["driver_calls"])
        # The struct route agrees with the JSON route.
        self.assertEqual(gvmalloc.device_stats(1), d1)
        self.assertEqual(gvmalloc.memory_reserved(1), d1["reserved_bytes"])
        self.assertEqual(gvmalloc.memory_allocated("cuda:1"), d1["live_bytes"])

        gvmalloc.free(p, 20 * MiB, 1)
        peak = gvmalloc.max_memory_reserved(1)
        self.assertEqual(peak, d1["peak_reserved_bytes"])
        gvmalloc.empty_cache(1)
        after = gvmalloc.device_stats(1)
        self.assertLess(after["reserved_bytes"], d1["reserved_bytes"])
        self.assertEqual(after["cached_bytes"] + after["live_bytes"], after["reserved_bytes"])
        self.assertEqual(gvmalloc.max_memory_reserved(1), peak)
        gvmalloc.free(q, 0, 1)  # size 0: unknown, not checked
        gvmalloc.empty_cache()
        self.assertEqual(gvmalloc.memory_reserved(1), 0)

    def test_a_forgotten_stream_handle_is_a_new_stream_afterwards(self):
        gvmalloc.forget_stream(0x1234)  # before the allocator starts: nothing to do
        self.assertFalse(gvmalloc.is_initialized())

        def reuse_after(forget):
            """(the same block again, the waits it took) for a block freed on a stream
            and asked for again on a stream with the same handle."""
            gvmalloc.init_simulated("h200", 1)
            handle = 0x1234  # the simulated driver takes any handle as a stream
            p = gvmalloc.malloc(8 * MiB, 0, handle)
            gvmalloc.free(p, 8 * MiB, 0, handle)
            before = gvmalloc.device_stats(0)
            if forget:
                gvmalloc.forget_stream(forget(handle))
            q = gvmalloc.malloc(8 * MiB, 0, handle)
            waits = gvmalloc.device_stats(0)["cross_stream_waits"] - before["cross_stream_waits"]
            gvmalloc.free(q, 8 * MiB, 0, handle)
            gvmalloc.shutdown()
            return q == p, waits

        # Not forgotten: the block freed on the stream is its own again at once.
        self.assertEqual(reuse_after(None), (True, 0))

        # Forgotten (as the handle, or a torch, CuPy or Numba stream object):
        # the next stream with that handle is another stream, which takes the
        # dead one's block only behind a wait on what the dead one left.
        class TorchStream:
            def __init__(self, h):
                self.cuda_stream = h

        class CupyStream:
            def __init__(self, h):
                self.ptr = h

        class NumbaStream:
            def __init__(self, h):
                self.h = h

            def __int__(self):
                return self.h

        for make in (int, TorchStream, CupyStream, NumbaStream):
            self.assertEqual(reuse_after(make), (True, 1), make.__name__)

    def test_forget_stream_refuses_what_is_no_stream(self):
        gvmalloc.init_simulated("h200", 1)
        with self.assertRaisesRegex(TypeError, "expected a stream handle"):
            gvmalloc.forget_stream("cuda:0")
        gvmalloc.forget_stream(0)  # the legacy stream: forgotten, the allocator goes on
        gvmalloc.free(gvmalloc.malloc(4096), 4096)

    def test_memory_snapshot_is_the_json_text(self):
        gvmalloc.init_simulated("a100", 1)
        text = gvmalloc.memory_snapshot()
        self.assertTrue(text.startswith('{"devices":['), text[:40])
        self.assertEqual(gvmalloc.stats()["devices"][0]["device"], 0)

    def test_conf_over_gvm_conf(self):
        os.environ["GVM_CONF"] = "max_chunk_size:4MiB,small_max:64KiB"
        gvmalloc.init_simulated("h200", 1, "max_chunk_size:16MiB")
        config = gvmalloc.stats()["config"]
        self.assertIn("max_chunk_size:16MiB", config)
        self.assertIn("small_max:64KiB", config)

    def test_bad_conf_names_the_key_and_starts_nothing(self):
        with self.assertRaises(gvmalloc.GvmError) as cm:
            gvmalloc.init_simulated("h200", 1, "chunk:3")
        self.assertEqual(cm.exception.status, "GVM_ERROR_CONFIG")
        self.assertIn('unknown key "chunk"', str(cm.exception))
        self.assertFalse(gvmalloc.is_initialized())
        os.environ["GVM_CONF"] = "max_chunk_size:3MiB"
        with self.assertRaisesRegex(gvmalloc.GvmError, "3MiB.*max_chunk_size"):
            gvmalloc.init_simulated("h200", 1)
        self.assertFalse(gvmalloc.is_initialized())

    def test_bad_arguments_are_errors_that_change_nothing(self):
        with self.assertRaisesRegex(gvmalloc.GvmError, "GVM_ERROR_INVALID_ARGUMENT.*h300"):
            gvmalloc.init_simulated("h300", 1)
        with self.assertRaisesRegex(gvmalloc.GvmError, "GVM_ERROR_NOT_INITIALIZED"):
            gvmalloc.shutdown()
        with self.assertRaisesRegex(gvmalloc.GvmError, "GVM_ERROR_NOT_INITIALIZED"):
            gvmalloc.malloc(MiB)
        gvmalloc.init_simulated("h200", 2)
        with self.assertRaisesRegex(gvmalloc.GvmError, "GVM_ERROR_ALREADY_INITIALIZED"):
            gvmalloc.init_simulated("h200", 2)
        p = gvmalloc.malloc(MiB, 0)
        gvmalloc.free(p, MiB, 0)
        before = gvmalloc.stats()["devices"]
        with self.assertRaisesRegex(gvmalloc.GvmError, "GVM_ERROR_INVALID_ARGUMENT.*not a live"):
            gvmalloc.free(p, MiB, 0)  # a double free
        with self.assertRaisesRegex(gvmalloc.GvmError, "no device 5"):
            gvmalloc.malloc(MiB, 5)
        with self.assertRaisesRegex(gvmalloc.GvmError, "size is 0"):
            gvmalloc.malloc(0, 0)
        with self.assertRaisesRegex(gvmalloc.GvmError, "no device 7"):
            gvmalloc.device_stats(7)
        with self.assertRaisesRegex(gvmalloc.GvmError, "GVM_ERROR_CONFIG"):
            gvmalloc.set_peer_policy("sometimes")
        self.assertEqual(gvmalloc.stats()["devices"], before)

    def test_out_of_memory_is_a_memory_error(self):
        gvmalloc.init_simulated("h200", 1, "max_reserved:64MiB")
        with self.assertRaises(gvmalloc.OutOfMemoryError) as cm:
            gvmalloc.malloc(128 * MiB, 0)
        self.assertIsInstance(cm.exception, MemoryError)
        self.assertEqual(cm.exception.status, "GVM_ERROR_OUT_OF_MEMORY")

    def test_scratch_and_peer_policy(self):
        gvmalloc.init_simulated("h200", 2)
        s = gvmalloc.scratch_malloc(4 * MiB, 0)
        d = gvmalloc.malloc(4 * MiB, 1)
        self.assertGreater(gvmalloc.device_stats(0)["scratch_reserved_bytes"], 0)
        self.assertEqual(gvmalloc.peer_policy(0, 1), "per_allocation")
        gvmalloc.record_stream(s, 0, stream_device=1)
        gvmalloc.set_peer_policy("none")
        self.assertEqual(gvmalloc.peer_policy(0, 1), "none")
        with self.assertRaisesRegex(gvmalloc.GvmError, "no device 4"):
            gvmalloc.peer_policy(0, 4)
        gvmalloc.free(d, 4 * MiB, 1)
        gvmalloc.free(s, 4 * MiB, 0)

    def test_framework_entry_points_share_the_allocator(self):
        # PyTorch dlopen()s library_path() itself; a second handle on the same
        # file must reach the same allocator, or enable() would split the stats.
        gvmalloc.init_simulated("h200", 1)
        other = ctypes.CDLL(gvmalloc.library_path())
        other.gvm_torch_malloc.restype = ctypes.c_void_p
        other.gvm_torch_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        other.gvm_torch_pool_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                                              ctypes.c_void_p]
        p = other.gvm_torch_malloc(6 * MiB, 0, None)
        self.assertTrue(p)
        self.assertEqual(gvmalloc.device_stats(0)["allocations"], 1)
        self.assertGreater(gvmalloc.memory_reserved(0), 0)
        other.gvm_torch_pool_free(p, 6 * MiB, 0, None)  # frees and trims
        self.assertEqual(gvmalloc.memory_reserved(0), 0)
        self.assertEqual(gvmalloc.device_stats(0)["frees"], 1)


if __name__ == "__main__":
    unittest.main()
