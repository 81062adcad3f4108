"""Whole PyTorch programs with PyTorch's allocator, PyTorch's allocator with
expandable segments, and gvmalloc's native backend, side by side in one run
(docs/pytorch.md, "Programs").

    python bench/torch_programs.py [--out DIR] [--programs resnet50,gpt2,llama]
                                   [--allocators native,gvm,expandable] [--steps N]
                                   [--deadline SECONDS]  (a run starts only if it should
                                                          end by then, judged by the
                                                          program's runs before it; the
                                                          others are reported as not run)
                                   [--rounds N]  (the allocators N times, each round in
                                                  the order of the one before rotated by
                                                  one: gvm,native,expandable then
                                                  native#2,expandable#2,gvm#2, ...)

Programs (random initialisation, configurations only: nothing is downloaded):
  resnet50  torchvision ResNet-50 training, torch.backends.cudnn.benchmark=True,
            bf16 autocast, channels_last, SGD; one fixed batch shape
            (GVM_TORCH_CUDNN_BENCHMARK_LIMIT=N sets cudnn.benchmark_limit)
  gpt2      transformers GPT-2 small training, AdamW, bf16 autocast, batch and
            sequence length varying from step to step (the same schedule for all)
  llama     a Llama-style decoder (transformers LlamaConfig, 16 layers) in bf16,
            greedy generate() of 128 tokens, KV cache growing each token

--allocators also takes gvm-keep (gvmalloc with reserve_slack:-1: no release
before growth, so no fence or unmap: what the policy's releases cost),
gvm-unshared (gvmalloc with shared_spans:false: every span a granule),
gvm-base (gvmalloc of the build tree $GVM_BASE_BUILD: a change beside its base
in one rotation), and any name again with a suffix (gvm#2) for a second run in
the same order.
--rounds N writes those suffixes itself: no allocator runs first in every round,
so a host that speeds up or slows down over the set does not favour one of them.

Each program runs once per allocator, each run in a process of its own (the
allocator is chosen before CUDA starts) with the same seeds; the ResNet-50 run
with PyTorch's allocator is made twice (unless --allocators names native#2
already), to show whether cuDNN's timed algorithm choice keeps it
bit-identical to itself. Per run: median step time,
torch.cuda.max_memory_reserved(), the losses (or generated tokens) compared bit
for bit with the native run, the cost of an allocate+free pair of a few sizes
inside the program's process, the allocations per step, a torch.profiler table
of the busiest operators with the self CPU time of the operators that allocate
(where the allocator runs), the GPU's busy and idle time per profiled step, and
for gvmalloc its driver calls by entry point.
Prints the tables (the programs; with runs of several rounds - gvm,native,
expandable,gvm#2,native#2,expandable#2 - each run against the native and the
expandable run of its own round; where the time goes; the GPU's side) and writes
torch-programs.{txt,json} into DIR (default $OUT, else ./torch-programs-out). A
run that fails is reported and the others go on; exit status 1 if one failed.
"""

import json
import os
import random
import statistics
import subprocess
import sys
import time

MiB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# In the order they run: the two that matter most first, so that a run cut
# short by --deadline still compares them.
ALLOCATORS = {
    "native": {},
    "gvm": {},
    "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    # gvmalloc without its releases before growth (no fences, no unmaps): what
    # the fragmentation policy's releases cost a program, apart from the rest.
    "gvm-keep": {"GVM_CONF": "reserve_slack:-1"},
    # gvmalloc with every span a granule (no shared spans): what sharing a
    # granule between small classes saves a program's peak.
    "gvm-unshared": {"GVM_CONF": "shared_spans:false"},
    # gvmalloc of another build tree ($GVM_BASE_BUILD, e.g. of the commit
    # before a change): the change and its base in the same rotation.
    "gvm-base": {},
}


def is_gvm(allocator):
    return allocator.split("#")[0] in ("gvm", "gvm-keep", "gvm-unshared", "gvm-base")


def base_libraries(build):
    """The two libraries of build tree `build` for gvm-base, or SystemExit
    saying what is missing."""
    if not build:
        raise SystemExit("gvm-base runs gvmalloc of another build tree: set GVM_BASE_BUILD to it")
    libs = {"GVMALLOC_LIBRARY": os.path.join(build, "allocator", "libgvmalloc.so"),
            "GVMALLOC_TORCH_LIBRARY": os.path.join(build, "allocator", "libgvmalloc_torch.so")}
    for path in libs.values():
        if not os.path.exists(path):
            raise SystemExit("gvm-base: %s is not there (GVM_BASE_BUILD=%s: build its gvmalloc "
                             "and gvmalloc_torch targets first)" % (path, build))
    return libs


