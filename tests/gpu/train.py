#!/usr/bin/env python3
"""cuwarden GPU validation: a small GPT-style training loop on a real GPU (PyTorch).

Run it under cuwarden to see a real framework live under a cap:

    cuwarden run --limit 4G -- python3 tests/gpu/train.py --steps 300
    cuwarden run --limit 4G -- python3 tests/gpu/train.py --expect-oom

The data are synthetic but learnable (a fixed random "next token" table with 10% noise),
from a fixed seed, so the loss falls from ~ln(vocab) and runs are comparable.

Output: a header line, `step N loss L ms/step M` every --log-every steps, then one JSON line
with the allocator's figures (memory_allocated, max_memory_allocated, memory_reserved, ...).

--expect-oom trains with --oom-batch (default 256: the logits alone need 2 GiB, so a step
needs well over 4 GiB), catches torch.cuda.OutOfMemoryError, prints
`OOM caught: <first line of the message>` and exits 0; exits 3 if no OOM happened.
Exit 2: no CUDA device.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention (SDPA) and a 4x MLP."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, seq: int, layers: int, d_model: int, heads: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def make_dataset(n_seq: int, seq: int, vocab: int, seed: int) -> torch.Tensor:
    """n_seq sequences of seq+1 tokens: x[t+1] = table[x[t]] with prob 0.9, else random."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randperm(vocab, generator=g)
    data = torch.empty(n_seq, seq + 1, dtype=torch.long)
    data[:, 0] = torch.randint(vocab, (n_seq,), generator=g)
    for t in range(seq):
        noise = torch.rand(n_seq, generator=g) < 0.1
        rand_tok = torch.randint(vocab, (n_seq,), generator=g)
        data[:, t + 1] = torch.where(noise, rand_tok, table[data[:, t]])
    return data


def memory_report(dev) -> dict:
    free, total = torch.cuda.mem_get_info(dev)
    return {
        "memory_allocated": torch.cuda.memory_allocated(dev),
        "max_memory_allocated": torch.cuda.max_memory_allocated(dev),
        "memory_reserved": torch.cuda.memory_reserved(dev),
        "max_memory_reserved": torch.cuda.max_memory_reserved(dev),
        "mem_get_info_free": free,
        "mem_get_info_total": total,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast for forward/loss")
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--hold-s", type=float, default=0.0,
                   help="after training, keep everything allocated this long (for observers)")
    p.add_argument("--expect-oom", action="store_true",
                   help="train with --oom-batch; success = torch.cuda.OutOfMemoryError caught")
    p.add_argument("--oom-batch", type=int, default=256)
    args = p.parse_args()

    if not torch.cuda.is_available():
        print("train.py: no CUDA device visible to PyTorch", file=sys.stderr)
        return 2
    dev = torch.device("cuda", 0)
    torch.manual_seed(args.seed)
    batch = args.oom_batch if args.expect_oom else args.batch
    steps = min(args.steps, 5) if args.expect_oom else args.steps  # the OOM comes at step 1

    model = GPT(args.vocab, args.seq, args.layers, args.d_model, args.heads).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    data = make_dataset(2048, args.seq, args.vocab, args.seed).to(dev)
    g = torch.Generator(device=dev).manual_seed(args.seed)
    free, total = torch.cuda.mem_get_info(dev)
    print(f"train.py: pid {os.getpid()}, torch {torch.__version__}, device {torch.cuda.get_device_name(dev)}, "
          f"params {n_params / 1e6:.1f}M, batch {batch}, seq {args.seq}, steps {steps}, "
          f"bf16 {args.bf16}, mem_get_info total {total / 2**30:.2f} GiB free {free / 2**30:.2f} GiB",
          flush=True)

    step_ms = []
    loss_val = float("nan")
    t_log = time.perf_counter()
    try:
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            idx = torch.randint(data.shape[0], (batch,), device=dev, generator=g)
            x, y = data[idx, :-1], data[idx, 1:]
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.bf16):
                logits = model(x)
                loss = F.cross_entropy(logits.float().view(-1, args.vocab), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if step % args.log_every == 0 or step == 1 or step == steps:
                loss_val = loss.item()  # synchronizes
            torch.cuda.synchronize(dev)
            step_ms.append((time.perf_counter() - t0) * 1e3)
            if step % args.log_every == 0 or step == 1 or step == steps:
                recent = step_ms[-args.log_every:]
                print(f"step {step} loss {loss_val:.4f} ms/step {sum(recent) / len(recent):.2f} "
                      f"(last {step_ms[-1]:.2f}) allocated {torch.cuda.memory_allocated(dev) / 2**20:.0f} MiB "
                      f"elapsed {time.perf_counter() - t_log:.1f}s", flush=True)
    except torch.cuda.OutOfMemoryError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
        print(f"OOM caught: {first}", flush=True)
        report = memory_report(dev)
        report.update({"oom": True, "batch": batch, "steps_done": len(step_ms)})
        print(json.dumps(report), flush=True)
        if args.expect_oom:
            return 0
        return 1

    report = memory_report(dev)
    steady = step_ms[5:] if len(step_ms) > 10 else step_ms
    report.update({
        "oom": False,
        "batch": batch,
        "steps_done": len(step_ms),
        "final_loss": loss_val if math.isfinite(loss_val) else None,
        "mean_step_ms": sum(steady) / len(steady) if steady else None,
        "params": n_params,
    })
    if args.hold_s > 0:
        print(f"holding memory for {args.hold_s:.1f}s", flush=True)
        time.sleep(args.hold_s)
    print(json.dumps(report), flush=True)
    if args.expect_oom:
        print(f"train.py: --expect-oom, but {len(step_ms)} steps with batch {batch} ran without OOM",
              file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
