"""NumPy aliases that numba-cuda still names after NumPy removed them.

NumPy 2.0 deprecated numpy.row_stack (an alias of numpy.vstack) and NumPy 2.5
removed it. numba-cuda 0.68 still registers an overload for np.row_stack in
numba_cuda/numba/cuda/np/arrayobj.py, which runs when its typing registries
load at the first kernel compile: with NumPy 2.5 every compile then fails with
"AttributeError: module 'numpy' has no attribute 'row_stack'" (the first GPU
run of tests/python/test_numba_gpu.py: numba-cuda 0.68, NumPy 2.5). That is an
incompatibility between those two packages, not gvmalloc's; docs/numba.md says
what a program does about it. The traceback of that run names no other
missing attribute (the import stops at the first), so row_stack is the only
alias restored; another one would show up as the same AttributeError naming it.
"""

# (removed name, the function it was an alias of)
REMOVED_ALIASES = (("row_stack", "vstack"),)


def restore(numpy):
    """Sets each removed alias that `numpy` lacks back to the function it named.
    Returns what it set, as "numpy.row_stack = numpy.vstack" lines (empty when
    this NumPy still has them all)."""
    restored = []
    for old, new in REMOVED_ALIASES:
        if not hasattr(numpy, old) and hasattr(numpy, new):
            setattr(numpy, old, getattr(numpy, new))
            restored.append("numpy.%s = numpy.%s" % (old, new))
    return restored
