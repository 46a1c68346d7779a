"""Shared helpers of the compat.sh row programs (PyTorch, JAX, CuPy, NCCL).

Every row program prints one JSON line per (process, device) it measured, the "part":
  {"compat": 1, "pid": .., "device": 0, "api": "..", "held_bytes": ..,
   "framework_bytes": .., "framework_figure": "torch.cuda.max_memory_reserved",
   "outcome": "torch.cuda.OutOfMemoryError", "oom": true, "message": "first line",
   "meminfo_total": .., "cuwarden_at_oom": {"0": {"used_bytes": .., ...}}, "checks": {..}}
compat.sh (through report.py) compares it with what cuwarden's daemon counted.

Environment set by compat.sh: CUWARDEN_CLI (the cuwarden command; its socket is found
through CUWARDEN_RUN_DIR), COMPAT_CAP_BYTES (the cap of this row, bytes, one device),
COMPAT_CHUNK_MIB (256), COMPAT_MAX_MIB (how far to try, 16384), COMPAT_HOLD_S (1.5).
"""
import json
import os
import subprocess
import sys
import time
import traceback

MiB = 1 << 20
GiB = 1 << 30

# NVLink multicast stays off in NCCL, PyTorch and NVSHMEM, whatever the caller's environment.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

OOM_MARKERS = ("OutOfMemory", "out of memory", "RESOURCE_EXHAUSTED", "cudaErrorMemoryAllocation",
               "CUDA_ERROR_OUT_OF_MEMORY", "Out of memory", "OUT_OF_MEMORY")


def env_int(name, default):
    try:
        return int(os.environ.get(name, ""))
    except ValueError:
        return default


CHUNK = env_int("COMPAT_CHUNK_MIB", 256) * MiB
MAX_BYTES = env_int("COMPAT_MAX_MIB", 16384) * MiB
CAP = env_int("COMPAT_CAP_BYTES", 0) or None


def hold():
    """Stay at the peak a moment, so the daemon's NVML poll sees the process there."""
    try:
        time.sleep(float(os.environ.get("COMPAT_HOLD_S", "1.5")))
    except ValueError:
        time.sleep(1.5)


def first_line(e, limit=300):
    for line in str(e).strip().splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


def exc_name(e):
    mod = type(e).__module__ or ""
    name = type(e).__qualname__
    return name if mod in ("builtins", "__main__", "") else "%s.%s" % (mod, name)


def looks_oom(e):
    text = exc_name(e) + " " + str(e)
    return any(m in text for m in OOM_MARKERS)


def cuwarden_self(pid=None, wait_s=4.0):
    """This process's devices as cuwarden's daemon counts them at this moment:
    {"0": {"used_bytes", "peak_bytes", "limit_bytes", "ooms", "driver_used_bytes"}}, or None
    (no CLI, no daemon, or the daemon has not found this process within wait_s)."""
    cli = os.environ.get("CUWARDEN_CLI")
    if not cli:
        return None
    pid = os.getpid() if pid is None else pid
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            out = subprocess.run([cli, "--json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 universal_newlines=True, timeout=10, env=env).stdout
            state = json.loads(out)
        except Exception:
            state = None
        for p in (state or {}).get("processes", []) or []:
            if p.get("pid") == pid:
                keys = ("used_bytes", "peak_bytes", "limit_bytes", "ooms", "driver_used_bytes", "alloc_count")
                return {str(d.get("ordinal")): {k: d.get(k) for k in keys} for d in p.get("devices", []) or []}
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.25)


def emit(**part):
    part.setdefault("compat", 1)
    part.setdefault("pid", os.getpid())
    print(json.dumps(part, default=str, sort_keys=False), flush=True)


def run_main(main, api, device=0):
    """Runs main(); any exception it lets out becomes an error part (exit status 2)."""
    try:
        rc = main()
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - report everything
        traceback.print_exc()
        emit(device=device, api=api, held_bytes=None, framework_bytes=None, framework_figure=None,
             outcome="error: %s" % exc_name(e), oom=looks_oom(e), message=first_line(e))
        rc = 2
    sys.stdout.flush()
    sys.exit(rc or 0)


def import_or_skip(module, api, device=0):
    """Imports a framework, or reports it missing (exit status 3: row not run)."""
    try:
        return __import__(module)
    except BaseException as e:  # noqa: BLE001
        emit(device=device, api=api, held_bytes=None, framework_bytes=None, framework_figure=None,
             outcome="not run: %s not importable" % module, oom=False, skipped=True,
             message="%s: %s" % (exc_name(e), first_line(e)))
        sys.exit(3)
