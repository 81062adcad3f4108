"""PyTorch's allocator semantics, checked the same way with PyTorch's own
allocator and with gvmalloc: our own equivalents of the allocator tests of
PyTorch's test/test_cuda.py (record_stream, out of memory and retry, memory
fraction, statistics, empty_cache, snapshots and history, cuDNN benchmark,
CUDA graphs, make_graphed_callables, MemPool, torch.compile's
mode="reduce-overhead"), plus what a program meets beside them (threads,
CUDA IPC, the profiler's memory view).

The allocator is chosen before CUDA starts, so each allocator runs in its own
interpreter, a worker that runs the cases one after the other (a case marked
fresh gets a worker of its own). A case raises AssertionError when the
semantics differ, Skip when it cannot run here.

    python _torch_semantics.py run CASE native|gvm     one case, fresh interpreter
    python _torch_semantics.py worker native|gvm       cases by name on stdin
    python _torch_semantics.py table [--out DIR] [--cases a,b] [--timeout S]
                                     [--allocators native,gvm] [--deadline S]
                                                       every case under both, one table

In table mode each case runs under each allocator before the next case (the
cases marked fresh after the others); a worker that dies is reported as CRASH
for the case it was running (with its exit status or signal and the end of its
stderr), a case that runs past its time as TIMEOUT, and the remaining cases go
on in a new worker, started ahead of need.
tools/torch-semantics.sh runs the table with the environment set.
"""

import gc
import json
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20
GiB = 1 << 30


class Skip(Exception):
    """The case cannot run here (no second GPU, a PyTorch without the feature)."""


# ---- the cases -----------------------------------------------------------------

CASES = {}  # name -> (function, one-line description, options)


def case(description, fresh=False, timeout=120, expect=None):
    """Registers a case. fresh: run in an interpreter of its own. expect: for a case
    whose right outcome differs by allocator, {allocator: note} (docs/pytorch.md)."""
    def register(f):
        CASES[f.__name__] = (f, description, {"fresh": fresh, "timeout": timeout,
                                              "expect": expect or {}})
        return f
    return register


def torch_():
    import torch
    return torch


_cycles = None


def cycles_per_ms():
    """GPU clock cycles per millisecond, for torch.cuda._sleep (measured once)."""
    global _cycles
    if _cycles is None:
        torch = torch_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(1000000)
        end.record()
        end.synchronize()
        _cycles = 1000000 / start.elapsed_time(end)
    return _cycles


def settle():
    gc.collect()
    if "torch" in sys.modules:
        sys.modules["torch"].cuda.synchronize()


@case("the allocator PyTorch reports is the one chosen")
def allocator_backend(alloc):
    torch = torch_()
    torch.zeros(1, device="cuda")
    name = torch.cuda.get_allocator_backend()
    want = "gvmalloc" if alloc == "gvm" else "native"
    assert name == want, "get_allocator_backend() is %r, expected %r" % (name, want)
    detail = {"backend": name}
    if alloc == "gvm":
        import gvmalloc.torch as gt
        info = gt.backend_info()
        assert info["installed"], "gvmalloc's backend is loaded but not installed: %r" % info
        detail["built_for"] = info["built_for"]
    return detail


def _record_stream_trial(torch, view):
    n = 16 * MiB  # 64 MiB of float32
    cur = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    x = torch.full((n,), 1.0, device="cuda")
    side.wait_stream(cur)
    with torch.cuda.stream(side):
        torch.cuda._sleep(int(50 * cycles_per_ms()))  # the read below starts 50 ms late
        src = x[1024:] if view else x
        y = src.clone()
    (x[1024:] if view else x).record_stream(side)
    x_ptr = x.data_ptr()
    del x, src
    z = torch.full((n,), 2.0, device="cuda")  # same size, on the current stream
    reused = z.data_ptr() == x_ptr
    torch.cuda.synchronize()
    wrong = int((y != 1.0).sum().item())
    del y, z
    return wrong, reused


@case("Tensor.record_stream: a freed block is not reused while the recorded stream reads it")
def record_stream_reuse(alloc):
    torch = torch_()
    results = [_record_stream_trial(torch, view=False) for _ in range(5)]
    wrong = [w for w, _ in results]
    assert sum(wrong) == 0, "elements read wrong in 5 trials: %s" % wrong
    return {"trials": 5, "wrong": wrong, "reused_at_once": sum(r for _, r in results)}


@case("record_stream on a view at an offset protects the whole block")
def record_stream_shifted_view(alloc):
    torch = torch_()
    results = [_record_stream_trial(torch, view=True) for _ in range(3)]
    wrong = [w for w, _ in results]
    assert sum(wrong) == 0, "elements read wrong: %s" % wrong
    return {"wrong": wrong}


