"""GPU workloads for the Python tests, one per process: the allocator must be
chosen before CUDA starts, so each run is a fresh interpreter.

    python _workloads.py train native|gvm
    python _workloads.py resnet native|gvm
    python _workloads.py infer native|gvm
    python _workloads.py mempool
    python _workloads.py scratch_peer
    python _workloads.py dist
    python _workloads.py ddp native|gvm
    python _workloads.py cupy
    python _workloads.py cupy_dead_stream
    python _workloads.py numba

Each prints what it measured, then one line "GVM_RESULT <json>" for the test.
"""

import gc
import json
import os
import random
import socket
import statistics
import sys
import time

MiB = 1 << 20


def result(**kw):
    print("GVM_RESULT " + json.dumps(kw), flush=True)


def setup_torch(allocator):
    import torch
    if allocator == "gvm":
        import gvmalloc.torch
        gvmalloc.torch.enable()
    elif allocator != "native":
        raise SystemExit("allocator must be native or gvm, not %r" % allocator)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # The math attention: composed of deterministic kernels, in every torch build.
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_math_sdp(True)
    return torch


def peak_reserved(torch, allocator):
    if allocator == "gvm":
        import gvmalloc
        return gvmalloc.max_memory_reserved(0)
    return torch.cuda.max_memory_reserved(0)


def gpt2(torch, **overrides):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(**overrides)  # GPT-2 small (124M) unless overridden; random init
    return GPT2LMHeadModel(cfg).cuda(), cfg


def train(allocator, steps=32):
    torch = setup_torch(allocator)
    model, cfg = gpt2(torch)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    rng = random.Random(1234)
    gen = torch.Generator().manual_seed(42)
    losses, times = [], []
    for step in range(steps):
        batch = rng.choice([2, 4, 6, 8, 12, 16])
        seq = rng.randint(64, 1024)
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen).cuda()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        print("%s step %2d batch %2d seq %4d loss %.6f (%s)"
              % (allocator, step, batch, seq, losses[-1], losses[-1].hex()), flush=True)
    peak = peak_reserved(torch, allocator)
    med = statistics.median(times[1:])
    print("%s: peak reserved %.1f MiB, median step %.2f ms" % (allocator, peak / MiB, med * 1e3))
    result(allocator=allocator, losses=[x.hex() for x in losses], peak_reserved=peak,
           median_step_s=med)


def resnet_train(allocator, benchmark_limit=1, steps=12):
    """ResNet-50 training as vision scripts run it - cudnn.benchmark on,
    channels_last, bf16 autocast, SGD - made repeatable: deterministic
    algorithms, and cuDNN's benchmark limited to the first candidate its
    heuristics rank (torch.backends.cudnn.benchmark_limit = 1), so that which
    algorithm a convolution gets no longer depends on a timing race. The
    benchmark still runs through the allocator (its workspaces, cacheInfo)."""
    torch = setup_torch(allocator)
    import torchvision
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.benchmark_limit = int(benchmark_limit)
    torch.backends.cudnn.deterministic = True
    model = torchvision.models.resnet50(weights=None).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(5)
    batch = 32
    data = [(torch.randn(batch, 3, 224, 224, generator=gen),
             torch.randint(0, 1000, (batch,), generator=gen)) for _ in range(3)]
    data = [(x.cuda().to(memory_format=torch.channels_last), y.cuda()) for x, y in data]
    loss_fn = torch.nn.CrossEntropyLoss()
    losses, times = [], []
    for step in range(steps):
        x, y = data[step % len(data)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        print("%s resnet step %2d loss %.6f (%s)" % (allocator, step, losses[-1], losses[-1].hex()),
              flush=True)
    # torch.cuda's own figure, whichever allocator answers it.
    peak = torch.cuda.max_memory_reserved(0)
    med = statistics.median(times[2:])
    print("%s: torch.cuda.max_memory_reserved %.1f MiB, median step %.2f ms"
          % (allocator, peak / MiB, med * 1e3))
    result(allocator=allocator, losses=[x.hex() for x in losses], peak_reserved=peak,
           median_step_s=med)


def infer(allocator, steps=24):
    import hashlib
    torch = setup_torch(allocator)
    model, cfg = gpt2(torch)
    model.eval()
    rng = random.Random(99)
    gen = torch.Generator().manual_seed(7)
    digests = []
    with torch.no_grad():
        for step in range(steps):
            batch = rng.choice([1, 2, 3, 5, 8, 13, 21])
            seq = rng.randint(1, 768)
            ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen).cuda()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(input_ids=ids, use_cache=False).logits
            # Greedy continuation by a few tokens: more shapes, outputs that depend on outputs.
            for _ in range(3):
                nxt = logits[:, -1, :].argmax(dim=-1, keepdim=True)
                ids = torch.cat([ids, nxt], dim=1)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = model(input_ids=ids, use_cache=False).logits
            data = logits.float().cpu().contiguous().view(torch.uint8).numpy().tobytes()
            digests.append(hashlib.sha256(data + ids.cpu().numpy().tobytes()).hexdigest())
            print("%s step %2d batch %2d seq %3d logits sum %.6f %s"
                  % (allocator, step, batch, seq, logits.float().sum().item(), digests[-1][:16]))
    result(allocator=allocator, digests=digests, peak_reserved=peak_reserved(torch, allocator))


