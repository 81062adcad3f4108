#!/usr/bin/env bash
# tools/bench-all.sh: every benchmark and trace replay, gvmalloc side by side
# with PyTorch's allocator (default and expandable segments) and
# cudaMallocAsync, on a GPU machine, in one run of about 6-10 minutes (every
# shipped trace replayed with every allocator included).
#
#   tools/bench-all.sh [RESULTS_DIR]      (default bench-out)
#   OUT=/some/dir tools/bench-all.sh      also packs RESULTS_DIR into
#                                         $OUT/bench-results.tgz (+ summary.txt)
#   GVM_BENCH_REBUILD=1                   configure build-gpu afresh
#   GVM_BENCH_BUILD=DIR                   another build directory than build-gpu
#   GVM_BENCH_REPS=5                      repetitions (medians are reported)
#   GVM_BENCH_MIN_TIME=0.2                seconds per repetition (microbenchmarks)
#   GVM_BENCH_GROWTH_FILTER=gvm_cuda      which growth/trim cases (a benchmark filter)
#   GVM_BENCH_SKIP_PEER=1                 leave out gvm-bench-peer
#   GVM_BENCH_COMMIT="abc1234 subject"    the commit env.json names, for a copy of
#                                         the tree whose .git is not its own
#
# Then: tools/bench-report.py RESULTS_DIR   (writes docs/benchmarks.md + plots)
#       tools/bench-report.py RESULTS_DIR --readme README.md --peers traces/peers.csv
#
# Builds (or reuses) build-gpu, Release; PyTorch's baseline is built when
# python3 imports torch, also in a build-gpu that tools/gpu-suite.sh left
# configured without it. Each step's failure is reported and the run goes on;
# the exit status is 1 if any step failed. Uses no network.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD="${GVM_BENCH_BUILD:-$ROOT/build-gpu}"
RES="${1:-$PWD/bench-out}"
REPS="${GVM_BENCH_REPS:-5}"
MIN_TIME="${GVM_BENCH_MIN_TIME:-0.2}"
JOBS=$(nproc 2>/dev/null || echo 4)
TRACE="$ROOT/traces/gpt2_train.trace.gz"
ARGS=(--benchmark_repetitions="$REPS" --benchmark_report_aggregates_only=true)
EXPANDABLE="expandable_segments:True"
mkdir -p "$RES"
RES=$(cd "$RES" && pwd)
rm -f "$RES"/*.json "$RES"/*.csv "$RES"/*.log
START=$SECONDS
FAILED=()
DONE=()

# step NAME TIMEOUT_S CMD...: output to $RES/NAME.log; records ok / FAILED.
step() {
  local name=$1 limit=$2
  shift 2
  printf '=== %s (limit %ss): %s\n' "$name" "$limit" "$*"
  local t=$SECONDS
  timeout "$limit" "$@" >"$RES/$name.log" 2>&1
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    tail -n 15 "$RES/$name.log"
    FAILED+=("$name: exit $rc$([ "$rc" = 124 ] && echo ' (timed out)') (log: $name.log)")
  fi
  DONE+=("$name: exit $rc, $((SECONDS - t)) s")
  return "$rc"
}

# --- build --------------------------------------------------------------------------
TARGETS=(gvm-bench-alloc gvm-bench-mt gvm-bench-growth gvm-bench-peer gvm-replay gvm-replay-baseline)
if [ "${GVM_BENCH_REBUILD:-0}" = 1 ] || [ ! -f "$BUILD/CMakeCache.txt" ]; then
  step configure 300 cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGVM_BENCH_WITH_TORCH=ON
elif grep -q '^GVM_BENCH_WITH_TORCH:BOOL=OFF' "$BUILD/CMakeCache.txt"; then
  # tools/gpu-suite.sh configures build-gpu without the PyTorch baseline; reusing
  # that cache as it is would leave every torch column of this run empty.
  step configure 300 cmake -S "$ROOT" -B "$BUILD" -DGVM_BENCH_WITH_TORCH=ON
fi
if ! step build 600 cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}"; then
  # The PyTorch baseline compiles against whatever torch is installed; if its
  # headers do not fit, measure the rest rather than nothing.
  echo "build failed: trying again without the PyTorch baseline (build.log says why)"
  cp "$RES/build.log" "$RES/build-with-torch.log" 2>/dev/null
  step configure-without-torch 300 cmake -S "$ROOT" -B "$BUILD" -DGVM_BENCH_WITH_TORCH=OFF
  step build 600 cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}"
fi
grep -h "torch" "$RES/configure.log" 2>/dev/null | head -2
B="$BUILD/bench"

# --- the machine, for the report ----------------------------------------------------
PY=$(command -v python3 || true)
if [ -n "$PY" ]; then
  "$PY" - "$RES/env.json" "$0 $*" "${ARGS[*]} --benchmark_min_time=$MIN_TIME (and, where a binary has them, --benchmark_min_warmup_time=0.1 --benchmark_enable_random_interleaving=true)" "$ROOT" <<'PY'
import json, os, platform, subprocess, sys, datetime
def run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
    except Exception:
        return ""
smi = run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]).splitlines()
gpus = [l.split(", ") for l in smi if l]
cuda = ""
for l in run(["nvidia-smi"]).splitlines():
    if "CUDA Version" in l:
        cuda = l.split("CUDA Version:")[1].strip(" |")
cpu = ""
for l in run(["lscpu"]).splitlines():
    if l.startswith("Model name:"):
        cpu = l.split(":", 1)[1].strip()
torch = run([sys.executable, "-c", "import torch; print(torch.__version__)"])
# The commit measured: GVM_BENCH_COMMIT when given; else the tree's HEAD,
# said to differ when tracked files do not match it (a copy of the tree with
# an older .git named a commit that was not the one measured).
commit = os.environ.get("GVM_BENCH_COMMIT", "")
if not commit:
    commit = run(["git", "-C", sys.argv[4], "log", "-1", "--format=%h %s"]) or "unknown"
    changed = [l for l in run(["git", "-C", sys.argv[4], "status", "--porcelain",
                               "--untracked-files=no"]).splitlines() if l.strip()]
    if changed:
        commit += " (the working tree differs from it in %d tracked file%s)" % (
            len(changed), "" if len(changed) == 1 else "s")
env = {
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    "host": platform.node(),
    "gpu": "%d× %s" % (len(gpus), gpus[0][0]) if gpus else "none found",
    "driver_version": gpus[0][1] if gpus and len(gpus[0]) > 1 else "unknown",
    "cuda_version": cuda or "unknown",
    "cpu": cpu or platform.processor(),
    "nproc": os.cpu_count(),
    "torch_version": torch or "not installed",
    "commit": commit,
    "command": sys.argv[2],
    "bench_args": sys.argv[3],
}
json.dump(env, open(sys.argv[1], "w"), indent=1)
PY
fi

# --- microbenchmarks ----------------------------------------------------------------
bench() {  # bench NAME LIMIT BINARY [ARGS...]
  local name=$1 limit=$2 bin=$3
  shift 3
  if [ ! -x "$bin" ]; then
    FAILED+=("$name: $bin not built")
    return 1
  fi
  # A warm-up before each benchmark's timed runs, for every allocator alike
  # (Google Benchmark 1.7 and later): the first benchmark of a binary no
  # longer pays for the host's clock ramp and first page faults.
  local warm=() help
  help=$("$bin" --help 2>/dev/null)
  grep -q benchmark_min_warmup_time <<<"$help" && warm=(--benchmark_min_warmup_time=0.1)
  # The repetitions of every benchmark in random order through the binary's
  # run (Google Benchmark 1.6 and later), for every allocator alike: on a
  # shared host a slow stretch of a few seconds otherwise lands on all the
  # repetitions of whichever benchmarks ran then, and their medians with it
  # (2026-12-02, one H200 host: the same binary's pair 20-24 ns in one
  # minute, 30-46 ns in the next).
  grep -q benchmark_enable_random_interleaving <<<"$help" &&
    warm+=(--benchmark_enable_random_interleaving=true)
  step "$name" "$limit" "$bin" --benchmark_out="$RES/$name.json" --benchmark_out_format=json \
    "${ARGS[@]}" "${warm[@]}" --benchmark_min_time="$MIN_TIME" "$@"
}
bench alloc 200 "$B/gvm-bench-alloc"
PYTORCH_CUDA_ALLOC_CONF=$EXPANDABLE bench alloc-expandable 100 "$B/gvm-bench-alloc" \
  --benchmark_filter=/torch
bench mt 150 "$B/gvm-bench-mt" --benchmark_filter=-gvm_sim
PYTORCH_CUDA_ALLOC_CONF=$EXPANDABLE bench mt-expandable 60 "$B/gvm-bench-mt" \
  --benchmark_filter=/torch
# One fresh allocator per repetition; the time is one growth, not a minimum.
step growth 200 "$B/gvm-bench-growth" --benchmark_out="$RES/growth.json" \
  --benchmark_out_format=json "${ARGS[@]}" --benchmark_filter="${GVM_BENCH_GROWTH_FILTER:-gvm_cuda}"
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "${GVM_BENCH_SKIP_PEER:-0}" = 1 ]; then
  DONE+=("peer: skipped (GVM_BENCH_SKIP_PEER=1; tools/gpu-suite.sh runs it too)")
elif [ "${GPUS:-0}" -ge 2 ]; then
  bench peer 150 "$B/gvm-bench-peer"
else
  DONE+=("peer: skipped (${GPUS:-0} GPU(s); it needs 2)")
fi

# --- trace replay -------------------------------------------------------------------
step replay-gvmalloc 120 bash -c "'$B/gvm-replay' --driver cuda --repeat $REPS --json \
  --timeline '$RES/timeline-gvmalloc.csv' --timeline-every 20 '$TRACE' >'$RES/replay-gvmalloc.json'"
step replay-torch 120 bash -c "'$B/gvm-replay-baseline' --impl torch --repeat $REPS --json \
  --timeline '$RES/timeline-torch.csv' --timeline-every 20 '$TRACE' >'$RES/replay-torch.json'"
step replay-torch_expandable 120 env PYTORCH_CUDA_ALLOC_CONF=$EXPANDABLE bash -c \
  "'$B/gvm-replay-baseline' --impl torch --repeat $REPS --json \
  --timeline '$RES/timeline-torch_expandable.csv' --timeline-every 20 '$TRACE' \
  >'$RES/replay-torch_expandable.json'"
step replay-async 120 bash -c "'$B/gvm-replay-baseline' --impl async --repeat $REPS --json \
  '$TRACE' >'$RES/replay-async.json'"
# Every shipped trace (traces/peers.csv lists them) with every allocator: the
# table of gvm-replay's main job and the README, measured side by side.
for t in $(sed -n 's/^\([a-z0-9_]*\),.*/\1/p' "$ROOT/traces/peers.csv" | sort -u); do
  [ "$t" = trace ] && continue
  T="$ROOT/traces/$t.trace.gz"
  step "traces-gvmalloc-$t" 120 bash -c "'$B/gvm-replay' --driver cuda --repeat $REPS --json \
    '$T' >'$RES/traces-gvmalloc-$t.json'"
  step "traces-torch-$t" 180 bash -c "'$B/gvm-replay-baseline' --impl torch --repeat $REPS --json \
    '$T' >'$RES/traces-torch-$t.json'"
  step "traces-torch_expandable-$t" 180 env PYTORCH_CUDA_ALLOC_CONF=$EXPANDABLE bash -c \
    "'$B/gvm-replay-baseline' --impl torch --repeat $REPS --json '$T' \
    >'$RES/traces-torch_expandable-$t.json'"
  step "traces-async-$t" 180 bash -c "'$B/gvm-replay-baseline' --impl async --repeat $REPS --json \
    '$T' >'$RES/traces-async-$t.json'"
