"""Whole PyTorch programs with PyTorch's allocator, PyTorch's allocator with
expandable segments, and gvmalloc's native backend, side by side in one run
(docs/pytorch.md, "Programs").

    python bench/torch_programs.py [--out DIR] [--programs resnet50,gpt2,llama]
                                   [--allocators native,expandable,gvm] [--steps N]
                                   [--deadline SECONDS]  (runs not started by then are
                                                          reported as not run)

Programs (random initialisation, configurations only: nothing is downloaded):
  resnet50  torchvision ResNet-50 training, torch.backends.cudnn.benchmark=True,
            bf16 autocast, channels_last, SGD; one fixed batch shape
  gpt2      transformers GPT-2 small training, AdamW, bf16 autocast, batch and
            sequence length varying from step to step (the same schedule for all)
  llama     a Llama-style decoder (transformers LlamaConfig, 16 layers) in bf16,
            greedy generate() of 256 tokens, KV cache growing each token

Each program runs once per allocator, each run in a process of its own (the
allocator is chosen before CUDA starts) with the same seeds; the ResNet-50 run
with PyTorch's allocator is made twice, to show whether cuDNN's timed
algorithm choice keeps it bit-identical to itself. Per run: median step time,
torch.cuda.max_memory_reserved(), the losses (or generated tokens) compared bit
for bit with the native run, the cost of an allocate+free pair of a few sizes
inside the program's process, a torch.profiler table of the busiest operators,
and for gvmalloc its driver calls by entry point (where its own time goes).
Prints one table and writes torch-programs.{txt,json} into DIR (default
$OUT, else ./torch-programs-out). A run that fails is reported and the others go on.
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
}


def result(**kw):
    print("GVM_RESULT " + json.dumps(kw), flush=True)


# ---- inside one process ----------------------------------------------------------

def setup(allocator):
    import torch
    if allocator == "gvm":
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


def profile_table(torch, step, n):
    """The profiler's table of the busiest operators over `n` steps, and the CPU time of
    the operators that allocate device memory (aten::empty*, where the allocator runs)
    against all operators' CPU time."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    allocating = sum(e.self_cpu_time_total for e in events if e.key.startswith("aten::empty"))
    calls = sum(e.count for e in events if e.key.startswith("aten::empty"))
    table = events.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=48)
    return table, {"empty_ops_self_cpu_ms": round(allocating / 1e3, 3), "empty_ops_calls": calls,
                   "all_ops_self_cpu_ms": round(total / 1e3, 3)}


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


def finish(torch, allocator, times, checks, step, profile_steps, **extra):
    peak = torch.cuda.max_memory_reserved()
    pairs = alloc_pair_us(torch)
    table, empty_ops = profile_table(torch, step, profile_steps)
    out = dict(allocator=allocator, median_step_s=statistics.median(times), steps=len(times),
               peak_reserved=peak, checks=checks, alloc_pair_us=pairs, profile=table,
               empty_ops=empty_ops,
               backend=torch.cuda.get_allocator_backend(), **extra)
    if allocator == "gvm":
        out["gvmalloc"] = gvm_summary()
    result(**out)


def resnet50(allocator, steps):
    torch = setup(allocator)
    import torchvision
    torch.backends.cudnn.benchmark = True
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

    warm = 5  # the first steps run cuDNN's benchmark
    times, losses = [], []
    for i in range(warm + steps):
        dt, loss = timed(torch, step)
        losses.append(loss.item().hex())
        if i >= warm:
            times.append(dt)
    finish(torch, allocator, times, losses, step, 5, batch=batch)


def gpt2(allocator, steps):
    torch = setup(allocator)
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config()
    model = GPT2LMHeadModel(cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    rng = random.Random(1234)
    gen = torch.Generator().manual_seed(42)
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

    times, losses = [], []
    for i in range(len(batches)):
        dt, loss = timed(torch, step)
        losses.append(loss.item().hex())
        if i >= 2:
            times.append(dt)
    finish(torch, allocator, times, losses, step, 4)


def llama(allocator, steps):
    torch = setup(allocator)
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=16,
                      num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                      max_position_embeddings=2048)
    model = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    gen = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, cfg.vocab_size, (4, 128), generator=gen).cuda()
    new_tokens = 256

    def step():
        with torch.no_grad():
            return model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                  do_sample=False, use_cache=True, pad_token_id=0)

    times, outputs = [], []
    for i in range(1 + max(1, steps // 8)):
        dt, out = timed(torch, step)
        outputs.append(out[:, 128:].cpu().numpy().tobytes().hex()[:64] + ":%d" % int(out.sum().item()))
        if i >= 1:
            times.append(dt)
    finish(torch, allocator, times, outputs, step, 1, tokens_per_call=new_tokens * prompt.shape[0])


PROGRAMS = {"resnet50": resnet50, "gpt2": gpt2, "llama": llama}


# ---- the side-by-side run ------------------------------------------------------------

def run_one(program, allocator, steps, timeout):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.update(ALLOCATORS[allocator.split("#")[0]])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(ROOT, "integrations", "python"),
                                                    env.get("PYTHONPATH")) if p)
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
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


