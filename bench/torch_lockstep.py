"""Whole PyTorch programs with several allocators in lockstep: every
allocator's process alive at once, each with its program built and warmed up,
taking step k in turn - one process at a time, the others waiting on their
standard input - before any takes step k + 1 (docs/pytorch.md, "Measuring on
a GPU").

    python bench/torch_lockstep.py [--programs resnet50,gpt2,llama]
                                   [--allocators native,expandable,gvm]
                                   [--steps N] [--out DIR] [--deadline SECONDS]
                                   [--pin CPUS]

Why: the host drifts. The same allocator's median step moves by 30% between
runs minutes apart, more than the allocators differ, so runs one after another
(bench/torch_programs.py) cannot say whether one allocator's step is shorter
than another's. In lockstep the drift hits every allocator's step k alike, and
the verdict is the median over the steps of the paired ratio
t_allocator[k] / t_reference[k], with a distribution-free 95% interval of that
median (binomial order statistics).

The programs are bench/torch_programs.py's (built by its build_* functions,
the same seeds): ResNet-50 training with cudnn.benchmark, GPT-2 training, a
Llama generate loop. --steps N: N paired steps per program (generate() calls
for llama); default resnet50 120, gpt2 40, llama 6. --allocators takes
torch_programs.py's names (gvm-keep, gvm-base with GVM_BASE_BUILD, ...) and a
name again with a suffix (gvm#2: a second gvmalloc process, to see the
method's own spread). The order of the processes is rotated by one at every
step, so that none always goes first.

--pin CPUS (e.g. 0-7): every worker runs on those CPUs only. They take their
steps one at a time, so pinning them all to the same CPUs takes out what a
process's placement on the host adds (other cores, another memory node) and
leaves only the allocators' difference and the host's drift, which lockstep
pairs away.

The workers of a program start one at a time (each warms up, cuDNN's
benchmark included, before the next starts), are all alive during the steps,
and are ended before the next program's start. --deadline SECONDS: a program
starts only if its workers should be ready in time (judged by the workers
before it), and its steps stop early when the next would end past its share
of the time left (the time left split evenly between it and the programs after
it; at least 6 steps where the deadline allows); the tables say how many
paired steps were taken.

Per program: each allocator's median step, min, quartiles and max; each
allocator's per-step ratio to native and to expandable (median, quartiles, the
95% interval of the median, the steps at or below the reference) - where an
allocator runs in several processes (gvm#2), to every other process, and a
table across processes: for each pair of allocators the lowest and highest of
those medians over their processes' pairs with the pairs' verdicts, an
allocator against itself being the method's own spread; peak
reserved; whether every step's loss (or tokens) equals native's bit for bit;
for gvmalloc its driver calls over the paired steps; and where a step goes - after the
paired steps each worker in turn runs a few steps under torch.profiler (the GPU's busy
and idle time, the CPU of all operators and of those that allocate). Prints the tables and
writes torch-lockstep.{txt,json} into DIR (default $OUT, else
./torch-lockstep-out), each worker's standard error in DIR/workers/. A worker
that dies or does not answer in time is reported with its standard error's
end, the others are ended cleanly, the next programs still run; exit status 1.

Protocol: `torch_lockstep.py worker PROGRAM ALLOCATOR STEPS` builds the
program, runs its warm-up steps and writes `GVM_LOCKSTEP {"ready": true, ...}`;
then reads commands, one a line: `step` (answer: {"t": seconds, "check": ...,
"diag": what bench/step_diag.py saw in the step; the tables show the slowest step's}),
`profile` (a few steps under torch.profiler; answer: {"profile": {...}}) and `end` (answer: peak reserved, backend, gvmalloc's counters; then it
exits 0). Other output lines are ignored. $GVM_LOCKSTEP_WORKER (a command
line) replaces `python torch_lockstep.py` as the worker's command (the tests
use a fake worker).
"""

import json
import math
import os
import queue
import shlex
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
import step_diag  # noqa: E402
import torch_programs as tp  # noqa: E402
from torch_programs import ALLOCATORS, base_libraries, is_gvm, timed  # noqa: E402

MiB = 1 << 20
PREFIX = "GVM_LOCKSTEP "
DEFAULT_STEPS = {"resnet50": 120, "gpt2": 40, "llama": 6}
DEFAULT_ALLOCATORS = ["native", "expandable", "gvm"]
REFERENCES = ("native", "expandable")
WORKER_ENV = "GVM_LOCKSTEP_WORKER"