def mempool():
    import torch
    import gvmalloc
    import gvmalloc.torch as gt
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    x = torch.randn(1024, 1024, device="cuda")  # native
    pool = gt.mem_pool()
    base = gvmalloc.memory_reserved(0)
    allocs_before = gvmalloc.device_stats(0)["allocations"]
    sizes = [(257, 1031), (2048, 4096), (4096, 4096), (333, 12345), (8192, 1024)]
    pooled, live_in_pool = [], None
    with torch.cuda.use_mem_pool(pool):
        for i, (m, n) in enumerate(sizes):
            g = torch.Generator(device="cuda").manual_seed(i)
            a = torch.randn(m, n, device="cuda", generator=g)
            pooled.append((a @ a.T).sum(dim=1))
        live_in_pool = gvmalloc.device_stats(0)
    allocs_in_pool = live_in_pool["allocations"] - allocs_before
    y = torch.randn(2048, 2048, device="cuda")  # native again, outside the pool
    after_native = gvmalloc.device_stats(0)["allocations"]
    # The same program on PyTorch's allocator: the same results, bit for bit.
    for i, (m, n) in enumerate(sizes):
        g = torch.Generator(device="cuda").manual_seed(i)
        a = torch.randn(m, n, device="cuda", generator=g)
        assert torch.equal((a @ a.T).sum(dim=1), pooled[i]), "pooled result %d differs" % i
    del pooled, a, g
    gc.collect()
    torch.cuda.synchronize()
    reserved_with_pool = gvmalloc.memory_reserved(0)
    del pool
    gc.collect()
    torch.cuda.synchronize()
    reserved_after_pool = gvmalloc.memory_reserved(0)
    torch.cuda.empty_cache()
    gvmalloc.empty_cache()
    reserved_after_empty = gvmalloc.memory_reserved(0)
    # What PyTorch itself still holds from the pool's time: the cuBLAS
    # workspace of the matmuls (CUBLAS_WORKSPACE_CONFIG=:4096:8 is 32 MiB),
    # cached with the cuBLAS handle, is live in gvmalloc's eyes.
    live_after_empty = gvmalloc.memory_allocated(0)
    print("mempool: base %d, in pool %d live / %d reserved (%d allocations), pool kept %d, "
          "pool dead %d, after empty_cache %d; native tensors %s"
          % (base, live_in_pool["live_bytes"], live_in_pool["reserved_bytes"], allocs_in_pool,
             reserved_with_pool, reserved_after_pool, reserved_after_empty,
             tuple(x.shape) + tuple(y.shape)))
    result(base=base, allocs_in_pool=allocs_in_pool, reserved_in_pool=live_in_pool["reserved_bytes"],
           allocs_outside=after_native - live_in_pool["allocations"],
           reserved_after_pool=reserved_after_pool, reserved_after_empty=reserved_after_empty,
           live_after_empty=live_after_empty)


