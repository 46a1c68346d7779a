#!/usr/bin/env python3
"""A small PyTorch training for the call-site checks (tests/gpu/callsites.sh).

  train.py --steps N [--plant-mib M] [--wait FILE] [--oom-gib G] [--timing]

Trains a transformer encoder on random tokens. Before the loop it allocates one large tensor
at the line marked PLANTED (printed as "planted LINE"), kept alive: the largest call site by
live bytes. --wait FILE: after warm-up, print "ready" and wait until FILE exists (the caller
takes snapshots meanwhile). --oom-gib G: then allocate G GiB at the line marked PLANTED-OOM
(printed as "oom-line LINE"); under a smaller cap PyTorch raises OutOfMemoryError, which is
caught and printed. --timing: print one line per step, "step_ms X".
"""
import argparse
import inspect
import os
import sys
import time

import torch
import torch.nn as nn


def planted(mib):
    print("planted", inspect.currentframe().f_lineno + 1, flush=True)
    return torch.empty(mib * 2**20 // 4, dtype=torch.float32, device="cuda")  # PLANTED


def oversized(gib):
    print("oom-line", inspect.currentframe().f_lineno + 1, flush=True)
    return torch.empty(int(gib * 2**30) // 4, dtype=torch.float32, device="cuda")  # PLANTED-OOM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--plant-mib", type=int, default=1024)
    ap.add_argument("--wait")
    ap.add_argument("--oom-gib", type=float, default=0)
    ap.add_argument("--timing", action="store_true")
    ap.add_argument("--batch", type=int, default=32)
    a = ap.parse_args()
    torch.manual_seed(0)
    keep = planted(a.plant_mib)
    d = 512
    model = nn.Sequential(nn.Embedding(8192, d),
                          nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 8, 2048, batch_first=True), 4),
                          nn.Linear(d, 8192)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lossf = nn.CrossEntropyLoss()
    for step in range(a.steps):
        x = torch.randint(0, 8192, (a.batch, 256), device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(x)
        loss = lossf(out.view(-1, 8192), x.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if a.timing:
            print("step_ms %.3f" % ((time.perf_counter() - t0) * 1e3), flush=True)
    if a.wait:
        print("ready", os.getpid(), flush=True)
        while not os.path.exists(a.wait):
            time.sleep(0.05)
    if a.oom_gib:
        try:
            big = oversized(a.oom_gib)
            print("oom: allocated", big.numel(), flush=True)
        except torch.OutOfMemoryError as e:
            print("oom: OutOfMemoryError:", str(e).splitlines()[0], flush=True)
    del keep
    return 0


if __name__ == "__main__":
    sys.exit(main())