@case("an allocation larger than the GPU raises torch.OutOfMemoryError; the device still works")
def oom_error(alloc):
    # What PyTorch guarantees: the error's type, and a device that still works
    # after it. The wording is each allocator's own (PyTorch's refuses 8e9 GiB
    # with "Tried to allocate more than 1EB memory." before its allocator runs,
    # so without counting it in num_ooms); gvmalloc's is checked under gvm.
    torch = torch_()
    t = torch.zeros(1024, device="cuda")
    ooms0 = torch.cuda.memory_stats().get("num_ooms", 0)
    messages = {}
    for label, n in (("500 GiB", 500 * GiB), ("8e9 GiB", 1024 * 1024 * 1024 * 8000000000)):
        try:
            torch.empty(n, dtype=torch.int8, device="cuda")
        except torch.OutOfMemoryError as e:
            messages[label] = str(e)
        else:
            raise AssertionError("no torch.OutOfMemoryError for %s" % label)
    t.fill_(1)
    assert bool((t == 1).all()), "a kernel after the error computed wrong"
    ooms = torch.cuda.memory_stats()["num_ooms"] - ooms0
    # 500 GiB goes through the allocator, which counts it (PyTorch's own test
    # of out-of-memory errors allocates the same).
    assert ooms >= 1, "memory_stats()['num_ooms'] did not count the 500 GiB request"
    if alloc == "gvm":
        for label, size in (("500 GiB", "500.00 GiB"), ("8e9 GiB", "8000000000.00 GiB")):
            m = messages[label]
            assert m.startswith("CUDA out of memory. Tried to allocate %s." % size), m[:300]
            assert "gvmalloc" in m, "gvmalloc's reason is missing: " + m[:300]
        assert ooms == 2, "num_ooms counted %d of the 2 errors" % ooms
    return {"messages": {k: v.splitlines()[0][:200] for k, v in messages.items()}, "num_ooms": ooms}


@case("filling the GPU ends in torch.OutOfMemoryError; after freeing, the same allocation succeeds",
      timeout=180)
