"""compat.sh rows 11-12: CuPy under a cuwarden cap, allocating until refused.

  cupy_row.py --mode pool      CuPy's default memory pool (cupy.get_default_memory_pool())
  cupy_row.py --mode nopool    cupy.cuda.set_allocator(None): every array is its own cudaMalloc

Grows in COMPAT_CHUNK_MIB uint8 arrays (each written with cudaMemset) until refused.
Prints one JSON part (format in cuwq.py).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuwq  # noqa: E402


def outcome_of(e):
    name = cuwq.exc_name(e)
    text = str(e)
    for code in ("cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY"):
        if code in text and code not in name:
            return "%s (%s)" % (name, code)
    return name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("pool", "nopool"), default="pool")
    args = ap.parse_args()
    cp = cuwq.import_or_skip("cupy", "cupy")
    cp.cuda.Device(0).use()
    if args.mode == "nopool":
        cp.cuda.set_allocator(None)
    pool = cp.get_default_memory_pool()
    free, total = cp.cuda.runtime.memGetInfo()
    print("cupy_row: pid %d, cupy %s, CUDA runtime %s, mode %s, memGetInfo free %d total %d" %
          (os.getpid(), cp.__version__, cp.cuda.runtime.runtimeGetVersion(), args.mode, free, total),
          file=sys.stderr, flush=True)

    held = []
    outcome, oom, message = "no error (reached %d MiB)" % (cuwq.MAX_BYTES >> 20), False, ""
    while (len(held) + 1) * cuwq.CHUNK <= cuwq.MAX_BYTES:
        try:
            a = cp.empty((cuwq.CHUNK,), dtype=cp.uint8)
            cp.cuda.runtime.memset(a.data.ptr, 1, cuwq.CHUNK)
            held.append(a)
        except Exception as e:  # noqa: BLE001 - cupy.cuda.memory.OutOfMemoryError, CUDARuntimeError
            outcome, oom, message = outcome_of(e), cuwq.looks_oom(e), cuwq.first_line(e)
            break
    cp.cuda.Device(0).synchronize()
    held_bytes = sum(int(a.nbytes) for a in held)
    cw = cuwq.cuwarden_self()
    pool_total, pool_used = pool.total_bytes(), pool.used_bytes()
    if args.mode == "pool":
        figure, fbytes = "cupy pool total_bytes()", pool_total
    else:
        figure, fbytes = "live cupy arrays' nbytes (pool disabled; pool total_bytes() = %d)" % pool_total, held_bytes
    part = dict(device=0, api="cupy", held_bytes=held_bytes, chunks=len(held), framework_bytes=fbytes,
                framework_figure=figure, outcome=outcome, oom=oom, message=message, meminfo_total=total,
                pool_total_bytes=pool_total, pool_used_bytes=pool_used, cuwarden_at_oom=cw,
                cupy_version=cp.__version__, checks={})
    cuwq.hold()
    del held
    pool.free_all_blocks()
    cuwq.emit(**part)
    return 0


if __name__ == "__main__":
    cuwq.run_main(main, "cupy")