done
# A failed replay leaves an empty JSON file; the report must not read it.
for f in "$RES"/replay-*.json "$RES"/traces-*.json; do [ -s "$f" ] || rm -f "$f"; done

# --- report, pack, summary ----------------------------------------------------------
if [ -n "$PY" ]; then
  "$PY" "$ROOT/tools/bench-report.py" "$RES" --out "$RES/benchmarks.md" --img "$RES/img" \
    >"$RES/report.log" 2>&1 || FAILED+=("report: tools/bench-report.py failed (report.log)")
fi
{
  echo
  echo "==================== bench-all summary ($((SECONDS - START)) s) ===================="
  for d in "${DONE[@]}"; do echo "$d"; done
  if [ -s "$RES/benchmarks.md" ]; then
    # The replay table and the targets: the headline figures.
    sed -n '/^## Targets/,/^## Alloc/p' "$RES/benchmarks.md" | sed '$d'
    sed -n '/^| allocator | ratio/,/^$/p' "$RES/benchmarks.md"
    sed -n '/^## Every shipped trace/,/^## Peer/p' "$RES/benchmarks.md" | sed '$d'
  fi
  if [ "${#FAILED[@]}" -eq 0 ]; then
    echo "RESULT: all steps passed"
  else
    echo "RESULT: ${#FAILED[@]} step(s) failed:"
    for f in "${FAILED[@]}"; do echo "  $f"; done
  fi
  echo "results: $RES (tools/bench-report.py $RES writes docs/benchmarks.md)"
} | tee "$RES/summary.txt"

if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  tar -C "$RES" -czf "$OUT/bench-results.tgz" . && cp "$RES/summary.txt" "$OUT/"
fi
[ "${#FAILED[@]}" -eq 0 ]