# Seconds a worker has to answer: ready (import, build, warm-up), a step, end.
READY_TIMEOUT_S = 300.0
STEP_TIMEOUT_S = 120.0
END_TIMEOUT_S = 60.0
# Under --deadline: a worker's start before any has started (then 1.2 x the
# slowest so far), the time kept for ending the workers and writing the tables,
# and the steps a program takes whatever its share, where the deadline allows.
STARTUP_GUESS_S = 20.0
END_RESERVE_S = 5.0
MIN_ROUNDS = 6
# A worker's profiled steps may take this many times its longest paired step
# (torch.profiler's overhead over a few steps), plus this much.
PROFILE_STEP_FACTOR = 20.0
PROFILE_SLACK_S = 30.0

# The clock of the deadline and the walls (the tests put a fake one here).
clock = time.monotonic


# ---- a worker: one program with one allocator, stepped on command -------------------

def worker(program, allocator, steps):
    # The protocol gets stdout's descriptor to itself; the rest of stdout (the
    # libraries' chatter, Python's and C's) goes to stderr from here on.
    sys.stdout.flush()
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)

    def say(**kw):
        proto.write(PREFIX + json.dumps(kw) + "\n")
        proto.flush()

    t0 = time.perf_counter()
    prog = tp.BUILDERS[program](allocator, steps)
    torch = prog.torch
    warm_times, warm_checks = [], []
    for _ in range(prog.warm):
        dt, out = timed(torch, prog.step)
        warm_times.append(round(dt, 5))
        warm_checks.append(prog.check(out))
    counters = tp.gvm_counters() if is_gvm(allocator) else None
    a0 = tp.allocations_so_far(torch)
    say(ready=True, program=program, allocator=allocator, pid=os.getpid(),
        warm_checks=warm_checks, warm_times_s=warm_times,
        build_and_warm_s=round(time.perf_counter() - t0, 2),
        backend=torch.cuda.get_allocator_backend())
    n = 0
    # Each step's CPU, collector, faults, gvmalloc's driver time and, for a
    # step far slower than the median, where its Python stack sat
    # (step_diag.py). Reading gvmalloc's counters between steps adds their
    # own driver calls to none of them: they are counts kept by the library.
    watch = step_diag.StepWatch(tp.gvm_counters if counters is not None else None, tp.counters_since)
    # The counters as the paired steps left them, read before anything else
    # (a profiled pass) adds its own.
    after_steps = None

    def steps_done():
        nonlocal after_steps
        if after_steps is None:
            after_steps = (tp.allocations_so_far(torch), tp.gvm_counters() if counters is not None else None)
        return after_steps

    while True:
        line = sys.stdin.readline()
        if not line:
            return 1  # the coordinator is gone
        command = line.strip()
        if command == "step":
            watch.begin()
            dt, out = timed(torch, prog.step)
            diag = watch.end(dt)
            n += 1
            say(t=dt, check=prog.check(out), diag=diag)
        elif command == "profile":
            # Profiled steps after the paired ones (not counted among them):
            # where a step's time goes - the GPU's busy and idle time, the CPU
            # of all operators and of those that allocate.
            steps_done()
            _, summary = tp.profile_table(torch, prog.step, prog.profile_steps)
            say(profile=summary)
        elif command == "end":
            allocations, now = steps_done()
            out = dict(steps=n, peak_reserved=torch.cuda.max_memory_reserved(),
                       backend=torch.cuda.get_allocator_backend(),
                       allocations_per_step=round((allocations - a0) / max(1, n), 1))
            if counters is not None:
                steps_only = tp.counters_since(now, counters)
                out["gvmalloc"] = {"lockstep_steps": steps_only,
                                   "device0": tp.gvm_summary()["device0"]}
            say(**out)
            return 0
        elif command:
            say(error="unknown command %r" % command)


# ---- the coordinator's side of a worker ------------------------------------------------

class WorkerFailed(Exception):
    pass


def worker_command(program, allocator, steps):
    base = os.environ.get(WORKER_ENV)
    cmd = shlex.split(base) if base else [sys.executable, os.path.abspath(__file__)]
    return cmd + ["worker", program, allocator, str(steps)]


def exit_text(rc):
    return "signal %d" % -rc if rc < 0 else "exit %d" % rc