def oom_retry_after_free(alloc):
    torch = torch_()
    block = 4 * GiB
    held = []
    message = None
    try:
        for _ in range(80):  # 320 GiB: more than any single GPU holds
            held.append(torch.empty(block, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError as e:
        message = str(e).splitlines()[0]
    assert message is not None, "no OutOfMemoryError after %d x 4 GiB" % len(held)
    n = len(held)
    del held[n // 2:]
    settle()
    again = torch.empty(block, dtype=torch.uint8, device="cuda")
    again.fill_(7)
    assert int(again[-1].item()) == 7
    del again, held
    settle()
    torch.cuda.empty_cache()
    return {"blocks_before_oom": n, "message": message[:160]}


@case("an out-of-memory observer is called before the error is raised", fresh=True)
def oom_observer(alloc):
    torch = torch_()
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is None:
        raise Skip("this torch has no _cuda_attach_out_of_memory_observer")
    seen = []
    attach(lambda device, alloc_, total, free: seen.append((device, alloc_, total, free)))
    try:
        torch.empty(1024 * GiB * 1024, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        pass
    else:
        raise AssertionError("no OutOfMemoryError")
    assert len(seen) == 1, "observer called %d times" % len(seen)
    device, _, total, _ = seen[0]
    assert device == 0 and total > 0, seen[0]
    return {"observer_args": seen[0]}


@case("set_per_process_memory_fraction caps the process; beyond it, OutOfMemoryError")
def memory_fraction(alloc):
    torch = torch_()
    t = torch.zeros(1024, device="cuda")
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(0.5, 0)
    try:
        got = torch.cuda.get_per_process_memory_fraction(0) \
            if hasattr(torch.cuda, "get_per_process_memory_fraction") else None
        if got is not None:
            assert abs(got - 0.5) < 1e-9, "get_per_process_memory_fraction() is %r" % got
        # What is reserved now counts against the cap too (PyTorch's own test
        # subtracts max_memory_reserved, the same in a process that just started).
        ok = int(total * 0.499) - torch.cuda.memory_reserved()
        tmp = torch.empty(ok, dtype=torch.int8, device="cuda")
        del tmp
        torch.cuda.empty_cache()
        try:
            torch.empty(int(total * 0.5), dtype=torch.int8, device="cuda")
        except torch.OutOfMemoryError as e:
            message = str(e).splitlines()[0]
        else:
            raise AssertionError("half the GPU allocated under a 0.5 fraction")
        t.fill_(1)
        assert bool((t == 1).all())
    finally:
        try:
            torch.cuda.set_per_process_memory_fraction(1.0, 0)
        except RuntimeError as e:  # the case's own error (raised above) says more
            print("memory_fraction: resetting the fraction failed: %s" % str(e).splitlines()[0])
        torch.cuda.empty_cache()
    return {"message": message[:160]}


STAT_KEYS = (
    "allocation.all.current", "allocation.small_pool.current", "allocation.large_pool.current",
    "allocated_bytes.all.current", "allocated_bytes.all.peak", "allocated_bytes.all.allocated",
    "allocated_bytes.all.freed", "reserved_bytes.all.current", "reserved_bytes.all.peak",
    "active_bytes.all.current", "requested_bytes.all.current", "segment.all.current",
    "inactive_split_bytes.all.current", "num_alloc_retries", "num_ooms", "num_device_alloc",
    "num_device_free", "max_split_size",
)


@case("memory_stats keys; memory_allocated / max / reserved follow tensors; peaks reset")
def memory_stats_basics(alloc):
    torch = torch_()
    settle()
    s = torch.cuda.memory_stats()
    missing = [k for k in STAT_KEYS if k not in s]
    assert not missing, "memory_stats() lacks %s" % missing
    m0 = torch.cuda.memory_allocated()
    x = torch.empty(10 * MiB, dtype=torch.uint8, device="cuda")
    assert torch.cuda.memory_allocated() >= m0 + 10 * MiB, "memory_allocated did not grow by 10 MiB"
    assert torch.cuda.max_memory_allocated() >= torch.cuda.memory_allocated()
    assert torch.cuda.memory_reserved() >= torch.cuda.memory_allocated()
    assert torch.cuda.max_memory_reserved() >= torch.cuda.memory_reserved()
    small0 = torch.cuda.memory_stats()["allocated_bytes.small_pool.current"]
    y = torch.empty(4096, dtype=torch.uint8, device="cuda")
    assert torch.cuda.memory_stats()["allocated_bytes.small_pool.current"] >= small0 + 4096
    del x, y
    assert torch.cuda.memory_allocated() == m0, "memory_allocated %d after free, was %d" % (
        torch.cuda.memory_allocated(), m0)
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()
    assert torch.cuda.max_memory_reserved() == torch.cuda.memory_reserved(), (
        "max_memory_reserved %d != memory_reserved %d after reset_peak_memory_stats"
        % (torch.cuda.max_memory_reserved(), torch.cuda.memory_reserved()))
    torch.cuda.reset_accumulated_memory_stats()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == 0
    z = torch.empty(1000, device="cuda")
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == 1
    del z
    p = torch.cuda.caching_allocator_alloc(MiB)
    assert torch.cuda.memory_allocated() >= m0 + MiB
    torch.cuda.caching_allocator_delete(p)
    assert torch.cuda.memory_allocated() == m0
    return {"reserved": torch.cuda.memory_reserved()}


@case("memory_allocated and its peak through a long mix of small and large tensors")
def memory_stats_sequence(alloc):
    torch = torch_()
    settle()
    g = torch.Generator().manual_seed(3)
    m0 = torch.cuda.memory_allocated()
    last = [m0, torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()]

    def check(direction, reset=False):
        m, mx, mr = (torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated(),
                     torch.cuda.max_memory_reserved())
        if direction > 0:
            assert m > last[0], "memory_allocated did not grow"
        elif direction < 0:
            assert m < last[0], "memory_allocated did not shrink"
        else:
            assert m == last[0], "memory_allocated changed"
        assert m <= mx and mx >= last[1] and mr >= last[2], "a peak went backwards"
        assert torch.cuda.memory_reserved() <= mr
        last[:] = [m, mx, mr]
        if reset:
            torch.cuda.reset_peak_memory_stats()
            assert torch.cuda.max_memory_allocated() == m
            last[1] = m
            last[2] = torch.cuda.max_memory_reserved()

    tensors = []
    for i in range(1, 18):
        tensors.append(torch.empty(i * i * 4 + 1, device="cuda"))
        check(1)
    for i in range(5, 22):
        tensors.append(torch.empty(i, i * 7, i * 9, i * 11, device="cuda"))
        check(1, reset=(i % 2 == 0))
    tensors.append(torch.empty(0, 0, 0, device="cuda"))
    check(0)
    order = torch.randperm(len(tensors), generator=g).tolist()
    permuted = [tensors[i] for i in order]
    del tensors
    check(0)
    while permuted:
        n = permuted.pop().numel()
        check(-1 if n else 0)
    torch.cuda.empty_cache()
    check(0, reset=True)
    assert torch.cuda.memory_allocated() == m0
    return {}


@case("empty_cache returns cached memory and leaves max_memory_reserved")
def empty_cache(alloc):
    torch = torch_()
    settle()
    torch.cuda.empty_cache()
    x = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    del x
    before = torch.cuda.memory_reserved()
    peak = torch.cuda.max_memory_reserved()
    assert before >= 256 * MiB, "256 MiB freed but only %d reserved" % before
    torch.cuda.empty_cache()
    after = torch.cuda.memory_reserved()
    assert after <= before - 256 * MiB, "empty_cache kept %d of %d" % (after, before)
    assert torch.cuda.max_memory_reserved() == peak
    return {"reserved_before": before, "after": after}


@case("memory_summary prints the tables")
def memory_summary(alloc):
    torch = torch_()
    x = torch.empty(3 * MiB, device="cuda")
    s = torch.cuda.memory_summary()
    for part in ("Allocated memory", "Active memory", "Requested memory", "GPU reserved memory",
                 "Allocations", "from large pool", "from small pool"):
        assert part in s, "memory_summary lacks %r" % part
    assert torch.cuda.memory_summary(abbreviated=True)
    del x
    return {"lines": len(s.splitlines())}


@case("memory_snapshot: segments cover memory_reserved and hold each live tensor's block")
def snapshot_segments(alloc):
    torch = torch_()
    settle()
    x = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
    segments = torch.cuda.memory_snapshot()
    total = sum(s["total_size"] for s in segments if s["device"] == 0)
    assert total == torch.cuda.memory_reserved(), "segments sum to %d, memory_reserved is %d" % (
        total, torch.cuda.memory_reserved())
    found = None
    for s in segments:
        address = s["address"]
        for b in s["blocks"]:
            assert b["address"] == address, "blocks do not tile their segment"
            address += b["size"]
            if b["address"] == x.data_ptr():
                found = b
        assert address == s["address"] + s["total_size"]
    assert found is not None, "no block at the tensor's address"
    assert found["state"] == "active_allocated" and found["size"] >= 3 * MiB, found
    live = sum(1 for s in segments for b in s["blocks"] if b["state"] == "active_allocated")
    assert live == torch.cuda.memory_stats()["allocation.all.current"], (
        "%d live blocks in the snapshot, allocation.all.current %d"
        % (live, torch.cuda.memory_stats()["allocation.all.current"]))
    del x
    return {"segments": len(segments)}


def _allocate_here(torch):
    return torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")


@case("_record_memory_history: alloc and free traces with stacks; _snapshot; memory_viz renders it")
def snapshot_history(alloc):
    torch = torch_()
    torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
    try:
        keep = _allocate_here(torch)
        gone = _allocate_here(torch)
        gone_ptr = gone.data_ptr()
        del gone
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    trace = snap["device_traces"][0]
    actions = {}
    for e in trace:
        if e["addr"] == gone_ptr:
            actions.setdefault(e["action"], e)
    assert "alloc" in actions and "free_requested" in actions, (
        "trace of the freed tensor: %s" % sorted(actions))
    frames = [f["name"] for f in actions["alloc"]["frames"]]
    assert "_allocate_here" in frames, "the alloc's stack lacks the Python frame: %s" % frames[:8]
    block = [b for s in snap["segments"] for b in s["blocks"] if b["address"] == keep.data_ptr()]
    assert block and block[0]["state"] == "active_allocated", block
    assert any(f["name"] == "_allocate_here" for f in block[0]["frames"]), "live block has no stack"
    from torch.cuda import _memory_viz
    html = _memory_viz.trace_plot(snap)
    assert isinstance(html, str) and len(html) > 1000
    seg = _memory_viz.segment_plot(snap)
    assert isinstance(seg, str) and len(seg) > 1000
    del keep
    return {"trace_entries": len(trace), "settings": str(snap.get("allocator_settings", {}))[:120]}


@case("torch.backends.cudnn.benchmark=True: a convolutional net trains, results as without it",
      timeout=180)
def cudnn_benchmark(alloc):
    torch = torch_()
    if not torch.backends.cudnn.is_available():
        raise Skip("no cuDNN")
    nn = torch.nn

    def run(benchmark):
        torch.backends.cudnn.benchmark = benchmark
        torch.manual_seed(0)
        net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
                            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)).cuda()
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        g = torch.Generator(device="cuda").manual_seed(1)
        losses = []
        for _ in range(4):
            x = torch.randn(32, 3, 64, 64, device="cuda", generator=g)
            loss = net(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses

    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # the algorithms' results then agree closely
    try:
        with_benchmark = run(True)
        torch.backends.cudnn.benchmark = False
        without = run(False)
    finally:
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.allow_tf32 = tf32
    for a, b in zip(with_benchmark, without):
        assert abs(a - b) <= 1e-3 * max(1.0, abs(b)), "losses %s vs %s" % (with_benchmark, without)
    return {"losses": [round(v, 6) for v in with_benchmark]}


def _mlp(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 256)).cuda()


def _warm_up(torch, fn, *args):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(s)


@case("CUDA graph: capture a 2-layer MLP, replay with new inputs, results as eager")
def graph_capture_replay(alloc):
    torch = torch_()
    model = _mlp(torch)
    static_in = torch.randn(64, 512, device="cuda")
    with torch.no_grad():
        _warm_up(torch, model, static_in)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = model(static_in)
        for i in range(3):
            x = torch.randn(64, 512, device="cuda", generator=torch.Generator(device="cuda").manual_seed(i))
            static_in.copy_(x)
            g.replay()
            torch.testing.assert_close(static_out, model(x), rtol=1e-5, atol=1e-6)
    pool_reserved = torch.cuda.memory_reserved()
    del g, static_out
    return {"reserved_with_graph": pool_reserved}


@case("two graphs share one pool (other_graph.pool() and graph_pool_handle()), replayed in order")
def graph_shared_pool(alloc):
    torch = torch_()
    x = torch.randn(1 << 20, device="cuda")
    torch.cuda.synchronize()
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g1, stream=s):
            a = x * 2
        with torch.cuda.graph(g2, pool=g1.pool(), stream=s):
            b = a + 1
    torch.cuda.current_stream().wait_stream(s)
    h = torch.cuda.graph_pool_handle()
    g3, g4 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g3, pool=h, stream=s):
            c = x * 3
        with torch.cuda.graph(g4, pool=h, stream=s):
            d = c - 1
    torch.cuda.current_stream().wait_stream(s)
    for k in range(3):
        x.copy_(torch.full_like(x, float(k)))
        g1.replay()
        g2.replay()
        g3.replay()
        g4.replay()
        torch.cuda.synchronize()
        assert bool((b == 2 * k + 1).all()) and bool((d == 3 * k - 1).all()), "round %d wrong" % k
    del g1, g2, g3, g4, a, b, c, d
    return {}


