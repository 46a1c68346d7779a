#!/usr/bin/env python3
"""cuwarden bench: a GPT-style training loop for the end-to-end row of bench/gpu.sh.

~100M parameters by default (12 layers, d_model 768, 12 heads, vocab 16384 with a tied
head, sequence 512, batch 8), bf16 autocast, AdamW, synthetic but learnable data from a
fixed seed (a random "next token" table with 10% noise). Deterministic, so that two runs
of the same command print bit-identical losses: torch.manual_seed and
torch.cuda.manual_seed_all, torch.use_deterministic_algorithms(True) (warn_only: an op
without a deterministic implementation is recorded in the JSON's "determinism", not fatal),
CUBLAS_WORKSPACE_CONFIG=:4096:8 set before torch initialises CUDA, cuDNN deterministic and
not benchmarking, TF32 off, and attention through the math SDPA backend (or an explicit
softmax(QK^T)V where torch.nn.attention is missing) so that the flash / memory-efficient
kernels, whose backward is not deterministic, are never used. The same command bare and
under `cuwarden run --limit 100G -- ...` must print the same losses; the step times are
the overhead.

    python3 bench/train_gpt.py --steps 120 --warmup 20 --json out.json

Each step is timed to completion (torch.cuda.synchronize() after the optimizer step).
Output: a header line, then one JSON object on the last line (also written to --json):
params, device, torch version, cuwarden (1 when libcuwarden.so is mapped), step_ms (the
measured steps), median_ms, losses (every step, warm-up included, as Python floats, so
two runs compare exactly), the allocator's peaks (max_memory_requested: the peak sum of
requested sizes), pid and step_start_ns (CLOCK_REALTIME at each step's start, warm-up
included: where cuwarden's events of this process fall among the steps).
Exit 2: the requested device is unavailable.
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import warnings

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS; before torch loads

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


try:  # PyTorch >= 2.3: pick the SDPA backend explicitly
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
except ImportError:
    SDPBackend = sdpa_kernel = None

# "math-sdpa": F.scaled_dot_product_attention restricted to the math backend (set in main);
# "explicit": softmax(QK^T / sqrt(d)) V written out. Both deterministic; never flash/efficient.
ATTENTION = {"impl": "explicit"}


def attention(q, k, v):
    if ATTENTION["impl"] == "math-sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.shape[-2]
    att = (q @ k.transpose(-2, -1)) / (q.shape[-1] ** 0.5)
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    return att.masked_fill(~mask, float("-inf")).softmax(-1) @ v


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and a 4x GELU MLP."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = attention(q, k, v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, seq: int, layers: int, d: int, heads: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as GPT-2
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_batches(n, batch, seq, vocab, seed):
    """n batches of (input, target): a fixed random successor table, 10% noise. CPU, seeded."""
    g = torch.Generator().manual_seed(seed)
    succ = torch.randperm(vocab, generator=g)
    out = []
    for _ in range(n):
        tok = torch.empty(batch, seq + 1, dtype=torch.long)
        tok[:, 0] = torch.randint(vocab, (batch,), generator=g)
        noise = torch.rand(batch, seq, generator=g) < 0.1
        rnd = torch.randint(vocab, (batch, seq), generator=g)
        for i in range(seq):
            tok[:, i + 1] = torch.where(noise[:, i], rnd[:, i], succ[tok[:, i]])
        out.append((tok[:, :-1].contiguous(), tok[:, 1:].contiguous()))
    return out


def cuwarden_loaded():
    try:
        with open("/proc/self/maps") as f:
            return int("libcuwarden.so" in f.read())
    except OSError:
        return 0


def cuwarden_counters(cli):
    """This process's counters on its first device, as `cuwarden --json` shows them ({} if none)."""
    import subprocess
    out = subprocess.run([cli, "--json"], capture_output=True, text=True, timeout=60).stdout
    for p in json.loads(out or "{}").get("processes", []):
        if p.get("pid") == os.getpid() and p.get("devices"):
            return {k: v for k, v in p["devices"][0].items() if isinstance(v, (int, float))}
    return {}


