#!/usr/bin/env bash
# tools/gpu-suite.sh: the whole check on a GPU machine, in one run.
#
#   OUT=/some/dir tools/gpu-suite.sh      (logs go to ./gpu-suite-out; with OUT
#                                          set, also packed into $OUT as
#                                          gpu-suite-logs.tgz + summary.txt + JSON)
#   GVM_SUITE_STEPS=build,tests,soak,sanitizer,python,bench,replay   (the default: all)
#   GVM_SOAK_SECONDS=180                                  (the soak step's length)
#   GVM_BENCH_ARGS="--benchmark_repetitions=5 ..."        (extra benchmark flags)
#
# 1. configure and build from scratch into build-gpu (Release, -j$(nproc));
#    without the step "build", the build-gpu already there is used
# 2. gvm-info (what the allocator sees)
# 3. ctest: every test; non-GPU labels in parallel, label gpu one at a time
#    (GPU tests time kernels and fill device memory: running them side by side
#    would make them measure each other); the soak in its own step (4)
# 4. the soak (tests/gpu_peer/soak.hpp) for GVM_SOAK_SECONDS
# 5. every binary with a gpu-labelled test under compute-sanitizer memcheck,
#    then racecheck, without the tests named *Unfenced* (they break a context
#    on purpose, in a child process); the soak runs 10 s under memcheck and is
#    left out of racecheck (why: below). Failed API
#    calls are not counted (--report-api-errors no): the tests make many on
#    purpose (bad input, out of memory, toggling peer access twice); memcheck
#    counts device-side memory errors, racecheck shared-memory hazards.
# 6. the Python tests (tools/python-tests.sh: PyTorch, CuPy, Numba, NCCL) and the
#    documented install, followed from a fresh prefix (tools/install-check.sh)
# 7. the benchmarks bench/gvm-bench-* (JSON) and gvm-replay on the GPT-2 trace
# 8. a short summary, last
#
# Each step's failure is reported and the run goes on, so one run gives the
# whole picture; the exit status is 1 if anything failed. Uses no network.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD="$ROOT/build-gpu"
OUT_DIR="$PWD/gpu-suite-out"
STEPS=",${GVM_SUITE_STEPS:-build,tests,soak,sanitizer,python,bench,replay},"
want() { [[ "$STEPS" == *",$1,"* ]]; }
JOBS=$(nproc 2>/dev/null || echo 4)
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)

FAILED=()     # "step: why" for every step that failed
SUMMARY=()    # lines of the final summary

note() { printf '\n=== %s\n' "$*"; }

# run_step NAME CMD...: runs CMD with its output in $OUT_DIR/NAME.log, says
# ok or FAILED (with the log's last lines), records a failure, and returns
# CMD's status. The logs hold everything; the terminal gets the outline.
run_step() {
  local name=$1
  shift
  local log="$OUT_DIR/$name.log"
  note "$name: $*"
  local start=$SECONDS
  "$@" >"$log" 2>&1
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    FAILED+=("$name: exit $rc (log: $log)")
    tail -n 30 "$log"
    echo "--- $name FAILED (exit $rc, $((SECONDS - start)) s, log: $log)"
  else
    echo "--- $name ok ($((SECONDS - start)) s)"
  fi
  return "$rc"
}

PYTHON=$(command -v python3 || true)
SANITIZER=$(command -v compute-sanitizer || true)
[ -z "$SANITIZER" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] &&
  SANITIZER=/usr/local/cuda/bin/compute-sanitizer

# --- 0. environment (for the record; a failure here fails nothing) ---------------
{
  date -u
  uname -a
  command -v nvidia-smi >/dev/null && nvidia-smi
  command -v nvidia-smi >/dev/null && nvidia-smi topo -m
  command -v nvcc >/dev/null && nvcc --version
  cmake --version | head -1
  "${CXX:-g++}" --version | head -1
  [ -n "$SANITIZER" ] && "$SANITIZER" --version | tail -1
  git -C "$ROOT" log -1 --oneline 2>/dev/null
} >"$OUT_DIR/environment.log" 2>&1