@case("a graph's output stays valid after the graph dies; its memory goes when the output does")
def graph_output_outlives_graph(alloc):
    torch = torch_()
    settle()
    torch.cuda.empty_cache()
    x = torch.randn(4 * MiB, device="cuda")
    base = torch.cuda.memory_allocated()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            y = x * 2 + 1
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    torch.cuda.synchronize()
    want = x * 2 + 1
    del g
    settle()
    assert torch.equal(y, want), "output changed after the graph died"
    held = torch.cuda.memory_allocated()
    assert held >= base + y.numel() * 4, "the output's memory was counted freed"
    del y, want
    settle()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_allocated() <= base + 4 * MiB * 4, "memory not back after the output died"
    return {"held": held - base}


@case("blocks freed during capture are reused inside it; replay is right")
def graph_free_in_capture(alloc):
    torch = torch_()
    x = torch.randn(1 << 20, device="cuda")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            t = x * 2
            t_ptr = t.data_ptr()
            del t
            u = x * 3
            reused = u.data_ptr() == t_ptr
            out = u + 1
            del u
    torch.cuda.current_stream().wait_stream(s)
    for k in (1.0, 2.0):
        x.fill_(k)
        g.replay()
        torch.cuda.synchronize()
        assert bool((out == 3 * k + 1).all()), "replay with x=%s wrong" % k
    del g, out
    return {"reused_in_capture": reused}