def render(runs, seconds):
    """The table (and the profiles) of {program: [run result, ...]}."""
    lines = ["", "=== PyTorch programs (%.0f s): native = PyTorch's allocator, expandable = with "
             "expandable_segments:True, gvm = gvmalloc's native backend" % seconds,
             "%-9s %-11s %12s %9s %14s %9s  %-18s %s" % ("program", "allocator", "median step", "vs native",
                                                         "peak reserved", "vs native", "equal to native",
                                                         "alloc+free us (4K/1M/64M)")]
    for program, rs in runs.items():
        ref = next((r for r in rs if r["allocator"] == "native" and "error" not in r), None)
        for r in rs:
            if "error" in r:
                lines.append("%-9s %-11s FAILED: %s" % (program, r["allocator"], r["error"]))
                continue
            ratio_t = r["median_step_s"] / ref["median_step_s"] if ref else float("nan")
            ratio_m = r["peak_reserved"] / ref["peak_reserved"] if ref else float("nan")
            unit = "ms" if program != "llama" else "ms/call"
            lines.append("%-9s %-11s %9.2f %-2s %8.3fx %10.0f MiB %8.3fx  %-18s %s" % (
                program, r["allocator"], r["median_step_s"] * 1e3, unit, ratio_t, r["peak_reserved"] / MiB,
                ratio_m, compare(r["checks"], ref["checks"] if ref else None),
                "/".join("%.2f" % v for v in r["alloc_pair_us"].values())))
    for program, rs in runs.items():
        for r in rs:
            if "error" in r or r["allocator"] not in ("native", "gvm"):
                continue
            lines.append("")
            lines.append("--- %s, %s: torch.profiler, busiest operators by self CPU time" % (program, r["allocator"]))
            lines.append(r["profile"].rstrip())
            e = r["empty_ops"]
            lines.append("allocating operators (aten::empty*): %d calls, %.1f ms self CPU of %.1f ms "
                         "for all operators" % (e["empty_ops_calls"], e["empty_ops_self_cpu_ms"],
                                               e["all_ops_self_cpu_ms"]))
            if r["allocator"] == "gvm":
                g = r["gvmalloc"]
                lines.append("gvmalloc driver calls (all of the run): " + ", ".join(
                    "%s %d calls %.1f ms" % (c["call"], c["calls"], c["ms"]) for c in g["driver_calls"][:8]))
                lines.append("gvmalloc device 0: " + ", ".join("%s %s" % kv for kv in g["device0"].items()))
    return "\n".join(lines)


def main(argv):
    if argv and argv[0] == "worker":
        PROGRAMS[argv[1]](argv[2], int(argv[3]))
        return 0
    out_dir = os.environ.get("OUT") or "torch-programs-out"
    programs, allocators, steps, deadline = list(PROGRAMS), list(ALLOCATORS), 16, None
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
        else:
            raise SystemExit(__doc__)
    os.makedirs(out_dir, exist_ok=True)
    start = time.monotonic()
    runs = {}
    for program in programs:
        order = list(allocators)
        if program == "resnet50" and "native" in order:
            order.append("native#2")  # last: the least needed
        runs[program] = []
        for allocator in order:
            left = None if deadline is None else deadline - (time.monotonic() - start)
            if left is not None and left < 20:
                runs[program].append({"allocator": allocator, "error": "not run: the --deadline passed"})
                continue
            print("== %s with %s" % (program, allocator), flush=True)
            r = run_one(program, allocator, steps, timeout=int(min(240, left or 240)))
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
    failed = [r for rs in runs.values() for r in rs if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
