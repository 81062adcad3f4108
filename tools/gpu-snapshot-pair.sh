#!/usr/bin/env bash
# On a GPU machine with PyTorch: records one small run with gvmalloc.record_trace
# and torch.cuda.memory._dump_snapshot (tools/gpu-snapshot-pair.py), and
# replays the snapshot with gvm-replay --snapshot. Under a minute after the
# build (the build of gvm-replay alone: a minute or two).
#
#   OUT=/some/dir tools/gpu-snapshot-pair.sh
#
# Writes $OUT/paired_snapshot.pickle, $OUT/paired_record.trace.gz (copy both
# into tests/python/data/: the CPU test then checks they read to the same
# events), $OUT/paired_replay.txt and $OUT/check.txt (that test, run here).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT="${OUT:-$PWD/gpu-snapshot-pair}"
BUILD="${GVM_BUILD:-$ROOT/build-gpu}"
mkdir -p "$OUT"
if [ ! -x "$BUILD/bench/gvm-replay" ]; then
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >"$OUT/configure.log" 2>&1
  cmake --build "$BUILD" -j "$(nproc)" --target gvm-replay >"$OUT/build.log" 2>&1
fi
GVM_REPLAY="$BUILD/bench/gvm-replay" python3 "$ROOT/tools/gpu-snapshot-pair.py" "$OUT"
# The CPU test on the fresh pair, here and now.
(cd "$ROOT/tests/python" && GVM_SNAPSHOT_PAIR_DIR="$OUT" PYTHONPATH="$ROOT/integrations/python" \
   python3 -m unittest -v test_snapshot_cpu.SnapshotAndRecordTraceOfOneRun) >"$OUT/check.txt" 2>&1 || true
tail -n 4 "$OUT/check.txt"