@case("a side stream forked and joined inside a capture; its allocations are the graph's")
def graph_side_stream(alloc):
    torch = torch_()
    x = torch.randn(1 << 20, device="cuda")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s2 = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            s2.wait_stream(s)
            with torch.cuda.stream(s2):
                y = x * 2
            s.wait_stream(s2)
            y.record_stream(s)
            z = y + 1
            del y
    torch.cuda.current_stream().wait_stream(s)
    x.fill_(4.0)
    g.replay()
    torch.cuda.synchronize()
    assert bool((z == 9.0).all()), "forked capture replayed wrong"
    del g, z
    return {}


@case("make_graphed_callables: a graphed module trains like the eager one", timeout=180)
def make_graphed_callables(alloc):
    # As PyTorch's own test of it (test_graph_make_graphed_callables): a mean
    # loss against targets, SGD at lr 0.1, gradients cleared before each
    # forward, the graphed and the eager copy each trained over the same
    # batches. (A sum-of-squares loss at that rate diverges to inf, then NaN,
    # within 6 steps under any allocator.)
    torch = torch_()
    nn = torch.nn

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8)).cuda()

    eager, graphed = make(), make()
    start = [p.detach().clone() for p in eager.parameters()]
    graphed = torch.cuda.make_graphed_callables(graphed, (torch.randn(16, 64, device="cuda"),))
    g = torch.Generator(device="cuda").manual_seed(5)
    batches = [(torch.randn(16, 64, device="cuda", generator=g),
                torch.randn(16, 8, device="cuda", generator=g)) for _ in range(6)]
    losses = {}
    for name, m in (("graphed", graphed), ("eager", eager)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        losses[name] = []
        for x, y in batches:
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            losses[name].append(loss.item())
    assert all(math.isfinite(v) for v in losses["eager"]), "eager training diverged: %s" % losses
    torch.testing.assert_close(losses["graphed"], losses["eager"], rtol=1e-4, atol=1e-6)
    for pe, pg in zip(eager.parameters(), graphed.parameters()):
        torch.testing.assert_close(pg, pe, rtol=1e-4, atol=1e-5)
    moved = max(float((p - p0).abs().max()) for p, p0 in zip(graphed.parameters(), start))
    assert moved > 0, "the graphed module's parameters did not change"
    return {"losses": [round(v, 6) for v in losses["graphed"]]}


@case("an LSTM with dropout (cuDNN) captured and replayed")
def graph_cudnn_dropout(alloc):
    torch = torch_()
    if not torch.backends.cudnn.is_available():
        raise Skip("no cuDNN")
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(32, 64, num_layers=2, dropout=0.3).cuda()
    x = torch.randn(10, 4, 32, device="cuda")
    _warm_up(torch, lstm, x)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            out, _ = lstm(x)
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    assert bool(torch.isfinite(out).all())
    del g, out
    return {}


@case("MemPool + use_mem_pool: allocations in the context land in the pool, others do not")
def mempool_use_mem_pool(alloc):
    torch = torch_()
    pool = torch.cuda.MemPool()
    assert pool.use_count() == 1, "use_count %d after MemPool()" % pool.use_count()
    with torch.cuda.use_mem_pool(pool):
        inside = pool.use_count()
        x = torch.randn(1 << 20, device="cuda")
    y = torch.randn(1 << 20, device="cuda")
    assert inside == 2, "use_count %d inside use_mem_pool" % inside
    assert pool.use_count() == 1
    segments = pool.snapshot()
    in_pool = {b["address"] for s in segments for b in s["blocks"] if b["state"] == "active_allocated"}
    assert all(tuple(s["segment_pool_id"]) == tuple(pool.id) for s in segments), "foreign segment"
    assert x.data_ptr() in in_pool, "the tensor made in the context is not in the pool"
    assert y.data_ptr() not in in_pool, "a tensor made outside is in the pool"
    assert torch.equal(x, x.clone())
    del x, y, pool
    settle()
    torch.cuda.empty_cache()
    return {"pool_segments": len(segments)}


@case("a graph captured into a MemPool's pool keeps it referenced while it lives")
def mempool_graph(alloc):
    torch = torch_()
    pool = torch.cuda.MemPool()
    x = torch.randn(1 << 20, device="cuda")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, pool=pool.id, stream=s):
            y = x * 5
    torch.cuda.current_stream().wait_stream(s)
    during = pool.use_count()
    x.fill_(2.0)
    g.replay()
    torch.cuda.synchronize()
    assert bool((y == 10.0).all())
    del g
    settle()
    after = pool.use_count()
    assert during == 2 and after == 1, "use_count %d with the graph, %d after" % (during, after)
    del y, pool
    return {}


def _block(torch):
    """A pre-norm transformer block (attention + MLP) made of plain operators."""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self, d=256, heads=4):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    torch.manual_seed(0)
    return Block().cuda().eval()


