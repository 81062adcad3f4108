"""PyTorch's allocator semantics with gvmalloc's native backend, case by case
(tests/python/_torch_semantics.py): each case must give with gvmalloc what it
gives with PyTorch's own allocator. One worker interpreter per allocator runs
the cases (the allocator is chosen before CUDA starts). Skipped without torch,
a GPU, the library or the backend. tools/torch-semantics.sh prints the whole
table instead.
"""

import os
import tempfile
import unittest

import _support
import _torch_semantics as sem

NO_LIBRARY = not os.environ.get("GVMALLOC_LIBRARY")
BACKEND = os.environ.get("GVMALLOC_TORCH_LIBRARY")


def why_skip():
    if NO_LIBRARY:
        return "GVMALLOC_LIBRARY is not set (tools/python-tests.sh sets it)"
    if not _support.have("torch"):
        return "torch is not installed"
    if _support.gpus() < 1:
        return "needs a CUDA GPU, torch sees none"
    if not BACKEND or not os.path.isfile(BACKEND):
        return "gvmalloc's PyTorch backend is not built (GVMALLOC_TORCH_LIBRARY: %r)" % BACKEND
    return None


_workers = {}
_log_dir = tempfile.mkdtemp(prefix="gvm-semantics-")


def result(name, alloc):
    opts = sem.CASES[name][2]
    if opts["fresh"]:
        w = sem.Worker(alloc, _log_dir)
        try:
            return w.run(name, opts["timeout"])
        finally:
            w.close()
    w = _workers.get(alloc)
    if w is None:
        w = _workers[alloc] = sem.Worker(alloc, _log_dir)
    r = w.run(name, opts["timeout"])
    if r["status"] in ("CRASH", "TIMEOUT"):
        w.close()
        del _workers[alloc]
    return r


def tearDownModule():
    for w in _workers.values():
        w.close()


def make_test(name):
    def test(self):
        reason = why_skip()
        if reason:
            self.skipTest(reason)
        native = result(name, "native")
        if native["status"] == "skip":
            self.skipTest("skipped with PyTorch's allocator too: %s" % native["detail"].get("reason"))
        self.assertEqual(native["status"], "pass",
                         "fails with PyTorch's own allocator (the machine, not gvmalloc?): %s"
                         % native["detail"])
        gvm = result(name, "gvm")
        print("\n%s: native %s, gvmalloc %s %s" % (name, native["status"], gvm["status"],
                                                   gvm["detail"] if gvm["status"] != "pass" else ""))
        self.assertEqual(gvm["status"], "pass", "%s with gvmalloc: %s" % (gvm["status"], gvm["detail"]))
    test.__doc__ = sem.CASES[name][1]
    return test


class Semantics(unittest.TestCase):
    pass


for _name in sem.CASES:
    setattr(Semantics, "test_" + _name, make_test(_name))


if __name__ == "__main__":
    unittest.main()
