"""gvmalloc inside Numba's CUDA target on a real GPU (in its own interpreter,
like the CuPy and torch tests). Skipped without numba, numpy or a GPU."""

import os
import subprocess
import sys
import unittest

import _support


def numba_gpus():
    if not (_support.have("numba") and _support.have("numpy")):
        return 0
    r = subprocess.run([sys.executable, "-c",
                        "from numba import cuda; print(len(cuda.gpus) if cuda.is_available() else 0)"],
                       capture_output=True, text=True, timeout=120)
    try:
        return int(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return 0


class Numba(unittest.TestCase):
    def test_kernels_over_varied_sizes_match_numpy_and_come_from_gvmalloc(self):
        if not os.environ.get("GVMALLOC_LIBRARY"):
            self.skipTest("GVMALLOC_LIBRARY is not set (tools/python-tests.sh sets it)")
        if not (_support.have("numba") and _support.have("numpy")):
            self.skipTest("numba or numpy is not installed")
        if numba_gpus() < 1:
            self.skipTest("numba sees no GPU")
        r = _support.run_workload("numba")
        if r["numpy_shim"]:
            print("numba: shim needed: NumPy %s with numba-cuda %s (%s); the kernels ran with it"
                  % (r["numpy"], r["numba_cuda"], ", ".join(r["numpy_shim"])))
        else:
            print("numba: no shim needed (NumPy %s, numba-cuda %s)" % (r["numpy"], r["numba_cuda"]))
        self.assertTrue(r["plugged"], "numba's context does not allocate through gvmalloc")
        self.assertLess(r["worst_saxpy"], 1e-14)
        self.assertTrue(r["scale_exact"])
        # 6 device arrays an iteration (the copies to the host allocate none).
        self.assertGreaterEqual(r["allocations"], 6 * 40)
        self.assertGreaterEqual(r["frees"], 6 * 40)
        self.assertEqual(r["frees_deferred"], 0)
        self.assertEqual(r["frees_after"], 1)
        self.assertGreater(r["total"], 0)
        self.assertLessEqual(r["free"], r["total"])
        self.assertIn("cuIpcGetMemHandle cannot export", r["ipc"])


if __name__ == "__main__":
    unittest.main()