def _compile_check(torch, shapes, calls):
    from torch._dynamo.utils import counters
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = _block(torch)
    compiled = torch.compile(model, mode="reduce-overhead")
    g = torch.Generator(device="cuda").manual_seed(0)
    inputs = {shape: torch.randn(*shape, device="cuda", generator=g) for shape in shapes}
    allocations = []
    with torch.no_grad():
        for i in range(calls):
            shape = shapes[i % len(shapes)]
            torch.compiler.cudagraph_mark_step_begin()
            out = compiled(inputs[shape]).clone()
            torch.testing.assert_close(out, model(inputs[shape]), rtol=2e-3, atol=2e-3)
            torch.cuda.synchronize()
            allocations.append(torch.cuda.memory_stats()["allocation.all.allocated"])
    skips = dict(counters["inductor"]).get("cudagraph_skips", 0)
    assert skips == 0, "torch.compile skipped CUDA graphs %d times" % skips
    return allocations


@case("torch.compile(mode='reduce-overhead') of a transformer block: eager's outputs, replays",
      fresh=True, timeout=300)
def compile_reduce_overhead(alloc):
    torch = torch_()
    allocations = _compile_check(torch, [(8, 64, 256)], calls=6)
    # A replay allocates only the clone of its output (and eager's check):
    # the same count on every call once the graph is recorded.
    steps = [b - a for a, b in zip(allocations[2:], allocations[3:])]
    assert len(set(steps)) == 1, "allocations per call after recording vary: %s" % steps
    return {"allocations_per_replayed_call": steps[0]}


@case("torch.compile(mode='reduce-overhead') alternating two shapes: re-recording after replays",
      fresh=True, timeout=300)
def compile_two_shapes(alloc):
    torch = torch_()
    _compile_check(torch, [(4, 64, 256), (6, 32, 256)], calls=8)
    return {}


@case("several threads, each on its own stream, allocate and compute at once")
def threads_streams(alloc):
    torch = torch_()
    errors = []

    def work(k):
        try:
            s = torch.cuda.Stream()
            g = torch.Generator(device="cuda").manual_seed(k)
            with torch.cuda.stream(s):
                for i in range(40):
                    n = 64 + (i * 37 + k * 11) % 512
                    a = torch.randn(n, n, device="cuda", generator=g)
                    b = (a @ a.T).sum()
                    c = (a.double() @ a.double().T).sum()
                    if abs(b.item() - c.item()) > 1e-2 * max(1.0, abs(c.item())):
                        errors.append("thread %d step %d: %s vs %s" % (k, i, b.item(), c.item()))
            s.synchronize()
        except Exception as e:  # reported, not swallowed
            errors.append("thread %d: %r" % (k, e))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    return {}


@case("zero-size tensors allocate nothing", timeout=60)
def zero_size(alloc):
    torch = torch_()
    settle()
    m0 = torch.cuda.memory_allocated()
    t = torch.empty(0, device="cuda")
    assert t.data_ptr() == 0 and torch.cuda.memory_allocated() == m0
    del t
    return {}


@case("torch.profiler's memory view (profile_memory=True) sees the allocations")
def profiler_memory(alloc):
    torch = torch_()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True) as prof:
        x = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")
        y = x + 1
        del x, y
    events = prof.key_averages()
    usage = 0
    for e in events:
        usage = max(usage, getattr(e, "self_device_memory_usage", 0) or getattr(e, "self_cuda_memory_usage", 0) or 0)
    assert usage >= 8 * MiB, "the profiler saw %d bytes of device memory" % usage
    return {"max_self_device_memory": usage}


@case("torch.accelerator's memory functions answer with the same allocator")
def accelerator_memory(alloc):
    torch = torch_()
    acc = getattr(torch, "accelerator", None)
    if acc is None or not hasattr(acc, "memory_allocated"):
        raise Skip("this torch has no torch.accelerator.memory_allocated")
    x = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda")
    assert acc.memory_allocated() == torch.cuda.memory_allocated(), (
        "torch.accelerator says %d, torch.cuda %d" % (acc.memory_allocated(), torch.cuda.memory_allocated()))
    del x
    return {}


def _ipc_child(conn):
    import pickle
    import torch  # noqa: F401  (registers the CUDA tensor reductions)
    t = pickle.loads(conn.recv_bytes())
    conn.send(float(t.sum().item()))


@case("a CUDA tensor sent to another process (CUDA IPC)", fresh=True, timeout=180,
      expect={"gvm": "a RuntimeError saying why gvmalloc's blocks cannot be shared that way"})
def ipc_share_tensor(alloc):
    torch = torch_()
    import torch.multiprocessing as mp
    from multiprocessing.reduction import ForkingPickler
    t = torch.ones(1000, device="cuda")
    try:
        # What torch.multiprocessing's queues do, but here, so that an error is
        # raised in this thread rather than in a queue's feeder thread.
        data = bytes(ForkingPickler.dumps(t))
    except RuntimeError as e:
        if alloc != "gvm":
            raise
        assert "cannot be shared with another process" in str(e), str(e)[:300]
        return {"error": str(e).splitlines()[0][:160]}
    assert alloc != "gvm", "gvmalloc shared a block through CUDA IPC"
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_ipc_child, args=(child,))
    p.start()
    try:
        parent.send_bytes(data)
        assert parent.poll(120), "the other process did not answer"
        got = parent.recv()
    finally:
        p.join(30)
        if p.is_alive():
            p.terminate()
    assert got == 1000.0, got
    return {"sum": got}


# ---- running them ---------------------------------------------------------------------

