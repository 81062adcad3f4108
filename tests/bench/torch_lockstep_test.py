#!/usr/bin/env python3
"""bench/torch_lockstep.py without torch or a GPU: its workers are replaced by
a fake worker (plain Python, written here into a temporary directory) whose
step times are given, and its clock by the sum of the fake seconds the workers
report, so that the rotation, the paired ratios with their median and
interval, the bit-equality column, a worker that dies, hangs or fails to start,
the environment of each worker and the --deadline are checked on any machine.
Usage: torch_lockstep_test.py PATH/TO/torch_lockstep.py
"""
import gc
import importlib.util
import io
import json
import math
import os
import shlex
import sys
import tempfile
import time
from contextlib import redirect_stdout

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)


def load(path):
    spec = importlib.util.spec_from_file_location("torch_lockstep", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The fake worker. $FAKE_LOCKSTEP is a JSON object: "clock" (a file it appends
# its fake seconds to: "startup" when ready, each step's time), "log" (a file
# of events: start, ready, step k, end), "times" {alloc or program/alloc: [step
# seconds, cycled]}, and per allocator (or program/allocator): "die_at" /
# "hang_at" / "diverge_at" a step, "die_at_start", "warm_diverge",
# "exit_after_end" an exit status.
FAKE_WORKER = r'''
import json, os, sys, time
spec = json.loads(os.environ["FAKE_LOCKSTEP"])
assert sys.argv[1] == "worker", sys.argv
program, alloc, steps = sys.argv[2], sys.argv[3], int(sys.argv[4])

def get(key, default=None):
    d = spec.get(key, {})
    return d.get(program + "/" + alloc, d.get(alloc, default))

def append(path, text):
    with open(path, "a") as f:
        f.write(text + "\n")

def log(event):
    append(spec["log"], "%s %s %s" % (program, alloc, event))

log("start pid=%d steps=%d conf=%s pythonpath=%s cpus=%s" % (
    os.getpid(), steps, os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), os.environ.get("PYTHONPATH", ""),
    ",".join(map(str, sorted(os.sched_getaffinity(0))))))
# Chatter: more than a pipe holds, on both streams, and lines like the protocol's.
sys.stderr.write(("warming up %s\n" % alloc) * 20000)
sys.stdout.write("loading weights\n" * 10000)
print("GVM_LOCKSTEPX {\"ready\": true}")
sys.stdout.flush()
time.sleep(0.05)
if get("die_at_start"):
    sys.stderr.write("fake failure before ready\n")
    sys.exit(4)
append(spec["clock"], repr(spec.get("startup", 10.0)))
log("ready")
warm = ["w0", "w1x" if get("warm_diverge") else "w1"]
print("GVM_LOCKSTEP " + json.dumps({"ready": True, "warm_checks": warm, "backend": "fake"}), flush=True)
times = get("times", [1.0])
k = 0
while True:
    line = sys.stdin.readline()
    if not line:
        sys.exit(1)
    cmd = line.strip()
    if cmd == "step":
        if get("die_at") == k:
            sys.stderr.write("fake crash at step %d\n" % k)
            sys.stderr.flush()
            os._exit(3)
        if get("hang_at") == k:
            time.sleep(120)
        t = times[k % len(times)]
        append(spec["clock"], repr(t))
        log("step %d" % k)
        print("chatter between steps")
        d = get("diverge_at")
        c = ("x%d" if d is not None and k >= d else "c%d") % k
        # What step_diag.py would say: half of the step on the CPU, and
        # gvmalloc's driver a tenth of it; a step of a second or more sampled.
        diag = {"cpu_ms": t * 500, "off_cpu_ms": t * 500, "gc_ms": 0.25, "gc_runs": 1,
                "ctx_switches": [k, 1], "faults": [2 * k, 0], "jit_cache_new": 4 if t >= 1.0 else 0}
        if alloc.startswith("gvm"):
            diag["gvmalloc"] = {"driver_ms": t * 100, "fences": 1, "chunks_mapped": 0}
        if t >= 1.0:
            diag["stacks"] = {"samples": 7, "samples_the_wall_allows": int(t / 0.005),
                              "top": [[5, "models.py:12 forward < train.py:3 step"], [2, "x.py:1 f"]]}
        print("GVM_LOCKSTEP " + json.dumps({"t": t, "check": c, "diag": diag}), flush=True)
        k += 1
    elif cmd == "profile":
        log("profile")
        if get("hang_in_profile"):
            time.sleep(120)
        busy = {"native": 20.0, "expandable": 21.0}.get(alloc, 22.0)
        print("GVM_LOCKSTEP " + json.dumps({"profile": {
            "steps": 3, "gpu": {"gpu_busy_ms_per_step": busy, "gpu_idle_ms_per_step": 5.0,
                                "gpu_span_ms_per_step": busy + 5.0, "gpu_activities_per_step": 900.0},
            "all_ops_self_cpu_ms_per_step": 30.0, "alloc_ops_self_cpu_ms_per_step": 1.5,
            "alloc_ops_calls_per_step": 500.0, "all_ops": {}, "by_op": {}}}), flush=True)
    elif cmd == "end":
        log("end")
        out = {"steps": k, "peak_reserved": {"native": 1000, "expandable": 950}.get(alloc, 900) << 20,
               "backend": "fake"}
        if alloc.startswith("gvm"):
            out["gvmalloc"] = {"lockstep_steps": {"chunks_mapped": 0, "driver_calls": 2}}
        print("GVM_LOCKSTEP " + json.dumps(out), flush=True)
        sys.exit(get("exit_after_end", 0))
    else:
        print("GVM_LOCKSTEP " + json.dumps({"error": "unknown " + cmd}), flush=True)
'''


# The script's own worker() on stand-ins of torch and gvmalloc: the program is
# built by a fake builder whose step chatters on stdout (Python's and the
# descriptor's, without a newline), which worker() must keep off its protocol.
REAL_WORKER = r'''
import importlib.util, os, sys, time, types
spec = importlib.util.spec_from_file_location("torch_lockstep", sys.argv[1])
tl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tl)
state = {"i": 0}
cuda = types.SimpleNamespace(synchronize=lambda: None, max_memory_reserved=lambda: 123 << 20,
                             get_allocator_backend=lambda: "fake-backend",
                             memory_stats=lambda: {"allocation.all.allocated": 5 * state["i"]})
torch = types.ModuleType("torch")
torch.cuda = cuda
gvmalloc = types.ModuleType("gvmalloc")
gvmalloc.stats = lambda: {"devices": [{"chunks_mapped": state["i"], "chunks_unmapped": 0, "fences": 0}],
                          "driver_calls": {"cuMemMap": {"calls": state["i"], "ns": 10 ** 6 * state["i"]}}}
sys.modules["gvmalloc"] = gvmalloc

def slow_part():
    # A kernel compiled from PTX, as the driver would cache it.
    d = os.path.join(os.environ["CUDA_CACHE_PATH"], "a", "2")
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, "daf1"), "w").close()
    time.sleep(0.3)

def build(allocator, steps):
    def step():
        state["i"] += 1
        if state["i"] == 6:  # the last of 4 paired steps, after 2 warm-up steps
            slow_part()
        sys.stdout.write("progress %d%%" % state["i"])
        sys.stdout.flush()
        os.write(1, b"[C chatter]")
        return state["i"]
    return tl.tp.Built(torch, step, lambda out: "loss%d" % out, 2, steps, 1)

def profile_table(torch, step, n):
    # torch.profiler is not here: the steps run as the profiler would run them.
    for _ in range(n):
        step()
    return "(table)", {"steps": n, "gpu": None, "all_ops_self_cpu_ms_per_step": 7.25,
                       "alloc_ops_self_cpu_ms_per_step": 0.5, "alloc_ops_calls_per_step": 3.0}

tl.tp.BUILDERS = {p: build for p in tl.tp.BUILDERS}
tl.tp.profile_table = profile_table
sys.exit(tl.main(sys.argv[2:]))
'''


class Runner:
    def __init__(self, tl, d):
        self.tl, self.d, self.n = tl, d, 0
        fake = os.path.join(d, "fake_worker.py")
        with open(fake, "w") as f:
            f.write(FAKE_WORKER)
        os.environ[tl.WORKER_ENV] = "%s %s" % (shlex.quote(sys.executable), shlex.quote(fake))

    def run(self, argv, spec):
        """main(argv) with the fake workers of `spec`: (rc, printed, json, log lines, out dir, s)."""
        self.n += 1
        base = os.path.join(self.d, "run%d" % self.n)
        os.makedirs(base)
        spec = dict(spec, clock=os.path.join(base, "clock"), log=os.path.join(base, "log"))
        for f in (spec["clock"], spec["log"]):
            open(f, "w").close()
        os.environ["FAKE_LOCKSTEP"] = json.dumps(spec)

        def clock():
            with open(spec["clock"]) as f:
                return sum(float(x) for x in f.read().split())

        self.tl.clock = clock
        out_dir = os.path.join(base, "out")
        out = io.StringIO()
        t0 = time.monotonic()
        with redirect_stdout(out):
            rc = self.tl.main(["--out", out_dir] + argv)
        seconds = time.monotonic() - t0
        with open(os.path.join(out_dir, "torch-lockstep.json")) as f:
            js = json.load(f)
        with open(spec["log"]) as f:
            log = f.read().splitlines()
        with open(os.path.join(out_dir, "torch-lockstep.txt")) as f:
            check(f.read().strip() in out.getvalue(), "the text file holds the printed tables")
        return rc, out.getvalue(), js, log, out_dir, seconds


def pids_of(log):
    return [int(l.split("pid=")[1].split()[0]) for l in log if " start pid=" in l]


def all_gone(pids):
    for pid in pids:
        try:
            os.kill(pid, 0)
            return False
        except ProcessLookupError:
            pass
        except PermissionError:
            return False
    return True


def rows(text, program, allocator, ref=None):
    """The table rows of (program, allocator[, vs ref]) split in words."""
    out = []
    for l in text.splitlines():
        w = l.split()
        if w[:2] == [program, allocator] and (ref is None or (len(w) > 2 and w[2] == ref)):
            out.append(w)
    return out


def unit_checks(tl):
    # median_ci: ranks from the binomial(n, 1/2) tails, on shuffled input.
    xs = [float(x) for x in range(1, 101)]
    shuffled = xs[::7] + [x for x in xs if x not in xs[::7]]
    check(tl.median_ci(xs[:5]) is None, "5 values: no 95% interval")
    lo, hi, cov = tl.median_ci(list(reversed(xs[:6])))
    check((lo, hi) == (1.0, 6.0) and abs(cov - (1 - 2 / 64)) < 1e-12, "n=6: min-max, 96.9%%: %s %s %s"
          % (lo, hi, cov))
    lo, hi, cov = tl.median_ci(xs[:10][::-1])
    check((lo, hi) == (2.0, 9.0) and abs(cov - (1 - 22 / 1024)) < 1e-12, "n=10: ranks 2, 9: %s %s %s"
          % (lo, hi, cov))
    lo, hi, cov = tl.median_ci(xs[:20])
    check((lo, hi) == (6.0, 15.0) and abs(cov - (1 - 2 * 21700 / 2 ** 20)) < 1e-12,
          "n=20: ranks 6, 15: %s %s %s" % (lo, hi, cov))
    lo, hi, cov = tl.median_ci(shuffled)
    check((lo, hi) == (40.0, 61.0) and cov >= 0.95, "n=100: ranks 40, 61: %s %s %s" % (lo, hi, cov))
    lo, hi, cov = tl.median_ci(xs[:20], level=0.99)
    check((lo, hi) == (4.0, 17.0) and cov >= 0.99, "n=20 at 99%%: ranks 4, 17: %s %s %s" % (lo, hi, cov))
    # Every n up to 60: the coverage is at least 95%, and one rank further in is not.
    for n in range(6, 61):
        lo, hi, cov = tl.median_ci(xs[:n])
        j = int(lo)
        tail = sum(math.comb(n, i) for i in range(j)) / 2 ** n
        wider = sum(math.comb(n, i) for i in range(j + 1)) / 2 ** n
        if not (hi == n + 1 - j and cov >= 0.95 and abs(cov - (1 - 2 * tail)) < 1e-12 and wider > 0.025):
            check(False, "n=%d: ranks %s, %s, coverage %s" % (n, lo, hi, cov))
            break
    check(tl.quartiles([4.0, 1.0, 3.0, 2.0, 5.0]) == (2.0, 3.0, 4.0), "quartiles of 1..5")
    check(tl.quartiles([7.0]) == (7.0, 7.0, 7.0), "quartiles of one value")
    check(tl.rotation(["a", "b", "c"], 0) == ["a", "b", "c"] and tl.rotation(["a", "b", "c"], 4) ==
          ["b", "c", "a"], "rotation")
    # The slowest step: found among steps with readings, none without them;
    # a gvmalloc step without a driver call says so.
    diag = lambda ms, calls: {"cpu_ms": ms, "off_cpu_ms": 0.0, "gc_ms": 0.0, "ctx_switches": [1, 0],  # noqa: E731
                              "faults": [3, 0], "gvmalloc": {"driver_ms": 0.0, "driver_calls": calls}}
    run = {"times_s": [0.1, 0.4, 0.1], "diags": [diag(100.0, 2), diag(400.0, 0), diag(100.0, 2)]}
    sl = tl.slowest_step(run)
    check(sl["step"] == 1 and sl["x_median"] == 4.0 and sl["median_diag"]["cpu_ms"] == 100.0,
          "slowest_step: %s" % sl)
    text = "\n".join(tl.render_slowest([{"program": "gpt2", "allocators": ["gvm"],
                                          "runs": {"gvm": dict(run, slowest=sl)}}]))
    check("gvmalloc in that step: no driver call" in text, "a step without driver calls:\n" + text)
    check(text.splitlines()[3].split()[-1] == "—", "no JIT cache reading: a dash:\n" + text)
    check(tl.slowest_step({"times_s": [0.1, 0.2], "diags": [None, None]}) is None and
          tl.render_slowest([{"program": "gpt2", "allocators": ["gvm"], "runs": {"gvm": {"slowest": None}}}]) == [],
          "no readings (an older worker): no slowest step, no table")
    # Where the driver's JIT cache is: $CUDA_CACHE_PATH, none when disabled;
    # a directory not made yet holds 0 files.
    sd = tl.step_diag
    saved = {k: os.environ.pop(k, None) for k in ("CUDA_CACHE_PATH", "CUDA_CACHE_DISABLE")}
    os.environ["CUDA_CACHE_PATH"] = "/nonexistent-jit-cache"
    check(sd.jit_cache_dir() == "/nonexistent-jit-cache" and sd.jit_cache_files(sd.jit_cache_dir()) == 0,
          "an unmade cache directory: 0 files")
    os.environ["CUDA_CACHE_DISABLE"] = "1"
    check(sd.jit_cache_dir() is None and sd.jit_cache_files(None) is None, "a disabled cache: no reading")
    for k, v in saved.items():
        os.environ.pop(k, None)
        if v is not None:
            os.environ[k] = v
    # The cache's walk is not the step's: a walk of 0.2 s of CPU around an
    # empty step leaves its CPU time near zero.
    def slow_walk(path, real=sd.jit_cache_files):
        t0 = time.process_time()
        while time.process_time() - t0 < 0.2:
            pass
        return real(path)
    sd.jit_cache_files, real_walk = slow_walk, sd.jit_cache_files
    try:
        w = sd.StepWatch()
        w.begin()
        out = w.end(0.001)
        gc.callbacks.remove(w._on_gc)
    finally:
        sd.jit_cache_files = real_walk
    check(out["cpu_ms"] < 100, "the JIT cache's walk counted in the step's CPU: %s" % out)
    s = tl.ratio_stats([1.0] * 6, [2.0] * 6)
    check(s["verdict"] == "at or below" and s["median"] == 0.5, "ratios all 0.5: %s" % s)
    s = tl.ratio_stats([3.0] * 6, [2.0] * 6)
    check(s["verdict"] == "above", "ratios all 1.5: %s" % s["verdict"])
    s = tl.ratio_stats([1.0] * 5, [2.0] * 5)
    check(s["verdict"] == "too few steps", "5 steps: %s" % s["verdict"])


def main(path):
    tl = load(path)
    unit_checks(tl)
    tl.STARTUP_GUESS_S, tl.END_RESERVE_S, tl.MIN_ROUNDS = 20.0, 5.0, 6
    tl.READY_TIMEOUT_S, tl.STEP_TIMEOUT_S, tl.END_TIMEOUT_S = 60.0, 60.0, 30.0
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "garbage"  # removed for every worker but expandable's
    with tempfile.TemporaryDirectory() as d:
        r = Runner(tl, d)

        # gpt2: a drift d_k shared by all, gvm = native x ratio_k (exact binary
        # fractions), expandable = native; gvm's checks differ from step 4.
        # llama: gvm 0.875 x native, expandable 1.25 x native; expandable's
        # warm-up differs.
        drift = [1, 2, 4, 1, 2, 4, 8, 1, 2, 4]
        ratio = [0.875, 1.0, 0.75, 1.125, 0.875, 0.9375, 1.25, 0.875, 1.0, 0.8125]
        native = [x * 0.125 for x in drift]
        spec = {"times": {"gpt2/native": native, "gpt2/expandable": native,
                          "gpt2/gvm": [a * b for a, b in zip(native, ratio)],
                          "llama/native": [0.5, 1.0, 2.0], "llama/expandable": [0.625, 1.25, 2.5],
                          "llama/gvm": [0.4375, 0.875, 1.75]},
                "diverge_at": {"gpt2/gvm": 4}, "warm_diverge": {"llama/expandable": True}}
        rc, text, js, log, out_dir, _ = r.run(["--programs", "gpt2,llama", "--steps", "10"], spec)
        check(rc == 0, "exit status %d with every worker passing:\n%s" % (rc, text))
        allocs = ["native", "expandable", "gvm"]
        # Started one at a time: each ready before the next starts.
        starts = [l.split()[:3] for l in log if l.split()[2] in ("start", "ready")]
        check(starts == [[p, a, e] for p in ("gpt2", "llama") for a in allocs for e in ("start", "ready")],
              "workers start one at a time, each ready before the next: %s" % starts)
        # The steps in rotating order, all of one program's workers alive together.
        steps = [l.split()[:2] + [int(l.split()[3])] for l in log if l.split()[2] == "step"]
        want = [[p, a, k] for p in ("gpt2", "llama") for k in range(10) for a in tl.rotation(allocs, k)]
        check(steps == want, "the steps' order: %s" % steps[:12])
        events = [l.split()[:3] for l in log if l.startswith("gpt2") or l.startswith("llama")]
        first_llama = next(i for i, e in enumerate(events) if e[0] == "llama")
        check(all(e[2] == "end" for e in events[first_llama - 3:first_llama]) and
              sum(1 for e in events[:first_llama] if e[2] == "end") == 3,
              "gpt2's three workers end before llama's first starts: %s" % events[first_llama - 4:first_llama + 1])
        check(all_gone(pids_of(log)), "no worker is left running")
        gpt2_events = [e for e in events if e[0] == "gpt2"]
        profiles = [e[1] for e in gpt2_events if e[2] == "profile"]
        last_step = max(i for i, e in enumerate(gpt2_events) if e[2] == "step")
        first_end = min(i for i, e in enumerate(gpt2_events) if e[2] == "end")
        check(profiles == tl.rotation(allocs, 10) and
              all(last_step < i < first_end for i, e in enumerate(gpt2_events) if e[2] == "profile"),
              "each worker profiled once, after the paired steps and before any end, in the next "
              "round's order: %s" % gpt2_events[-8:])
        prof = [w for w in rows(text, "gpt2", "gvm") if len(w) == 7 and w[2] == "22.000"]
        check(prof == [["gpt2", "gvm", "22.000", "5.000", "30.000", "1.500", "500.0"]],
              "gvm's profile row: %s" % rows(text, "gpt2", "gvm"))
        env = {l.split()[1]: l for l in log if l.startswith("gpt2") and " start " in l}
        check("conf=None" in env["native"] and "conf=None" in env["gvm"] and
              "conf=expandable_segments:True" in env["expandable"],
              "PYTORCH_CUDA_ALLOC_CONF per worker: %s" % list(env.values()))
        check(all(os.path.join("integrations", "python") in v for v in env.values()),
              "integrations/python on every worker's PYTHONPATH")
        check("steps=10" in env["gvm"], "the worker is given the steps")
        p = {x["program"]: x for x in js["programs"]}
        g = p["gpt2"]["runs"]["gvm"]["vs"]["native"]
        check(g["n"] == 10 and g["ratios"] == ratio, "gvm's per-step ratios are the given ones: %s" % g.get("ratios"))
        check(g["median"] == 0.90625 and g["q1"] == 0.875 and g["q3"] == 1.0,
              "gvm vs native median 0.90625, quartiles 0.875, 1.0: %s %s %s" % (g["median"], g["q1"], g["q3"]))
        check(g["ci"] == [0.8125, 1.125] and abs(g["ci_coverage"] - (1 - 22 / 1024)) < 1e-12,
              "gvm vs native interval: ranks 2 and 9 of 10: %s" % g["ci"])
        check(g["at_or_below"] == 8 and g["verdict"] == "undecided", "8 of 10 at or below, undecided: %s %s"
              % (g["at_or_below"], g["verdict"]))
        check(p["gpt2"]["runs"]["gvm"]["vs"]["expandable"]["ratios"] == ratio, "gvm vs expandable = vs native")
        check(p["gpt2"]["runs"]["native"]["median_s"] == 0.25 and p["gpt2"]["runs"]["native"]["min_s"] == 0.125,
              "native's median and min step")
        check(p["gpt2"]["paired_steps"] == 10 and not p["gpt2"]["stopped"], "all 10 paired steps")
        row = rows(text, "gpt2", "gvm", "native")
        check(row == [["gpt2", "gvm", "native", "0.906", "0.875", "1.000", "0.812-1.125", "(97.9%)",
                       "8", "of", "10", "undecided"]], "gpt2 gvm vs native row: %s" % row)
        row = rows(text, "llama", "gvm", "native")
        check(row == [["llama", "gvm", "native", "0.875", "0.875", "0.875", "0.875-0.875", "(97.9%)",
                       "10", "of", "10", "at", "or", "below"]], "llama gvm vs native row: %s" % row)
        row = rows(text, "llama", "expandable", "native")
        check(row and row[0][3] == "1.250" and row[0][-1] == "above", "llama expandable vs native: %s" % row)
        row = rows(text, "llama", "gvm", "expandable")
        check(row and row[0][3] == "0.700" and row[0][-3:] == ["at", "or", "below"],
              "llama gvm vs expandable: %s" % row)
        check(not rows(text, "gpt2", "native", "native"), "no allocator against itself")
        # The first table: median ms, min, q1, q3, max, peak, equal to native.
        row = rows(text, "gpt2", "gvm")[0]
        check(row[2] == "10" and " ".join(row).endswith("900 MiB no (from step 4)"),
              "gpt2 gvm's checks differ from step 4: %s" % row)
        check(" ".join(rows(text, "gpt2", "expandable")[0]).endswith("950 MiB yes"), "gpt2 expandable equal")
        check(" ".join(rows(text, "gpt2", "native")[0][2:4]) == "10 250.00", "native's row: %s"
              % rows(text, "gpt2", "native")[0])
        check(" ".join(rows(text, "llama", "expandable")[0]).endswith("no (from warm-up step 1)"),
              "llama expandable's warm-up differs: %s" % rows(text, "llama", "expandable")[0])
        check(" ".join(rows(text, "llama", "gvm")[0]).endswith("MiB yes"), "llama gvm equal")
        check("gpt2, gvm: gvmalloc over the paired steps: chunks_mapped 0, driver_calls 2" in text,
              "gvmalloc's counters")
        # The slowest step: gvm's step 6 (1.25 s, 5 x its median of 0.25 s),
        # with what the worker saw in it beside the median step's readings.
        sl = p["gpt2"]["runs"]["gvm"]["slowest"]
        check(sl["step"] == 6 and sl["t_s"] == 1.25 and sl["x_median"] == 5.0 and
              sl["median_diag"] == {"cpu_ms": 125.0, "off_cpu_ms": 125.0, "gc_ms": 0.25, "driver_ms": 25.0},
              "gvm's slowest step: %s" % sl)
        row = [w for w in rows(text, "gpt2", "gvm") if len(w) > 3 and w[2] == "6"]
        check(row == [["gpt2", "gvm", "6", "1250.00", "5.00", "625.00", "(125.00)", "625.00", "(125.00)",
                       "0.25", "(0.25)", "125.00", "(25.00)", "6/1", "12/0", "+4"]], "gvm's slowest-step row: %s" % row)
        check("gvmalloc in that step: driver_ms 125.0, fences 1" in text, "its counters in that step")
        check("its Python stack, 7 samples (the wall allows 250):" in text and
              "5  models.py:12 forward < train.py:3 step" in text, "its sampled stacks")
        row = [w for w in rows(text, "gpt2", "native") if len(w) > 3 and w[2] == "6"]
        check(len(row) == 1 and row[0][11] == "—" and row[0][12:] == ["6/1", "12/0", "+4"], "native's slowest step, no driver column: %s" % row)
        check(os.path.exists(os.path.join(out_dir, "workers", "gpt2-gvm.log")) and
              "warming up gvm" in open(os.path.join(out_dir, "workers", "gpt2-gvm.log")).read(),
              "each worker's stderr in a file")
        # The defaults: per program steps (--steps not given).
        rc, text, js, log, _, _ = r.run(["--programs", "llama,gpt2", "--allocators", "native,gvm"], {})
        p = {x["program"]: x for x in js["programs"]}
        check(rc == 0 and p["llama"]["paired_steps"] == 6 and p["gpt2"]["paired_steps"] == 40,
              "default steps: llama 6, gpt2 40: %s" % {k: v.get("paired_steps") for k, v in p.items()})
        check(rows(text, "gpt2", "gvm", "native") and not rows(text, "gpt2", "gvm", "expandable"),
              "no expandable run: no column against it")
        check("Across processes" not in text, "one process an allocator: no table across processes")

        # Two processes an allocator: every process paired with every other, and
        # the table across processes (exact binary fractions of a shared drift).
        drift = [1, 2, 4, 1, 2, 4, 8, 1]
        native = [x * 0.125 for x in drift]
        spec = {"times": {"native": native, "native#2": native,
                          "gvm": [x * 0.875 for x in native], "gvm#2": [x * 0.75 for x in native]}}
        rc, text, js, log, _, _ = r.run(["--programs", "gpt2", "--steps", "8",
                                         "--allocators", "native,native#2,gvm,gvm#2"], spec)
        g = js["programs"][0]
        check(rc == 0, "two processes an allocator: exit status %d" % rc)
        check(sorted(g["runs"]["gvm#2"]["vs"]) == ["gvm", "native", "native#2"] and
              g["runs"]["gvm#2"]["vs"]["native#2"]["median"] == 0.75,
              "gvm#2 paired with every other process: %s" % sorted(g["runs"]["gvm#2"]["vs"]))
        across = {(c["allocator"], c["vs"]): c for c in g["across"]}
        c = across.get(("gvm", "native"), {})
        check(c.get("pairs") == 4 and c.get("lowest") == 0.75 and c.get("highest") == 0.875 and
              c.get("verdicts") == {"at or below": 4}, "gvm against native over 4 pairs: %s" % c)
        c = across.get(("native", "native"), {})
        check(c.get("pairs") == 1 and c.get("lowest") == 1.0 and c.get("highest") == 1.0,
              "native against itself, one pair (not both ways): %s" % c)
        c = across.get(("gvm", "gvm"), {})
        check(c.get("pairs") == 1 and abs(c.get("lowest", 0) - 0.875 / 0.75) < 1e-12 and
              c.get("verdicts") == {"above": 1}, "gvm ÷ gvm#2 above: %s" % c)
        check(["gpt2", "gvm", "native", "4", "0.750", "0.875", "at", "or", "below", "4"] in
              [w for w in rows(text, "gpt2", "gvm")], "the across row of gvm: %s" % rows(text, "gpt2", "gvm"))
        check(["gpt2", "gvm", "itself", "1", "1.167", "1.167", "above", "1"] in rows(text, "gpt2", "gvm"),
              "the row of gvm against itself")

        # A worker dying mid-run: reported with its stderr's end, the others ended, the next program runs.
        spec = {"die_at": {"gpt2/gvm": 3}, "exit_after_end": {"llama/native": 5}}
        rc, text, js, log, _, _ = r.run(["--programs", "gpt2,llama", "--steps", "8"], spec)
        p = {x["program"]: x for x in js["programs"]}
        check(rc == 1, "a dead worker makes the exit status 1")
        err = p["gpt2"]["runs"]["gvm"].get("error", "")
        check("step 3" in err and "exit 3" in err, "the death is reported: %s" % err)
        check("fake crash at step 3" in p["gpt2"]["runs"]["gvm"].get("stderr", ""), "with its stderr")
        check("--- gpt2, gvm FAILED" in text and "fake crash at step 3" in text, "the stderr tail in the text")
        check(rows(text, "gpt2", "gvm")[0][2] == "FAILED:", "the table says FAILED: %s" % rows(text, "gpt2", "gvm"))
        check(p["gpt2"]["paired_steps"] == 3 and len(p["gpt2"]["runs"]["native"]["times_s"]) == 3,
              "only the whole rounds are kept: %s" % p["gpt2"]["paired_steps"])
        ends = [l.split()[:2] for l in log if l.split()[2] == "end"]
        check(["gpt2", "native"] in ends and ["gpt2", "expandable"] in ends and ["gpt2", "gvm"] not in ends,
              "the others are ended: %s" % ends)
        check(p["llama"]["paired_steps"] == 8, "the next program still runs")
        # gvm died in step 3's round after native, which went first (rotation 3 of 3):
        # native took 4 steps, 3 of them paired, and is not a failure for that.
        check(p["gpt2"]["failed"] == ["gvm"], "only gvm failed: %s" % p["gpt2"]["failed"])
        check("exit 5" in p["llama"]["runs"]["native"].get("error", ""),
              "a worker that exits 5 after its end answer is reported: %s" % p["llama"]["runs"]["native"])
        check(all_gone(pids_of(log)), "no worker is left running after a death")

        # A profile that hangs costs its worker the profile and the end answer, not its
        # steps; --pin puts every worker on the CPUs named.
        tl.PROFILE_STEP_FACTOR, tl.PROFILE_SLACK_S = 0.0, 1.0
        mine = os.sched_getaffinity(0)
        cpu = min(mine)
        spec = {"hang_in_profile": {"gpt2/gvm": True}}
        rc, text, js, log, _, seconds = r.run(["--programs", "gpt2", "--steps", "7", "--pin", str(cpu)], spec)
        tl.PROFILE_STEP_FACTOR, tl.PROFILE_SLACK_S = 20.0, 30.0
        p = js["programs"][0]
        g = p["runs"]["gvm"]
        check(rc == 0 and p["paired_steps"] == 7 and len(g["times_s"]) == 7 and g["vs"]["native"]["n"] == 7,
              "a hung profile keeps its worker's steps (exit %d): %s" % (rc, p.get("paired_steps")))
        check("no answer to 'profile' within 1 s" in g.get("profile_error", ""),
              "the hung profile is reported: %s" % g.get("profile_error"))
        check(["gpt2", "gvm", "no", "profile:"] in [w[:4] for w in rows(text, "gpt2", "gvm")],
              "the profile table says so: %s" % rows(text, "gpt2", "gvm"))
        check("peak_reserved" not in g and "peak_reserved" in p["runs"]["native"],
              "no end answer from the killed worker, the others' as usual")
        check(seconds < 30, "the hung profile is given up in time (%.0f s)" % seconds)
        check(all_gone(pids_of(log)), "no worker is left running after a hung profile")
        starts = [l for l in log if " start " in l]
        check(len(starts) == 3 and all(l.endswith("cpus=%d" % cpu) for l in starts),
              "every worker on the CPU of --pin: %s" % [l.split()[-1] for l in starts])
        check(os.sched_getaffinity(0) == mine, "the coordinator's own CPUs are given back: %s"
              % sorted(os.sched_getaffinity(0)))
        for bad in ("x", "99999", ""):
            try:
                tl.parse_cpus(bad)
                check(False, "--pin %r is refused" % bad)
            except SystemExit as e:
                check("--pin" in str(e), "--pin %r refused: %s" % (bad, e))
        check(tl.parse_cpus("%d-%d,%d" % (cpu, cpu, cpu)) == {cpu}, "a range and a repeat")

        # A hung worker: given up after the step timeout, killed; one that dies before ready.
        tl.STEP_TIMEOUT_S = 1.0
        spec = {"hang_at": {"gpt2/expandable": 2}, "die_at_start": {"llama/expandable": True}}
        rc, text, js, log, _, seconds = r.run(["--programs", "gpt2,llama", "--steps", "6"], spec)
        tl.STEP_TIMEOUT_S = 60.0
        p = {x["program"]: x for x in js["programs"]}
        err = p["gpt2"]["runs"]["expandable"].get("error", "")
        check(rc == 1 and "no answer to 'step' within 1 s" in err, "the hang is reported: %s" % err)
        check(seconds < 40, "the hang is given up in time (%.0f s)" % seconds)
        check(p["gpt2"]["paired_steps"] == 2, "two paired steps before the hang")
        err = p["llama"]["runs"]["expandable"].get("error", "")
        check("no answer to 'ready'" in err and "exit 4" in err, "death before ready: %s" % err)
        started = [l.split()[1] for l in log if l.startswith("llama") and " start " in l]
        check(started == ["native", "expandable"], "no worker starts after one failed to: %s" % started)
        check(rows(text, "llama", "gvm") == [["llama", "gvm", "not", "started", "(a", "worker", "before", "it",
                                              "failed)"]], "gvm not started: %s" % rows(text, "llama", "gvm"))
        check(p["llama"]["paired_steps"] == 0 and ["llama", "native", "end"] in [l.split()[:3] for l in log],
              "the ready one is ended")
        check(all_gone(pids_of(log)), "no worker is left running after a hang")

        # --deadline 80 with fake seconds: each worker 10 s to start, each step 1 s, two
        # allocators. resnet50 (the first: 2 x 20 s guessed) is ready at 20 s, its share
        # ends at 80/3: 6 rounds (the minimum) to 32 s; gpt2 (2 x 1.2 x 10 = 24 s expected,
        # 48 left) ready at 52 s, share to 56 s: 6 rounds, 64 s; llama: 16 s left, not run.
        spec = {"startup": 10.0, "times": {"native": [1.0], "gvm": [1.0]}}
        rc, text, js, log, _, _ = r.run(["--allocators", "native,gvm", "--steps", "30", "--deadline", "80"], spec)
        p = {x["program"]: x for x in js["programs"]}
        check(rc == 0, "a deadline is not a failure (exit %d)" % rc)
        check(p["resnet50"].get("paired_steps") == 6 and p["gpt2"].get("paired_steps") == 6,
              "steps under --deadline 80: %s" % {k: v.get("paired_steps") for k, v in p.items()})
        check("stopped after 6 of 30 paired steps by the --deadline" in text, "a program cut short says so")
        check("llama     not run: 16 s left of the --deadline, starting its 2 workers takes about 24 s"
              in text, "the program not started says why:\n" + text)
        check(not any(l.startswith("llama") for l in log), "llama's workers never start")
        # --deadline 200: the shares (200/3, then half of the 134 s left) end resnet50 and gpt2
        # after 23 rounds; llama, ready at 152 s, runs to the deadline less 5 s: 21 rounds.
        rc, text, js, log, _, _ = r.run(["--allocators", "native,gvm", "--steps", "30", "--deadline", "200"], spec)
        p = {x["program"]: x for x in js["programs"]}
        got = [p[x].get("paired_steps") for x in ("resnet50", "gpt2", "llama")]
        check(got == [23, 23, 21], "steps under --deadline 200: %s" % got)
        check(js["seconds"] <= 200, "the run ends by the deadline (%s fake s)" % js["seconds"])
        # No deadline: all steps.
        rc, text, js, log, _, _ = r.run(["--allocators", "native,gvm", "--steps", "30"], spec)
        check([x.get("paired_steps") for x in js["programs"]] == [30, 30, 30], "no deadline: every step")

        # The script's own worker() behind the protocol (stand-ins of torch and gvmalloc).
        real = os.path.join(d, "real_worker.py")
        with open(real, "w") as f:
            f.write(REAL_WORKER)
        fake_cmd = os.environ[tl.WORKER_ENV]
        os.environ["CUDA_CACHE_PATH"] = os.path.join(d, "jit-cache")  # made by the slow step
        os.environ[tl.WORKER_ENV] = " ".join(shlex.quote(x) for x in (sys.executable, real, path))
        tl.READY_TIMEOUT_S = tl.STEP_TIMEOUT_S = 20.0
        tl.clock = time.monotonic
        out_dir = os.path.join(d, "real")
        out = io.StringIO()
        with redirect_stdout(out):
            rc = tl.main(["--out", out_dir, "--programs", "gpt2", "--allocators", "native,gvm", "--steps", "4"])
        os.environ[tl.WORKER_ENV] = fake_cmd
        text = out.getvalue()
        with open(os.path.join(out_dir, "torch-lockstep.json")) as f:
            g = json.load(f)["programs"][0]
        check(rc == 0 and g["paired_steps"] == 4, "the real worker takes 4 paired steps (exit %d):\n%s" % (rc, text))
        run = g["runs"]["gvm"]
        check(run.get("warm_checks") == ["loss1", "loss2"] and run["checks"] == ["loss3", "loss4", "loss5", "loss6"],
              "the real worker's warm-up and step checks: %s %s" % (run.get("warm_checks"), run["checks"]))
        check(run.get("peak_reserved") == 123 << 20 and run.get("backend") == "fake-backend" and
              run.get("allocations_per_step") == 5.0, "the real worker's end answer: %s" % run)
        check("gpt2, gvm: gvmalloc over the paired steps: chunks_mapped 4, chunks_unmapped 0, fences 0, "
              "driver_calls 4, driver_ms 4.0" in text, "gvmalloc's counters between ready and end:\n" + text)
        check(run.get("profile", {}).get("all_ops_self_cpu_ms_per_step") == 7.25,
              "the real worker answers 'profile': %s" % run.get("profile"))
        prof = rows(text, "gpt2", "gvm")
        check(any(r[2:] == ["—", "—", "7.250", "0.500", "3.0"] for r in prof),
              "the profile's row (no GPU activity: dashes): %s" % prof)
        check("gvmalloc" not in g["runs"]["native"], "no gvmalloc counters for native")
        # step_diag.StepWatch in the real worker: the slow step is the last, its
        # stack sampled in slow_part, gvmalloc's driver time read around it.
        sl = run.get("slowest") or {}
        dg = sl.get("diag", {})
        st = dg.get("stacks", {})
        check(sl.get("step") == 3 and dg.get("gvmalloc", {}).get("driver_ms") == 1.0 and
              dg.get("off_cpu_ms", 0) > 200 and st.get("samples", 0) > 10 and
              "slow_part" in st["top"][0][1], "the real worker's slowest step: %s" % sl)
        check(all("stacks" not in x for x in run["diags"][:3]), "ordinary steps keep no samples")
        check(dg.get("jit_cache_new") == 1 and [x["jit_cache_new"] for x in run["diags"][:3]] == [0, 0, 0],
              "the JIT cache's new file in the slow step, none before: %s" % [x.get("jit_cache_new")
                                                                           for x in run["diags"]])
        del os.environ["CUDA_CACHE_PATH"]
        check(" ".join(rows(text, "gpt2", "native")[0]).endswith("123 MiB yes"), "the real worker's row")
        log_path = os.path.join(out_dir, "workers", "gpt2-gvm.log")
        err = open(log_path).read() if os.path.exists(log_path) else ""
        check("progress 3%[C chatter]" in err, "stdout's chatter goes to the worker's stderr: %r" % err[:200])
        tl.READY_TIMEOUT_S, tl.STEP_TIMEOUT_S = 60.0, 60.0

        # Refused before any worker starts.
        for bad, word in ((["--programs", "bert"], "--programs"), (["--allocators", "gvm,gvm"], "--allocators"),
                          (["--allocators", "gvm"], "--allocators"), (["--allocators", "gvm,nativ"], "nativ"),
                          (["--steps", "0"], "--steps")):
            try:
                tl.main(["--out", os.path.join(d, "refused")] + bad)
                check(False, "%s is refused" % bad)
            except SystemExit as e:
                check(word in str(e), "%s refused naming %s: %s" % (bad, word, e))
    if FAILURES:
        print("FAILED checks:")
        for f in FAILURES:
            print("  - " + f)
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
