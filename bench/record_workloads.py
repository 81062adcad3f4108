"""Real PyTorch workloads of shapes the shipped traces lack, recorded as gvmalloc traces.

    python bench/record_workloads.py OUT_DIR [--workloads vit_train,...] [--timeout S]

(all ten by default).

The shipped traces (traces/README.md) are GPT-2 and ResNet-50 training, BERT
inference and a Llama generate loop; the fragmentation policy was studied on
them (docs/design-notes.md, "Fragmentation"). These workloads are other shapes,
recorded to check that the policy holds on programs it was not tuned on:

  vit_train           torchvision ViT-B/16 training, AdamW, bf16 autocast, batch
                      16-64 at random (vision transformer: few, large activations)
  efficientnet_side   torchvision EfficientNet-B0 training, SGD, bf16, channels_last,
                      batch 32-128 and resolution 192-256 at random; each batch is
                      copied to the GPU on a side stream and handed to the main
                      stream with record_stream (a prefetching data loader: many
                      small tensors, and blocks of a second stream)
  gpt2_checkpointed   transformers GPT-2 small fine-tuning with activation
                      checkpointing (gradient_checkpointing_enable), AdamW, bf16,
                      batch 4-16 and sequence 128-1024 at random
  speech_ctc          a speech recogniser in plain PyTorch: two strided Conv2d over
                      80-dim filterbank frames, a 12-layer Transformer encoder (d=512),
                      CTC loss; 4-32 utterances of 2-30 s at random (lengths that
                      move the peak batch by batch, in training)
  t5_seq2seq          transformers T5-small-sized encoder-decoder training, AdamW,
                      random source and target lengths (cross-attention, two stacks)

A second set, recorded after rule 7 (2026-12-06), of shapes none of the rules was
studied on:

  convnext_train      torchvision ConvNeXt-T training, AdamW, bf16, channels_last,
                      batch 16-96 and resolution 160-288 at random (depthwise 7x7
                      convolutions, LayerNorm over channels)
  segmentation_train  torchvision DeepLabV3-ResNet50 training with its auxiliary head,
                      SGD, bf16, batch 4-16 of crops 256-576 high and wide at random
                      (dense per-pixel outputs, dilated convolutions)
  moe_train           a decoder of 8 layers whose feed-forward is 8 experts with top-2
                      routing, in plain PyTorch, AdamW, bf16, batch 4-16 and sequence
                      128-1024 at random: each expert's batch is the tokens routed to
                      it, a size that changes with every layer and step
  bert_accum          transformers BERT-base sequence classification fine-tuning, AdamW,
                      bf16, batch 8-32 and sequence 32-512 at random, gradients
                      accumulated over 4 micro-batches (one recorded step = one micro-batch)
  whisper_train       transformers Whisper-sized speech encoder-decoder (6+6 layers,
                      d=512) training on 30 s of log-mel frames with transcripts of
                      8-440 tokens at random

Every model is randomly initialised from a configuration (nothing is downloaded).
Each workload runs in a process of its own under PyTorch's own allocator, warms
up for two steps, and records its next steps with gvmalloc.torch.record_trace
into OUT_DIR/<workload>.trace.gz (what PyTorch's allocator reserved is in the
trace's header). A workload that fails or times out is reported and the others
go on; exit status 1 if one failed. Then tools/replay-peers.sh replays the
traces under gvmalloc and each peer on the GPU.
"""

import json
import os
import random
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# ---- inside one process ------------------------------------------------------------

def setup():
    import torch
    torch.manual_seed(0)
    random.seed(0)
    return torch


def record(torch, name, out_dir, step, warm, steps):
    """Runs `warm` steps, then records `steps` more into OUT_DIR/name.trace.gz."""
    import gvmalloc.torch
    for i in range(warm):
        step(i)
    torch.cuda.synchronize()
    path = os.path.join(out_dir, name + ".trace.gz")
    t0 = time.perf_counter()
    with gvmalloc.torch.record_trace(path):
        for i in range(warm, warm + steps):
            step(i)
    seconds = time.perf_counter() - t0
    print("GVM_RESULT " + json.dumps({
        "workload": name, "trace": path, "steps": steps, "seconds": round(seconds, 2),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "max_memory_allocated": torch.cuda.max_memory_allocated()}), flush=True)


