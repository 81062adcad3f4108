"""What one timed step of a PyTorch program spent outside its operators' own
work, for bench/torch_lockstep.py's workers: the step's wall time alone cannot
say why one step of a run took 40 times the median (GPT-2 under gvmalloc, once
in each of two runs: docs/pytorch.md).

    watch = StepWatch(gvm_counters)      # gvm_counters: None, or a callable
    watch.begin()
    ... the step ...
    diag = watch.end(seconds)            # a dict, JSON-ready

Per step it reads:
- cpu_ms: the process's CPU time (every thread). A step that waits in
  torch.cuda.synchronize spins by default, so this is close to the wall unless
  the process was off the CPU.
- off_cpu_ms: wall minus CPU: the time no thread of the process ran (the host
  took the CPU away, or a thread slept on a lock or on the GPU).
- ctx_switches: voluntary and involuntary context switches (getrusage).
- faults: minor and major page faults.
- gc_ms and gc_runs: Python's collector, from gc.callbacks.
- for gvmalloc (gvm_counters given): its driver calls, their time, fences and
  chunks mapped and unmapped during the step (bench/torch_programs.py's
  counters; the time of each entry point of the driver in by_call).
- jit_cache_new: files the CUDA driver's JIT cache gained during the step
  ($CUDA_CACHE_PATH, else its default under the home directory; None where
  $CUDA_CACHE_DISABLE=1 or the directory cannot be read). A kernel the
  driver compiles from PTX lands there: the first process to need it pays
  the compile, the next finds it on disk (docs/pytorch.md, "GPT-2's one slow
  step"), so a slow step with new entries is that compile, not the allocator.
- stacks: a sampling of the main thread's Python stack every SAMPLE_S by a
  side thread, kept only for a step that took at least SLOW_FACTOR times the
  median of the steps before it (the samples of an ordinary step are
  dropped): the most frequent stacks with their counts, and how many samples
  were taken against how many the wall allows - far fewer means the main
  thread held the GIL (native code that does not release it), so the sampler
  could not run.

The sampler takes the GIL for a few microseconds every SAMPLE_S; every
allocator's worker runs it alike.
"""

import collections
import gc
import os
import resource
import statistics
import sys
import threading
import time

SAMPLE_S = 0.005
SLOW_FACTOR = 3.0
MIN_HISTORY = 3  # steps before a step can be called slow
TOP_STACKS = 4
FRAMES = 6  # innermost frames of a sampled stack


def jit_cache_dir():
    if os.environ.get("CUDA_CACHE_DISABLE") == "1":
        return None
    return os.environ.get("CUDA_CACHE_PATH") or os.path.join(os.path.expanduser("~"), ".nv", "ComputeCache")


def jit_cache_files(path):
    """The files under the JIT cache directory (None if it cannot be read;
    0 if it is not there yet: the driver makes it at its first compile)."""
    if path is None:
        return None
    if not os.path.isdir(path):
        return 0 if not os.path.exists(path) else None
    n = 0
    for _, _, files in os.walk(path):
        n += len(files)
    return n


def _frames(frame):
    out = []
    while frame is not None and len(out) < FRAMES:
        code = frame.f_code
        out.append("%s:%d %s" % (os.path.basename(code.co_filename), frame.f_lineno, code.co_name))
        frame = frame.f_back
    return " < ".join(out)


class _Sampler:
    def __init__(self, thread_id):
        self.thread_id = thread_id
        self.on = threading.Event()
        self.lock = threading.Lock()
        self.counts = collections.Counter()
        self.samples = 0
        t = threading.Thread(target=self._run, name="step-sampler", daemon=True)
        t.start()

    def _run(self):
        while True:
            self.on.wait()
            time.sleep(SAMPLE_S)
            if not self.on.is_set():
                continue
            frame = sys._current_frames().get(self.thread_id)
            if frame is None:
                continue
            key = _frames(frame)
            del frame
            with self.lock:
                self.counts[key] += 1
                self.samples += 1

    def start(self):
        with self.lock:
            self.counts.clear()
            self.samples = 0
        self.on.set()

    def stop(self):
        self.on.clear()
        with self.lock:
            return self.samples, self.counts.most_common(TOP_STACKS)


class StepWatch:
    def __init__(self, gvm_counters=None, counters_since=None):
        self.gvm_counters = gvm_counters
        self.counters_since = counters_since
        self.history = []
        self.gc_s = 0.0
        self.gc_runs = 0
        self._gc_t0 = None
        gc.callbacks.append(self._on_gc)
        self.sampler = _Sampler(threading.get_ident())
        self.jit_dir = jit_cache_dir()

    def _on_gc(self, phase, info):
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        elif self._gc_t0 is not None:
            self.gc_s += time.perf_counter() - self._gc_t0
            self.gc_runs += 1
            self._gc_t0 = None

    def begin(self):
        # The cache's walk first (and in end() last): its CPU time and
        # faults are not the step's.
        self._jit0 = jit_cache_files(self.jit_dir)
        self._cpu0 = time.process_time()
        self._ru0 = resource.getrusage(resource.RUSAGE_SELF)
        self._gc0 = (self.gc_s, self.gc_runs)
        self._gvm0 = self.gvm_counters() if self.gvm_counters else None
        self.sampler.start()

    def end(self, seconds):
        samples, stacks = self.sampler.stop()
        cpu_s = time.process_time() - self._cpu0
        ru = resource.getrusage(resource.RUSAGE_SELF)
        out = {
            "cpu_ms": round(cpu_s * 1e3, 3),
            "off_cpu_ms": round(max(0.0, seconds - cpu_s) * 1e3, 3),
            "ctx_switches": [ru.ru_nvcsw - self._ru0.ru_nvcsw, ru.ru_nivcsw - self._ru0.ru_nivcsw],
            "faults": [ru.ru_minflt - self._ru0.ru_minflt, ru.ru_majflt - self._ru0.ru_majflt],
            "gc_ms": round((self.gc_s - self._gc0[0]) * 1e3, 3),
            "gc_runs": self.gc_runs - self._gc0[1],
        }
        jit = jit_cache_files(self.jit_dir)
        out["jit_cache_new"] = jit - self._jit0 if jit is not None and self._jit0 is not None else None
        if self._gvm0 is not None:
            out["gvmalloc"] = self.counters_since(self.gvm_counters(), self._gvm0)
        slow = (len(self.history) >= MIN_HISTORY
                and seconds >= SLOW_FACTOR * statistics.median(self.history))
        if slow:
            out["stacks"] = {"samples": samples, "samples_the_wall_allows": int(seconds / SAMPLE_S),
                             "top": [[n, key] for key, n in stacks]}
        self.history.append(seconds)
        return out