class Worker:
    """One worker process: commands to its stdin, its protocol lines read by a
    thread (line by line, so that neither side waits on a full pipe), its
    stderr into a file."""

    def __init__(self, program, allocator, steps, log_path, cpus=None):
        self.allocator = allocator
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.answers = queue.Queue()
        # Pinned by inheritance: this thread takes the CPUs for the spawn (a
        # child inherits its parent thread's affinity) and gets its own back,
        # rather than a preexec_fn, which is not safe beside the reader threads
        # of the workers started before.
        before = os.sched_getaffinity(0) if cpus is not None else None
        try:
            if cpus is not None:
                os.sched_setaffinity(0, cpus)
            self.proc = subprocess.Popen(worker_command(program, allocator, steps),
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self.log, env=tp.program_env(allocator),
                                         encoding="utf-8", errors="replace", bufsize=1)
        finally:
            if before is not None:
                os.sched_setaffinity(0, before)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        try:
            for line in iter(self.proc.stdout.readline, ""):
                if line.startswith(PREFIX):
                    self.answers.put(line[len(PREFIX):])
        finally:
            self.answers.put(None)

    def _gone(self, what):
        try:
            rc = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return what
        return "%s: it exited (%s)" % (what, exit_text(rc))

    def ask(self, command, timeout, needs=()):
        """Send `command` (None: send nothing, wait for the ready line) and
        return the answer, or raise WorkerFailed."""
        what = "ready" if command is None else command
        if command is not None:
            try:
                self.proc.stdin.write(command + "\n")
                self.proc.stdin.flush()
            except (OSError, ValueError):
                raise WorkerFailed(self._gone("could not send %r, its stdin is closed" % command))
        try:
            line = self.answers.get(timeout=max(timeout, 0.1))
        except queue.Empty:
            raise WorkerFailed("no answer to %r within %.0f s" % (what, timeout))
        if line is None:
            raise WorkerFailed(self._gone("no answer to %r, its output ended" % what))
        try:
            msg = json.loads(line)
        except ValueError:
            raise WorkerFailed("a malformed answer to %r: %r" % (what, line[:200]))
        if not isinstance(msg, dict) or "error" in msg:
            raise WorkerFailed("answered %r with an error: %s" % (what, line.strip()[:300]))
        missing = [k for k in needs if k not in msg]
        if missing:
            raise WorkerFailed("its answer to %r lacks %s: %s" % (what, ", ".join(missing), line.strip()[:300]))
        return msg

    def end(self, timeout):
        """`end`, then the process's exit; its answer, or WorkerFailed."""
        msg = self.ask("end", timeout)
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise WorkerFailed("answered 'end' but had not exited %.0f s later" % timeout)
        if rc != 0:
            raise WorkerFailed("answered 'end', then %s" % exit_text(rc))
        return msg

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.proc.stdin,):
            try:
                f.close()
            except (OSError, ValueError):
                pass

    def stderr_tail(self, n=3000):
        try:
            self.log.flush()
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n))
                return f.read().decode("utf-8", errors="replace")
        except OSError as e:
            return "(its stderr could not be read: %s)" % e

    def close(self):
        self.kill()
        self.reader.join(timeout=5)
        if self.proc.stdout:
            try:
                self.proc.stdout.close()
            except (OSError, ValueError):
                pass
        self.log.close()


# ---- statistics ----------------------------------------------------------------------------

def quartiles(xs):
    """(q1, median, q3) of xs (inclusive method: within min and max)."""
    s = sorted(xs)
    if len(s) == 1:
        return s[0], s[0], s[0]
    q1, q2, q3 = statistics.quantiles(s, n=4, method="inclusive")
    return q1, q2, q3


def median_ci(xs, level=0.95):
    """A distribution-free interval of the median of xs: (x_(j), x_(n+1-j), coverage)
    of the sorted values, j the largest rank with P(B <= j - 1) <= (1 - level) / 2,
    B ~ Binomial(n, 1/2); coverage = 1 - 2 P(B <= j - 1) >= level. None where no
    rank is enough (fewer than 6 values at 95%)."""
    n = len(xs)
    if n == 0:
        return None
    s = sorted(xs)
    alpha = (1.0 - level) / 2
    total = 2 ** n
    j, tail = 0, 0
    while j < n // 2 + 1:
        nxt = tail + math.comb(n, j)
        if nxt / total > alpha + 1e-12:
            break
        tail = nxt
        j += 1
    if j == 0:
        return None
    return s[j - 1], s[n - j], 1.0 - 2.0 * tail / total


def ratio_stats(times, ref):
    """The per-step ratios times[k] / ref[k] and what the tables say of them."""
    ratios = [a / b for a, b in zip(times, ref)]
    if not ratios:
        return {"n": 0}
    q1, med, q3 = quartiles(ratios)
    ci = median_ci(ratios)
    out = {"n": len(ratios), "median": med, "q1": q1, "q3": q3,
           "ci": None if ci is None else [ci[0], ci[1]],
           "ci_coverage": None if ci is None else ci[2],
           "at_or_below": sum(1 for r in ratios if r <= 1.0), "ratios": ratios}
    if ci is None:
        out["verdict"] = "too few steps"
    elif ci[1] <= 1.0:
        out["verdict"] = "at or below"
    elif ci[0] > 1.0:
        out["verdict"] = "above"
    else:
        out["verdict"] = "undecided"
    return out