def scratch_peer():
    import torch
    import gvmalloc
    import gvmalloc.torch as gt
    gt.enable()
    n = (48 * MiB) // 4 + 123
    frees0 = gvmalloc.device_stats(0)["frees"]
    x = gt.scratch_tensor((n,), torch.float32, 0)
    assert x.device == torch.device("cuda", 0) and x.shape == (n,)
    x.copy_(torch.arange(n, device="cuda:0", dtype=torch.float32))
    ready = torch.cuda.Event()
    ready.record(torch.cuda.current_stream(0))
    s1 = torch.cuda.Stream(device=1)
    s1.wait_event(ready)
    with torch.cuda.device(1), torch.cuda.stream(s1):
        # A read by device 1, on a device-1 stream: gvm_peer_copy reads the scratch
        # directly when the policy admits device 1 (staged by the driver otherwise).
        direct = torch.empty(n, device="cuda:1", dtype=torch.float32)
        gvmalloc.peer_copy(direct.data_ptr(), 1, x.data_ptr(), 0, n * 4, s1.cuda_stream)
        # PyTorch's own cross-device copy from the scratch tensor.
        via_torch = torch.empty(n, device="cuda:1", dtype=torch.float32)
        torch_copy_error = ""
        try:
            via_torch.copy_(x)
        except Exception as e:  # observed on an H200 pair: cudaErrorInvalidValue
            torch_copy_error = str(e).splitlines()[0]
        gt.record_stream(x, s1)
        ok_direct = torch.equal(direct, torch.arange(n, device="cuda:1", dtype=torch.float32))
        ok_torch = not torch_copy_error and torch.equal(
            via_torch, torch.arange(n, device="cuda:1", dtype=torch.float32))
        # PyTorch runs a copy between devices on the source device's stream:
        # the source pushes. Into a scratch tensor of device 0 from device 1,
        # device 1 writes device 0's scratch, which the policy grants it.
        pushed = gt.scratch_tensor((n,), torch.float32, 0)
        src1 = torch.arange(n, device="cuda:1", dtype=torch.float32) * 2
        push_error = ""
        try:
            pushed.copy_(src1)
        except Exception as e:
            push_error = str(e).splitlines()[0]
    s1.synchronize()
    ok_push = not push_error and torch.equal(
        pushed, torch.arange(n, device="cuda:0", dtype=torch.float32) * 2)
    del pushed, src1
    stats0 = gvmalloc.device_stats(0)
    policy = gvmalloc.peer_policy(0, 1)
    view = x[1000:]
    gc.collect()
    torch.cuda.synchronize(0)
    # Counted from here: the temporaries above (the arange copied into x) are
    # device-0 frees too, and must not count as the scratch block's.
    frees0 = gvmalloc.device_stats(0)["frees"]
    del x
    gc.collect()
    frees_view_alive = gvmalloc.device_stats(0)["frees"] - frees0
    del view
    gc.collect()
    frees_after = gvmalloc.device_stats(0)["frees"] - frees0
    print("scratch: policy(0->1) %s, scratch reserved %d, direct ok %s, torch copy into the "
          "scratch ok %s, torch copy out of it ok %s%s, frees with a view alive %d, after %d"
          % (policy, stats0["scratch_reserved_bytes"], ok_direct, ok_push, ok_torch,
             " (" + torch_copy_error + ")" if torch_copy_error else "", frees_view_alive,
             frees_after))
    result(policy=policy, scratch_reserved=stats0["scratch_reserved_bytes"], ok_direct=ok_direct,
           ok_torch=ok_torch, torch_copy_error=torch_copy_error, ok_push=ok_push,
           push_error=push_error, frees_view_alive=frees_view_alive, frees_after=frees_after)


def _dist_rank(rank, world, port, iterations, out):
    import torch
    import torch.distributed as dist
    import gvmalloc
    import gvmalloc.torch as gt
    gt.enable()
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=world, device_id=torch.device("cuda", rank))
    rng = random.Random(5)  # the same sizes on every rank
    checked = 0
    for it in range(iterations):
        n = rng.randint(1, 3 * MiB)
        dtype = rng.choice([torch.float32, torch.int64, torch.bfloat16])
        # Values whose sums are exact in every dtype: bf16 holds integers
        # exactly only up to 256, and 3 x 63 < 256. (With % 4096, bf16
        # rounding made round(a) + round(2a) differ from round(3a).)
        base = torch.arange(n, device="cuda", dtype=torch.int64) % 64
        x = (base * (rank + 1)).to(dtype)
        dist.all_reduce(x)
        want = (base * sum(r + 1 for r in range(world))).to(dtype)
        assert torch.equal(x, want), "all_reduce %d (n=%d, %s) wrong on rank %d" % (it, n, dtype, rank)
        parts = [torch.empty(n, device="cuda", dtype=dtype) for _ in range(world)]
        dist.all_gather(parts, (base + rank).to(dtype))
        for r, p in enumerate(parts):
            assert torch.equal(p, (base + r).to(dtype)), "all_gather %d wrong on rank %d" % (it, rank)
        checked += 1
    torch.cuda.synchronize()
    s = gvmalloc.device_stats(rank)
    dist.destroy_process_group()
    with open(os.path.join(out, "rank%d.json" % rank), "w") as f:
        json.dump({"rank": rank, "checked": checked, "allocations": s["allocations"],
                   "peak_reserved": s["peak_reserved_bytes"]}, f)