def result(**kw):
    print("GVM_RESULT " + json.dumps(kw), flush=True)


# ---- inside one process ----------------------------------------------------------

def setup(allocator):
    import torch
    if is_gvm(allocator):
        import gvmalloc.torch
        gvmalloc.torch.enable()
    torch.manual_seed(0)
    random.seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def timed(torch, fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def alloc_pair_us(torch, sizes=(4096, MiB, 64 * MiB), n=2000):
    """The CPU time of torch.empty + free, per pair, in this process (cache hits)."""
    out = {}
    for size in sizes:
        x = torch.empty(size, dtype=torch.uint8, device="cuda")
        del x
        t0 = time.perf_counter()
        for _ in range(n):
            x = torch.empty(size, dtype=torch.uint8, device="cuda")
            del x
        out[str(size)] = round((time.perf_counter() - t0) / n * 1e6, 3)
    return out


# The operators that allocate device memory: PyTorch's allocator (or gvmalloc's
# backend) runs inside them, so their self CPU time holds the allocations'
# time. Frees run in tensor destructors, outside any operator: not in it (the
# pair cost below covers both).
ALLOCATING_OPS = ("aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
                  "aten::new_empty_strided", "aten::resize_")


def device_intervals(torch, prof):
    """(start, end) in µs of every activity on the GPU the profiler saw (kernels,
    copies, sets), from the profiler's events; empty if it recorded none."""
    from torch.autograd import DeviceType
    ivs = []
    for e in prof.events():
        if getattr(e, "device_type", None) == DeviceType.CUDA:
            ivs.append((e.time_range.start, e.time_range.end))
    if not ivs:
        # Older layouts keep the device activities in the kineto results only.
        try:
            for e in prof.profiler.kineto_results.events():
                if e.device_type() == DeviceType.CUDA:
                    ivs.append((e.start_ns() / 1e3, (e.start_ns() + e.duration_ns()) / 1e3))
        except AttributeError:
            pass
    return sorted(ivs)


def gpu_timeline(ivs, n):
    """Per step: how long the GPU was busy (the union of its activities), the span
    from its first activity to its last, and the idle time in between (the GPU
    waiting for the host: launches, syncs, the allocator's waits)."""
    if not ivs:
        return None
    busy, (cur_s, cur_e) = 0.0, ivs[0]
    for s, e in ivs[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = max(e for _, e in ivs) - ivs[0][0]
    return {"gpu_busy_ms_per_step": round(busy / 1e3 / n, 3),
            "gpu_span_ms_per_step": round(span / 1e3 / n, 3),
            "gpu_idle_ms_per_step": round((span - busy) / 1e3 / n, 3),
            "gpu_activities_per_step": round(len(ivs) / n, 1)}


def profile_table(torch, step, n):
    """The profiler's table of the busiest operators over `n` steps, and per step the
    self CPU time and calls of the operators that allocate device memory, beside the
    self CPU time of all operators."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    allocating = [e for e in events if e.key in ALLOCATING_OPS]
    table = events.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=48)
    return table, {
        "steps": n,
        "gpu": gpu_timeline(device_intervals(torch, prof), n),
        "alloc_ops_self_cpu_ms_per_step": round(sum(e.self_cpu_time_total for e in allocating) / 1e3 / n, 3),
        "alloc_ops_calls_per_step": round(sum(e.count for e in allocating) / n, 1),
        "all_ops_self_cpu_ms_per_step": round(total / 1e3 / n, 3),
        "by_op": {e.key: {"calls": e.count, "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 3)}
                  for e in allocating},
    }


def allocations_so_far(torch):
    return torch.cuda.memory_stats().get("allocation.all.allocated", 0)


TIMED_START = {}


def mark_timed_start(torch, allocator):
    """The allocation count now (the timed steps begin), and for gvmalloc its
    driver counters, so that finish() can say what the timed steps alone cost
    in driver calls: a growth, a release or a fence there is host time inside
    the step, where a warm-up's is not."""
    if is_gvm(allocator):
        TIMED_START["gvm"] = gvm_counters()
    return allocations_so_far(torch)


def gvm_counters():
    import gvmalloc
    s = gvmalloc.stats()
    d = s["devices"][0] if s["devices"] else {}
    out = {k: d.get(k, 0) for k in ("chunks_mapped", "chunks_unmapped", "fences")}
    out["driver_calls"] = sum(v["calls"] for v in s["driver_calls"].values())
    out["driver_ns"] = sum(v["ns"] for v in s["driver_calls"].values())
    # Per entry point too: a fence's wait for queued work (cuEventSynchronize)
    # and a growth's mapping are both host time, and only the split says which.
    out["by_call"] = {name: (v["calls"], v["ns"]) for name, v in s["driver_calls"].items()}
    return out


def counters_since(now, then):
    """What gvm_counters() grew by between two readings: the counts, driver_ms,
    and by_call as "entry point: calls / ms" for the entry points called."""
    out = {k: now[k] - then[k] for k in now if k not in ("driver_ns", "by_call")}
    out["driver_ms"] = round((now["driver_ns"] - then["driver_ns"]) / 1e6, 3)
    calls = []
    for name, (n, ns) in now["by_call"].items():
        n0, ns0 = then["by_call"].get(name, (0, 0))
        if n > n0:
            calls.append((name, n - n0, ns - ns0))
    calls.sort(key=lambda c: -c[2])
    out["by_call"] = "; ".join("%s %d / %.3f ms" % (c, n, ns / 1e6) for c, n, ns in calls)
    return out


def gvm_summary():
    import gvmalloc
    s = gvmalloc.stats()
    calls = sorted(((name, v["calls"], v["ns"]) for name, v in s["driver_calls"].items() if v["calls"]),
                   key=lambda c: -c[2])
    d = s["devices"][0] if s["devices"] else {}
    keep = ("allocations", "cache_hits", "chunks_mapped", "chunks_unmapped", "fences", "oom_retries",
            "cross_stream_waits", "peak_reserved_bytes", "peak_live_bytes")
    return {"driver_calls": [{"call": c, "calls": n, "ms": round(ns / 1e6, 3)} for c, n, ns in calls],
            "device0": {k: d.get(k) for k in keep}}


def finish(torch, allocator, times, checks, step, profile_steps, allocations, **extra):
    """allocations: blocks allocated over the timed steps (memory_stats' count)."""
    in_timed = None
    if is_gvm(allocator) and "gvm" in TIMED_START:
        # Read before the pairs and the profiled steps below add their own.
        in_timed = counters_since(gvm_counters(), TIMED_START["gvm"])
    peak = torch.cuda.max_memory_reserved()
    pairs = alloc_pair_us(torch)
    table, alloc_ops = profile_table(torch, step, profile_steps)
    out = dict(allocator=allocator, median_step_s=statistics.median(times), steps=len(times),
               step_times_s=[round(t, 5) for t in times],
               peak_reserved=peak, checks=checks, alloc_pair_us=pairs, profile=table,
               alloc_ops=alloc_ops, allocations_per_step=round(allocations / max(1, len(times)), 1),
               backend=torch.cuda.get_allocator_backend(), **extra)
    if is_gvm(allocator):
        out["gvmalloc"] = gvm_summary()
        if in_timed is not None:
            out["gvmalloc"]["timed_steps"] = in_timed
    result(**out)


class Built:
    """A program built and not yet run: its torch module, step() (one training
    step or generate() call), check(out) (a step's output as the string compared
    bit for bit: a loss's hex, the tokens' digest), its warm-up steps, its timed
    steps, the steps profiled after them, and the extra fields of its result."""

    def __init__(self, torch, step, check, warm, steps, profile_steps, **extra):
        self.torch, self.step, self.check = torch, step, check
        self.warm, self.steps, self.profile_steps, self.extra = warm, steps, profile_steps, extra


def loss_check(loss):
    return loss.item().hex()


def build_resnet50(allocator, steps):
    torch = setup(allocator)
    import torchvision
    torch.backends.cudnn.benchmark = True
    # GVM_TORCH_CUDNN_BENCHMARK_LIMIT=N: cuDNN's benchmark times only the first N
    # candidates its heuristics rank (PyTorch's default is 10). With 1 every
    # process gets the same algorithms, so the timing race of the benchmark no
    # longer differs between the allocators' processes.
    limit = os.environ.get("GVM_TORCH_CUDNN_BENCHMARK_LIMIT")
    if limit:
        torch.backends.cudnn.benchmark_limit = int(limit)
    model = torchvision.models.resnet50(weights=None).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator(device="cuda").manual_seed(1)
    batch = 64
    data = [(torch.randn(batch, 3, 224, 224, device="cuda", generator=g).to(memory_format=torch.channels_last),
             torch.randint(0, 1000, (batch,), device="cuda", generator=g)) for _ in range(4)]
    loss_fn = torch.nn.CrossEntropyLoss()
    state = {"i": 0}

    def step():
        x, y = data[state["i"] % len(data)]
        state["i"] += 1
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    # 5 warm-up steps: the first steps run cuDNN's benchmark.
    return Built(torch, step, loss_check, 5, steps, 3, batch=batch)


def build_gpt2(allocator, steps):
    torch = setup(allocator)
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config()
    model = GPT2LMHeadModel(cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    rng = random.Random(1234)
    gen = torch.Generator().manual_seed(42)
    # The schedule's first shapes do not depend on `steps`: a longer run starts
    # with the same steps as a shorter one.
    schedule = [(rng.choice([4, 8, 12, 16]), rng.randint(128, 1024)) for _ in range(steps + 2)]
    batches = [torch.randint(0, cfg.vocab_size, s, generator=gen) for s in schedule]
    state = {"i": 0}

    def step():
        ids = batches[state["i"] % len(batches)].cuda(non_blocking=True)
        state["i"] += 1
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return Built(torch, step, loss_check, 2, steps, 4)


def build_llama(allocator, steps):
    torch = setup(allocator)
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=16,
                      num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                      max_position_embeddings=2048)
    model = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    gen = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, cfg.vocab_size, (4, 128), generator=gen).cuda()
    # 128 new tokens a call: the KV cache grows 128 times, and three runs of
    # the program fit the time budget of tools/torch-gpu-run.sh.
    new_tokens = 128

    def step():
        with torch.no_grad():
            return model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                  do_sample=False, use_cache=True, pad_token_id=0)

    def check(out):
        return out[:, 128:].cpu().numpy().tobytes().hex()[:64] + ":%d" % int(out.sum().item())

    return Built(torch, step, check, 1, max(1, steps // 8), 1,
                 tokens_per_call=new_tokens * prompt.shape[0])


def run_built(allocator, prog):
    """The program's warm-up and timed steps, then finish(): its result line.
    The checks are of every step, the warm-up's included."""
    torch = prog.torch
    times, checks = [], []
    for i in range(prog.warm + prog.steps):
        if i == prog.warm:
            a0 = mark_timed_start(torch, allocator)
        dt, out = timed(torch, prog.step)
        checks.append(prog.check(out))
        if i >= prog.warm:
            times.append(dt)
    finish(torch, allocator, times, checks, prog.step, prog.profile_steps,
           allocations_so_far(torch) - a0, **prog.extra)


def resnet50(allocator, steps):
    run_built(allocator, build_resnet50(allocator, steps))


def gpt2(allocator, steps):
    run_built(allocator, build_gpt2(allocator, steps))


def llama(allocator, steps):
    run_built(allocator, build_llama(allocator, steps))


PROGRAMS = {"resnet50": resnet50, "gpt2": gpt2, "llama": llama}
# The programs built, not run (bench/torch_lockstep.py steps them itself).
BUILDERS = {"resnet50": build_resnet50, "gpt2": build_gpt2, "llama": build_llama}


# ---- the side-by-side run ------------------------------------------------------------

def program_env(allocator):
    """The environment of a program's process with `allocator` (a name, with or
    without #n): PyTorch's allocator configuration of that allocator alone,
    gvm-base's libraries, the gvmalloc package on PYTHONPATH."""
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.update(ALLOCATORS[allocator.split("#")[0]])
    if allocator.split("#")[0] == "gvm-base":
        env.update(base_libraries(os.environ.get("GVM_BASE_BUILD")))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(ROOT, "integrations", "python"),
                                                    env.get("PYTHONPATH")) if p)
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return env


