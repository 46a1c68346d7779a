#!/usr/bin/env python3
"""A stand-in for tests/gpu/tensors_show.py without PyTorch (tests/gpu/tensors_keep_dryrun.sh runs it
through tests/gpu/tensors_keep.sh on the simulated driver, as SHOW_PY):

    show_stand_in.py cached OUT.json
    CUWARDEN_CLI=cuwarden cuwarden run --tensors --callsites 16 -- show_stand_in.py tensors OUT.json

STAND_IN_LIBS names a folder of three small libraries named as PyTorch's and cuBLAS's are
(tensors_keep_dryrun.sh builds them): libc10_cuda.so (c10_alloc: the allocator, cuMemAlloc_v2),
libtorch_cuda.so (getNewWorkspace(N): a workspace through c10_alloc; getCurrentCUDABlasHandle(N):
a handle through cuBLAS and, N > 0, a workspace through c10_alloc from the getter itself, as where
PyTorch's workspace function is inlined) and libcublas.so.13 (cublasCreate_stub: 132,096 bytes
from cuMemAlloc_v2 itself, as cuBLAS's handle). At
each of tensors_show.py's marks it holds known tensors, workspaces and handles; the cached run
writes what memory_allocated() would say (the tensors, rounded to 512), the tensors run what
tensors_show.py's classification finds in cuwarden's snapshot of it. Workspace sizes follow
CUBLAS_WORKSPACE_CONFIG (:SIZE_KIB:COUNT) as PyTorch's do.
"""
import ctypes
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tensors_show  # noqa: E402  (its helpers; it imports torch only in main())

MiB = 1 << 20


def workspace_bytes():
    cfg = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if not cfg:
        return 32 * MiB
    return sum(int(s) * 1024 * int(c) for s, c in re.findall(r":([0-9]+):([0-9]+)", cfg))


def main():
    mode, out = sys.argv[1], sys.argv[2]
    libs = os.environ["STAND_IN_LIBS"]
    cuda = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cuda.cuCtxSetCurrent(ctx) == 0
    c10 = ctypes.CDLL(f"{libs}/libc10_cuda.so", mode=ctypes.RTLD_GLOBAL)
    ctypes.CDLL(f"{libs}/libcublas.so.13", mode=ctypes.RTLD_GLOBAL)
    torch_cuda = ctypes.CDLL(f"{libs}/libtorch_cuda.so", mode=ctypes.RTLD_GLOBAL)
    for f in (c10.c10_alloc, torch_cuda.getNewWorkspace, torch_cuda.getCurrentCUDABlasHandle):
        f.restype, f.argtypes = ctypes.c_uint64, [ctypes.c_size_t]
    c10.c10_free.argtypes = [ctypes.c_uint64]
    tensors, marks = {}, []

    def tensor(n):
        tensors[c10.c10_alloc(n)] = n

    def mark(name):
        cuda.cuCtxSynchronize()
        rec = {"mark": name}
        if mode == "cached":
            rec["memory_allocated"] = sum((n + 511) // 512 * 512 for n in tensors.values())
            rec["requested_bytes"] = sum(tensors.values())
            rec["memory_reserved"] = 2 * rec["memory_allocated"]
        else:
            classes, detail = tensors_show.by_pytorch(tensors_show.snapshot())
            rec["classes"], rec["sites"] = classes, detail
            rec["libc10_cuda_bytes"] = classes["tensor"]["rounded"] + classes["workspace"]["rounded"]
            rec["other_bytes"] = classes["cublas"]["requested"] + classes["other"]["requested"]
        marks.append(rec)

    for i in range(4):
        tensor(4 * MiB + 100 * i)
    mark("model")
    if mode == "tensors":  # the forward thread's handle and workspace (memory_allocated counts neither here)
        torch_cuda.getCurrentCUDABlasHandle(0)
        torch_cuda.getNewWorkspace(workspace_bytes())
    tensor(MiB + 3)
    tensor(700)
    mark("forward")
    if mode == "tensors":  # the autograd thread's: a workspace the handle getter makes itself (inlined)
        torch_cuda.getCurrentCUDABlasHandle(workspace_bytes())
    tensor(2 * MiB + 1)
    mark("backward")
    tensor(8 * MiB)
    mark("optimizer")
    for p in [p for p, n in tensors.items() if n == 700]:
        c10.c10_free(p)
        del tensors[p]
    mark("freed")
    res = {"mode": mode, "torch": "none", "device": "simulated", "marks": marks, "lines": {},
           "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"), "cleared_workspaces": False,
           "expected_workspace_bytes": 2 * ((workspace_bytes() + 511) // 512 * 512),
           "expected_cublas_bytes": 2 * 132096}
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