def load_standin():
    """GVM_SEMANTICS_STANDIN=<module>: run that module's CASES instead (and no torch):
    how the runner's handling of crashes and timeouts is tested on CPU."""
    name = os.environ.get("GVM_SEMANTICS_STANDIN")
    if not name:
        return False
    import importlib
    module = importlib.import_module(name)
    CASES.clear()
    CASES.update(module.CASES)
    return True


def prepare(alloc):
    """What a worker does before it is given a case: the imports (no CUDA, no
    gvmalloc started), so that a spare worker touches no GPU while it waits."""
    if load_standin():
        return
    if alloc not in ("native", "gvm"):
        raise SystemExit("allocator must be native or gvm, not %r" % alloc)
    import torch  # noqa: F401
    if alloc == "gvm":
        import gvmalloc.torch  # noqa: F401


def setup(alloc):
    """Chooses the allocator: before the first case, before CUDA starts."""
    prepare(alloc)
    if alloc == "gvm" and not os.environ.get("GVM_SEMANTICS_STANDIN"):
        import gvmalloc.torch
        gvmalloc.torch.enable()


def run_case(name, alloc):
    fn, _, _ = CASES[name]
    t0 = time.perf_counter()
    try:
        detail = fn(alloc) or {}
        status = "pass"
    except Skip as e:
        status, detail = "skip", {"reason": str(e)}
    except Exception as e:
        status = "fail"
        detail = {"error": "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0][:400] if str(e).strip() else ""),
                  "traceback": traceback.format_exc()[-3000:]}
    try:
        settle()
        # The next case, and the other allocator's worker, start from the memory
        # the driver has, not from what this case left cached.
        if "torch" in sys.modules:
            sys.modules["torch"].cuda.empty_cache()
    except Exception as e:  # a broken context is the case's result
        if status == "pass":
            status, detail = "fail", {"error": "after the case: %r" % e}
    return {"case": name, "allocator": alloc, "status": status, "seconds": round(time.perf_counter() - t0, 2),
            "detail": detail}


def worker(alloc):
    prepare(alloc)
    print("GVM_READY", flush=True)
    started = False
    for line in sys.stdin:
        name = line.strip()
        if not name:
            continue
        if not started:
            setup(alloc)
            started = True
        print("GVM_CASE " + json.dumps(run_case(name, alloc), default=str), flush=True)


