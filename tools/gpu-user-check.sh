#!/usr/bin/env bash
# tools/gpu-user-check.sh: on a GPU machine, in one go (a few minutes), what a
# user meets first, beyond what tools/gpu-suite.sh already measures:
#
#   OUT=/some/dir tools/gpu-user-check.sh [BUILD_DIR]     (BUILD_DIR: build-gpu)
#
# 1. configure (Release, with the PyTorch baseline where torch is installed)
#    unless BUILD_DIR is configured already, and build it;
# 2. gvm-info on the real driver;
# 3. gvm-bench-alloc and gvm-bench-mt through the backend layer, unfiltered and
#    short (--benchmark_min_time=0.05): every allocator runs, a "left out" line
#    only for what the build lacks, no "ERROR OCCURRED";
# 4. gvm-replay on the real driver and gvm-replay-baseline (async, torch);
# 5. the CTests of the messages, the bench layer and the install;
# 6. the Numba plugin on the GPU (tools/python-tests.sh -k numba).
# Logs go to $OUT (default ./gpu-user-check-out), one per step, and a summary
# is printed last and written to $OUT/summary.txt. Exit 1 if a step failed.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-$ROOT/build-gpu}
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
OUT=${OUT:-$PWD/gpu-user-check-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
JOBS=$(nproc 2>/dev/null || echo 4)
SUMMARY=()
FAILED=0

step() {  # step NAME CMD...: CMD's output in $OUT/NAME.log, its status in the summary
  local name=$1
  shift
  printf '\n=== %s: %s\n' "$name" "$*"
  local start=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 15 "$OUT/$name.log"
  SUMMARY+=("$name: exit $rc ($((SECONDS - start)) s)")
  [ "$rc" -eq 0 ] || FAILED=1
  return "$rc"
}

if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  step configure cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release || exit 1
fi
step build cmake --build "$BUILD" -j "$JOBS" || { printf '%s\n' "${SUMMARY[@]}"; exit 1; }

step gvm-info "$BUILD/tools/gvm-info"
step bench-alloc "$BUILD/bench/gvm-bench-alloc" --benchmark_min_time=0.05
step bench-mt "$BUILD/bench/gvm-bench-mt" --benchmark_min_time=0.05
step replay "$BUILD/bench/gvm-replay" --driver cuda
step replay-async "$BUILD/bench/gvm-replay-baseline" --impl async
step replay-torch "$BUILD/bench/gvm-replay-baseline" --impl torch
step ctest ctest --test-dir "$BUILD" --output-on-failure -j 4 \
  -R 'leaves_out|bad_gvm_conf|one_line|timeline_unwritable|without_events|install_and_build|gvm_info|skip_summary|docs_design_notes|Config\.|TraceReader'
step numba "$ROOT/tools/python-tests.sh" "$BUILD" -k numba

for b in bench-alloc bench-mt; do
  SUMMARY+=("$b: $(grep -c 'ERROR OCCURRED' "$OUT/$b.log") ERROR OCCURRED, $(grep -c '^BM_' "$OUT/$b.log") results")
  while IFS= read -r line; do SUMMARY+=("  $line"); done < <(grep 'left out' "$OUT/$b.log")
done
for r in replay replay-async replay-torch; do
  while IFS= read -r line; do SUMMARY+=("$r: $line"); done < <(grep -E '^(allocator|ratio|ns per op)|^gvm-replay' "$OUT/$r.log")
done
while IFS= read -r line; do SUMMARY+=("$line"); done < <(grep -E '^numba:|passed|failed|skipped|SKIPPED' "$OUT/numba.log" | tail -n 4)

printf '\n=== summary (logs in %s)\n' "$OUT"
printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/summary.txt"
exit "$FAILED"
