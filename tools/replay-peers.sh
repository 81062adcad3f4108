#!/usr/bin/env bash
# Traces replayed on the GPU under gvmalloc and each peer, as tools/bench-all.sh
# does for the shipped traces: one JSON per (allocator, trace) in RESULTS_DIR.
# Without TRACE arguments, the synthetic traces (tools/synth_traces.py,
# regenerated into RESULTS_DIR/traces: same seed, same events); with them,
# those (e.g. the workloads bench/record_workloads.py records). On a machine
# with a GPU and PyTorch:
#
#   tools/replay-peers.sh RESULTS_DIR [TRACE...]
#   GVM_BENCH_BUILD=<build dir> GVM_BENCH_REPS=3 tools/replay-peers.sh RESULTS_DIR
#
# then `python3 tools/replay-peers-report.py RESULTS_DIR` prints the table.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RES="${1:?usage: tools/replay-peers.sh RESULTS_DIR [TRACE...]}"
shift
BUILD="${GVM_BENCH_BUILD:-$ROOT/build-bench}"
REPS="${GVM_BENCH_REPS:-3}"
mkdir -p "$RES"
[ -f "$BUILD/CMakeCache.txt" ] || cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >"$RES/configure.log" 2>&1
cmake --build "$BUILD" -j "$(nproc)" --target gvm-replay gvm-replay-baseline >"$RES/build.log" 2>&1 ||
  { tail -20 "$RES/build.log"; exit 1; }
TRACES=("$@")
if [ "${#TRACES[@]}" -eq 0 ]; then
  mkdir -p "$RES/traces"
  python3 "$ROOT/tools/synth_traces.py" "$RES/traces" >/dev/null || exit 1
  TRACES=("$RES"/traces/*.trace.gz)
fi
B="$BUILD/bench"
rc=0
for T in "${TRACES[@]}"; do
  t="$(basename "$T" .trace.gz)"
  timeout 180 "$B/gvm-replay" --driver cuda --repeat "$REPS" --json "$T" >"$RES/gvmalloc-$t.json" || rc=1
  timeout 180 "$B/gvm-replay-baseline" --impl torch --repeat "$REPS" --json "$T" >"$RES/torch-$t.json" || rc=1
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 180 \
    "$B/gvm-replay-baseline" --impl torch --repeat "$REPS" --json "$T" >"$RES/torch_expandable-$t.json" || rc=1
  timeout 180 "$B/gvm-replay-baseline" --impl async --repeat "$REPS" --json "$T" >"$RES/async-$t.json" || rc=1
done
exit $rc