def compare(run, ref):
    """Whether a run's checks (its warm-up's, then its paired steps') equal the
    reference's bit for bit, and if not, from which step."""
    if ref is None:
        return "no native run"
    for what, a, b in (("warm-up step", run.get("warm_checks", []), ref.get("warm_checks", [])),
                       ("step", run["checks"], ref["checks"])):
        if a != b:
            for i, (x, y) in enumerate(zip(a, b)):
                if x != y:
                    return "no (from %s %d)" % (what, i)
            return "no (%d vs %d %ss)" % (len(a), len(b), what)
    return "yes"


def rotation(allocators, k):
    """The order of step k: the allocators rotated left by k."""
    i = k % len(allocators)
    return allocators[i:] + allocators[:i]


# ---- one program ----------------------------------------------------------------------------

def capped(timeout, hard_end):
    """A worker's timeout, cut so that a hung worker is given up before the
    deadline's end by more than its reserve (never below 10 s)."""
    if hard_end is None:
        return timeout
    return min(timeout, max(10.0, hard_end + END_RESERVE_S + 30.0 - clock()))


def run_program(program, allocators, steps, log_dir, share_end=None, hard_end=None, cpus=None):
    """One program's workers, started one at a time, then `steps` rounds of
    one step each in rotating order, then ended. share_end / hard_end: clock()
    values; no round is started that should end past share_end (after
    MIN_ROUNDS rounds) or past hard_end."""
    res = {"program": program, "allocators": list(allocators), "steps_asked": steps,
           "runs": {a: {"allocator": a, "times_s": [], "checks": [], "diags": []} for a in allocators},
           "order": [], "failed": [], "stopped": None}
    runs = res["runs"]
    workers = {}
    t0 = clock()

    def fail(a, e):
        w = workers.get(a)
        runs[a]["error"] = str(e)
        if w is not None:
            w.kill()
            runs[a]["stderr"] = w.stderr_tail()
        res["failed"].append(a)
        print("   %s FAILED: %s" % (a, e), flush=True)

    try:
        for a in allocators:
            print("== %s: starting %s" % (program, a), flush=True)
            r0 = clock()
            name = a.replace("#", "_")
            try:
                workers[a] = Worker(program, a, steps, os.path.join(log_dir, "%s-%s.log" % (program, name)),
                                    cpus)
                msg = workers[a].ask(None, capped(READY_TIMEOUT_S, hard_end), needs=("ready",))
            except (WorkerFailed, OSError) as e:
                fail(a, e)
                break
            runs[a]["ready_s"] = round(clock() - r0, 2)
            runs[a]["warm_checks"] = msg.get("warm_checks", [])
            for k in ("warm_times_s", "build_and_warm_s", "backend", "pid"):
                if k in msg:
                    runs[a][k] = msg[k]
            print("   ready in %.1f s" % runs[a]["ready_s"], flush=True)
        res["startup_s"] = round(clock() - t0, 2)

        longest = 0.0
        done = 0
        taken = {a: 0 for a in allocators}  # steps each worker took, a round cut short included
        while not res["failed"] and done < steps:
            now = clock()
            if hard_end is not None:
                limit = hard_end if done < MIN_ROUNDS else min(share_end, hard_end)
                if now + 1.2 * longest > limit:
                    res["stopped"] = ("stopped after %d of %d paired steps by the --deadline"
                                      % (done, steps))
                    print("   " + res["stopped"], flush=True)
                    break
            order = rotation(allocators, done)
            res["order"].append(order)
            for a in order:
                try:
                    msg = workers[a].ask("step", capped(STEP_TIMEOUT_S, hard_end), needs=("t", "check"))
                except WorkerFailed as e:
                    fail(a, "step %d: %s" % (done, e))
                    break
                runs[a]["times_s"].append(float(msg["t"]))
                runs[a]["checks"].append(msg["check"])
                runs[a]["diags"].append(msg.get("diag"))
                taken[a] += 1
            if res["failed"]:
                # Only whole rounds are paired: the one cut short is dropped.
                res["order"].pop()
                for a in allocators:
                    del runs[a]["times_s"][done:]
                    del runs[a]["checks"][done:]
                    del runs[a]["diags"][done:]
                break
            done += 1
            longest = max(longest, clock() - now)
            if done == 1 or done % 20 == 0:
                print("   step %d: %s" % (done, ", ".join(
                    "%s %.2f ms" % (a, runs[a]["times_s"][-1] * 1e3) for a in allocators)), flush=True)
        res["paired_steps"] = done

        # Each worker's profiled steps, one worker at a time, in the order of
        # the round after the last (so that none is always profiled first).
        # Optional: skipped when the deadline is near (a profiled step takes
        # several times a plain one), and a profile that fails or takes too
        # long costs its worker the profile and the end answer, not its steps.
        if done > 0 and not res["failed"]:
            for a in rotation(allocators, done):
                budget = PROFILE_STEP_FACTOR * max(runs[a]["times_s"]) + PROFILE_SLACK_S
                if hard_end is not None and clock() + budget > hard_end:
                    runs[a]["profile_error"] = "not profiled: the --deadline was near"
                    continue
                try:
                    msg = workers[a].ask("profile", budget, needs=("profile",))
                except WorkerFailed as e:
                    runs[a]["profile_error"] = str(e)
                    workers[a].kill()
                    print("   %s: no profile (%s)" % (a, e), flush=True)
                    continue
                runs[a]["profile"] = msg["profile"]

        for a in allocators:
            w = workers.get(a)
            if w is None or a in res["failed"] or "profile_error" not in runs[a]:
                continue
            if w.proc.poll() is not None:
                runs[a]["end_error"] = "not asked: its profile failed"

        for a in allocators:
            w = workers.get(a)
            if w is None or a in res["failed"] or "end_error" in runs[a]:
                continue
            try:
                msg = w.end(capped(END_TIMEOUT_S, hard_end))
            except WorkerFailed as e:
                fail(a, "end: %s" % e)
                continue
            for k, v in msg.items():
                if k != "steps":
                    runs[a][k] = v
            if msg.get("steps", taken[a]) != taken[a]:
                fail(a, "it counted %s steps, the coordinator %d" % (msg.get("steps"), taken[a]))
    finally:
        for w in workers.values():
            w.close()
    res["wall_s"] = round(clock() - t0, 2)
    summarize(res)
    res["across"] = across_processes(res)
    return res