def run_one(program, allocator, steps, timeout):
    env = program_env(allocator)
    cmd = [sys.executable, __file__, "worker", program, allocator.split("#")[0], str(steps)]
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return {"allocator": allocator, "error": "timed out after %d s" % timeout, "stderr": err[-2000:]}
    for line in reversed(r.stdout.splitlines()):
        if line.startswith("GVM_RESULT "):
            out = json.loads(line[len("GVM_RESULT "):])
            out["allocator"] = allocator
            out["wall_s"] = round(time.monotonic() - t0, 1)
            return out
    how = ("signal %d" % -r.returncode) if r.returncode < 0 else "exit %d" % r.returncode
    return {"allocator": allocator, "error": "no result (%s)" % how, "stderr": r.stderr[-3000:]}


def compare(checks, reference):
    if reference is None:
        return "no native run"
    if checks == reference:
        return "yes"
    for i, (a, b) in enumerate(zip(checks, reference)):
        if a != b:
            return "no (from step %d)" % i
    return "no (%d vs %d steps)" % (len(checks), len(reference))


def split_round(allocator):
    """("gvm", 2) for "gvm#2"; ("gvm", 1) for "gvm"."""
    name, _, n = allocator.partition("#")
    return name, int(n) if n.isdigit() else 1


def rounds_table(runs):
    """Per program with more than one round (a run named alloc#n is round n):
    each allocator's step time against the native and the expandable run of
    the same round. Between runs minutes apart the host moves a program's step
    by more than the allocators do (docs/pytorch.md), so a verdict compares
    runs of one round, never of two."""
    lines = []
    medians = {}
    for program, rs in runs.items():
        done = [r for r in rs if "error" not in r]
        by_round = {}
        for r in done:
            name, n = split_round(r["allocator"])
            by_round.setdefault(n, {})[name] = r
        if len(by_round) < 2:
            continue
        if not lines:
            lines = ["", "=== Rounds (a run named alloc#n is round n, the first of each allocator "
                     "round 1): each run's median step ÷ that of the native and of the "
                     "expandable run of its own round",
                     "%-9s %-11s %6s  %-26s %-26s %s" % ("program", "allocator", "rounds",
                                                         "vs native (each round)",
                                                         "vs expandable (each round)",
                                                         "rounds at or below both")]
        names = []
        for n in sorted(by_round):
            names += [a for a in by_round[n] if a not in names]
        for name in names:
            vs_native, vs_expandable, both, rounds = [], [], 0, 0
            raw = {"native": [], "expandable": []}
            for n in sorted(by_round):
                r = by_round[n].get(name)
                if r is None:
                    continue
                rounds += 1
                ratios = []
                for ref_name, out in (("native", vs_native), ("expandable", vs_expandable)):
                    ref = by_round[n].get(ref_name)
                    if ref is None:
                        out.append("—")
                        continue
                    ratio = r["median_step_s"] / ref["median_step_s"]
                    out.append("%.3f" % ratio)
                    raw[ref_name].append(ratio)
                    ratios.append(ratio)
                both += 1 if len(ratios) == 2 and max(ratios) <= 1.0 else 0
            lines.append("%-9s %-11s %6d  %-26s %-26s %d of %d" % (
                program, name, rounds, " ".join(vs_native), " ".join(vs_expandable), both, rounds))
            medians[(program, name)] = [median_of(raw["native"]), median_of(raw["expandable"])]
    if lines:
        lines += ["", "=== Rounds, the median of each allocator's ratios over its rounds",
                  "%-9s %-11s %10s %14s" % ("program", "allocator", "vs native", "vs expandable")]
        for (program, name), (n, e) in medians.items():
            lines.append("%-9s %-11s %10s %14s" % (program, name, n, e))
    return lines


