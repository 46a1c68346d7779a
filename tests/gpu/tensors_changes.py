#!/usr/bin/env python3
"""cuwarden GPU check: what `cuwarden run --tensors` changes inside PyTorch (docs/tensors.md,
"What changes for the program"), each change asserted. Run it twice:

    CUWARDEN_LIMIT=1G cuwarden run --tensors -- python3 tests/gpu/tensors_changes.py tensors
    CUWARDEN_LIMIT=1G cuwarden run -- python3 tests/gpu/tensors_changes.py cached

Prints one JSON object (every observation) and exits 1 when one differs from what the docs
say for its mode:
- a refusal (a 2 GiB tensor under a 1 GiB cap): with the cache off, a RuntimeError (PyTorch
  2.11: its subclass torch.AcceleratorError) that is not torch.cuda.OutOfMemoryError and says
  "out of memory"; with the cache on,
  torch.cuda.OutOfMemoryError;
- memory_allocated() after a 64 MiB tensor: with the cache off PyTorch counts nothing it
  sends to cudaMalloc (0 before and after); with the cache on, the tensor's bytes;
- CUDA IPC of a tensor (what torch.multiprocessing does): with the cache off PyTorch refuses
  it itself ("invalid device pointer"); with the cache on it makes a handle;
- the tensors still compute (a matmul against the CPU's answer), in both modes.
"""
import json
import os
import sys

import torch

MiB = 1 << 20


def main():
    mode = sys.argv[1]
    assert mode in ("tensors", "cached"), mode
    uncached = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") is not None
    obs = {"mode": mode, "PYTORCH_NO_CUDA_MEMORY_CACHING": os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING"),
           "CUWARDEN_POOL": os.environ.get("CUWARDEN_POOL"), "torch": torch.__version__}
    failures = []

    def expect(what, ok):
        if not ok:
            failures.append(what)

    expect("PyTorch's cache is off exactly in the tensors mode", uncached == (mode == "tensors"))

    torch.cuda.init()
    before = torch.cuda.memory_allocated()
    a = torch.ones(64 * MiB // 4, device="cuda")
    obs["memory_allocated_before"] = before
    obs["memory_allocated_after_64MiB"] = torch.cuda.memory_allocated()
    if mode == "tensors":
        expect("memory_allocated counts no tensor with the cache off", obs["memory_allocated_after_64MiB"] == before)
    else:
        expect("memory_allocated counts the tensor with the cache on",
               obs["memory_allocated_after_64MiB"] - before == 64 * MiB)

    x = torch.randn(256, 256)
    y = (x.cuda() @ x.cuda()).cpu()
    obs["matmul_max_error"] = float((y - x @ x).abs().max())
    expect("a matmul on pooled tensors gives the CPU's answer", obs["matmul_max_error"] < 1e-2)

    try:
        torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
        obs["refusal"] = {"raised": None}
    except Exception as e:  # the type is what is observed
        obs["refusal"] = {"raised": type(e).__module__ + "." + type(e).__qualname__,
                          "is_OutOfMemoryError": isinstance(e, torch.cuda.OutOfMemoryError),
                          "is_RuntimeError": isinstance(e, RuntimeError),
                          "says_out_of_memory": "out of memory" in str(e).lower(),
                          "message": str(e).splitlines()[0][:200]}
    r = obs["refusal"]
    expect("a 2 GiB tensor under a 1 GiB cap is refused", r["raised"] is not None)
    if r["raised"] is not None:
        if mode == "tensors":
            expect("the refusal is a RuntimeError, not torch.cuda.OutOfMemoryError",
                   not r["is_OutOfMemoryError"] and r["is_RuntimeError"])
            expect("the refusal says out of memory", r["says_out_of_memory"])
        else:
            expect("the refusal is torch.cuda.OutOfMemoryError", r["is_OutOfMemoryError"])
    torch.cuda.synchronize()
    b = torch.ones(16 * MiB // 4, device="cuda")  # the process goes on after the refusal
    obs["after_refusal_sum"] = float(b.sum())
    expect("the process allocates and computes after the refusal", obs["after_refusal_sum"] == 4 * MiB)

    try:
        handle = a.untyped_storage()._share_cuda_()
        obs["ipc"] = {"shared": True, "handle_fields": len(handle)}
    except Exception as e:
        obs["ipc"] = {"shared": False, "raised": type(e).__qualname__, "message": str(e).splitlines()[0][:200]}
    if mode == "tensors":
        expect("CUDA IPC of a tensor is refused by PyTorch (invalid device pointer)",
               not obs["ipc"]["shared"] and "invalid device pointer" in obs["ipc"].get("message", ""))
    else:
        expect("CUDA IPC of a tensor works with the cache on", obs["ipc"]["shared"])

    obs["failures"] = failures
    print(json.dumps(obs))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
