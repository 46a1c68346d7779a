#!/usr/bin/env python3
"""Device memory the driver reserves for a context's limits (cuCtxSetLimit), which no
allocation call makes: the malloc heap of device-side malloc, the per-thread stack, the printf
FIFO. Measured against cuMemGetInfo on device 0, each limit raised in a fresh primary context,
then an empty kernel launched (some reservations are made at the first launch after a
change), then one that calls malloc (where the heap would be made lazily); and the process's
use as NVML reports it, which a cap of --cap-scope process counts.

    python3 tests/gpu/ctx_limits.py            # prints one Markdown table

No cuwarden needed: it measures what a cap of the default scope (allocations) leaves outside,
as it leaves the context itself; --cap-scope process counts it through NVML."""
import ctypes
import sys

cu = ctypes.CDLL("libcuda.so.1")
size_t, c_int, c_void_p = ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p
PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.extern .func (.param .b64 func_retval0) malloc (.param .b64 malloc_param_0);
.visible .entry nop() { ret; }
.visible .entry use_malloc() {
  .reg .b64 %rd<3>;
  mov.u64 %rd1, 64;
  {
    .param .b64 param0;
    st.param.b64 [param0+0], %rd1;
    .param .b64 retval0;
    call.uni (retval0), malloc, (param0);
    ld.param.b64 %rd2, [retval0+0];
  }
  ret;
}
"""
LIMITS = {"CU_LIMIT_STACK_SIZE": 0, "CU_LIMIT_PRINTF_FIFO_SIZE": 1, "CU_LIMIT_MALLOC_HEAP_SIZE": 2}


def check(r, what):
    if r != 0:
        sys.exit(f"{what}: CUresult {r}")


def free_bytes():
    free, total = size_t(), size_t()
    check(cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
    return free.value


def launch(name=b"nop"):
    mod, fn = c_void_p(), c_void_p()
    check(cu.cuModuleLoadData(ctypes.byref(mod), PTX), "cuModuleLoadData")
    check(cu.cuModuleGetFunction(ctypes.byref(fn), mod, name), "cuModuleGetFunction")
    check(cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, None, None, None), "cuLaunchKernel")
    check(cu.cuCtxSynchronize(), "cuCtxSynchronize")


def measure(limit, value):
    dev, ctx = c_int(), c_void_p()
    check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    launch(b"nop")
    before = free_bytes()
    old = size_t()
    check(cu.cuCtxGetLimit(ctypes.byref(old), LIMITS[limit]), "cuCtxGetLimit")
    check(cu.cuCtxSetLimit(LIMITS[limit], size_t(value)), f"cuCtxSetLimit({limit})")
    after_set = free_bytes()
    launch(b"nop")
    after_launch = free_bytes()
    launch(b"use_malloc")  # a kernel that calls malloc: where the heap would be made lazily
    after_malloc = free_bytes()
    driver = driver_figure()
    check(cu.cuDevicePrimaryCtxReset(dev), "cuDevicePrimaryCtxReset")
    return old.value, before - after_set, before - after_launch, before - after_malloc, driver


def driver_figure():
    """This process's used GPU memory as NVML reports it (nvidia-smi), MiB; what a cap of
    --cap-scope process counts."""
    import os
    import subprocess
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        pid, _, used = line.partition(",")
        if pid.strip() == str(os.getpid()):
            return int(used.strip())
    return -1


def main():
    check(cu.cuInit(0), "cuInit")
    name = ctypes.create_string_buffer(256)
    dev = c_int()
    check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    cu.cuDeviceGetName(name, 256, dev)
    drv = c_int()
    cu.cuDriverGetVersion(ctypes.byref(drv))
    print(f"device 0: {name.value.decode()}, driver API {drv.value}\n")
    print("| limit | default | set to | taken at cuCtxSetLimit | after a launch | after a kernel calling malloc "
          "| the process's use by NVML |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    mib = 1 << 20
    for limit, value in (("CU_LIMIT_MALLOC_HEAP_SIZE", 1 << 30), ("CU_LIMIT_MALLOC_HEAP_SIZE", 4 << 30),
                         ("CU_LIMIT_STACK_SIZE", 16 << 10), ("CU_LIMIT_STACK_SIZE", 64 << 10),
                         ("CU_LIMIT_PRINTF_FIFO_SIZE", 256 << 20)):
        old, at_set, at_launch, at_malloc, driver = measure(limit, value)
        print(f"| {limit} | {old} B | {value // 1024} KiB | {at_set / mib:.0f} MiB | {at_launch / mib:.0f} MiB "
              f"| {at_malloc / mib:.0f} MiB | {driver} MiB |")


if __name__ == "__main__":
    main()
