#!/usr/bin/env bash
# tools/install-check.sh: the install steps of docs/pytorch.md and docs/cupy.md,
# followed as a user would, on a GPU machine without network.
#
#   tools/install-check.sh [BUILD_DIR]        (BUILD_DIR: build, the README's)
#
# cmake --install BUILD_DIR into a fresh prefix, then, from outside the source
# tree and with GVMALLOC_LIBRARY unset, PYTHONPATH=<prefix>/lib/python only:
# PyTorch with gvmalloc.torch.enable() (the native backend, from the prefix)
# runs a matmul, and CuPy with
# gvmalloc.cupy.enable() an FFT, each in its own process, and both show their
# allocations in gvmalloc's stats and the library loaded from the prefix.
# Without torch or cupy that half is reported as skipped; exit 1 on a failure.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-build}
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
PYTHON=${PYTHON:-python3}
PREFIX=$(mktemp -d)
trap 'rm -rf "$PREFIX"' EXIT

echo "=== cmake --install $BUILD --prefix $PREFIX"
cmake --install "$BUILD" --prefix "$PREFIX" >"$PREFIX.log" 2>&1 || { cat "$PREFIX.log"; exit 1; }
rm -f "$PREFIX.log"
[ -d "$PREFIX/lib/python/gvmalloc" ] || { echo "no $PREFIX/lib/python/gvmalloc after install"; exit 1; }

cd "$PREFIX" || exit 1
failed=0
for runtime in torch cupy; do
  echo "=== $runtime, PYTHONPATH=<prefix>/lib/python"
  env -u GVMALLOC_LIBRARY PYTHONPATH="$PREFIX/lib/python" "$PYTHON" - "$runtime" "$PREFIX" <<'PY'
import sys, os
runtime, prefix = sys.argv[1], sys.argv[2]
try:
    __import__(runtime)
except ImportError as e:
    print("install-check %s: SKIPPED (%s)" % (runtime, e))
    sys.exit(0)
import gvmalloc
assert gvmalloc.__file__.startswith(prefix), gvmalloc.__file__
if runtime == "torch":
    import torch, gvmalloc.torch
    gvmalloc.torch.enable()
    a = torch.randn(512, 512, device="cuda")
    b = (a @ a).sum().item()
    torch.cuda.synchronize()
    # The native backend, installed beside the library.
    backend = gvmalloc.torch.backend_info()["library"]
    assert backend.startswith(os.path.realpath(prefix)), backend
    print("install-check torch: backend %s (%s)" % (backend, torch.cuda.get_allocator_backend()))
else:
    import cupy, gvmalloc.cupy
    gvmalloc.cupy.enable()
    x = cupy.random.random(1 << 16)
    b = float(abs(cupy.fft.fft(x)).sum())
s = gvmalloc.device_stats(0)
lib = gvmalloc._lib.library_path()
assert lib and lib.startswith(os.path.realpath(prefix)), lib
ok = s["allocations"] > 0
print("install-check %s: %s (allocations %d, reserved %d, library %s)"
      % (runtime, "ok" if ok else "FAILED: no allocation went through gvmalloc",
         s["allocations"], s["reserved_bytes"], lib))
sys.exit(0 if ok else 1)
PY
  [ $? -eq 0 ] || failed=1
done
exit "$failed"