def base_name(allocator):
    """The allocator a process runs: gvm#2 runs gvm."""
    return allocator.split("#", 1)[0]


def references(allocators):
    """What each process's steps are paired with: native and expandable; and,
    where an allocator runs in several processes (gvm#2), every other process,
    so that two processes of one allocator show the method's own spread beside
    what the allocators differ by."""
    if len({base_name(a) for a in allocators}) < len(allocators):
        return list(allocators)
    return list(REFERENCES)


def summarize(res):
    """Per allocator the step times' spread, equality with native and the
    paired ratios to native and to expandable, or to every other process where
    an allocator runs in several (over the paired steps)."""
    runs = res["runs"]
    native = runs.get("native")
    if native is not None and "native" in res["failed"]:
        native = None
    for a, r in runs.items():
        if r["times_s"]:
            q1, med, q3 = quartiles(r["times_s"])
            r.update(median_s=med, min_s=min(r["times_s"]), q1_s=q1, q3_s=q3, max_s=max(r["times_s"]))
        r["equal_to_native"] = compare(r, native) if a not in res["failed"] else None
        r["slowest"] = slowest_step(r)
        r["vs"] = {}
        for ref in references(res["allocators"]):
            if ref == a or ref not in runs:
                continue
            r["vs"][ref] = ratio_stats(r["times_s"], runs[ref]["times_s"])


DIAG_KEYS = ("cpu_ms", "off_cpu_ms", "gc_ms")


def slowest_step(r):
    """The slowest paired step with what step_diag.py saw in it, beside the
    median over the steps of the same readings; None without diagnostics."""
    times, diags = r.get("times_s", []), r.get("diags", [])
    if not times or len(diags) != len(times) or any(d is None for d in diags):
        return None
    k = max(range(len(times)), key=lambda i: times[i])
    med = {key: statistics.median(d[key] for d in diags) for key in DIAG_KEYS}
    drv = [d["gvmalloc"]["driver_ms"] for d in diags if "gvmalloc" in d]
    if drv:
        med["driver_ms"] = statistics.median(drv)
    return {"step": k, "t_s": times[k], "x_median": round(times[k] / statistics.median(times), 2),
            "diag": diags[k], "median_diag": med}


# ---- the tables ------------------------------------------------------------------------------

