#!/usr/bin/env bash
# tools/python-tests.sh: the Python tests (tests/python) against a build tree.
#
#   tools/python-tests.sh [BUILD_DIR] [pytest args...]
#
# BUILD_DIR defaults to build, the folder the README's commands make
# (cmake --preset default); tools/gpu-suite.sh passes its build-gpu. A first
# argument that starts with "-" is a pytest argument (tools/python-tests.sh -k cupy).
#
# Sets GVMALLOC_LIBRARY to BUILD_DIR/allocator/libgvmalloc.so (and
# GVMALLOC_TORCH_LIBRARY to the PyTorch backend beside it) and PYTHONPATH to
# integrations/python, runs pytest (-s: the tests print losses, peak reserved and
# step times), and ends with pytest's short summary. Without a GPU, torch,
# cupy or numba the GPU tests are skipped with the reason; the CPU tests run anywhere.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0). Uses no network.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=build
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  BUILD=$1
  shift
fi
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
LIB="$BUILD/allocator/libgvmalloc.so"
if [ ! -f "$LIB" ]; then
  echo "python-tests: $LIB not found; build first (cmake --workflow --preset build makes build/), or name the build folder: tools/python-tests.sh BUILD_DIR" >&2
  exit 2
fi
PYTHON=${PYTHON:-python3}
RUNNER=(-m pytest -s -rsfE -p no:cacheprovider "$@" .)
if ! "$PYTHON" -c "import pytest" 2>/dev/null; then
  echo "python-tests: no pytest for $PYTHON: running unittest instead" >&2
  RUNNER=(-m unittest discover -v -p "test_*.py")
fi

export GVMALLOC_LIBRARY="$LIB"
# gvmalloc's PyTorch backend, built beside the library when cmake found torch;
# without it gvmalloc.torch.enable() says how to build it, and the semantics
# tests skip.
# The version it must carry is that of the torch this Python imports (cmake asks
# python3 too, unless GVM_TORCH_ROOT named another torch): CTest gives cmake's answer,
# and the CPU tests check the library's mark against it.
if [ -f "$BUILD/allocator/libgvmalloc_torch.so" ]; then
  export GVMALLOC_TORCH_LIBRARY="$BUILD/allocator/libgvmalloc_torch.so"
  GVM_TORCH_BUILT_FOR=$("$PYTHON" -c "import torch; print(torch.__version__)" 2>/dev/null) &&
    export GVM_TORCH_BUILT_FOR
fi
export PYTHONPATH="$ROOT/integrations/python${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0
export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}
export PYTHONDONTWRITEBYTECODE=1

cd "$ROOT/tests/python" || exit 2
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
start=$SECONDS
"$PYTHON" "${RUNNER[@]}" 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}

echo
echo "=== python-tests summary ($BUILD, $((SECONDS - start)) s)"
# The figures the tests print (a line may start after pytest's progress dot).
sed -nE 's/^(\.|test_[a-z_]+\.py )?((losses |peak reserved:|median step:|mempool: reserved|scratch:|dist rank|cupy:|numba:|torch copy_).*)/\2/p' "$LOG" | awk '!seen[$0]++'
grep -E "^(SKIPPED|FAILED|ERROR) |skipped .|^(FAIL|ERROR):" "$LOG"
tail -n 1 "$LOG"
exit "$rc"
