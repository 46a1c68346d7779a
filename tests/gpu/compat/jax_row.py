"""compat.sh rows 9-10: JAX under a cuwarden cap, allocating until refused.

  jax_row.py --mode default    XLA's BFC allocator, preallocating. It sizes its pool from what
                               cuMemGetInfo reports, so under cuwarden it must take 75% of the
                               CAP (bytes_limit ~ 0.75 * COMPAT_CAP_BYTES), and cuwarden must
                               count about that much right after start-up.
  jax_row.py --mode platform   XLA_PYTHON_CLIENT_ALLOCATOR=platform (set by the caller): every
                               buffer is its own driver allocation, no pool.

Grows in COMPAT_CHUNK_MIB float32 arrays (jnp.full, materialized) until XLA refuses.
Prints one JSON part (format in cuwq.py).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuwq  # noqa: E402

POOL_KEYS = ("peak_pool_bytes", "pool_bytes", "peak_bytes_reserved", "bytes_reserved")


def numeric(stats):
    return {k: v for k, v in (stats or {}).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def outcome_of(e):
    name = cuwq.exc_name(e).rsplit(".", 1)[-1]
    text = str(e)
    for code in ("RESOURCE_EXHAUSTED", "INTERNAL", "UNKNOWN", "FAILED_PRECONDITION"):
        if code in text:
            return "%s %s" % (name, code)
    return name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("default", "platform"), default="default")
    args = ap.parse_args()
    jax = cuwq.import_or_skip("jax", "jax")
    import jax.numpy as jnp

    backend = jax.default_backend()
    devs = jax.devices()
    print("jax_row: pid %d, jax %s, backend %s, devices %s, XLA_PYTHON_CLIENT_ALLOCATOR=%r" %
          (os.getpid(), jax.__version__, backend, devs, os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "")),
          file=sys.stderr, flush=True)
    if backend != "gpu":
        cuwq.emit(device=0, api="jax", held_bytes=None, framework_bytes=None, framework_figure=None,
                  outcome="error: jax backend is %s, not gpu" % backend, oom=False, message=str(devs)[:200])
        return 2
    d = devs[0]
    jnp.ones((1024,), jnp.float32).block_until_ready()  # backend and allocator are up
    stats0 = numeric(d.memory_stats())
    cw0 = cuwq.cuwarden_self()

    elems = cuwq.CHUNK // 4
    held = []
    outcome, oom, message = "no error (reached %d MiB)" % (cuwq.MAX_BYTES >> 20), False, ""
    while (len(held) + 1) * cuwq.CHUNK <= cuwq.MAX_BYTES:
        try:
            a = jnp.full((elems,), float(len(held)), jnp.float32)  # a fresh buffer, written on the GPU
            a.block_until_ready()
            held.append(a)
        except Exception as e:  # noqa: BLE001 - XlaRuntimeError and friends
            outcome, oom, message = outcome_of(e), cuwq.looks_oom(e), cuwq.first_line(e)
            break
    stats1 = numeric(d.memory_stats())
    cw1 = cuwq.cuwarden_self()
    held_bytes = sum(int(a.nbytes) for a in held)

    figure, fbytes = None, None
    for k in POOL_KEYS:
        if stats1.get(k):
            figure, fbytes = "jax memory_stats %s" % k, int(stats1[k])
            break
    if figure is None and stats1.get("peak_bytes_in_use"):
        figure, fbytes = "jax memory_stats peak_bytes_in_use", int(stats1["peak_bytes_in_use"])
    if figure is None:
        figure, fbytes = "live jax arrays' nbytes (memory_stats empty)", held_bytes

    checks = {}
    cap = cuwq.CAP
    if args.mode == "default" and cap:
        limit = stats0.get("bytes_limit") or stats1.get("bytes_limit")
        checks["bytes_limit ~ 0.75 x cap (%s)" % ("%.3f x cap" % (limit / cap) if limit else "missing")] = \
            bool(limit) and abs(limit / cap - 0.75) <= 0.03
        used0 = ((cw0 or {}).get("0") or {}).get("used_bytes")
        pool0 = stats0.get("pool_bytes") or stats0.get("bytes_reserved") or limit
        checks["cuwarden used after start-up ~ preallocated pool (%s)" % (
            "%.3f x cap" % (used0 / cap) if used0 is not None else "not seen")] = \
            used0 is not None and bool(pool0) and abs(used0 - pool0) <= max(0.05 * pool0, 64 * cuwq.MiB)
    part = dict(device=0, api="jax", held_bytes=held_bytes, chunks=len(held), framework_bytes=fbytes,
                framework_figure=figure, outcome=outcome, oom=oom, message=message,
                memory_stats_start=stats0, memory_stats_at_oom=stats1, cuwarden_after_start=cw0,
                cuwarden_at_oom=cw1, checks=checks, jax_version=jax.__version__,
                allocator=os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default"))
    cuwq.hold()
    del held
    cuwq.emit(**part)
    return 0


if __name__ == "__main__":
    cuwq.run_main(main, "jax")
