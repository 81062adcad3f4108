"""gvmalloc inside CuPy on a real GPU (in its own interpreter, like the torch
tests). Skipped without cupy, numpy or a GPU."""

import os
import subprocess
import sys
import unittest

import _support


def cupy_gpus():
    if not (_support.have("cupy") and _support.have("numpy")):
        return 0
    r = subprocess.run([sys.executable, "-c",
                        "import cupy; print(cupy.cuda.runtime.getDeviceCount())"],
                       capture_output=True, text=True, timeout=120)
    try:
        return int(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return 0


class CuPy(unittest.TestCase):
    def test_ffts_and_matmuls_match_numpy_and_come_from_gvmalloc(self):
        if not os.environ.get("GVMALLOC_LIBRARY"):
            self.skipTest("GVMALLOC_LIBRARY is not set (tools/python-tests.sh sets it)")
        if not (_support.have("cupy") and _support.have("numpy")):
            self.skipTest("cupy or numpy is not installed")
        if cupy_gpus() < 1:
            self.skipTest("CuPy sees no GPU")
        r = _support.run_workload("cupy")
        self.assertLess(r["worst_fft"], 1e-9)
        self.assertLess(r["worst_mm"], 1e-9)
        self.assertGreater(r["allocations"], 0)
        self.assertGreater(r["frees"], 0)

    def test_trim_after_a_side_stream_is_destroyed(self):
        # Blocks freed on a stream CuPy later destroys: empty_cache must not
        # record events on (or wait for) the dead handle.
        if not os.environ.get("GVMALLOC_LIBRARY"):
            self.skipTest("GVMALLOC_LIBRARY is not set (tools/python-tests.sh sets it)")
        if not (_support.have("cupy") and _support.have("numpy")):
            self.skipTest("cupy or numpy is not installed")
        if cupy_gpus() < 1:
            self.skipTest("CuPy sees no GPU")
        r = _support.run_workload("cupy_dead_stream")
        self.assertEqual(r["live"], 0)
        self.assertEqual(r["total"], 8 * (sum((1 << 20) * (k + 1) - 1 for k in range(4)) + 1024))


if __name__ == "__main__":
    unittest.main()
