#!/usr/bin/env python3
"""Record an allocation trace of a real program, for bench/trace_replay and the ctest replays.

    python3 bench/traces/record.py train    --out bench/traces/gpt2-train.trace.gz
    python3 bench/traces/record.py generate --out bench/traces/gpt2-generate.trace.gz
    python3 bench/traces/record.py cupy     --out bench/traces/cupy-grow.trace.gz

train: a GPT-2 (transformers, 6 layers, random init) trained with bf16 autocast, batch 8 and a
different sequence length each step (64..1024), AdamW. generate: the same model's generate()
with varying prompt lengths (16..512) and batch sizes (1..16). Both record PyTorch's memory
history (the caching allocator's own blocks: what a program without a caching allocator would
ask cudaMalloc for). cupy: a CuPy program with its memory pool off (an allocator of our own
that calls cudaMalloc/cudaFree and records both) whose arrays grow step by step.

Trace format (text, gzip): '#' comment lines (source, events, peak live), then one event per
line, in the program's order: 'a ID BYTES' (an allocation) or 'f ID' (its free). IDs are
dense from 0. Blocks still live at the end have no 'f'.
"""
import argparse
import gzip
import random
import sys


class Trace:
    def __init__(self):
        self.events = []  # ("a", id, bytes) / ("f", id)
        self.next_id = 0
        self.live = 0
        self.peak = 0
        self.sizes = {}

    def alloc(self, size):
        i = self.next_id
        self.next_id += 1
        self.events.append(("a", i, size))
        self.sizes[i] = size
        self.live += size
        self.peak = max(self.peak, self.live)
        return i

    def free(self, i):
        self.events.append(("f", i))
        self.live -= self.sizes.pop(i)

    def write(self, path, source):
        with gzip.open(path, "wt") as f:
            f.write("# cuwarden allocation trace v1\n")
            f.write(f"# source: {source}\n")
            f.write(f"# events: {len(self.events)}, allocations: {self.next_id}, peak live bytes: {self.peak}\n")
            for e in self.events:
                f.write(f"a {e[1]} {e[2]}\n" if e[0] == "a" else f"f {e[1]}\n")
        print(f"{path}: {len(self.events)} events, {self.next_id} allocations, peak live {self.peak / 2**30:.2f} GiB",
              file=sys.stderr)


def from_torch_history(snapshot, trace):
    """The caching allocator's block events of device 0: alloc, then the free the program asked for."""
    by_addr = {}
    for e in snapshot["device_traces"][0]:
        a = e["action"]
        if a == "alloc":
            by_addr[e["addr"]] = trace.alloc(e["size"])
        elif a in ("free_requested", "free_completed"):
            i = by_addr.pop(e["addr"], None)  # the first of the two for a block
            if i is not None:
                trace.free(i)


def record_torch(path, workload, source):
    """Runs workload() under PyTorch's memory history and writes its block events as a trace."""
    import torch
    torch.cuda.memory._record_memory_history(max_entries=2_000_000)
    workload()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    tr = Trace()
    from_torch_history(snap, tr)
    tr.write(path, f"{source}; PyTorch {torch.__version__}")


def gpt2(layers):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=layers, n_positions=1024, n_embd=768, n_head=12, vocab_size=50257)
    return GPT2LMHeadModel(cfg).cuda()


def run_train(args):
    import torch
    model = gpt2(6)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(1)

    def train():
        for _ in range(args.steps):
            t = rng.randint(64, 1024)
            x = torch.randint(0, 50257, (8, t), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    record_torch(args.out, train, f"GPT-2 (6 layers, random init) training, bf16 autocast, batch 8, "
                                  f"sequence length 64..1024 per step, {args.steps} steps, AdamW")


def run_generate(args):
    import torch
    model = gpt2(6).eval()
    rng = random.Random(2)

    def generate():
        with torch.no_grad():
            for _ in range(args.steps):
                b, t = rng.randint(1, 16), rng.randint(16, 512)
                x = torch.randint(0, 50257, (b, t), device="cuda")
                model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=rng.randint(16, 128),
                               min_new_tokens=16, do_sample=False, pad_token_id=0)

    record_torch(args.out, generate, f"GPT-2 (6 layers, random init) generate(), greedy, batch 1..16, prompt "
                                     f"16..512 tokens, 16..128 new tokens, {args.steps} calls")


def run_cupy(args):
    import cupy as cp
    tr = Trace()

    class Owner:
        def __init__(self, ptr, size):
            self.ptr, self.id = ptr, tr.alloc(size)

        def __del__(self):
            tr.free(self.id)
            cp.cuda.runtime.free(self.ptr)

    def alloc(size):
        if size == 0:
            return cp.cuda.memory.MemoryPointer(cp.cuda.memory.UnownedMemory(0, 0, None, 0), 0)
        ptr = cp.cuda.runtime.malloc(size)
        return cp.cuda.memory.MemoryPointer(cp.cuda.memory.UnownedMemory(ptr, size, Owner(ptr, size)), 0)

    cp.cuda.set_allocator(alloc)  # the pool off: every array is its own cudaMalloc
    rs = cp.random.RandomState(3)
    rng = random.Random(3)
    # A growing simulation: a history buffer that grows by concatenation, particle arrays whose
    # count grows, and temporaries of the current sizes.
    hist = cp.zeros(0, dtype=cp.float32)
    n = 1 << 20
    pos = rs.rand(n, 3, dtype=cp.float32)
    for step in range(args.steps):
        n = int(n * rng.uniform(1.01, 1.08))
        pos = cp.concatenate([pos, rs.rand(n - pos.shape[0], 3, dtype=cp.float32)])
        vel = rs.standard_normal((n, 3), dtype=cp.float32)
        pos = pos + 0.01 * vel
        e = (vel * vel).sum(axis=1)
        hist = cp.concatenate([hist, e[: rng.randint(1000, 200000)]])
        del vel, e
    cp.cuda.Device().synchronize()
    del pos, hist
    cp.cuda.set_allocator(None)
    tr.write(args.out, f"CuPy {cp.__version__} with its memory pool off: particle arrays growing 1-8% per step "
                       f"from 1M, a history buffer growing by concatenation, {args.steps} steps")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", choices=["train", "generate", "cupy"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=None)
    args = ap.parse_args()
    args.steps = args.steps or {"train": 40, "generate": 8, "cupy": 120}[args.workload]
    {"train": run_train, "generate": run_generate, "cupy": run_cupy}[args.workload](args)


if __name__ == "__main__":
    main()
