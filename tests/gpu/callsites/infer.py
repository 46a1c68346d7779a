#!/usr/bin/env python3
"""ResNet-50 inference at one batch size: exit 0 when it ran, 1 on an out-of-memory error.

  infer.py --batch N [--fraction-gib G]

--fraction-gib G: PyTorch's own cap, torch.cuda.set_per_process_memory_fraction(G GiB / the
device's memory): the bisection done inside PyTorch that `cuwarden fit --limit G` is set
beside. Prints "peak_reserved BYTES" (torch.cuda.max_memory_reserved) when it ran.
"""
import argparse
import sys

import torch
import torchvision


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--fraction-gib", type=float, default=0)
    a = ap.parse_args()
    if a.fraction_gib:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(a.fraction_gib * 2**30 / total, 0)
    torch.backends.cudnn.benchmark = False
    model = torchvision.models.resnet50().cuda().eval()
    try:
        with torch.no_grad():
            x = torch.randn(a.batch, 3, 224, 224, device="cuda")
            for _ in range(2):
                model(x)
            torch.cuda.synchronize()
    except torch.OutOfMemoryError as e:
        print("out of memory:", str(e).splitlines()[0], file=sys.stderr)
        return 1
    print("peak_reserved", torch.cuda.max_memory_reserved(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