def across_processes(p):
    """Where an allocator runs in several processes: for each pair of
    allocators (an allocator with itself included) the paired ratios' medians
    over every pair of their processes, lowest and highest, and how many
    pairs' verdicts were at or below, above, undecided. A pair of one
    allocator's processes is counted once (a ÷ a#2, not also a#2 ÷ a)."""
    order = []
    for a in p["allocators"]:
        if base_name(a) not in order:
            order.append(base_name(a))
    if len(order) == len(p["allocators"]):
        return []
    good = [a for a in p["allocators"] if a not in p["failed"] and p["runs"][a].get("times_s")]
    out = []
    for x in order:
        for y in order:
            medians, verdicts = [], []
            for i, a in enumerate(good):
                for j, b in enumerate(good):
                    if base_name(a) != x or base_name(b) != y or a == b or (x == y and j < i):
                        continue
                    st = p["runs"][a].get("vs", {}).get(b)
                    if st and st.get("n"):
                        medians.append(st["median"])
                        verdicts.append(st["verdict"])
            if medians:
                out.append({"allocator": x, "vs": y, "pairs": len(medians), "lowest": min(medians),
                            "highest": max(medians),
                            "verdicts": {v: verdicts.count(v) for v in sorted(set(verdicts))}})
    return out


def fmt_ci(s):
    if s.get("ci") is None:
        return "—"
    return "%.3f-%.3f (%.1f%%)" % (s["ci"][0], s["ci"][1], 100 * s["ci_coverage"])


def render_slowest(results):
    """The slowest paired step of each process with what step_diag.py saw
    in it (the lines of its table, none without readings)."""
    slow = [(p, a, p["runs"][a]["slowest"]) for p in results for a in p.get("allocators", [])
            if p["runs"][a].get("slowest")]
    if not slow:
        return []
    lines = ["", "=== The slowest paired step of each process (bench/step_diag.py): its time and "
             "what the process spent in it - CPU (every thread), off CPU (wall minus CPU), "
             "Python's collector, gvmalloc's driver calls - beside the median step's; "
             "context switches voluntary/involuntary and page faults minor/major in the step; "
             "jit: files the CUDA driver's JIT cache gained in it (a kernel compiled from PTX, "
             "paid by the first process to need it)",
             "%-9s %-12s %5s %10s %7s %19s %19s %15s %19s %11s %9s %4s" % (
                 "program", "allocator", "step", "ms", "x med", "cpu ms (median)",
                 "off cpu ms (median)", "gc ms (median)", "driver ms (median)", "ctx sw", "faults", "jit")]
    for p, a, s in slow:
        d, m = s["diag"], s["median_diag"]
        g = d.get("gvmalloc")
        cell = lambda key, w: ("%.2f (%.2f)" % (d[key], m[key])).rjust(w)  # noqa: E731
        drv = ("%.2f (%.2f)" % (g["driver_ms"], m["driver_ms"])).rjust(19) if g else "%19s" % "—"
        jit = d.get("jit_cache_new")
        lines.append("%-9s %-12s %5d %10.2f %7.2f %s %s %s %s %11s %9s %4s" % (
            p["program"], a, s["step"], s["t_s"] * 1e3, s["x_median"], cell("cpu_ms", 19),
            cell("off_cpu_ms", 19), cell("gc_ms", 15), drv,
            "%d/%d" % tuple(d["ctx_switches"]), "%d/%d" % tuple(d["faults"]),
            "—" if jit is None else "+%d" % jit))
        if g:
            lines.append("%-9s %-12s       gvmalloc in that step: %s" % ("", "", ", ".join(
                "%s %s" % kv for kv in g.items() if kv[1]) or "no driver call"))
        st = d.get("stacks")
        if st:
            lines.append("%-9s %-12s       its Python stack, %d samples (the wall allows %d):" % (
                "", "", st["samples"], st["samples_the_wall_allows"]))
            for n, key in st["top"]:
                lines.append("%-9s %-12s         %5d  %s" % ("", "", n, key))
    return lines