# --- 1. build ---------------------------------------------------------------------
BUILT=0
if ! want build; then
  if [ -f "$BUILD/CMakeCache.txt" ]; then
    BUILT=1
    SUMMARY+=("build: not asked for; using $BUILD as it is")
  else
    FAILED+=("build: not asked for and no $BUILD")
    SUMMARY+=("build: not asked for and no $BUILD: nothing below ran")
  fi
else
  rm -rf "$BUILD"
  # Without the PyTorch baseline: the suite must not depend on torch's headers
  # (tools/bench-all.sh builds it).
  if run_step configure cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGVM_BENCH_WITH_TORCH=OFF &&
    run_step build cmake --build "$BUILD" -j "$JOBS"; then
    BUILT=1
    SUMMARY+=("build: ok (Release, -j$JOBS)")
  else
    SUMMARY+=("build: FAILED: nothing below ran")
  fi
fi

if [ "$BUILT" = 1 ]; then
  # --- 2. gvm-info ----------------------------------------------------------------
  # Without a driver this fails, and so does the run: on the GPU machine,
  # GPU tests that all skip are a failure, not a pass.
  run_step gvm-info "$BUILD/tools/gvm-info" && cat "$OUT_DIR/gvm-info.log"

  # --- 3. ctest -------------------------------------------------------------------
  ctest --test-dir "$BUILD" --show-only=json-v1 >"$OUT_DIR/ctest-tests.json" 2>/dev/null
  if want tests; then
  run_step ctest-nongpu ctest --test-dir "$BUILD" -LE '^gpu$' -j "$JOBS" --output-on-failure \
    --timeout 600 --output-junit "$OUT_DIR/ctest-nongpu.xml"
  # The soak has a step of its own (below) when it is asked for.
  SOAK_EXCLUDE=()
  want soak && SOAK_EXCLUDE=(-LE '^soak$')
  run_step ctest-gpu ctest --test-dir "$BUILD" -L '^gpu$' "${SOAK_EXCLUDE[@]}" -j 1 --output-on-failure \
    --timeout 900 --output-junit "$OUT_DIR/ctest-gpu.xml"
  cat "$OUT_DIR/ctest-nongpu.log" "$OUT_DIR/ctest-gpu.log" >"$OUT_DIR/ctest.log" 2>/dev/null

  if [ -n "$PYTHON" ]; then
    # Passed / failed / skipped per label, and what the hazard tests observed.
    while IFS= read -r line; do SUMMARY+=("$line"); done < <("$PYTHON" - "$OUT_DIR" <<'PY'
import json, sys, os, re, collections
import xml.etree.ElementTree as ET
out = sys.argv[1]
labels = {}
try:
    for t in json.load(open(os.path.join(out, "ctest-tests.json")))["tests"]:
        ls = []
        for p in t.get("properties", []):
            if p["name"] == "LABELS":
                ls = p["value"]
        labels[t["name"]] = ls or ["(no label)"]
except Exception as e:
    print("tests: cannot read the test list: %s" % e)
counts = collections.defaultdict(lambda: collections.Counter())
failed = []
hazards = []
for f in ("ctest-nongpu.xml", "ctest-gpu.xml"):
    path = os.path.join(out, f)
    if not os.path.exists(path):
        continue
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        print("tests: %s unreadable: %s" % (f, e))
        continue
    for tc in root.iter("testcase"):
        name = tc.get("name")
        if tc.find("failure") is not None or tc.get("status") == "fail":
            state = "failed"
            failed.append(name)
        elif tc.find("skipped") is not None or tc.get("status") in ("notrun", "disabled"):
            state = "skipped"
        else:
            state = "passed"
        for l in labels.get(name, ["(no label)"]):
            counts[l][state] += 1
        text = tc.findtext("system-out") or ""
        # The hazard reports (tests/gpu/hazard_scenarios.cpp): key=value lines.
        for block in re.findall(r"(scenario=.*?)(?:\n---|\Z)", text, re.S):
            kv = dict(l.split("=", 1) for l in block.splitlines() if "=" in l)
            hazards.append("  %s fenced=%s: pending=%s change=%s sync=%s later=%s" % (
                kv.get("scenario"), kv.get("fenced"), kv.get("pending_before_change", "-"),
                kv.get("change", "-"), kv.get("sync", "-"), kv.get("later", "-")))
for l in sorted(counts):
    c = counts[l]
    print("tests %-6s %d passed, %d failed, %d skipped" % (l + ":", c["passed"], c["failed"], c["skipped"]))
for n in failed[:10]:
    print("  FAILED: %s" % n)
if len(failed) > 10:
    print("  ... and %d more failures (ctest.log)" % (len(failed) - 10))
if hazards:
    print("hazards observed:")
    for h in hazards:
        print(h)
PY
)
  else
    SUMMARY+=("tests: see ctest.log (no python3 for the per-label counts)")
  fi
  fi  # want tests

  # --- 4. the soak ------------------------------------------------------------------
  SOAK_BIN="$BUILD/tests/gpu_peer/gvm_gpu_soak_test"
  if ! want soak; then
    SUMMARY+=("soak: not asked for (GVM_SUITE_STEPS)")
  elif [ ! -x "$SOAK_BIN" ]; then
    FAILED+=("soak: $SOAK_BIN not built")
    SUMMARY+=("soak: NOT RUN ($SOAK_BIN not built)")
  else
    run_step soak env GVM_SOAK_SECONDS="${GVM_SOAK_SECONDS:-180}" "$SOAK_BIN"
    rc=$?
    # The report's key=value lines (soak.hpp's to_string), the headline ones.
    soak_line=$(grep -E '^(seconds|allocations|frees|out_of_memory|scratch_blocks|direct_copies|staged_copies|policy_switches|switches_with_work_queued|trims|trims_with_work_queued|access_checks|ordinary_block_peer_access|wrong_words|control_failures|device[01]_reserved_after_trim|device[01]_free_memory_delta|device[01]_final_sync|error|invariants)=' \
      "$OUT_DIR/soak.log" | tr '\n' ' ')
    grep -q "SKIPPED" "$OUT_DIR/soak.log" && { FAILED+=("soak: skipped on a GPU machine"); rc=skipped; }
    SUMMARY+=("soak: exit $rc: $soak_line")
  fi

  # --- 5. compute-sanitizer: memcheck, then racecheck ------------------------------
  if ! want sanitizer; then
    SUMMARY+=("sanitizer: not asked for (GVM_SUITE_STEPS)")
  elif [ -z "$SANITIZER" ]; then
    FAILED+=("sanitizer: compute-sanitizer not found")
    SUMMARY+=("sanitizer: NOT RUN (compute-sanitizer not found)")
  elif [ -z "$PYTHON" ]; then
    FAILED+=("sanitizer: python3 needed to find the gpu test binaries")
    SUMMARY+=("sanitizer: NOT RUN (no python3)")
  else
    mapfile -t GPU_BINARIES < <("$PYTHON" - "$OUT_DIR/ctest-tests.json" <<'PY'
import json, sys
seen = []
for t in json.load(open(sys.argv[1]))["tests"]:
    ls = [p["value"] for p in t.get("properties", []) if p["name"] == "LABELS"]
    if ls and "gpu" in ls[0] and t.get("command"):
        exe = t["command"][0]
        if exe not in seen:
            seen.append(exe)
print("\n".join(seen))
PY
)
    for tool in memcheck racecheck; do
      total_errors=0
      for bin in "${GPU_BINARIES[@]}"; do
        [ -n "$bin" ] || continue
        name=$(basename "$bin")
        # racecheck leaves the soak out: its kernels are the four test
        # kernels the other binaries run under racecheck too (none uses shared
        # memory, which is what racecheck examines), and with kernels launched
        # from several threads at once (4 or 8) the tool fails on its own:
        # "Internal Sanitizer Error: Detected a failure to track a kernel
        # launch" in 4 of 5 runs on an H200 pair (counted in its summary as a
        # hazard), and one run did not end within 100 s. memcheck runs it.
        if [ "$tool" = racecheck ] && [ "$name" = gvm_gpu_soak_test ]; then
          SUMMARY+=("racecheck $name: left out (see tools/gpu-suite.sh)")
          continue
        fi
        run_step "$tool-$name" env GVM_SOAK_SECONDS=10 timeout 1800 "$SANITIZER" --tool "$tool" \
          --report-api-errors no --error-exitcode 99 \
          "$bin" '--gtest_filter=-*Unfenced*'
        rc=$?
        # memcheck: "ERROR SUMMARY: n errors"; racecheck: "RACECHECK SUMMARY:
        # n hazards displayed (e errors, w warnings)".
        log="$OUT_DIR/$tool-$name.log"
        if [ "$tool" = memcheck ]; then
          errors=$(grep -Eo 'ERROR SUMMARY: [0-9]+' "$log" | tail -1 | grep -Eo '[0-9]+$')
        else
          errors=$(grep -Eo 'RACECHECK SUMMARY: [0-9]+' "$log" | tail -1 | grep -Eo '[0-9]+$')
          [ -z "$errors" ] && grep -q 'ERROR SUMMARY: 0' "$log" && errors=0
        fi
        errors=${errors:-unknown}
        internal=$(grep -c 'Internal Sanitizer Error' "$log")
        [ "$errors" != unknown ] && total_errors=$((total_errors + errors))
        tests_run=$(grep -Eo '\[  PASSED  \] [0-9]+' "$log" | grep -Eo '[0-9]+$')
        SUMMARY+=("$tool $name: $errors errors/hazards ($internal internal to the tool), ${tests_run:-?} tests passed, exit $rc")
      done
      SUMMARY+=("$tool total: $total_errors")
    done
    [ "${#GPU_BINARIES[@]}" -eq 0 ] && SUMMARY+=("sanitizer: no gpu test binaries found")
  fi

  # --- 6. the Python tests (PyTorch, CuPy, NCCL) --------------------------------------
  if ! want python; then
    SUMMARY+=("python: not asked for (GVM_SUITE_STEPS)")
  else
    run_step python "$ROOT/tools/python-tests.sh" "$BUILD"
    rc=$?
    # python-tests.sh ends with its own summary: the figures, then pytest's line.
    while IFS= read -r line; do SUMMARY+=("  $line"); done < <(sed -n '/^=== python-tests summary/,$p' "$OUT_DIR/python.log")
    SUMMARY+=("python: exit $rc")
    # The documented install (cmake --install to a prefix), used as a user would.
    run_step install-check "$ROOT/tools/install-check.sh" "$BUILD"
    rc=$?
    while IFS= read -r line; do SUMMARY+=("  $line"); done < <(grep '^install-check' "$OUT_DIR/install-check.log")
    SUMMARY+=("install-check: exit $rc")
  fi

  # --- 7. benchmarks ------------------------------------------------------------------
  shopt -s nullglob
  # The suite's own benchmarks (tools/bench-all.sh runs the whole set, with
  # the PyTorch baseline): GVM_SUITE_BENCHES="alloc peer" by default.
  BENCHES=()
  for b in ${GVM_SUITE_BENCHES:-alloc peer}; do BENCHES+=("$BUILD/bench/gvm-bench-$b"); done
  shopt -u nullglob
  want bench || BENCHES=()
  for b in "${BENCHES[@]}"; do
    if [ ! -f "$b" ] || [ ! -x "$b" ]; then continue; fi
    name=$(basename "$b")
    # shellcheck disable=SC2086
    run_step "$name" "$b" --benchmark_format=json --benchmark_out="$OUT_DIR/$name.json" \
      --benchmark_out_format=json ${GVM_BENCH_ARGS:-}
    rc=$?
    if [ -n "$PYTHON" ] && [ -s "$OUT_DIR/$name.json" ]; then
      while IFS= read -r line; do SUMMARY+=("$line"); done < <("$PYTHON" - "$OUT_DIR/$name.json" "$name" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("%s: unreadable JSON (%s)" % (sys.argv[2], e)); sys.exit()
bs = d.get("benchmarks", [])
errs = [b["name"] for b in bs if b.get("error_occurred")]
print("%s: %d results, %d errors" % (sys.argv[2], len(bs), len(errs)))
# Headline: medians when repetitions were run, else the plain results.
pick = [b for b in bs if b.get("aggregate_name") == "median"] or \
       [b for b in bs if b.get("run_type", "iteration") == "iteration" and not b.get("error_occurred")]
for b in pick[:8]:
    extra = ""
    if "items_per_second" in b:
        extra = ", %.3g items/s" % b["items_per_second"]
    print("  %-50s %10.1f %s%s" % (b["name"][:50], b.get("real_time", 0), b.get("time_unit", ""), extra))
if len(pick) > 8:
    print("  ... %d more in %s" % (len(pick) - 8, sys.argv[1]))
PY
)
    else
      SUMMARY+=("$name: exit $rc, no JSON results")
    fi
  done
  if ! want bench; then
    SUMMARY+=("benchmarks: not asked for (GVM_SUITE_STEPS)")
  elif [ "${#BENCHES[@]}" -eq 0 ]; then
    SUMMARY+=("benchmarks: none built (bench/gvm-bench-*)")
  fi

  REPLAY="$BUILD/bench/gvm-replay"
  TRACE="$ROOT/traces/gpt2_train.trace.gz"
  if ! want replay; then
    SUMMARY+=("gvm-replay: not asked for (GVM_SUITE_STEPS)")
  elif [ -x "$REPLAY" ] && [ -f "$TRACE" ]; then
    note "gvm-replay: $REPLAY --driver cuda --json $TRACE"
    "$REPLAY" --driver cuda --json "$TRACE" >"$OUT_DIR/gvm-replay.json" 2>"$OUT_DIR/gvm-replay.log"
    rc=$?
    cat "$OUT_DIR/gvm-replay.log"
    if [ "$rc" -ne 0 ]; then
      FAILED+=("gvm-replay: exit $rc (log: $OUT_DIR/gvm-replay.log)")
      SUMMARY+=("gvm-replay: FAILED (exit $rc)")
    elif [ -n "$PYTHON" ]; then
      while IFS= read -r line; do SUMMARY+=("$line"); done < <("$PYTHON" - "$OUT_DIR/gvm-replay.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("gvm-replay: unreadable JSON (%s)" % e); sys.exit()
scalars = [(k, v) for k, v in d.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)]
print("gvm-replay (gpt2_train, real driver):")
for k, v in scalars[:10]:
    print("  %s: %s" % (k, v))