def dist_run(iterations=60):
    import tempfile
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_dist_rank, args=(2, port, iterations, out), nprocs=2, join=True)
        ranks = [json.load(open(os.path.join(out, "rank%d.json" % r))) for r in range(2)]
    for r in ranks:
        print("dist rank %d: %d iterations checked, %d gvmalloc allocations, peak reserved %.1f MiB"
              % (r["rank"], r["checked"], r["allocations"], r["peak_reserved"] / MiB))
    result(ranks=ranks, iterations=iterations)


def _ddp_rank(rank, world, port, allocator, steps, out):
    torch = setup_torch(allocator)  # each rank picks its allocator before CUDA starts
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=world, device_id=torch.device("cuda", rank))
    torch.manual_seed(0)  # the same initial weights on every rank
    model, cfg = gpt2(torch, n_layer=2, n_head=4, n_embd=256, vocab_size=2048, n_positions=256)
    # PyTorch's defaults: gradient buckets reduced on NCCL's stream while the
    # backward pass goes on, the buckets' memory kept alive with record_stream
    # (TORCH_NCCL_AVOID_RECORD_STREAMS is not set).
    ddp = DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    rng = random.Random(100 + rank)  # each rank its own batches, the same in every run
    losses = []
    for _ in range(steps):
        batch, seq = rng.choice([2, 4, 8]), rng.choice([64, 128, 256])
        g = torch.Generator(device="cuda").manual_seed(rng.randrange(1 << 30))
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda", generator=g)
        loss = ddp(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item().hex())
    torch.cuda.synchronize()
    # The ranks must hold the same weights after every step: checked at the end.
    flat = torch.cat([p.detach().float().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    same = all(torch.equal(gathered[0], x) for x in gathered[1:])
    stats = {}
    if allocator == "gvm":
        import gvmalloc
        s = gvmalloc.device_stats(rank)
        stats = {"allocations": s["allocations"], "cross_stream_waits": s["cross_stream_waits"]}
    peak = torch.cuda.max_memory_reserved(rank)  # the native backend answers it too
    dist.destroy_process_group()
    with open(os.path.join(out, "rank%d.json" % rank), "w") as f:
        json.dump({"rank": rank, "losses": losses, "weights_equal": same,
                   "peak_reserved": peak, **stats}, f)


def ddp_run(allocator, steps=16):
    """DDP training of a small GPT-2 on two ranks with PyTorch's default
    settings; the per-rank losses, for the test to compare with native's."""
    import tempfile
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_ddp_rank, args=(2, port, allocator, int(steps), out), nprocs=2, join=True)
        ranks = [json.load(open(os.path.join(out, "rank%d.json" % r))) for r in range(2)]
    for r in ranks:
        print("ddp %s rank %d: %d steps, last loss %s, weights equal across ranks %s, peak "
              "reserved %.1f MiB%s" % (allocator, r["rank"], len(r["losses"]), r["losses"][-1],
                                       r["weights_equal"], r["peak_reserved"] / MiB,
                                       ", %d gvmalloc allocations, %d cross-stream waits"
                                       % (r["allocations"], r["cross_stream_waits"])
                                       if "allocations" in r else ""))
    result(allocator=allocator, ranks=ranks)


def cupy_run(iterations=40):
    import cupy
    import numpy
    import gvmalloc
    import gvmalloc.cupy as gc_
    gc_.enable()
    rng = numpy.random.default_rng(0)
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]  # alive to the end
    worst_fft = worst_mm = 0.0
    for i in range(iterations):
        stream = streams[i % 2] if i % 3 == 0 else cupy.cuda.Stream.null
        with stream:
            n = int(rng.integers(100, 200_000))
            a = rng.standard_normal(n) + 1j * rng.standard_normal(n)
            f = cupy.fft.fft(cupy.asarray(a)).get()
            ref = numpy.fft.fft(a)
            worst_fft = max(worst_fft, float(numpy.max(numpy.abs(f - ref)) / numpy.max(numpy.abs(ref))))
            m, k, p = (int(v) for v in rng.integers(1, 700, size=3))
            A, B = rng.standard_normal((m, k)), rng.standard_normal((k, p))
            C = (cupy.asarray(A) @ cupy.asarray(B)).get()
            ref = A @ B
            worst_mm = max(worst_mm, float(numpy.max(numpy.abs(C - ref)) / (numpy.max(numpy.abs(ref)) + 1e-300)))
        stream.synchronize()
    s = gvmalloc.device_stats(0)
    cupy.fft.config.get_plan_cache().clear()
    print("cupy: %d iterations, worst relative error fft %.2e matmul %.2e; gvmalloc %d allocations, "
          "%d frees, peak reserved %.1f MiB"
          % (iterations, worst_fft, worst_mm, s["allocations"], s["frees"],
             s["peak_reserved_bytes"] / MiB))
    result(worst_fft=worst_fft, worst_mm=worst_mm, allocations=s["allocations"], frees=s["frees"])