def render(results, seconds):
    lines = ["", "=== PyTorch programs in lockstep (%.0f s): step k of every allocator's process, "
             "one process at a time, before step k+1; the order rotated by one each step" % seconds,
             "%-9s %-12s %6s %9s %9s %9s %9s %9s %14s  %s" % (
                 "program", "allocator", "steps", "median ms", "min", "q1", "q3", "max", "peak reserved",
                 "equal to native")]
    for p in results:
        if p.get("not_run"):
            lines.append("%-9s %s" % (p["program"], p["not_run"]))
            continue
        for a in p["allocators"]:
            r = p["runs"][a]
            if "error" in r:
                lines.append("%-9s %-12s FAILED: %s" % (p["program"], a, r["error"]))
                continue
            if "ready_s" not in r:
                lines.append("%-9s %-12s not started (a worker before it failed)" % (p["program"], a))
                continue
            if not r["times_s"]:
                lines.append("%-9s %-12s %6d (no paired step)" % (p["program"], a, 0))
                continue
            peak = "%10.0f MiB" % (r["peak_reserved"] / MiB) if "peak_reserved" in r else "%14s" % "—"
            lines.append("%-9s %-12s %6d %9.2f %9.2f %9.2f %9.2f %9.2f %s  %s" % (
                p["program"], a, len(r["times_s"]), r["median_s"] * 1e3, r["min_s"] * 1e3, r["q1_s"] * 1e3, r["q3_s"] * 1e3, r["max_s"] * 1e3, peak,
                r["equal_to_native"]))
        if p["program"] == "llama":
            lines.append("%-9s (llama: ms per generate() call)" % "")
        if p.get("stopped"):
            lines.append("%-9s %s" % ("", p["stopped"]))
        elif p["failed"]:
            lines.append("%-9s %d of %d paired steps (a worker failed)" % ("", p["paired_steps"],
                                                                           p["steps_asked"]))
    lines += ["", "=== Paired ratios: t_allocator[k] / t_reference[k] over the paired steps k; "
              "the median's 95% interval from binomial order statistics (distribution-free); "
              "verdict: at or below = the whole interval <= 1, above = > 1",
              "%-9s %-12s %-11s %7s %7s %7s  %-23s %15s  %s" % (
                  "program", "allocator", "vs", "median", "q1", "q3", "95% CI of the median",
                  "steps <= ref", "verdict")]
    for p in results:
        if p.get("not_run"):
            continue
        for a in p["allocators"]:
            r = p["runs"][a]
            for ref, s in r.get("vs", {}).items():
                if a in p["failed"] or ref in p["failed"] or not s.get("n"):
                    continue
                lines.append("%-9s %-12s %-11s %7.3f %7.3f %7.3f  %-23s %15s  %s" % (
                    p["program"], a, ref, s["median"], s["q1"], s["q3"], fmt_ci(s),
                    "%d of %d" % (s["at_or_below"], s["n"]), s["verdict"]))
    across = [(p, c) for p in results if not p.get("not_run") for c in p.get("across", [])]
    if across:
        lines += ["", "=== Across processes, where an allocator ran in several: the medians above "
                  "over every pair of the two allocators' processes, lowest and highest, and the "
                  "pairs' verdicts; an allocator against itself is the method's own spread, "
                  "which bounds what the set can tell",
                  "%-9s %-12s %-12s %5s %7s %7s  %s" % (
                      "program", "allocator", "vs", "pairs", "lowest", "highest", "verdicts")]
        for p, c in across:
            lines.append("%-9s %-12s %-12s %5d %7.3f %7.3f  %s" % (
                p["program"], c["allocator"], c["vs"] if c["vs"] != c["allocator"] else "itself",
                c["pairs"], c["lowest"], c["highest"],
                ", ".join("%s %d" % kv for kv in c["verdicts"].items())))
    profiled = [(p, a) for p in results for a in p.get("allocators", [])
                if p["runs"][a].get("profile") or p["runs"][a].get("profile_error")]
    if profiled:
        lines += ["", "=== Where a step goes: torch.profiler over a few steps after the paired ones, "
                  "each worker in turn (ms per step; busy = the union of the GPU's kernels, copies "
                  "and sets, idle = the gaps between its first and last activity; alloc ops = the "
                  "operators that allocate, where the allocator runs)",
                  "%-9s %-12s %12s %12s %12s %14s %12s" % (
                      "program", "allocator", "gpu busy", "gpu idle", "all ops CPU", "alloc ops CPU",
                      "allocs/step")]
        for p, a in profiled:
            if not p["runs"][a].get("profile"):
                lines.append("%-9s %-12s no profile: %s" % (p["program"], a, p["runs"][a]["profile_error"]))
                continue
            o = p["runs"][a]["profile"]
            g = o.get("gpu") or {}
            cell = lambda k: "%12.3f" % g[k] if k in g else "%12s" % "—"  # noqa: E731
            lines.append("%-9s %-12s %s %s %12.3f %14.3f %12.1f" % (
                p["program"], a, cell("gpu_busy_ms_per_step"), cell("gpu_idle_ms_per_step"),
                o["all_ops_self_cpu_ms_per_step"], o["alloc_ops_self_cpu_ms_per_step"],
                o["alloc_ops_calls_per_step"]))
    lines += render_slowest(results)
    extra = []
    for p in results:
        for a in p.get("allocators", []):
            g = p["runs"][a].get("gvmalloc")
            if g and "lockstep_steps" in g:
                extra.append("%s, %s: gvmalloc over the paired steps: %s" % (
                    p["program"], a, ", ".join("%s %s" % kv for kv in g["lockstep_steps"].items())))
    if extra:
        lines += [""] + extra
    for p in results:
        for a in p.get("failed", []):
            r = p["runs"][a]
            lines += ["", "--- %s, %s FAILED: %s; the end of its stderr:" % (p["program"], a, r["error"]),
                      r.get("stderr", "").rstrip()[-1500:]]
    return "\n".join(lines)


