#!/usr/bin/env python3
"""What an MPS client looks like to the driver, measured: the facts cuwarden's refusal to suspend
an MPS client relies on (docs/suspend.md). Without MPS and then under an MPS control daemon of
its own (nvidia-cuda-mps-control -d, pipe and log directories under a temporary directory), a
child process reads CU_DEVICE_ATTRIBUTE_MPS_ENABLED (the attribute the interposer reads) before
and after it makes a context; then a victim under MPS (checkpoint_probe.py's, holding MiB MiB
with a pattern) is locked and checkpointed by pid, and what the driver answers is recorded,
with the process state, and, should the checkpoint succeed, the restore and the victim's data.

    python3 tests/gpu/mps_probe.py [--mib 256]   # prints one Markdown report

Needs driver 570 or later and nvidia-cuda-mps-control; no cuwarden, no PyTorch (ctypes on
libcuda). Stops its MPS daemon at the end."""
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint_probe as cp  # noqa: E402

MPS_ENABLED = 133  # CU_DEVICE_ATTRIBUTE_MPS_ENABLED (cuda.h)


def attr_child():
    cu = cp.cu
    cp.check(cu.cuInit(0), "cuInit")
    dev, ctx, v = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_int(-1)
    cp.check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    r0 = cu.cuDeviceGetAttribute(ctypes.byref(v), MPS_ENABLED, dev)
    before = v.value if r0 == 0 else cp.err_name(r0)
    cp.check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
    cp.check(cu.cuCtxSetCurrent(ctx), "set current")
    v.value = -1
    r1 = cu.cuDeviceGetAttribute(ctypes.byref(v), MPS_ENABLED, dev)
    after = v.value if r1 == 0 else cp.err_name(r1)
    print(f"{before} {after}", flush=True)


def attr(env):
    out = subprocess.run([sys.executable, __file__, "--attr"], env=env, capture_output=True, text=True, timeout=120)
    return out.stdout.strip() or f"failed: {out.stderr.strip()[-300:]}"


def main():
    mib = int(sys.argv[sys.argv.index("--mib") + 1]) if "--mib" in sys.argv else 256
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,compute_mode", "--format=csv,noheader", "-i",
                          "0"], capture_output=True, text=True).stdout.strip()
    print(f"GPU 0: {gpu}; victim holds {mib} MiB\n")
    rows = []

    def row(what, result, extra=""):
        rows.append((what, result, extra))
        print(f"  {what}: {result} {extra}", file=sys.stderr, flush=True)

    cp.check(cp.cu.cuInit(0), "cuInit")  # the controller's, before MPS runs: it is no client
    plain = dict(os.environ)
    row("MPS_ENABLED without MPS (before / after a context)", attr(plain))

    control = shutil.which("nvidia-cuda-mps-control")
    if not control:
        row("nvidia-cuda-mps-control", "not found: no MPS case")
        report(rows)
        return
    tmp = tempfile.mkdtemp(prefix="mps-probe-")
    mps = dict(plain, CUDA_MPS_PIPE_DIRECTORY=f"{tmp}/pipe", CUDA_MPS_LOG_DIRECTORY=f"{tmp}/log")
    os.makedirs(mps["CUDA_MPS_PIPE_DIRECTORY"])
    os.makedirs(mps["CUDA_MPS_LOG_DIRECTORY"])
    r = subprocess.run([control, "-d"], env=mps, capture_output=True, text=True)
    row("nvidia-cuda-mps-control -d", f"exit {r.returncode}", (r.stdout + r.stderr).strip()[-200:])
    try:
        row("MPS_ENABLED under MPS (before / after a context)", attr(mps))
        # The victim under MPS: checkpoint_probe.py's, in the MPS environment.
        saved = dict(os.environ)
        os.environ.update(mps)
        try:
            v = cp.Victim(mib)
        except Exception as e:  # noqa: BLE001 — the report says what happened
            row("victim under MPS", f"did not start: {e!r}")
            v = None
        finally:
            os.environ.clear()
            os.environ.update(saved)
        if v is not None:
            apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"],
                                  capture_output=True, text=True).stdout.strip().replace("\n", "; ")
            row("nvidia-smi --query-compute-apps with the victim", apps or "(none)", f"victim pid {v.pid}")
            row("state of the MPS client", cp.state(v.pid))
            r, t = cp.lock(v.pid, 10000)
            row("lock (10 s timeout)", cp.err_name(r), f"{t * 1000:.1f} ms; state {cp.state(v.pid)}")
            if r == 0:
                r, t = cp.timed(cp.cu.cuCheckpointProcessCheckpoint, v.pid, ctypes.byref(cp.Reserved8()))
                row("checkpoint", cp.err_name(r), f"{t:.2f} s; state {cp.state(v.pid)}")
                if r == 0:
                    r, t = cp.timed(cp.cu.cuCheckpointProcessRestore, v.pid, ctypes.byref(cp.RestoreArgs()))
                    row("restore", cp.err_name(r), f"{t:.2f} s; state {cp.state(v.pid)}")
                r, _ = cp.timed(cp.cu.cuCheckpointProcessUnlock, v.pid, ctypes.byref(cp.Reserved8()))
                row("unlock", cp.err_name(r), f"state {cp.state(v.pid)}")
            v.send("check")
            row("victim's check of its data after", v.line(30) or "no answer in 30 s")
            v.close()
    finally:
        q = subprocess.run([control], input="quit\n", env=mps, capture_output=True, text=True, timeout=60)
        row("MPS quit", f"exit {q.returncode}")
        time.sleep(1)
        shutil.rmtree(tmp, ignore_errors=True)
    report(rows)


def report(rows):
    print("| case | result | notes |\n| --- | --- | --- |")
    for what, result, extra in rows:
        print(f"| {what} | {result} | {extra} |")


if __name__ == "__main__":
    if "--attr" in sys.argv:
        attr_child()
    else:
        main()
