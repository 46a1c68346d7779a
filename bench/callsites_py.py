#!/usr/bin/env python3
"""cuMemAlloc_v2 + cuMemFree_v2 pairs through ctypes, made 20 Python frames deep: what
CUWARDEN_CALLSITES costs a Python program (bench/callsites_cost.sh runs it with call sites
off, on without Python frames, and on with them). Prints "ns_per_pair X".

  callsites_py.py [--pairs N] [--depth D]
"""
import argparse
import ctypes
import time

ap = argparse.ArgumentParser()
ap.add_argument("--pairs", type=int, default=20000)
ap.add_argument("--depth", type=int, default=20)
a = ap.parse_args()
cuda = ctypes.CDLL("libcuda.so.1")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cuda.cuCtxSetCurrent(ctx) == 0
alloc, free = cuda.cuMemAlloc_v2, cuda.cuMemFree_v2
free.argtypes = [ctypes.c_uint64]


def pairs(n):
    p = ctypes.c_uint64()
    ref = ctypes.byref(p)
    for _ in range(n):
        alloc(ref, 1 << 20)
        free(p.value)


def at(depth, n):
    if depth == 0:
        return pairs(n)
    return at(depth - 1, n) or 0


at(a.depth, 200)
t0 = time.perf_counter()
at(a.depth, a.pairs)
print("ns_per_pair %.1f" % ((time.perf_counter() - t0) * 1e9 / a.pairs))
