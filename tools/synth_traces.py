#!/usr/bin/env python3
"""Synthetic allocation traces of shapes the shipped traces do not have.

The four real traces (traces/README.md) are GPT-2 training, ResNet-50 training,
BERT inference and a Llama-style generate loop, all on one stream. A policy
tuned to them may fail on other shapes; these traces check the principle:

  checkpoint_train  transformer training with activation checkpointing: the
                    forward keeps one input per layer, the backward recomputes
                    each layer's activations before its gradients; sequence
                    length and batch change every step; AdamW states appear at
                    the first step
  side_stream       a prefetching loader: each layer's weights are copied in on
                    a side stream (stream 7) while the main stream computes the
                    previous layer, and freed on the main stream after use
  kv_growth         generation that grows its KV cache one token at a time by
                    allocating the longer cache and freeing the shorter
                    (torch.cat), prompts and batch sizes varying per request
  many_small        a speech-style model with thousands of small tensors
                    (per-channel scales, biases, norms: 256 B-64 KiB) and
                    variable-length inputs whose activations are small too
  mixed             gvm-bench-alloc's mixed workload: 1000 live blocks,
                    256 B-64 MiB log-uniform, one replaced per step (churn)
  streams4          four streams each keeping 100 live blocks of 256 B-4 MiB,
                    interleaved (gvm-bench-mt's shape, replayed in order)

Sizes are rounded to 512 B like PyTorch's requests. Each trace is the same on
every run (fixed seeds). Format: docs/replay.md.

  tools/synth_traces.py OUT_DIR [NAME...]     writes OUT_DIR/NAME.trace.gz
"""
import gzip
import math
import os
import random
import sys

MIB = 1 << 20


