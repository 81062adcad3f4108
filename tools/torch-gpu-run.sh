#!/usr/bin/env bash
# tools/torch-gpu-run.sh: gvmalloc's PyTorch backend on a GPU machine, in one
# command of about 6 minutes on one H200 (docs/pytorch.md, "Measuring on a GPU"):
#
#   OUT=/some/dir tools/torch-gpu-run.sh [BUILD_DIR]
#
# BUILD_DIR: a build tree already configured (e.g. build-gpu, made with
# `cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release`); it is not
# reconfigured, only the targets below are built in it. Without BUILD_DIR the
# script configures build-torch itself (Release, no benchmarks).
#
# Steps (GVM_TORCH_STEPS, a comma list; default build,info,semantics,programs):
#   build      build libgvmalloc.so and libgvmalloc_torch.so (and the backend's
#              CPU tests when cpu is a step)
#   cpu        the backend's CPU tests (torch_core_tests, torch_backend_tests,
#              python_cpu) on the simulated driver
#   info       what the backend is: torch version, library, config
#   semantics  PyTorch's allocator semantics, PyTorch's allocator beside
#              gvmalloc, one table (tools/torch-semantics.sh)
#   programs   ResNet-50 / GPT-2 training, a Llama generate loop, each with
#              native, expandable segments and gvmalloc (bench/torch_programs.py):
#              the programs table and where the time goes (torch.profiler)
#   lockstep   the same programs with every allocator's process alive at once,
#              stepped in turn (step k of each before step k+1, the order
#              rotated each step: bench/torch_lockstep.py), so that the host's
#              drift hits all alike: per-step ratios to native and expandable,
#              their median with a 95% interval; not a default step
# and last a summary: every step's status, then the tables.
#
# Time budget per step, in seconds: GVM_TORCH_SEMANTICS_S (default 130: cases
# not started by then are "not-run"), GVM_TORCH_PROGRAMS_S (default 210: a run
# starts only if it should end by then), GVM_TORCH_LOCKSTEP_S (default 360: a
# program starts only if its workers should be ready by then, and its steps stop
# early for the programs after it), GVM_TORCH_BUILD_S (600), GVM_TORCH_CPU_S
# (300), GVM_TORCH_INFO_S (120). Each step is also killed 60 s after its budget.
# GVM_TORCH_CASES / GVM_TORCH_PROGRAMS (comma lists) narrow semantics and
# programs (lockstep too); GVM_TORCH_ALLOCATORS (a comma list, e.g.
# gvm,native,expandable,gvm#2) the programs' runs and their order (lockstep: its
# processes, native,expandable,gvm by default); GVM_TORCH_ROUNDS=N runs them N times, each round the
# one before rotated by one (bench/torch_programs.py --rounds);
# GVM_TORCH_LOCKSTEP_PIN (CPUs, e.g. 2-9): the lockstep workers all on those CPUs;
# GVM_TORCH_LOCKSTEP_STEPS=N: paired steps per program (bench/torch_lockstep.py
# --steps; the deadline still stops a program's steps early);
# GVM_TORCH_CMAKE_ARGS: more configure arguments (build-torch only);
# GVM_TORCH_JOBS: parallel jobs for build and cpu (default: nproc).
# A step that fails is reported and the rest still run; logs and tables go to
# $OUT (default ./torch-gpu-out). Exit status 1 if a step failed.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CONFIGURE=0
if [ $# -gt 0 ]; then
  BUILD=$1
  case "$BUILD" in /*) ;; *) BUILD="$PWD/$BUILD" ;; esac
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    echo "torch-gpu-run: $BUILD is not a configured build tree; configure it first:" \
      "cmake -S $ROOT -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release" >&2
    exit 2
  fi
else
  BUILD="$ROOT/build-torch"
  CONFIGURE=1
fi
OUT_DIR="${OUT:-$PWD/torch-gpu-out}"
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
STEPS=",${GVM_TORCH_STEPS:-build,info,semantics,programs},"
want() { [[ "$STEPS" == *",$1,"* ]]; }
JOBS=${GVM_TORCH_JOBS:-$(nproc 2>/dev/null || echo 4)}
PYTHON=${PYTHON:-python3}
SEMANTICS_S=${GVM_TORCH_SEMANTICS_S:-130}
PROGRAMS_S=${GVM_TORCH_PROGRAMS_S:-210}
LOCKSTEP_S=${GVM_TORCH_LOCKSTEP_S:-360}
FAILED=()
START=$SECONDS

step() {  # step NAME BUDGET_S CMD...: output to $OUT_DIR/NAME.log and the terminal
  local name=$1 budget=$2
  shift 2
  printf '\n=== %s (at %d s, budget %d s): %s\n' "$name" "$((SECONDS - START))" "$budget" "$*"
  local t0=$SECONDS
  timeout --kill-after=10 "$((budget + 60))" "$@" 2>&1 | tee "$OUT_DIR/$name.log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    FAILED+=("$name: killed $((budget + 60)) s after it started ($OUT_DIR/$name.log)")
    echo "--- $name KILLED (over its budget of $budget s by 60 s)"
  elif [ "$rc" -ne 0 ]; then
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
  if [ "$CONFIGURE" -eq 1 ]; then
    # shellcheck disable=SC2086  # GVM_TORCH_CMAKE_ARGS is a list of arguments
    step configure 300 cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGVM_BUILD_BENCH=OFF ${GVM_TORCH_CMAKE_ARGS:-}
  fi
  targets=(gvmalloc gvmalloc_torch)
  want cpu && targets+=(torch_core_tests torch_backend_tests)
  step build "${GVM_TORCH_BUILD_S:-600}" cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}"
fi

if want cpu; then
  step cpu-tests "${GVM_TORCH_CPU_S:-300}" ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS" \
    -R "^(python_cpu|StatCounters|Pools|TraceRing|BlockTable|LiveRequests|VersionCheck|Messages|Adapter|BackendSim|PoolCheckpointPlan)"
fi

if want info; then
  step info "${GVM_TORCH_INFO_S:-120}" "$PYTHON" -c '
import torch, gvmalloc, gvmalloc.torch as gt
gt.enable()  # first: a CUDA query below starts the allocator PyTorch would then keep
print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
torch.zeros(1, device="cuda")
info = gt.backend_info()
print("backend", torch.cuda.get_allocator_backend(), info["library"], "built for", info["built_for"],
      "installed" if info["installed"] else "NOT installed")
print("config:", gvmalloc.stats()["config"])
'
fi

if want semantics; then
  rm -f "$OUT_DIR/torch-semantics/torch-semantics.txt"  # never a table of an earlier run
  args=(--deadline "$SEMANTICS_S")
  [ -n "${GVM_TORCH_CASES:-}" ] && args+=(--cases "$GVM_TORCH_CASES")
  OUT="$OUT_DIR" step semantics "$SEMANTICS_S" "$ROOT/tools/torch-semantics.sh" "$BUILD" "${args[@]}"
fi

if want programs; then
  rm -f "$OUT_DIR/torch-programs/torch-programs.txt"
  args=(--out "$OUT_DIR/torch-programs" --deadline "$PROGRAMS_S")
  [ -n "${GVM_TORCH_PROGRAMS:-}" ] && args+=(--programs "$GVM_TORCH_PROGRAMS")
  [ -n "${GVM_TORCH_ALLOCATORS:-}" ] && args+=(--allocators "$GVM_TORCH_ALLOCATORS")
  [ -n "${GVM_TORCH_ROUNDS:-}" ] && args+=(--rounds "$GVM_TORCH_ROUNDS")
  step programs "$PROGRAMS_S" "$PYTHON" "$ROOT/bench/torch_programs.py" "${args[@]}"
fi

if want lockstep; then
  rm -f "$OUT_DIR/torch-lockstep/torch-lockstep.txt"
  args=(--out "$OUT_DIR/torch-lockstep" --deadline "$LOCKSTEP_S")
  [ -n "${GVM_TORCH_PROGRAMS:-}" ] && args+=(--programs "$GVM_TORCH_PROGRAMS")
  [ -n "${GVM_TORCH_ALLOCATORS:-}" ] && args+=(--allocators "$GVM_TORCH_ALLOCATORS")
  [ -n "${GVM_TORCH_LOCKSTEP_PIN:-}" ] && args+=(--pin "$GVM_TORCH_LOCKSTEP_PIN")
  [ -n "${GVM_TORCH_LOCKSTEP_STEPS:-}" ] && args+=(--steps "$GVM_TORCH_LOCKSTEP_STEPS")
  step lockstep "$LOCKSTEP_S" "$PYTHON" "$ROOT/bench/torch_lockstep.py" "${args[@]}"
fi

{
  printf '\n=== torch-gpu-run summary (%d s, build %s)\n' "$((SECONDS - START))" "$BUILD"
  want info && [ -f "$OUT_DIR/info.log" ] && cat "$OUT_DIR/info.log"
  want semantics && [ -f "$OUT_DIR/torch-semantics/torch-semantics.txt" ] &&
    cat "$OUT_DIR/torch-semantics/torch-semantics.txt"
  if want programs && [ -f "$OUT_DIR/torch-programs/torch-programs.txt" ]; then
    # The three tables; the profiles under them stay in torch-programs.txt.
    sed -n -e '/^=== PyTorch programs/,/^$/p' -e '/^=== Where the time goes/,/^$/p' \
      -e "/^=== The GPU's side/,/^\$/p" \
      "$OUT_DIR/torch-programs/torch-programs.txt"
    echo "(the profiler's tables of every run: $OUT_DIR/torch-programs/torch-programs.txt)"
  fi
  if want lockstep && [ -f "$OUT_DIR/torch-lockstep/torch-lockstep.txt" ]; then
    # Both tables and the counters; a failed worker's stderr stays in the file.
    sed -e '/^--- /,$d' "$OUT_DIR/torch-lockstep/torch-lockstep.txt"
    echo "(every step's time: $OUT_DIR/torch-lockstep/torch-lockstep.json)"
  fi
  if [ ${#FAILED[@]} -eq 0 ]; then
    echo "every step passed"
  else
    printf 'FAILED: %s\n' "${FAILED[@]}"
  fi
} | tee "$OUT_DIR/summary.txt"
[ ${#FAILED[@]} -eq 0 ]
