#!/usr/bin/env bash
# tools/bench-old-vs-new.sh: an earlier revision of gvmalloc and this tree, side
# by side on one GPU, so that "no slower than before" is judged within one run
# (between runs minutes apart the same binary moves by 20-60% on a shared host:
# docs/design-notes.md, "Known limits").
#
#   tools/bench-old-vs-new.sh OLD [ROUNDS] [OUT_DIR]
#
#   OLD      a revision of this repository (git archive), or a directory holding
#            that revision's source tree, or a .tar of it (one top directory)
#   ROUNDS   rounds of old then new (default 3)
#   OUT_DIR  where the JSON and the summary go (default ./old-vs-new-out)
#   GVM_OVN_ORDER="new old"  the order within a round (default "old new"), to
#            see whether running second favours either
#
# Builds gvm-bench-mt and gvm-bench-alloc of both (Release, no tests), then per
# round runs old then new: BM_threads on gvm_cuda at 1, 8 and 16 threads,
# BM_pair on gvm_cuda at every size and BM_mixed (its time is per two
# operations), medians of 3 repetitions each. Prints one
# table (tools/bench-old-vs-new.py) with every round's figure and the median
# over the rounds, old beside new; writes it to OUT_DIR/summary.txt.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OLD=${1:?usage: tools/bench-old-vs-new.sh OLD [ROUNDS] [OUT_DIR]}
ROUNDS=${2:-3}
OUT_DIR=${3:-$PWD/old-vs-new-out}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
JOBS=$(nproc 2>/dev/null || echo 4)

if [ -d "$OLD" ]; then
  OLD_SRC=$(cd "$OLD" && pwd)
elif [ -f "$OLD" ]; then
  mkdir -p "$WORK/old-src"
  tar -xf "$OLD" -C "$WORK/old-src"
  OLD_SRC=$(find "$WORK/old-src" -mindepth 1 -maxdepth 1 -type d | head -1)
else
  mkdir -p "$WORK/old-src"
  git -C "$ROOT" archive "$OLD" | tar -x -C "$WORK/old-src"
  OLD_SRC="$WORK/old-src"
fi

build() {  # build SRC DIR LOG
  cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DGVM_BUILD_TESTS=OFF \
        -DGVM_BUILD_TORCH_BACKEND=OFF >"$3" 2>&1
  cmake --build "$2" -j"$JOBS" --target gvm-bench-mt gvm-bench-alloc >>"$3" 2>&1
}
echo "building the old revision ($OLD) and this tree"
build "$OLD_SRC" "$WORK/old" "$OUT_DIR/build-old.log"
build "$ROOT" "$WORK/new" "$OUT_DIR/build-new.log"

FLAGS=(--benchmark_repetitions=3 --benchmark_report_aggregates_only=true
       --benchmark_min_time=0.2 --benchmark_out_format=json)
for round in $(seq 1 "$ROUNDS"); do
  for which in ${GVM_OVN_ORDER:-old new}; do
    echo "round $round: $which"
    "$WORK/$which/bench/gvm-bench-mt" "${FLAGS[@]}" \
        --benchmark_filter='BM_threads/gvm_cuda/.*threads:(1|8|16)$' \
        --benchmark_out="$OUT_DIR/mt-$which-$round.json" >"$OUT_DIR/mt-$which-$round.log" 2>&1
    "$WORK/$which/bench/gvm-bench-alloc" "${FLAGS[@]}" \
        --benchmark_filter='BM_(pair|mixed)/gvm_cuda/' \
        --benchmark_out="$OUT_DIR/pair-$which-$round.json" >"$OUT_DIR/pair-$which-$round.log" 2>&1
  done
done
python3 "$ROOT/tools/bench-old-vs-new.py" "$OUT_DIR" "$OLD" | tee "$OUT_DIR/summary.txt"