def r512(n):
    return max(512, (int(n) + 511) // 512 * 512)


class Writer:
    def __init__(self):
        self.lines = []
        self.next_id = 0
        self.live = {}

    def alloc(self, nbytes, stream=0):
        i = self.next_id
        self.next_id += 1
        self.lines.append("a %d %d %d" % (i, r512(nbytes), stream))
        self.live[i] = stream
        return i

    def free(self, i, stream=None):
        s = self.live.pop(i)
        self.lines.append("f %d %d" % (i, s if stream is None else stream))

    def text(self, header):
        return "".join("# %s\n" % h for h in header) + "\n".join(self.lines) + "\n"


def checkpoint_train(rng):
    w = Writer()
    layers, hidden, vocab = 16, 1024, 32000
    params = []
    for _ in range(layers):
        for shape in ((hidden, 3 * hidden), (hidden, hidden), (hidden, 4 * hidden),
                      (4 * hidden, hidden), (hidden,), (hidden,), (3 * hidden,), (4 * hidden,)):
            params.append(math.prod(shape) * 2)  # bf16
    params.append(vocab * hidden * 2)
    weights = [w.alloc(p) for p in params]
    opt = []
    for step in range(12):
        batch = rng.choice([2, 4, 8])
        seq = rng.choice([256, 512, 1024, 2048])
        tok = batch * seq
        act = tok * hidden * 2
        ckpt = []
        x = w.alloc(act)
        for _ in range(layers):  # forward: keep each layer's input only
            tmp = [w.alloc(act * 3), w.alloc(batch * 16 * seq * seq * 2), w.alloc(act),
                   w.alloc(act * 4), w.alloc(act * 4)]
            for t in tmp:
                w.free(t)
            ckpt.append(x)
            x = w.alloc(act)
        logits = w.alloc(tok * vocab * 2)
        loss_grad = w.alloc(tok * vocab * 2)
        w.free(logits)
        grads = [w.alloc(p) for p in params] if step == 0 or rng.random() < 0.5 else None
        gx = w.alloc(act)
        w.free(loss_grad)
        w.free(x)
        for layer in reversed(range(layers)):  # backward: recompute, then grads
            rec = [w.alloc(act * 3), w.alloc(batch * 16 * seq * seq * 2), w.alloc(act),
                   w.alloc(act * 4)]
            gtmp = [w.alloc(act * 4), w.alloc(act * 3), w.alloc(batch * 16 * seq * seq * 2)]
            for t in rec + gtmp:
                w.free(t)
            w.free(ckpt[layer])
            nxt = w.alloc(act)
            w.free(gx)
            gx = nxt
        w.free(gx)
        if grads is None:
            grads = [w.alloc(p) for p in params]
        if not opt:
            opt = [w.alloc(p * 2) for p in params] + [w.alloc(p * 2) for p in params]
        for p in params[::8]:  # optimizer temporaries
            t = w.alloc(p * 2)
            w.free(t)
        for g in grads:
            w.free(g)
    for i in opt + weights:
        w.free(i)
    return w, "transformer training, activation checkpointing, 16 layers, 12 steps"


def side_stream(rng):
    w = Writer()
    side = 7
    layers = 24
    sizes = [rng.choice([24, 32, 48, 64]) * MIB for _ in range(layers)]
    resident = [w.alloc(rng.choice([4, 8, 16]) * MIB) for _ in range(8)]
    for step in range(30):
        batch = rng.choice([1, 2, 4, 8, 16])
        act = batch * rng.choice([2, 3, 4]) * MIB
        pending = w.alloc(sizes[0], side)
        x = w.alloc(act)
        for layer in range(layers):
            nxt = w.alloc(sizes[(layer + 1) % layers], side) if layer + 1 < layers else None
            tmp = [w.alloc(act * 2), w.alloc(act), w.alloc(rng.choice([64, 256, 4096]) * 1024)]
            for t in tmp:
                w.free(t)
            y = w.alloc(act)
            w.free(x)
            x = y
            w.free(pending, 0)  # used and freed on the main stream
            pending = nxt
        w.free(x)
    for i in resident:
        w.free(i)
    return w, "layer weights prefetched on a side stream (7), freed on stream 0, 24 layers, 30 steps"


def kv_growth(rng):
    w = Writer()
    layers, heads_dim = 8, 2 * 1024 * 2  # K and V, bf16
    weights = [w.alloc(rng.choice([8, 16, 32]) * MIB) for _ in range(layers * 4)]
    for request in range(10):
        batch = rng.choice([1, 2, 4, 8])
        prompt = rng.randint(16, 512)
        new = rng.randint(16, 96)
        cache = [w.alloc(batch * prompt * heads_dim) for _ in range(layers)]
        for t in range(new):
            length = prompt + t + 1
            for layer in range(layers):
                tmp = w.alloc(batch * length * 64)
                grown = w.alloc(batch * length * heads_dim)
                w.free(cache[layer])
                w.free(tmp)
                cache[layer] = grown
            logits = w.alloc(batch * 32000 * 4)
            w.free(logits)
        for c in cache:
            w.free(c)
    for i in weights:
        w.free(i)
    return w, "generation growing the KV cache by one token per step (cat), 8 layers, 10 requests"


def many_small(rng):
    w = Writer()
    params = [w.alloc(rng.choice([256, 512, 1024, 2048, 4096, 8192, 16384, 65536]))
              for _ in range(3000)]
    params += [w.alloc(rng.choice([1, 2, 4]) * MIB) for _ in range(40)]
    opt = [w.alloc(r512(p) * 2) for p in range(3000)]
    for step in range(40):
        frames = rng.randint(100, 1600)
        acts = []
        for layer in range(30):
            a = w.alloc(frames * rng.choice([128, 256, 512]) * 2)
            small = [w.alloc(rng.choice([512, 1536, 4096, 12288])) for _ in range(rng.randint(2, 8))]
            for s in small:
                w.free(s)
            acts.append(a)
        grads = []
        for a in reversed(acts):
            g = w.alloc(frames * 512 * 2)
            w.free(a)
            grads.append(g)
            if len(grads) > 2:
                w.free(grads.pop(0))
        for g in grads:
            w.free(g)
        pg = [w.alloc(512 * rng.randint(1, 16)) for _ in range(600)]
        for g in pg:
            w.free(g)
    for i in opt + params:
        w.free(i)
    return w, "speech-style model: 3000 small parameters, variable-length inputs, 40 steps"


def mixed(rng):
    w = Writer()

    def size():
        return math.exp(math.log(256) + rng.random() * (math.log(64 * MIB) - math.log(256)))

    live = [w.alloc(size()) for _ in range(1000)]
    for _ in range(20000):
        k = rng.randrange(len(live))
        w.free(live[k])
        live[k] = w.alloc(size())
    for i in live:
        w.free(i)
    return w, "1000 live blocks, 256 B-64 MiB log-uniform, one replaced per step, 20000 steps"


def streams4(rng):
    w = Writer()

    def size():
        return math.exp(math.log(256) + rng.random() * (math.log(4 * MIB) - math.log(256)))

    streams = [1, 2, 3, 4]
    live = {s: [w.alloc(size(), s) for _ in range(100)] for s in streams}
    for _ in range(4000):
        for s in streams:
            k = rng.randrange(100)
            w.free(live[s][k])
            live[s][k] = w.alloc(size(), s)
    for s in streams:
        for i in live[s]:
            w.free(i)
    return w, "4 streams x 100 live blocks of 256 B-4 MiB, one replaced per stream per round"


TRACES = {
    "checkpoint_train": (checkpoint_train, 13),
    "side_stream": (side_stream, 17),
    "kv_growth": (kv_growth, 19),
    "many_small": (many_small, 23),
    "mixed": (mixed, 29),
    "streams4": (streams4, 31),
}


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(sys.argv) >= 2 else 2
    out = sys.argv[1]
    names = sys.argv[2:] or list(TRACES)
    for n in names:
        if n not in TRACES:
            print("synth_traces.py: unknown trace '%s' (known: %s)" % (n, ", ".join(TRACES)),
                  file=sys.stderr)
            return 2
    os.makedirs(out, exist_ok=True)
    for n in names:
        fn, seed = TRACES[n]
        w, what = fn(random.Random(seed))
        path = os.path.join(out, n + ".trace.gz")
        with gzip.GzipFile(path, "wb", mtime=0) as f:
            f.write(w.text(["synthetic: " + what,
                            "written by tools/synth_traces.py (seed %d)" % seed]).encode())
        print("%s: %d events" % (path, len(w.lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
