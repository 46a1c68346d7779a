#!/usr/bin/env python3
"""A stand-in for bench/train_gpt.py, to try the GPU scripts without PyTorch (tests/gpu/tensors_keep.sh
with TRAIN_PY=tests/gpu/train_stand_in.py; tests/gpu/tensors_keep_dryrun.sh runs it on the simulated
driver). Takes train_gpt's options (the model's are ignored) and writes the same JSON fields the
scripts read. Each "step" allocates through the driver API (ctypes, cuMemAlloc_v2 / cuMemFree_v2)
what a training step would: activations that grow through a forward pass, a large transient at
the peak, their frees in reverse order, gradients and an optimizer's temporaries; small and large
sizes, none a multiple of 512. Under `cuwarden run --tensors` these go through cuwarden's pool.
It computes its own peak of live requested bytes, `expected_peak_live_bytes`: what cuwarden's
events must give back.
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

MiB = 1 << 20


def cuwarden_counters(cli):
    """This process's counters on its first device, as `cuwarden --json` shows them ({} if none)."""
    out = subprocess.run([cli, "--json"], capture_output=True, text=True, timeout=60).stdout
    for p in json.loads(out or "{}").get("processes", []):
        if p.get("pid") == os.getpid() and p.get("devices"):
            return {k: v for k, v in p["devices"][0].items() if isinstance(v, (int, float))}
    return {}


class Device:
    def __init__(self):
        self.cuda = ctypes.CDLL("libcuda.so.1")
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        assert self.cuda.cuInit(0) == 0 and self.cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
        assert self.cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
        assert self.cuda.cuCtxSetCurrent(ctx) == 0
        self.cuda.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        self.cuda.cuMemAlloc_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.sizes = {}
        self.live = self.peak = 0

    def alloc(self, n):
        p = ctypes.c_uint64()
        r = self.cuda.cuMemAlloc_v2(ctypes.byref(p), n)
        if r != 0:
            raise SystemExit(f"train_stand_in: cuMemAlloc_v2({n}) = {r}")
        self.sizes[p.value] = n
        self.live += n
        self.peak = max(self.peak, self.live)
        return p.value

    def free(self, p):
        assert self.cuda.cuMemFree_v2(p) == 0
        self.live -= self.sizes.pop(p)

    def sync(self):
        self.cuda.cuCtxSynchronize()


def step(d, params, layers):
    acts = [d.alloc(3 * MiB + 1000 * (i + 1)) for i in range(layers)]      # activations
    acts += [d.alloc(4096 + 100 * i) for i in range(4 * layers)]           # small ones
    logits = d.alloc(40 * MiB + 77)                                        # the transient at the peak
    grad_logits = d.alloc(40 * MiB + 77)
    d.free(logits)
    grads = [d.alloc(d.sizes[p]) for p in params]
    for a in reversed(acts):
        d.free(a)
    d.free(grad_logits)
    tmp = [d.alloc(d.sizes[p] // 2 + 3) for p in params]                   # the optimizer's temporaries
    for t in tmp:
        d.free(t)
    for g in grads:
        d.free(g)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--json")
    ap.add_argument("--cuwarden-cli")
    ap.add_argument("--held-after", type=int, default=-1)
    ap.add_argument("--profile-steps", type=int, default=0)
    a = ap.parse_args()
    d = Device()
    params = [d.alloc(2 * MiB + 513 * (i + 1)) for i in range(a.layers)] + [d.alloc(700 + i) for i in range(8)]
    step_ms, step_start_ns, counters_before = [], [], None
    for i in range(a.warmup + a.steps):
        d.sync()
        if a.cuwarden_cli and i == a.warmup:
            counters_before = cuwarden_counters(a.cuwarden_cli)
        step_start_ns.append(time.time_ns())
        t0 = time.perf_counter()
        step(d, params, a.layers)
        d.sync()
        if i >= a.warmup:
            step_ms.append((time.perf_counter() - t0) * 1e3)
    measure_end_ns = time.time_ns()
    after = cuwarden_counters(a.cuwarden_cli) if counters_before is not None else None
    per_step = {k: (after.get(k, 0) - v) / a.steps for k, v in counters_before.items()
                if not k.endswith("_bytes")} if counters_before is not None and a.steps else None
    under = int("libcuwarden.so" in open("/proc/self/maps").read())
    peak512 = d.peak  # a stand-in: PyTorch's figures are its own peak here
    res = {"program": "train_stand_in", "device": "simulated", "torch": "none", "cuwarden": under,
           "warmup": a.warmup, "steps": a.steps, "median_ms": statistics.median(step_ms) if step_ms else None,
           "step_ms": step_ms, "first_loss": 1.0, "last_loss": 0.5,
           "max_memory_allocated": 0 if under else peak512, "max_memory_reserved": 0 if under else 2 * peak512,
           "max_memory_requested": 0 if under else d.peak,
           "pool_calls_per_step": per_step, "counters_before": counters_before, "counters_after": after,
           "pid": os.getpid(), "step_start_ns": step_start_ns, "measure_end_ns": measure_end_ns,
           "expected_peak_live_bytes": d.peak}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f)
    print(json.dumps({k: v for k, v in res.items() if k not in ("step_ms", "step_start_ns")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