def median_of(ratios):
    """The median of a rounds row's ratios, printed ("—": none)."""
    return "%.3f" % statistics.median(ratios) if ratios else "—"


def rotated_rounds(allocators, rounds):
    """The allocators `rounds` times, round r (from 1) rotated left by r - 1 and
    named alloc#r from round 2 on."""
    if any("#" in a for a in allocators):
        raise SystemExit("--rounds names the rounds itself: give the allocators without #n "
                         "(got %s)" % ",".join(allocators))
    order = []
    for r in range(1, rounds + 1):
        k = (r - 1) % len(allocators)
        for a in allocators[k:] + allocators[:k]:
            order.append(a if r == 1 else "%s#%d" % (a, r))
    return order


def render(runs, seconds):
    """The tables (and the profiles) of {program: [run result, ...]}."""
    lines = ["", "=== PyTorch programs (%.0f s): native = PyTorch's allocator, expandable = with "
             "expandable_segments:True, gvm = gvmalloc's native backend" % seconds,
             "%-9s %-11s %12s %9s %14s %9s  %-18s %s" % ("program", "allocator", "median step", "vs native",
                                                         "peak reserved", "vs native", "equal to native",
                                                         "alloc+free us (4K/1M/64M)")]
    for program, rs in runs.items():
        ref = next((r for r in rs if r["allocator"] == "native" and "error" not in r), None)
        for r in rs:
            if "error" in r:
                lines.append("%-9s %-11s %s" % (program, r["allocator"], r["error"] if r.get("not_run")
                                                 else "FAILED: " + r["error"]))
                continue
            ratio_t = r["median_step_s"] / ref["median_step_s"] if ref else float("nan")
            ratio_m = r["peak_reserved"] / ref["peak_reserved"] if ref else float("nan")
            unit = "ms" if program != "llama" else "ms/call"
            lines.append("%-9s %-11s %9.2f %-2s %8.3fx %10.0f MiB %8.3fx  %-18s %s" % (
                program, r["allocator"], r["median_step_s"] * 1e3, unit, ratio_t, r["peak_reserved"] / MiB,
                ratio_m, compare(r["checks"], ref["checks"] if ref else None),
                "/".join("%.2f" % v for v in r["alloc_pair_us"].values())))
    lines += rounds_table(runs)
    lines += ["", "=== Where the time goes, per step (CPU ms from torch.profiler over steps after "
              "the timed ones): alloc ops = the operators that allocate (%s; the allocator runs "
              "inside them); allocs x pair = allocations per step x the cost of a 4 KiB "
              "allocate+free pair in the process (frees included, which run outside any operator)"
              % ", ".join(o.split("::")[1] for o in ALLOCATING_OPS),
              "%-9s %-11s %11s %12s %14s %10s %13s %16s" % (
                  "program", "allocator", "step ms", "allocs/step", "alloc ops ms", "% of step",
                  "all ops ms", "allocs x pair ms")]
    for program, rs in runs.items():
        for r in rs:
            if "error" in r:
                continue
            o = r["alloc_ops"]
            step_ms = r["median_step_s"] * 1e3
            # What allocate+free pairs cost a step at the measured 4 KiB cache-hit
            # price (the common case): allocations per step x pair cost.
            pair_4k_us = next(iter(r["alloc_pair_us"].values()))
            lines.append("%-9s %-11s %11.2f %12.1f %14.3f %9.2f%% %13.3f %16.3f" % (
                program, r["allocator"], step_ms, r["allocations_per_step"],
                o["alloc_ops_self_cpu_ms_per_step"], 100.0 * o["alloc_ops_self_cpu_ms_per_step"] / step_ms,
                o["all_ops_self_cpu_ms_per_step"], r["allocations_per_step"] * pair_4k_us / 1e3))
    lines += ["", "=== The GPU's side of a step (torch.profiler's device activities over the "
              "profiled steps): busy = the union of kernels, copies and sets; idle = the gaps "
              "between the first and the last (the GPU waiting for the host)",
              "%-9s %-11s %11s %12s %12s %12s %14s" % ("program", "allocator", "step ms", "gpu busy ms",
                                                      "gpu span ms", "gpu idle ms", "activities")]
    for program, rs in runs.items():
        for r in rs:
            if "error" in r:
                continue
            g = r["alloc_ops"].get("gpu")
            if not g:
                lines.append("%-9s %-11s (the profiler recorded no device activity)" % (program, r["allocator"]))
                continue
            lines.append("%-9s %-11s %11.2f %12.3f %12.3f %12.3f %14.1f" % (
                program, r["allocator"], r["median_step_s"] * 1e3, g["gpu_busy_ms_per_step"],
                g["gpu_span_ms_per_step"], g["gpu_idle_ms_per_step"], g["gpu_activities_per_step"]))
    for program, rs in runs.items():
        for r in rs:
            if "error" in r or not (r["allocator"] == "native" or is_gvm(r["allocator"])):
                continue
            lines.append("")
            lines.append("--- %s, %s: torch.profiler, busiest operators by self CPU time" % (program, r["allocator"]))
            lines.append(r["profile"].rstrip())
            lines.append("allocating operators: " + ", ".join(
                "%s %d calls %.1f ms" % (k, v["calls"], v["self_cpu_ms"])
                for k, v in sorted(r["alloc_ops"]["by_op"].items())))
            if is_gvm(r["allocator"]) and "gvmalloc" in r:
                g = r["gvmalloc"]
                lines.append("gvmalloc driver calls (all of the run): " + ", ".join(
                    "%s %d calls %.1f ms" % (c["call"], c["calls"], c["ms"]) for c in g["driver_calls"][:8]))
                lines.append("gvmalloc device 0: " + ", ".join("%s %s" % kv for kv in g["device0"].items()))
                if "timed_steps" in g:
                    lines.append("gvmalloc in the timed steps alone: " + ", ".join(
                        "%s %s" % kv for kv in g["timed_steps"].items()))
    return "\n".join(lines)


