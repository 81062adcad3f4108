#!/usr/bin/env bash
# tools/torch-semantics.sh: PyTorch's allocator semantics with PyTorch's own
# allocator and with gvmalloc's native backend, side by side, as one table.
#
#   tools/torch-semantics.sh [BUILD_DIR] [--cases a,b] [--timeout S] [--allocators native,gvm]
#
# BUILD_DIR (default build-gpu) holds allocator/libgvmalloc.so and, beside it,
# libgvmalloc_torch.so (built when cmake found torch). Each allocator runs in
# worker interpreters of its own (tests/python/_torch_semantics.py): a case
# that fails, crashes its worker or hangs is reported as such and the others
# go on. Writes torch-semantics.{txt,json} and the workers' stderr into
# $OUT/torch-semantics (default ./torch-semantics-out). Exit status 1 if any
# case did not pass under either allocator. Uses no network.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=build-gpu
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then
  BUILD=$1
  shift
fi
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
LIB="$BUILD/allocator/libgvmalloc.so"
BACKEND="$BUILD/allocator/libgvmalloc_torch.so"
for f in "$LIB" "$BACKEND"; do
  if [ ! -f "$f" ]; then
    echo "torch-semantics: $f not found; build first: cmake --build $BUILD --target gvmalloc gvmalloc_torch" >&2
    exit 2
  fi
done
OUT_DIR="${OUT:-$PWD/torch-semantics-out}/torch-semantics"
mkdir -p "$OUT_DIR"

export GVMALLOC_LIBRARY="$LIB"
export GVMALLOC_TORCH_LIBRARY="$BACKEND"
export PYTHONPATH="$ROOT/integrations/python:$ROOT/tests/python${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0
export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}
export PYTHONDONTWRITEBYTECODE=1

exec "${PYTHON:-python3}" "$ROOT/tests/python/_torch_semantics.py" table --out "$OUT_DIR" "$@"