PY
)
    else
      SUMMARY+=("gvm-replay: ok (gvm-replay.json)")
    fi
  else
    SUMMARY+=("gvm-replay: not run (no $REPLAY or no $TRACE)")
  fi
fi

# --- 8. summary -----------------------------------------------------------------------
{
  echo
  echo "==================== gpu-suite summary ===================="
  for line in "${SUMMARY[@]}"; do echo "$line"; done
  if [ "${#FAILED[@]}" -eq 0 ]; then
    echo "RESULT: all steps passed"
  else
    echo "RESULT: ${#FAILED[@]} step(s) failed:"
    for f in "${FAILED[@]}"; do echo "  $f"; done
  fi
  echo "logs: $OUT_DIR"
} | tee "$OUT_DIR/summary.txt"

# The device tool brings back a few files only: the logs packed in one.
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  tar -C "$OUT_DIR" -czf "$OUT/gpu-suite-logs.tgz" . 2>/dev/null
  cp "$OUT_DIR/summary.txt" "$OUT/" 2>/dev/null
  for j in "$OUT_DIR"/gvm-bench-*.json "$OUT_DIR"/gvm-replay.json; do
    [ -f "$j" ] && cp "$j" "$OUT/"
  done
fi

[ "${#FAILED[@]}" -eq 0 ]
