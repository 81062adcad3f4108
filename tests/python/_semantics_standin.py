"""Stand-in cases for testing _torch_semantics.py's runner without torch or a GPU
(GVM_SEMANTICS_STANDIN=_semantics_standin): one of each outcome."""

import os
import signal
import time


class _Skip(Exception):
    pass


def _opts(fresh=False, timeout=30):
    return {"fresh": fresh, "timeout": timeout, "expect": {}}


def passes(alloc):
    print("a line the case prints")
    print("and another")
    return {"pid": os.getpid(), "t": time.time()}


def fails(alloc):
    assert alloc == "native", "differs under %s" % alloc


def crashes(alloc):
    if alloc == "gvm":
        os.kill(os.getpid(), signal.SIGSEGV)


def hangs(alloc):
    if alloc == "gvm":
        time.sleep(60)


def after(alloc):
    return {"pid": os.getpid(), "t": time.time()}


def fresh(alloc):
    return {"pid": os.getpid(), "t": time.time()}


CASES = {
    "passes": (passes, "passes everywhere", _opts()),
    "fresh": (fresh, "wants an interpreter of its own", _opts(fresh=True)),
    "fails": (fails, "fails under gvm", _opts()),
    "crashes": (crashes, "kills its worker under gvm", _opts()),
    "after": (after, "runs after a crash", _opts()),
    "hangs": (hangs, "outlives its time under gvm", _opts(timeout=3)),
}
