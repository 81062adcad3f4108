#!/usr/bin/env bash
# tools/torch-gpu-run.sh: gvmalloc's PyTorch backend on a GPU machine, in one
# command of about 8 minutes on one H200 (docs/pytorch.md):
#
#   OUT=/some/dir tools/torch-gpu-run.sh
#
#   1. configure build-torch (Release; cmake finds torch through python3) and
#      build the library, the backend and their CPU tests (-j$(nproc))
#   2. the CPU tests of both (torch_core_tests, torch_backend_tests on the
#      simulated driver, python_cpu)
#   3. what the backend is: torch version, which parts of gvmalloc's API it uses
#   4. the allocator semantics, PyTorch's allocator beside gvmalloc, one table
#      (tools/torch-semantics.sh), within GVM_TORCH_SEMANTICS_S (default 210) s
#   5. the programs: ResNet-50 / GPT-2 training, a Llama generate loop, each
#      with native, expandable segments and gvmalloc (bench/torch_programs.py),
#      within GVM_TORCH_PROGRAMS_S (default 210) s
#   6. a summary: every step's status, then both tables
#
# GVM_TORCH_CMAKE_ARGS: more arguments for the configure step.
# GVM_TORCH_STEPS=build,cpu,info,semantics,programs (the default: all) picks
# steps; GVM_TORCH_CASES / GVM_TORCH_PROGRAMS (comma lists) narrow 4 and 5.
# A step that fails is reported and the rest still run; logs and tables go to
# $OUT (default ./torch-gpu-out). Exit status 1 if anything failed.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD="$ROOT/build-torch"
OUT_DIR="${OUT:-$PWD/torch-gpu-out}"
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
STEPS=",${GVM_TORCH_STEPS:-build,cpu,info,semantics,programs},"
want() { [[ "$STEPS" == *",$1,"* ]]; }
JOBS=$(nproc 2>/dev/null || echo 4)
PYTHON=${PYTHON:-python3}
FAILED=()
START=$SECONDS

step() {  # step NAME CMD...: output to $OUT_DIR/NAME.log and the terminal
  local name=$1
  shift
  printf '\n=== %s (at %d s): %s\n' "$name" "$((SECONDS - START))" "$*"
  local t0=$SECONDS
  "$@" 2>&1 | tee "$OUT_DIR/$name.log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    FAILED+=("$name: exit $rc ($OUT_DIR/$name.log)")
    echo "--- $name FAILED (exit $rc, $((SECONDS - t0)) s)"
  else
    echo "--- $name ok ($((SECONDS - t0)) s)"
  fi
  return "$rc"
}

export GVMALLOC_LIBRARY="$BUILD/allocator/libgvmalloc.so"
export GVMALLOC_TORCH_LIBRARY="$BUILD/allocator/libgvmalloc_torch.so"
export PYTHONPATH="$ROOT/integrations/python:$ROOT/tests/python${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0
export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}
export PYTHONDONTWRITEBYTECODE=1

if want build; then
  # shellcheck disable=SC2086  # GVM_TORCH_CMAKE_ARGS is a list of arguments
  step configure cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGVM_BUILD_BENCH=OFF ${GVM_TORCH_CMAKE_ARGS:-}
  step build cmake --build "$BUILD" -j "$JOBS" --target gvmalloc gvmalloc_torch torch_core_tests torch_backend_tests
fi

if want cpu; then
  step cpu-tests ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS" -R "^(python_cpu|StatCounters|Pools|TraceRing|BlockTable|VersionCheck|Messages|AllocatorApi|Adapter|BackendSim|PoolCheckpointPlan)"
fi

if want info; then
  step info "$PYTHON" -c '
import torch, gvmalloc, gvmalloc.torch as gt
print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())
gt.enable()
torch.zeros(1, device="cuda")
info = gt.backend_info()
print("backend", torch.cuda.get_allocator_backend(), info["library"], "built for", info["built_for"])
print("gvmalloc API used:", ", ".join(k for k, v in info["capabilities"].items() if v) or "none")
print("gvmalloc API missing:", ", ".join(k for k, v in info["capabilities"].items() if not v) or "none")
print("config:", gvmalloc.stats()["config"])
'
fi

if want semantics; then
  args=(--deadline "${GVM_TORCH_SEMANTICS_S:-210}")
  [ -n "${GVM_TORCH_CASES:-}" ] && args+=(--cases "$GVM_TORCH_CASES")
  OUT="$OUT_DIR" step semantics "$ROOT/tools/torch-semantics.sh" "$BUILD" "${args[@]}"
fi

if want programs; then
  args=(--out "$OUT_DIR/torch-programs" --deadline "${GVM_TORCH_PROGRAMS_S:-210}")
  [ -n "${GVM_TORCH_PROGRAMS:-}" ] && args+=(--programs "$GVM_TORCH_PROGRAMS")
  step programs "$PYTHON" "$ROOT/bench/torch_programs.py" "${args[@]}"
fi

{
  printf '\n=== torch-gpu-run summary (%d s)\n' "$((SECONDS - START))"
  [ -f "$OUT_DIR/info.log" ] && cat "$OUT_DIR/info.log"
  [ -f "$OUT_DIR/torch-semantics/torch-semantics.txt" ] && cat "$OUT_DIR/torch-semantics/torch-semantics.txt"
  [ -f "$OUT_DIR/torch-programs/torch-programs.txt" ] &&
    sed -n '/^=== PyTorch programs/,/^$/p' "$OUT_DIR/torch-programs/torch-programs.txt"
  if [ ${#FAILED[@]} -eq 0 ]; then
    echo "every step passed"
  else
    printf 'FAILED: %s\n' "${FAILED[@]}"
  fi
} | tee "$OUT_DIR/summary.txt"
[ ${#FAILED[@]} -eq 0 ]