def cupy_dead_stream(rounds=8):
    """Arrays used and freed on a side stream, the stream dropped (CuPy destroys
    it), then gvmalloc.empty_cache(): the trim must not touch the dead handle
    (issue: it recorded an event on it and the process died in the trim)."""
    import cupy
    import gvmalloc
    import gvmalloc.cupy as gc_
    gc_.enable()
    total = 0.0
    for r in range(rounds):
        side = cupy.cuda.Stream(non_blocking=True)
        with side:
            xs = [cupy.arange((1 << 20) * (k + 1), dtype=cupy.float32) for k in range(4)]
            total += float(sum(float(x[-1].get()) for x in xs))
            big = cupy.ones(64 << 20, dtype=cupy.uint8)  # a large block too
            total += float(big[:1024].sum().get())
        side.synchronize()
        del xs, big
        del side  # CuPy destroys the stream here; its handle may be recycled
        # A new stream can get the old handle: work on it must not be mistaken
        # for the dead stream's.
        other = cupy.cuda.Stream(non_blocking=True)
        with other:
            y = cupy.zeros(1 << 20, dtype=cupy.float32)
            total += float(y.sum().get())
        del y, other
        gvmalloc.empty_cache()
    s = gvmalloc.device_stats(0)
    print("cupy dead streams: %d rounds survived, reserved after trim %.1f MiB, live %d bytes"
          % (rounds, s["reserved_bytes"] / MiB, s["live_bytes"]))
    result(rounds=rounds, reserved=s["reserved_bytes"], live=s["live_bytes"], total=total)


