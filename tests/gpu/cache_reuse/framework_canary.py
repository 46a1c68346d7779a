"""cuwarden GPU test: the reuse canary (see canary.cu) through a framework's own kernels.

    python3 framework_canary.py torch|cupy

The framework allocates per tensor with cudaMalloc/cudaFree (PyTorch with
PYTORCH_NO_CUDA_MEMORY_CACHING=1, CuPy with its pool disabled), so its frees reach the
cache. A large matrix product (cuBLAS) writes A; A is released while the product runs; B of
the same size is allocated and zeroed on another stream; B must end up all zero: the
product's late writes never land in it. B may be A while the product still runs
(reused_while_pending, reported) only where B's stream was made to wait for the product: the
pool's stream order (backends/pool/fence.hpp), where every piece of work since the pool last
saw the GPU idle went to the legacy stream and a non-blocking stream created afterwards waits
for it; without that wait the zeroing (microseconds) would finish before the product's last
writes (milliseconds) and B would not end up all zero. Prints one JSON line; exit 0 ok, 1
violated, 2 error.
"""
import json
import sys
import time

N = 8192  # an 8192 x 8192 float32 product: about 1.1 TFLOP, several milliseconds on an H200


def run_torch():
    import os
    import torch
    assert os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1", "run with PYTORCH_NO_CUDA_MEMORY_CACHING=1"
    x = torch.randn(N, N, device="cuda")
    y = torch.randn(N, N, device="cuda")
    a = torch.empty(N, N, device="cuda")
    torch.cuda.synchronize()
    for _ in range(200):  # no work between: the cache proves the device idle
        t = torch.empty(N, N, device="cuda")
        del t
    torch.mm(x, y, out=a)  # the late write: cuBLAS, the only work since
    main = torch.cuda.current_stream()
    pending = not main.query()
    pa = a.data_ptr()
    del a
    t0 = time.perf_counter()
    s2 = torch.cuda.Stream()
    with torch.cuda.stream(s2):
        b = torch.empty(N, N, device="cuda")
        alloc_us = (time.perf_counter() - t0) * 1e6
        early = b.data_ptr() == pa and not main.query()
        b.zero_()
    s2.synchronize()
    torch.cuda.synchronize()
    nonzero = int((b != 0).sum().item())
    return pending, b.data_ptr() == pa, early, alloc_us, nonzero


def run_cupy():
    import cupy as cp
    cp.cuda.set_allocator(None)
    x = cp.random.rand(N, N, dtype=cp.float32)
    y = cp.random.rand(N, N, dtype=cp.float32)
    a = cp.empty((N, N), dtype=cp.float32)
    cp.cuda.Device().synchronize()
    for _ in range(200):
        t = cp.empty((N, N), dtype=cp.float32)
        del t
    main = cp.cuda.get_current_stream()
    cp.matmul(x, y, out=a)
    pending = not main.done
    pa = a.data.ptr
    del a
    t0 = time.perf_counter()
    s2 = cp.cuda.Stream(non_blocking=True)
    with s2:
        b = cp.empty((N, N), dtype=cp.float32)
        alloc_us = (time.perf_counter() - t0) * 1e6
        early = b.data.ptr == pa and not main.done
        b.fill(0)
    s2.synchronize()
    cp.cuda.Device().synchronize()
    nonzero = int(cp.count_nonzero(b))
    return pending, b.data.ptr == pa, early, alloc_us, nonzero


def main():
    which = sys.argv[1]
    try:
        pending, reused, early, alloc_us, nonzero = run_torch() if which == "torch" else run_cupy()
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        print(json.dumps({"path": which, "error": repr(e)}))
        return 2
    ok = nonzero == 0
    print(json.dumps({"path": which, "bytes": N * N * 4, "late_write_pending_at_free": pending, "reused": reused,
                      "reused_while_pending": early, "alloc_us": round(alloc_us, 1), "nonzero_words": nonzero,
                      "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
