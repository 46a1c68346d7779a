#!/usr/bin/env python3
"""What the driver's checkpoint API does to another process, measured: the facts the simulated
driver (tests/fakecuda/src/checkpoint.hpp) and the daemon's suspend rely on. A victim process
(this script with --victim) holds device memory with a pattern; this process locks,
checkpoints, restores and unlocks it by pid, and records each call's CUresult, the process
state, the GPU's used memory (NVML through nvidia-smi), whether the victim's CUDA calls wait
while it is checkpointed, and whether its data survive. Then the cases that must fail: the
wrong state, a lock timeout behind a running kernel, managed memory, a pid without CUDA, no pid.

    python3 tests/gpu/checkpoint_probe.py [--mib 2048]   # prints one Markdown report

Needs driver 570 or later; no cuwarden, no PyTorch (ctypes on libcuda)."""
import ctypes
import os
import select
import subprocess
import sys
import time

cu = ctypes.CDLL("libcuda.so.1")
c_int, c_uint, c_void_p, size_t, u64 = ctypes.c_int, ctypes.c_uint, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64
STATES = {0: "RUNNING", 1: "LOCKED", 2: "CHECKPOINTED", 3: "FAILED"}
# A kernel that spins for `cycles` clock ticks: work that a lock must wait for.
PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry spin(.param .u64 cycles) {
  .reg .u64 %t0, %t1, %n;
  .reg .pred %p;
  ld.param.u64 %n, [cycles];
  mov.u64 %t0, %clock64;
LOOP:
  mov.u64 %t1, %clock64;
  sub.u64 %t1, %t1, %t0;
  setp.lt.u64 %p, %t1, %n;
  @%p bra LOOP;
  ret;
}
"""


class LockArgs(ctypes.Structure):
    _fields_ = [("timeoutMs", c_uint), ("reserved0", c_uint), ("reserved1", u64 * 7)]


class Reserved8(ctypes.Structure):
    _fields_ = [("reserved", u64 * 8)]


class RestoreArgs(ctypes.Structure):
    _fields_ = [("gpuPairs", c_void_p), ("gpuPairsCount", c_uint), ("reserved", ctypes.c_char * (52 - 8)),
                ("reserved1", u64)]


def err_name(r):
    s = ctypes.c_char_p()
    cu.cuGetErrorName(r, ctypes.byref(s))
    return f"{s.value.decode() if s.value else '?'} ({r})"


def check(r, what):
    if r != 0:
        sys.exit(f"{what}: {err_name(r)}")


# ---------------------------------------------------------------------------------------------
# The victim: a context, `mib` MiB with a pattern; commands on stdin, one answer line each.
def victim(mib, managed):
    check(cu.cuInit(0), "cuInit")
    dev, ctx = c_int(), c_void_p()
    check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
    check(cu.cuCtxSetCurrent(ctx), "set current")
    n = mib << 20
    ptr = u64()
    check(cu.cuMemAlloc_v2(ctypes.byref(ptr), size_t(n)), "cuMemAlloc")
    check(cu.cuMemsetD32_v2(ptr, c_uint(0xC0FFEE01), size_t(n // 4)), "memset")
    if managed:
        m = u64()
        check(cu.cuMemAllocManaged(ctypes.byref(m), size_t(64 << 20), c_uint(1)), "cuMemAllocManaged")
    mod, fn = c_void_p(), c_void_p()
    check(cu.cuModuleLoadData(ctypes.byref(mod), PTX), "cuModuleLoadData")
    check(cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"spin"), "cuModuleGetFunction")
    check(cu.cuCtxSynchronize(), "sync")
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "check":
            host = (ctypes.c_uint32 * 1024)()
            bad = 0
            for off in (0, n // 2, n - 4096):
                r = cu.cuMemcpyDtoH_v2(host, u64(ptr.value + off), size_t(4096))
                if r != 0:
                    print(f"error {err_name(r)}", flush=True)
                    break
                bad += sum(1 for v in host if v != 0xC0FFEE01)
            else:
                print("ok" if bad == 0 else f"bad {bad}", flush=True)
        elif cmd[0] == "spin":  # launch a kernel of N cycles, do not wait for it
            cycles = u64(int(cmd[1]))
            params = (c_void_p * 1)(ctypes.cast(ctypes.pointer(cycles), c_void_p))
            r = cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, None, params, None)
            print("launched" if r == 0 else f"error {err_name(r)}", flush=True)
        elif cmd[0] == "sync":
            r = cu.cuCtxSynchronize()
            print("synced" if r == 0 else f"error {err_name(r)}", flush=True)
        elif cmd[0] == "exit":
            return


# ---------------------------------------------------------------------------------------------
class Victim:
    def __init__(self, mib, managed=False):
        self.p = subprocess.Popen([sys.executable, __file__, "--victim", str(mib)] + (["--managed"] if managed else []),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.pid = self.p.pid
        assert self.line(60) == "ready"

    def send(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()

    def line(self, timeout):
        r, _, _ = select.select([self.p.stdout], [], [], timeout)
        return self.p.stdout.readline().strip() if r else None

    def close(self):
        try:
            self.send("exit")
            self.p.wait(30)
        except Exception:
            self.p.kill()
            self.p.wait()


def state(pid):
    s = c_int(-1)
    r = cu.cuCheckpointProcessGetState(pid, ctypes.byref(s))
    return STATES.get(s.value, str(s.value)) if r == 0 else err_name(r)


def used_mib():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True).stdout.strip()
    return int(out) if out.isdigit() else -1


def timed(f, *a):
    t = time.monotonic()
    r = f(*a)
    return r, time.monotonic() - t


def lock(pid, timeout_ms):
    a = LockArgs()
    a.timeoutMs = timeout_ms
    return timed(cu.cuCheckpointProcessLock, pid, ctypes.byref(a))


def main():
    mib = int(sys.argv[sys.argv.index("--mib") + 1]) if "--mib" in sys.argv else 2048
    check(cu.cuInit(0), "cuInit")
    drv = c_int()
    cu.cuDriverGetVersion(ctypes.byref(drv))
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader", "-i", "0"],
                         capture_output=True, text=True).stdout.strip()
    print(f"GPU 0: {gpu}; driver API {drv.value}; victim holds {mib} MiB\n")
    rows = []

    def row(what, result, extra=""):
        rows.append((what, result, extra))

    # 1. The round trip, with the victim's call made while it is checkpointed.
    v = Victim(mib)
    base = used_mib()
    row("state of a running CUDA process", state(v.pid))
    r, _ = timed(cu.cuCheckpointProcessCheckpoint, v.pid, ctypes.byref(Reserved8()))
    row("checkpoint without a lock", err_name(r), state(v.pid))
    r, _ = timed(cu.cuCheckpointProcessRestore, v.pid, ctypes.byref(RestoreArgs()))
    row("restore of a running process", err_name(r), state(v.pid))
    r, t = lock(v.pid, 10000)
    row("lock (10 s timeout)", err_name(r), f"{t * 1000:.1f} ms; state {state(v.pid)}")
    v.send("check")
    answered_locked = v.line(2)
    row("victim's cuMemcpyDtoH while locked", "waits" if answered_locked is None else f"returned: {answered_locked}")
    r, t = timed(cu.cuCheckpointProcessCheckpoint, v.pid, ctypes.byref(Reserved8()))
    during = used_mib()
    row("checkpoint", err_name(r), f"{t:.2f} s; state {state(v.pid)}; GPU used {base} -> {during} MiB")
    r, _ = lock(v.pid, 1000)
    row("lock of a checkpointed process", err_name(r), state(v.pid))
    r, t = timed(cu.cuCheckpointProcessRestore, v.pid, ctypes.byref(RestoreArgs()))
    row("restore", err_name(r), f"{t:.2f} s; state {state(v.pid)}; GPU used {used_mib()} MiB")
    r, t = timed(cu.cuCheckpointProcessUnlock, v.pid, ctypes.byref(Reserved8()))
    row("unlock", err_name(r), f"{t * 1000:.1f} ms; state {state(v.pid)}")
    got = answered_locked or v.line(30)
    row("victim's call after unlock; its data", got or "no answer in 30 s")
    v.send("check")
    row("victim's next check", v.line(30) or "no answer")
    r, _ = timed(cu.cuCheckpointProcessUnlock, v.pid, ctypes.byref(Reserved8()))
    row("unlock of a running process", err_name(r), state(v.pid))

    # 2. A lock behind a kernel that runs for seconds.
    clock = c_int()
    cu.cuDeviceGetAttribute(ctypes.byref(clock), 13, 0)  # CU_DEVICE_ATTRIBUTE_CLOCK_RATE, kHz
    cycles = clock.value * 1000 * 4  # about 4 s
    v.send(f"spin {cycles}")
    row("victim launches a 4 s kernel", v.line(10) or "no answer")
    r, t = lock(v.pid, 500)
    row("lock with a 500 ms timeout behind it", err_name(r), f"{t * 1000:.0f} ms; state {state(v.pid)}")
    if r == 0:
        cu.cuCheckpointProcessUnlock(v.pid, ctypes.byref(Reserved8()))
    r, t = lock(v.pid, 20000)
    row("lock with a 20 s timeout behind it", err_name(r), f"{t * 1000:.0f} ms; state {state(v.pid)}")
    if r == 0:
        cu.cuCheckpointProcessUnlock(v.pid, ctypes.byref(Reserved8()))
    v.send("sync")
    row("victim's synchronize after", v.line(30) or "no answer")
    v.close()

    # 3. Managed memory.
    m = Victim(256, managed=True)
    r, _ = lock(m.pid, 10000)
    row("managed memory: lock", err_name(r), state(m.pid))
    r, t = timed(cu.cuCheckpointProcessCheckpoint, m.pid, ctypes.byref(Reserved8()))
    row("managed memory: checkpoint", err_name(r), f"{t:.2f} s; state {state(m.pid)}")
    if r == 0:
        r, _ = timed(cu.cuCheckpointProcessRestore, m.pid, ctypes.byref(RestoreArgs()))
        row("managed memory: restore", err_name(r), state(m.pid))
    r, _ = timed(cu.cuCheckpointProcessUnlock, m.pid, ctypes.byref(Reserved8()))
    row("managed memory: unlock", err_name(r), state(m.pid))
    m.send("check")
    row("managed memory: the victim's next call", m.line(30) or "no answer in 30 s")
    m.close()

    # 4. Pids that are not CUDA processes.
    sleeper = subprocess.Popen(["sleep", "60"])
    row("a process without CUDA: state", state(sleeper.pid))
    r, _ = lock(sleeper.pid, 1000)
    row("a process without CUDA: lock", err_name(r))
    sleeper.kill()
    sleeper.wait()
    r, _ = lock(sleeper.pid, 1000)
    row("a pid with no process: lock", err_name(r), state(sleeper.pid))
    r, _ = lock(os.getpid(), 1000)
    row("the caller's own pid: lock", err_name(r))

    print("| case | result | notes |")
    print("| --- | --- | --- |")
    for what, result, extra in rows:
        print(f"| {what} | {result} | {extra} |")


if __name__ == "__main__":
    if "--victim" in sys.argv:
        victim(int(sys.argv[sys.argv.index("--victim") + 1]), "--managed" in sys.argv)
    else:
        main()