def numba_run(iterations=40):
    """Numba kernels over arrays of varied sizes, some on streams of their own,
    every result checked against numpy; the memory from gvmalloc.numba."""
    import importlib.metadata
    import numpy
    import _numpy_aliases
    # Before numba loads: numba-cuda 0.68 names numpy.row_stack, which NumPy
    # 2.5 removed (_numpy_aliases says why and where).
    shim = _numpy_aliases.restore(numpy)
    try:
        numba_cuda = importlib.metadata.version("numba-cuda")
    except importlib.metadata.PackageNotFoundError:
        numba_cuda = "not installed (numba's own CUDA target)"
    if shim:
        print("numba: NumPy %s lacks what numba-cuda %s names; restored for this process: %s"
              % (numpy.__version__, numba_cuda, ", ".join(shim)))
    import gvmalloc
    import gvmalloc.numba as gn
    gn.enable()
    from numba import cuda

    @cuda.jit
    def saxpy(a, x, y, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a * x[i] + y[i]

    @cuda.jit
    def scale_rows(m, v, out):
        i, j = cuda.grid(2)
        if i < out.shape[0] and j < out.shape[1]:
            out[i, j] = m[i, j] * v[i]

    rng = numpy.random.default_rng(0)
    streams = [cuda.stream() for _ in range(2)]  # alive to the end
    before = gvmalloc.device_stats(0)
    worst_saxpy = 0.0
    scale_exact = True
    for it in range(iterations):
        s = streams[it % 2] if it % 3 == 0 else None
        sid = s if s is not None else 0  # numba's "stream=0": the default stream
        n = int(rng.integers(1, 3_000_000))
        a = float(rng.standard_normal())
        xs, ys = rng.standard_normal(n), rng.standard_normal(n)
        r, c = (int(v) for v in rng.integers(1, 1500, size=2))
        ms, vs = rng.standard_normal((r, c)), rng.standard_normal(r)
        with gn.stream(s):
            x, y = cuda.to_device(xs, stream=sid), cuda.to_device(ys, stream=sid)
            out = cuda.device_array(n, dtype=numpy.float64, stream=sid)
            saxpy[(n + 255) // 256, 256, sid](a, x, y, out)
            m, v = cuda.to_device(ms, stream=sid), cuda.to_device(vs, stream=sid)
            mo = cuda.device_array((r, c), dtype=numpy.float64, stream=sid)
            scale_rows[((r + 15) // 16, (c + 15) // 16), (16, 16), sid](m, v, mo)
            got, got_m = out.copy_to_host(stream=sid), mo.copy_to_host(stream=sid)
        if s is not None:
            s.synchronize()
        ref = a * xs + ys
        worst_saxpy = max(worst_saxpy,
                          float(numpy.max(numpy.abs(got - ref)) / (numpy.max(numpy.abs(ref)) + 1e-300)))
        scale_exact = scale_exact and bool(numpy.array_equal(got_m, ms * vs[:, None]))
        del x, y, out, m, v, mo
    gc.collect()
    cuda.synchronize()
    ctx = cuda.current_context()
    plugged = isinstance(ctx.memory_manager, gn.GvmallocMemoryManager)
    # A block of the default stream used on another stream, named with record_stream.
    z = cuda.device_array(1 << 20, dtype=numpy.float64)
    gn.record_stream(z, streams[0])
    saxpy[(1 << 20) // 256, 256, streams[0]](2.0, z, z, z)
    streams[0].synchronize()
    del z
    # defer_cleanup holds frees back until it ends.
    frees0 = gvmalloc.device_stats(0)["frees"]
    with cuda.defer_cleanup():
        w = cuda.device_array(1 << 20, dtype=numpy.uint8)
        del w
        gc.collect()
        frees_deferred = gvmalloc.device_stats(0)["frees"] - frees0
    gc.collect()
    frees_after = gvmalloc.device_stats(0)["frees"] - frees0
    free, total = ctx.get_memory_info()
    ipc = ""
    try:
        cuda.device_array(16).get_ipc_handle()
    except NotImplementedError as e:
        ipc = str(e)
    s = gvmalloc.device_stats(0)
    allocations = s["allocations"] - before["allocations"]
    frees = s["frees"] - before["frees"]
    print("numba: %d iterations, worst relative error saxpy %.2e, scale_rows exact %s; gvmalloc "
          "%d allocations, %d frees, peak reserved %.1f MiB; memory info %d MiB free of %d MiB; "
          "defer_cleanup held %d of 1 frees; ipc refused: %s"
          % (iterations, worst_saxpy, scale_exact, allocations, frees,
             s["peak_reserved_bytes"] / MiB, free // MiB, total // MiB,
             1 - frees_deferred, bool(ipc)))
    result(plugged=plugged, worst_saxpy=worst_saxpy, scale_exact=scale_exact,
           allocations=allocations, frees=frees, live=s["live_bytes"], free=free, total=total,
           frees_deferred=frees_deferred, frees_after=frees_after, ipc=ipc,
           numpy_shim=shim, numpy=numpy.__version__, numba_cuda=numba_cuda)


def record_trace_run(allocator):
    """gvmalloc.torch.record_trace around a few allocations, under either
    allocator: the trace holds exactly the block's allocations and frees."""
    import gzip
    import tempfile
    torch = setup_torch(allocator)
    import gvmalloc.torch
    x = torch.empty(1 << 20, device="cuda")  # before the block: not in the trace
    path = os.path.join(tempfile.mkdtemp(), "block.trace.gz")
    with gvmalloc.torch.record_trace(path):
        kept = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (512, 4096, 3 << 20)]
        gone = torch.empty(16 << 20, dtype=torch.uint8, device="cuda")
        del gone
    with gzip.open(path, "rt") as f:
        events = [l.split()[0] for l in f if l.strip() and not l.startswith("#")]
    del kept, x
    result(allocations=events.count("a"), frees=events.count("f"),
           exported="record_trace" in gvmalloc.torch.__all__)


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    {"train": lambda: train(*rest), "resnet": lambda: resnet_train(*rest),
     "infer": lambda: infer(*rest), "mempool": mempool, "scratch_peer": scratch_peer,
     "dist": dist_run, "ddp": lambda: ddp_run(*rest), "cupy": cupy_run,
     "cupy_dead_stream": cupy_dead_stream, "numba": numba_run,
     "record_trace": lambda: record_trace_run(*rest)}[mode]()