def profile_steps(n, step, sync):
    """Runs n steps under torch.profiler; per step: wall ms, GPU busy ms (the union of kernel,
    copy and set intervals), GPU idle ms, and the host ms and count of each CUDA runtime call."""
    import tempfile
    from torch.profiler import ProfilerActivity, profile
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for i in range(n):
            step(i)
        sync()
        wall_ms = (time.perf_counter() - t0) * 1e3
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.load(open(f.name))
    events = trace.get("traceEvents", trace) if isinstance(trace, dict) else trace
    gpu = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events
                 if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    busy_us, end = 0.0, None
    for b, e in gpu:
        if end is None or b > end:
            busy_us += e - b
            end = e
        elif e > end:
            busy_us += e - end
            end = e
    calls = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cuda_runtime":
            c = calls.setdefault(e["name"], [0, 0.0])
            c[0] += 1
            c[1] += e.get("dur", 0) / 1e3
    span_ms = (gpu[-1][1] - gpu[0][0]) / 1e3 if gpu else 0.0
    top = sorted(calls.items(), key=lambda kv: -kv[1][1])[:12]
    return {"steps": n, "wall_ms_per_step": wall_ms / n, "gpu_busy_ms_per_step": busy_us / 1e3 / n,
            "gpu_idle_ms_per_step": max(0.0, span_ms - busy_us / 1e3) / n,
            "runtime_calls_per_step": {k: {"count": c / n, "host_ms": ms / n} for k, (c, ms) in top}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=120, help="measured steps")
    ap.add_argument("--warmup", type=int, default=20, help="steps before measuring")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--data-batches", type=int, default=64, help="distinct batches, cycled")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", help="also write the result JSON here")
    ap.add_argument("--attention", choices=("math-sdpa", "explicit"), default="math-sdpa",
                    help="math-sdpa falls back to explicit where torch.nn.attention is missing")
    ap.add_argument("--cuwarden-cli", help="the cuwarden CLI: read this process's counters from the daemon "
                    "before the first measured step and after the last (pool_calls_per_step)")
    ap.add_argument("--held-after", type=int, default=-1,
                    help="with --cuwarden-cli: after each step from this one on, read the pool's reserved "
                    "bytes (held_bytes: their maximum); -1: not read")
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="after the measured steps, this many more under torch.profiler: the GPU's idle "
                    "time between kernels and the host time in cudaMalloc / cudaFree per step")
    a = ap.parse_args()

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("train_gpt: no CUDA device", file=sys.stderr)
        return 2
    dev = torch.device(a.device)
    torch.manual_seed(a.seed)
    torch.cuda.manual_seed_all(a.seed)  # no-op without CUDA
    # warn_only: an op with no deterministic implementation warns (recorded below) rather
    # than failing the one benchmark run; every op that has one uses it either way.
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    use_math_sdpa = (a.attention == "math-sdpa" and sdpa_kernel is not None
                     and hasattr(F, "scaled_dot_product_attention"))
    ATTENTION["impl"] = "math-sdpa" if use_math_sdpa else "explicit"
    sdpa_ctx = (lambda: sdpa_kernel(SDPBackend.MATH)) if use_math_sdpa else contextlib.nullcontext

    model = GPT(a.vocab, a.seq, a.layers, a.d_model, a.heads).to(dev)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    data = [(x.to(dev), y.to(dev)) for x, y in make_batches(a.data_batches, a.batch, a.seq, a.vocab, a.seed)]
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"train_gpt: {params / 1e6:.1f}M parameters, {a.layers} layers, d={a.d_model}, seq {a.seq}, "
          f"batch {a.batch}, bf16 autocast, torch {torch.__version__}, {name}, cuwarden={cuwarden_loaded()}, "
          f"attention {ATTENTION['impl']}, CUBLAS_WORKSPACE_CONFIG={os.environ.get('CUBLAS_WORKSPACE_CONFIG')}",
          flush=True)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def train_step(x, y):
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16), sdpa_ctx():
            loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    losses, step_ms, nondeterministic = [], [], set()
    counters_before, held = None, 0
    step_start_ns = []  # CLOCK_REALTIME at each step's start, to place cuwarden's events in steps
    for step in range(a.warmup + a.steps):
        x, y = data[step % len(data)]
        sync()
        if a.cuwarden_cli and step == a.warmup:
            counters_before = cuwarden_counters(a.cuwarden_cli)
        step_start_ns.append(time.time_ns())
        t0 = time.perf_counter()
        if step == 0:  # every op runs in the first step: note any without a deterministic kernel
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                loss = train_step(x, y)
            nondeterministic |= {str(w.message).split("\n")[0] for w in caught
                                 if "deterministic" in str(w.message)}
            for m in sorted(nondeterministic):
                print(f"train_gpt: not deterministic: {m}", file=sys.stderr, flush=True)
        else:
            loss = train_step(x, y)
        sync()
        if step >= a.warmup:
            step_ms.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss.detach().float())
        if a.cuwarden_cli and 0 <= a.held_after <= step:
            held = max(held, cuwarden_counters(a.cuwarden_cli).get("reserved_bytes", 0))
    per_step = None
    measure_end_ns = time.time_ns()
    after = None
    if counters_before is not None and a.steps:
        after = cuwarden_counters(a.cuwarden_cli)
        per_step = {k: (after.get(k, 0) - v) / a.steps for k, v in counters_before.items()
                    if isinstance(v, (int, float)) and not k.endswith("_bytes")}
    profile = profile_steps(a.profile_steps, lambda i: train_step(*data[i % len(data)]), sync) \
        if a.profile_steps else None
    losses = [float(v) for v in torch.stack(losses).cpu().tolist()]

    res = {
        "program": "train_gpt", "params": params, "device": name, "torch": torch.__version__,
        "torch_cuda": torch.version.cuda, "cuwarden": cuwarden_loaded(), "warmup": a.warmup, "steps": a.steps,
        "config": {"layers": a.layers, "d_model": a.d_model, "heads": a.heads, "seq": a.seq, "batch": a.batch,
                   "vocab": a.vocab, "seed": a.seed},
        "determinism": {
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "warn_only": True,
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
            "attention": ATTENTION["impl"],
            "nondeterministic_ops": sorted(nondeterministic),
        },
        "median_ms": statistics.median(step_ms) if step_ms else None,
        "step_ms": [round(v, 4) for v in step_ms],
        "losses": losses,
        "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
        "max_memory_allocated": torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0,
        "max_memory_reserved": torch.cuda.max_memory_reserved(dev) if dev.type == "cuda" else 0,
        # the peak of the sum of requested sizes (0 with PyTorch's cache off: it keeps no statistics then)
        "max_memory_requested": torch.cuda.memory_stats(dev).get("requested_bytes.all.peak", 0)
        if dev.type == "cuda" else 0,
        "memory_reserved": torch.cuda.memory_reserved(dev) if dev.type == "cuda" else 0,
        "pool_calls_per_step": per_step,
        "counters_before": counters_before, "counters_after": after,
        "pid": os.getpid(), "step_start_ns": step_start_ns, "measure_end_ns": measure_end_ns,
        "held_bytes": held if a.held_after >= 0 else None,
        "profile": profile,
    }
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f)
    print(f"train_gpt: median step {res['median_ms']:.3f} ms, loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    print(json.dumps({k: v for k, v in res.items() if k not in ("step_ms", "losses")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