def main(argv):
    if argv and argv[0] == "worker":
        PROGRAMS[argv[1]](argv[2], int(argv[3]))
        return 0
    out_dir = os.environ.get("OUT") or "torch-programs-out"
    programs, allocators, steps, deadline = list(PROGRAMS), ["native", "gvm", "expandable"], 16, None
    rounds = 1
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--out":
            out_dir = args.pop(0)
        elif a == "--programs":
            programs = args.pop(0).split(",")
        elif a == "--allocators":
            allocators = args.pop(0).split(",")
        elif a == "--steps":
            steps = int(args.pop(0))
        elif a == "--deadline":
            deadline = float(args.pop(0))
        elif a == "--rounds":
            rounds = int(args.pop(0))
            if rounds < 1:
                raise SystemExit("--rounds: at least 1 (got %d)" % rounds)
        else:
            raise SystemExit(__doc__)
    unknown = [a for a in allocators if a.split("#")[0] not in ALLOCATORS]
    if unknown:
        raise SystemExit("--allocators: unknown %s (known: %s)" % (",".join(unknown),
                                                                   ",".join(ALLOCATORS)))
    if any(a.split("#")[0] == "gvm-base" for a in allocators):
        base_libraries(os.environ.get("GVM_BASE_BUILD"))  # refused before any run
    if rounds > 1:
        allocators = rotated_rounds(allocators, rounds)
    os.makedirs(out_dir, exist_ok=True)
    start = time.monotonic()
    runs = {}
    order = [(p, a) for p in programs for a in allocators]
    # ResNet-50's native run again, last (the least needed), unless the rounds
    # asked for already name a second one: a repeat would take its name, and
    # with it its round's place in the rounds table.
    if "resnet50" in programs and "native" in allocators and not any(
            split_round(a) == ("native", 2) for a in allocators):
        order.append(("resnet50", "native#2"))
    for program in programs:
        runs[program] = []
    for program, allocator in order:
        left = None if deadline is None else deadline - (time.monotonic() - start)
        # A run is started only if it should end by the deadline: it takes about
        # as long as this program's runs before it, or, for a program not run
        # yet, as the longest run so far (20 s before any).
        walls = ([r["wall_s"] for r in runs[program] if "wall_s" in r] or
                 [r["wall_s"] for rs in runs.values() for r in rs if "wall_s" in r])
        expect = 1.2 * max(walls) if walls else 20.0
        if left is not None and left < expect:
            runs[program].append({"allocator": allocator, "not_run": True,
                                  "error": "not run: %.0f s left of the --deadline, a run takes "
                                           "about %.0f s" % (max(left, 0), expect)})
            continue
        print("== %s with %s" % (program, allocator), flush=True)
        r = run_one(program, allocator, steps,
                    timeout=int(240 if left is None else min(240, max(left, 2 * expect))))
        if "error" in r:
            print("   FAILED: %s\n%s" % (r["error"], r.get("stderr", "")[-1500:]), flush=True)
        else:
            print("   median step %.2f ms, peak reserved %.0f MiB (%.0f s)"
                  % (r["median_step_s"] * 1e3, r["peak_reserved"] / MiB, r["wall_s"]), flush=True)
        runs[program].append(r)
    text = render(runs, time.monotonic() - start)
    print(text, flush=True)
    with open(os.path.join(out_dir, "torch-programs.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out_dir, "torch-programs.json"), "w") as f:
        json.dump(runs, f, indent=1)
    failed = [r for rs in runs.values() for r in rs if "error" in r and not r.get("not_run")]
    not_run = sum(1 for rs in runs.values() for r in rs if r.get("not_run"))
    if not_run:
        print("%d run(s) not started: the --deadline passed (in the table)" % not_run, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