def backward_and_step(loss, opt):
    """A training step's end: gradients, the optimiser's update, and the gradients
    dropped (set_to_none frees them, as training loops do)."""
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def vit_train(out_dir, steps):
    torch = setup()
    import torchvision
    model = torchvision.models.vit_b_16(weights=None).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(11)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(_):
        b = rng.choice([16, 32, 48, 64])
        x = torch.randn(b, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (b,), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        backward_and_step(loss, opt)

    record(torch, "vit_train", out_dir, step, 2, steps)


def efficientnet_side(out_dir, steps):
    torch = setup()
    import torchvision
    model = torchvision.models.efficientnet_b0(weights=None).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    rng = random.Random(12)
    side = torch.cuda.Stream()
    main = torch.cuda.current_stream()
    # Host batches in pinned memory, as a DataLoader with pin_memory=True gives.
    host = {}

    def host_batch(b, r):
        if (b, r) not in host:
            host[(b, r)] = (torch.randn(b, 3, r, r).pin_memory(),
                            torch.randint(0, 1000, (b,)).pin_memory())
        return host[(b, r)]

    def prefetch():
        b, r = rng.choice([32, 64, 96, 128]), rng.choice([192, 224, 256])
        hx, hy = host_batch(b, r)
        with torch.cuda.stream(side):
            x = hx.cuda(non_blocking=True).to(memory_format=torch.channels_last)
            y = hy.cuda(non_blocking=True)
        return x, y

    state = {"next": prefetch()}

    def step(_):
        main.wait_stream(side)
        x, y = state["next"]
        x.record_stream(main)
        y.record_stream(main)
        state["next"] = prefetch()  # the next batch's copy overlaps this step
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        backward_and_step(loss, opt)

    record(torch, "efficientnet_side", out_dir, step, 2, steps)


def gpt2_checkpointed(out_dir, steps):
    torch = setup()
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config()
    model = GPT2LMHeadModel(cfg).cuda().train()
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    opt = torch.optim.AdamW(model.parameters(), lr=3e-5)
    rng = random.Random(13)

    def step(_):
        b, t = rng.choice([4, 8, 16]), rng.randint(128, 1024)
        ids = torch.randint(0, cfg.vocab_size, (b, t), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        backward_and_step(loss, opt)

    record(torch, "gpt2_checkpointed", out_dir, step, 2, steps)


def speech_ctc(out_dir, steps):
    torch = setup()
    nn = torch.nn

    class Recogniser(nn.Module):
        def __init__(self, d=512, layers=12, vocab=32):
            super().__init__()
            self.sub = nn.Sequential(nn.Conv2d(1, 64, 3, stride=2), nn.ReLU(),
                                     nn.Conv2d(64, 64, 3, stride=2), nn.ReLU())
            self.proj = nn.Linear(64 * 19, d)
            layer = nn.TransformerEncoderLayer(d, 8, 4 * d, dropout=0.1, batch_first=True,
                                               norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers)
            self.head = nn.Linear(d, vocab)

        def forward(self, feats):  # (B, T, 80)
            x = self.sub(feats.unsqueeze(1))  # (B, 64, T/4, 19)
            b, c, t, f = x.shape
            x = self.proj(x.transpose(1, 2).reshape(b, t, c * f))
            return self.head(self.encoder(x)).log_softmax(-1)

    model = Recogniser().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ctc = nn.CTCLoss(zero_infinity=True)
    rng = random.Random(14)

    def step(_):
        b = rng.choice([4, 8, 16, 32])
        frames = rng.randint(200, 3000)  # 10 ms frames: 2-30 s of audio
        feats = torch.randn(b, frames, 80, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logp = model(feats)
        t_out = logp.shape[1]
        target_len = max(1, t_out // 4)
        targets = torch.randint(1, 32, (b, target_len), device="cuda")
        loss = ctc(logp.float().transpose(0, 1),
                   targets, torch.full((b,), t_out, dtype=torch.long, device="cuda"),
                   torch.full((b,), target_len, dtype=torch.long, device="cuda"))
        backward_and_step(loss, opt)

    record(torch, "speech_ctc", out_dir, step, 2, steps)


def t5_seq2seq(out_dir, steps):
    torch = setup()
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(d_model=512, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8,
                   vocab_size=32128, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    model = T5ForConditionalGeneration(cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(15)

    def step(_):
        b = rng.choice([8, 16, 32])
        src, tgt = rng.randint(32, 512), rng.randint(16, 256)
        ids = torch.randint(0, cfg.vocab_size, (b, src), device="cuda")
        labels = torch.randint(0, cfg.vocab_size, (b, tgt), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss
        backward_and_step(loss, opt)

    record(torch, "t5_seq2seq", out_dir, step, 2, steps)


# ---- recorded 2026-12-06, after rule 7: more shapes the policy was not studied on ----

def convnext_train(out_dir, steps):
    torch = setup()
    import torchvision
    model = torchvision.models.convnext_tiny(weights=None).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    rng = random.Random(16)

    def step(_):
        b, r = rng.choice([16, 32, 64, 96]), rng.choice([160, 192, 224, 256, 288])
        x = torch.randn(b, 3, r, r, device="cuda").to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (b,), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        backward_and_step(loss, opt)

    record(torch, "convnext_train", out_dir, step, 2, steps)


def segmentation_train(out_dir, steps):
    torch = setup()
    import torchvision
    model = torchvision.models.segmentation.deeplabv3_resnet50(
        weights=None, weights_backbone=None, num_classes=21, aux_loss=True).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=255)
    rng = random.Random(17)

    def step(_):
        # Crops of other heights and widths each batch, as segmentation training feeds.
        b = rng.choice([4, 8, 12, 16])
        h, w = rng.randrange(256, 577, 32), rng.randrange(256, 577, 32)
        x = torch.randn(b, 3, h, w, device="cuda")
        y = torch.randint(0, 21, (b, h, w), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
            loss = loss_fn(out["out"], y) + 0.4 * loss_fn(out["aux"], y)
        backward_and_step(loss, opt)

    record(torch, "segmentation_train", out_dir, step, 2, steps)


def moe_train(out_dir, steps):
    torch = setup()
    nn = torch.nn
    F = torch.nn.functional

    class Experts(nn.Module):
        """Top-2 routing over 8 feed-forward experts: each expert's batch is the
        tokens routed to it, a size that changes with every step and layer."""

        def __init__(self, d, n=8, k=2):
            super().__init__()
            self.router = nn.Linear(d, n)
            self.experts = nn.ModuleList(
                nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) for _ in range(n))
            self.k = k

        def forward(self, x):  # (N, d)
            weight, which = self.router(x).softmax(-1).topk(self.k, dim=-1)
            out = torch.zeros_like(x)
            for e, expert in enumerate(self.experts):
                rows, slot = (which == e).nonzero(as_tuple=True)
                if rows.numel() == 0:
                    continue
                y = expert(x[rows]) * weight[rows, slot].unsqueeze(-1).to(x.dtype)
                out = out.index_add(0, rows, y.to(out.dtype))
            return out

    class Block(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.moe = Experts(d)
            self.heads = heads

        def forward(self, x):  # (B, T, d)
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.moe(self.ln2(x).reshape(b * t, d)).view(b, t, d)

    class Model(nn.Module):
        def __init__(self, vocab=32000, d=768, layers=8, heads=12):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
            self.ln = nn.LayerNorm(d)

        def forward(self, ids):
            x = self.embed(ids)
            for blk in self.blocks:
                x = blk(x)
            return self.ln(x) @ self.embed.weight.t()

    model = Model().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(18)

    def step(_):
        b, t = rng.choice([4, 8, 16]), rng.randint(128, 1024)
        ids = torch.randint(0, 32000, (b, t), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(ids)
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                   ids[:, 1:].reshape(-1))
        backward_and_step(loss, opt)

    record(torch, "moe_train", out_dir, step, 2, steps)


def bert_accum(out_dir, steps):
    torch = setup()
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig(num_labels=4)
    model = BertForSequenceClassification(cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
    rng = random.Random(19)
    accumulate = 4  # micro-batches per optimizer step: the gradients live across them

    def step(i):
        b, t = rng.choice([8, 16, 24, 32]), rng.randint(32, 512)
        ids = torch.randint(0, cfg.vocab_size, (b, t), device="cuda")
        labels = torch.randint(0, 4, (b,), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss / accumulate
        loss.backward()
        if (i + 1) % accumulate == 0:
            opt.step()
            opt.zero_grad(set_to_none=True)

    record(torch, "bert_accum", out_dir, step, accumulate, steps)


def whisper_train(out_dir, steps):
    torch = setup()
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    cfg = WhisperConfig(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                        decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048)
    model = WhisperForConditionalGeneration(cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(20)

    def step(_):
        # 30 s of log-mel frames (Whisper's fixed input) and transcripts of any length.
        b, t = rng.choice([4, 8, 16, 24]), rng.randint(8, 440)
        feats = torch.randn(b, cfg.num_mel_bins, 2 * cfg.max_source_positions, device="cuda")
        labels = torch.randint(0, cfg.vocab_size - 100, (b, t), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_features=feats, labels=labels).loss
        backward_and_step(loss, opt)

    record(torch, "whisper_train", out_dir, step, 2, steps)


WORKLOADS = {
    "vit_train": (vit_train, 20),
    "efficientnet_side": (efficientnet_side, 30),
    "gpt2_checkpointed": (gpt2_checkpointed, 20),
    "speech_ctc": (speech_ctc, 30),
    "t5_seq2seq": (t5_seq2seq, 30),
    "convnext_train": (convnext_train, 30),
    "segmentation_train": (segmentation_train, 20),
    "moe_train": (moe_train, 30),
    "bert_accum": (bert_accum, 40),
    "whisper_train": (whisper_train, 20),
}


# ---- the driver ------------------------------------------------------------------------

def run_one(name, out_dir, timeout):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # PyTorch's own allocator, default settings
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(ROOT, "integrations", "python"),
                                                    env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, os.path.abspath(__file__), "worker", name, out_dir]
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"workload": name, "error": "timed out after %d s" % timeout}
    for line in reversed(r.stdout.splitlines()):
        if line.startswith("GVM_RESULT "):
            out = json.loads(line[len("GVM_RESULT "):])
            out["wall_s"] = round(time.monotonic() - t0, 1)
            return out
    how = ("signal %d" % -r.returncode) if r.returncode < 0 else "exit %d" % r.returncode
    return {"workload": name, "error": "no result (%s)" % how, "stderr": r.stderr[-3000:]}


def main(argv):
    if len(argv) >= 3 and argv[0] == "worker":
        fn, steps = WORKLOADS[argv[1]]
        fn(argv[2], steps)
        return 0
    args = list(argv)
    names, timeout = list(WORKLOADS), 120
    if "--workloads" in args:
        i = args.index("--workloads")
        names = args[i + 1].split(",")
        del args[i:i + 2]
    if "--timeout" in args:
        i = args.index("--timeout")
        timeout = int(args[i + 1])
        del args[i:i + 2]
    unknown = [n for n in names if n not in WORKLOADS]
    if len(args) != 1 or unknown:
        sys.stderr.write(__doc__)
        if unknown:
            sys.stderr.write("unknown workloads: %s\n" % ", ".join(unknown))
        return 2
    out_dir = os.path.abspath(args[0])
    os.makedirs(out_dir, exist_ok=True)
    results, rc = [], 0
    for name in names:
        r = run_one(name, out_dir, timeout)
        results.append(r)
        if "error" in r:
            rc = 1
            print("%-18s FAILED: %s\n%s" % (name, r["error"], r.get("stderr", "")), flush=True)
        else:
            print("%-18s %d steps in %.1f s (process %.1f s), PyTorch reserved %.0f MiB for %.0f MiB "
                  "allocated at most" % (name, r["steps"], r["seconds"], r["wall_s"],
                                         r["max_memory_reserved"] / 2**20,
                                         r["max_memory_allocated"] / 2**20), flush=True)
    with open(os.path.join(out_dir, "workloads.json"), "w") as f:
        json.dump(results, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