class Worker:
    """A worker interpreter for one allocator; its stderr goes to a file, kept for crash reports."""

    def __init__(self, alloc, log_dir):
        self.alloc = alloc
        self.err_path = os.path.join(log_dir, "worker-%s-%d.stderr" % (alloc, time.monotonic_ns()))
        self.err = open(self.err_path, "w")
        self.eof = False
        self.proc = subprocess.Popen([sys.executable, "-u", __file__, "worker", alloc],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err)
        self.pending = b""  # read from the worker, not yet a whole line
        self._ready = None  # known at the first run: a worker starts while others work

    @property
    def ready(self):
        if self._ready is None:
            self._ready = self._read_until("GVM_READY", 300) is not None
        return self._ready

    def _read_until(self, prefix, timeout):
        """The rest of the first line from the worker that starts with `prefix`; other
        lines are echoed. None on timeout or when the worker's output ends (self.eof).
        Reads the pipe unbuffered, so that select() sees every line that is not yet taken."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self.pending:
                raw, self.pending = self.pending.split(b"\n", 1)
                line = raw.decode(errors="replace")
                if line.startswith(prefix):
                    return line[len(prefix):].strip()
                sys.stdout.write("    [%s] %s\n" % (self.alloc, line))
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self.eof = True  # the worker died
                return None
            self.pending += chunk

    def run(self, name, timeout):
        if not self.ready:
            return self._died(name, "the worker did not start")
        try:
            self.proc.stdin.write((name + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            return self._died(name, "the worker had died")
        line = self._read_until("GVM_CASE ", timeout)
        if line is not None:
            return json.loads(line)
        if not self.eof:
            self.kill()
            return {"case": name, "allocator": self.alloc, "status": "TIMEOUT",
                    "detail": {"error": "no result in %d s" % timeout, "stderr": self.stderr_tail()}}
        return self._died(name, "the worker died")

    def _died(self, name, what):
        rc = self.proc.wait()
        how = ("signal %s" % signal.Signals(-rc).name) if rc < 0 else "exit %d" % rc
        return {"case": name, "allocator": self.alloc, "status": "CRASH",
                "detail": {"error": "%s (%s)" % (what, how), "stderr": self.stderr_tail()}}

    def stderr_tail(self, n=3000):
        self.err.flush()
        with open(self.err_path, errors="replace") as f:
            return f.read()[-n:]

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(30)
            except Exception:
                self.kill()
        self.err.close()


class Runner:
    """The cases of one allocator, each in a worker: one worker for the cases in a row,
    a new one after a crash or a hang, one of its own for a fresh case.

    A spare worker is always starting: a worker imports torch before its first case
    and enables gvmalloc and CUDA only when given one, so the spare's start costs CPU
    time beside the running case and no GPU memory, and a new worker is ready at once
    (the first table on the H200 machine spent 85 of its 170 s outside the cases, in
    its 14 worker starts)."""

    def __init__(self, alloc, log_dir, timeout_cap=None):
        self.alloc, self.log_dir, self.timeout_cap = alloc, log_dir, timeout_cap
        self.worker = None
        self.spare = Worker(alloc, log_dir)

    def _take_worker(self):
        w, self.spare = self.spare, Worker(self.alloc, self.log_dir)
        return w

    def run(self, name, deadline=None):
        opts = CASES[name][2]
        timeout = min(opts["timeout"], self.timeout_cap) if self.timeout_cap else opts["timeout"]
        if deadline is not None:
            left = deadline - time.monotonic()
            if left < 10:
                return {"case": name, "allocator": self.alloc, "status": "not-run",
                        "detail": {"error": "not run: the --deadline passed"}}
            timeout = min(timeout, left)
        if opts["fresh"]:
            self.close_worker()
        if self.worker is None:
            self.worker = self._take_worker()
        print("  %-8s %-28s ..." % (self.alloc, name), flush=True)
        r = self.worker.run(name, timeout)
        print("  %-8s %-28s %s (%.1f s)%s" % (self.alloc, name, r["status"], r.get("seconds", 0.0),
                                              "  " + r["detail"].get("error", "")[:160]
                                              if r["status"] != "pass" else ""), flush=True)
        if r["status"] in ("CRASH", "TIMEOUT") or opts["fresh"]:
            self.close_worker()
        return r

    def close_worker(self):
        if self.worker is not None:
            self.worker.close()
            self.worker = None

    def close(self):
        self.close_worker()
        if self.spare is not None:
            self.spare.kill()  # never given a case
            self.spare.err.close()
            self.spare = None


def table(names, out_dir, timeout_cap=None, allocators=("native", "gvm"), deadline_s=None):
    """Every case under every allocator, case by case (each case under each allocator
    before the next case: a run cut short by the deadline still compares the cases it
    ran), as one table."""
    os.makedirs(out_dir, exist_ok=True)
    start = time.monotonic()
    deadline = start + deadline_s if deadline_s is not None else None
    runners = {a: Runner(a, out_dir, timeout_cap) for a in allocators}
    # The fresh cases last: each wants a new interpreter, which the spare
    # worker has ready when cases in a row ran before it. The table keeps the
    # cases' order.
    order = ([n for n in names if not CASES[n][2]["fresh"]] +
             [n for n in names if CASES[n][2]["fresh"]])
    done = {}
    try:
        for name in order:
            row = {"case": name, "description": CASES[name][1], "expect": CASES[name][2]["expect"]}
            for a in allocators:
                row[a] = runners[a].run(name, deadline)
            done[name] = row
    finally:
        for r in runners.values():
            r.close()
    rows = [done[n] for n in names if n in done]
    with open(os.path.join(out_dir, "torch-semantics.json"), "w") as f:
        json.dump(rows, f, indent=1, default=str)
    lines = ["", "=== PyTorch allocator semantics (%d cases, %.0f s)" % (len(names), time.monotonic() - start),
             "%-30s %-9s %-9s %s" % ("case", "native", "gvmalloc", "note")]
    counts = {a: {} for a in allocators}
    for row in rows:
        cells = []
        for a in allocators:
            s = row[a]["status"]
            counts[a][s] = counts[a].get(s, 0) + 1
            cells.append("FAIL" if s == "fail" else s)
        note = ""
        g = row.get("gvm")
        if g is not None and g["status"] != "pass":
            note = g["detail"].get("error") or g["detail"].get("reason") or ""
        elif row["expect"].get("gvm"):
            note = "(expected difference: %s)" % row["expect"]["gvm"]
        n = row.get("native")
        if n is not None and n["status"] != "pass" and not note:
            note = "native: " + (n["detail"].get("error") or n["detail"].get("reason") or "")
        lines.append("%-30s %-9s %-9s %s" % (row["case"], *(cells + [""] * (2 - len(cells))), note[:200]))
    for a in allocators:
        lines.append("%s: %s" % ("gvmalloc" if a == "gvm" else a,
                                 ", ".join("%d %s" % (v, k) for k, v in sorted(counts[a].items()))))
    text = "\n".join(lines)
    print(text, flush=True)
    with open(os.path.join(out_dir, "torch-semantics.txt"), "w") as f:
        f.write(text + "\n")
    return rows


def main(argv):
    load_standin()
    if len(argv) >= 3 and argv[0] == "run":
        setup(argv[2])
        r = run_case(argv[1], argv[2])
        print("GVM_CASE " + json.dumps(r, default=str))
        return 0 if r["status"] in ("pass", "skip") else 1
    if len(argv) == 2 and argv[0] == "worker":
        worker(argv[1])
        return 0
    if argv and argv[0] == "table":
        out, names, cap, allocators = os.environ.get("OUT") or "torch-semantics-out", list(CASES), None, ("native", "gvm")
        deadline = None
        args = argv[1:]
        while args:
            a = args.pop(0)
            if a == "--out":
                out = args.pop(0)
            elif a == "--cases":
                names = [n for n in args.pop(0).split(",") if n]
            elif a == "--timeout":
                cap = float(args.pop(0))
            elif a == "--allocators":
                allocators = tuple(args.pop(0).split(","))
            elif a == "--deadline":
                deadline = float(args.pop(0))
            else:
                raise SystemExit("unknown argument %r" % a)
        unknown = [n for n in names if n not in CASES]
        if unknown:
            raise SystemExit("unknown cases %s; known: %s" % (unknown, ", ".join(CASES)))
        rows = table(names, out, cap, allocators, deadline)
        bad = [r for r in rows for a in allocators if r[a]["status"] not in ("pass", "skip")]
        return 1 if bad else 0
    if argv and argv[0] == "list":
        for name, (_, description, opts) in CASES.items():
            print("%-30s %s%s" % (name, description, "  [fresh]" if opts["fresh"] else ""))
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