# ---- the run -----------------------------------------------------------------------------------

def parse_cpus(text):
    """The CPUs of a list like "0-3,8": a set, refused (SystemExit) where this
    process may not run on one of them."""
    cpus = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise SystemExit("--pin: a list of CPUs like 0-3,8 (got %r)" % text)
    allowed = os.sched_getaffinity(0)
    if not cpus or not cpus <= allowed:
        raise SystemExit("--pin: %s is not within the CPUs this process may use (%s)"
                         % (text, ",".join(map(str, sorted(allowed)))))
    return cpus


USAGE = __doc__.split("\n\n")[1]


def main(argv):
    if argv and argv[0] == "worker":
        if len(argv) != 4:
            raise SystemExit("usage: torch_lockstep.py worker PROGRAM ALLOCATOR STEPS")
        return worker(argv[1], argv[2], int(argv[3]))
    out_dir = os.environ.get("OUT") or "torch-lockstep-out"
    programs, allocators, steps, deadline = list(DEFAULT_STEPS), list(DEFAULT_ALLOCATORS), None, None
    cpus = None
    args = list(argv)
    while args:
        a = args.pop(0)
        if a in ("--out", "--programs", "--allocators", "--steps", "--deadline", "--pin") and not args:
            raise SystemExit("%s needs a value\n%s" % (a, USAGE))
        if a == "--out":
            out_dir = args.pop(0)
        elif a == "--programs":
            programs = [p for p in args.pop(0).split(",") if p]
        elif a == "--allocators":
            allocators = [x for x in args.pop(0).split(",") if x]
        elif a == "--steps":
            steps = int(args.pop(0))
            if steps < 1:
                raise SystemExit("--steps: at least 1 (got %d)" % steps)
        elif a == "--deadline":
            deadline = float(args.pop(0))
        elif a == "--pin":
            cpus = parse_cpus(args.pop(0))
        else:
            raise SystemExit(USAGE)
    unknown = [p for p in programs if p not in DEFAULT_STEPS]
    if unknown or not programs:
        raise SystemExit("--programs: unknown %s (known: %s)" % (",".join(unknown), ",".join(DEFAULT_STEPS)))
    unknown = [a for a in allocators if a.split("#")[0] not in ALLOCATORS]
    if unknown:
        raise SystemExit("--allocators: unknown %s (known: %s)" % (",".join(unknown), ",".join(ALLOCATORS)))
    if len(set(allocators)) != len(allocators) or len(allocators) < 2:
        raise SystemExit("--allocators: at least two, each once (gvm#2 for a second gvm): %s"
                         % ",".join(allocators))
    if any(a.split("#")[0] == "gvm-base" for a in allocators):
        base_libraries(os.environ.get("GVM_BASE_BUILD"))  # refused before any worker starts
    log_dir = os.path.join(out_dir, "workers")
    os.makedirs(log_dir, exist_ok=True)
    start = clock()
    results = []
    ready_walls = []
    for i, program in enumerate(programs):
        n_steps = steps if steps is not None else DEFAULT_STEPS[program]
        share_end = hard_end = None
        if deadline is not None:
            now = clock()
            left = deadline - (now - start)
            per_worker = 1.2 * max(ready_walls) if ready_walls else STARTUP_GUESS_S
            expect = per_worker * len(allocators)
            if left < expect + END_RESERVE_S:
                results.append({"program": program, "not_run": "not run: %.0f s left of the --deadline, "
                                "starting its %d workers takes about %.0f s"
                                % (max(left, 0), len(allocators), expect)})
                print("== %s %s" % (program, results[-1]["not_run"]), flush=True)
                continue
            share_end = now + left / (len(programs) - i)
            hard_end = start + deadline - END_RESERVE_S
        res = run_program(program, allocators, n_steps, log_dir, share_end, hard_end, cpus)
        res["cpus"] = None if cpus is None else sorted(cpus)
        ready_walls += [r["ready_s"] for r in res["runs"].values() if "ready_s" in r]
        results.append(res)
    seconds = clock() - start
    text = render(results, seconds)
    print(text, flush=True)
    with open(os.path.join(out_dir, "torch-lockstep.txt"), "w") as f:
        f.write(text.lstrip("\n") + "\n")
    with open(os.path.join(out_dir, "torch-lockstep.json"), "w") as f:
        json.dump({"seconds": round(seconds, 1), "deadline": deadline, "allocators": allocators,
                   "programs": results}, f, indent=1)
    failed = sum(len(p.get("failed", [])) for p in results)
    if failed:
        print("%d worker(s) failed (in the tables)" % failed, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
