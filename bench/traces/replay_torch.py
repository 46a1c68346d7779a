#!/usr/bin/env python3
"""Replay an allocation trace through PyTorch's caching allocator (the reference rows of
bench/vmm_gpu.sh; cuw_trace_replay replays the same trace against the driver).

    python3 bench/traces/replay_torch.py TRACE [--expandable] [--pass time|held] [--json FILE]

Every 'a ID BYTES' is torch.empty(BYTES, dtype=torch.uint8, device='cuda'), every 'f ID' drops
that tensor. --expandable sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before torch is
imported. The loop is timed between two torch.cuda.synchronize() calls; held_peak_bytes is
torch.cuda.max_memory_reserved() over the loop (what the allocator took from the driver).
--pass held also samples NVML's used bytes of the device after every allocation
(held_nvml_peak_bytes, less the figure before the loop), the figure cuw_trace_replay's held pass
gives for the driver rows; the time pass leaves NVML out of the loop.
Prints one JSON object with cuw_trace_replay's keys where they apply (api "torch" or
"torch-expandable"). Exit status: 0 when replayed (refusals counted, the caller judges), 2 on
bad usage or a bad trace, 1 when CUDA cannot be used.
"""
import argparse
import ctypes
import gzip
import json
import os
import sys
import time


def read_trace(path):
    """(events, allocations, peak live bytes); events are (slot, bytes) with bytes -1 for a free.
    Exits 2 naming the line on a malformed or inconsistent line."""
    def bad(lineno, why):
        print(f"replay_torch.py: {path}:{lineno}: {why}", file=sys.stderr)
        sys.exit(2)

    try:
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        f = gzip.open(path, "rt") if gz else open(path, "rt")
    except OSError as e:
        print(f"replay_torch.py: cannot read {path}: {e}", file=sys.stderr)
        sys.exit(2)
    events, slot_of, sizes, live = [], {}, [], []
    live_bytes = peak = 0
    with f:
        for lineno, line in enumerate(f, 1):
            tok = line.split()
            if not tok or tok[0].startswith("#"):
                continue
            try:
                if tok[0] == "a" and len(tok) == 3:
                    i, n = int(tok[1]), int(tok[2])
                    if i < 0 or n < 0:
                        raise ValueError
                    if i in slot_of:
                        bad(lineno, f"id {i} allocated a second time")
                    slot_of[i] = len(sizes)
                    events.append((len(sizes), n))
                    sizes.append(n)
                    live.append(True)
                    live_bytes += n
                    peak = max(peak, live_bytes)
                    continue
                if tok[0] == "f" and len(tok) == 2:
                    i = int(tok[1])
                    s = slot_of.get(i)
                    if s is None:
                        bad(lineno, f"free of id {i}, never allocated")
                    if not live[s]:
                        bad(lineno, f"free of id {i}, already freed")
                    live[s] = False
                    live_bytes -= sizes[s]
                    events.append((s, -1))
                    continue
            except ValueError:
                pass
            bad(lineno, f"malformed line '{line.rstrip()}' (expected 'a ID BYTES', 'f ID' or '# ...')")
    return events, len(sizes), peak


class Nvml:
    """NVML's used bytes of the device torch calls cuda:0, through ctypes (no pynvml needed)."""

    class Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    def __init__(self, props):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise OSError("nvmlInit_v2 failed")
        self.dev = ctypes.c_void_p()
        bus = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0".encode()
        if self.lib.nvmlDeviceGetHandleByPciBusId_v2(bus, ctypes.byref(self.dev)) != 0:
            raise OSError(f"no NVML device at {bus.decode()}")
        self.mem = Nvml.Memory()

    def used(self):
        if self.lib.nvmlDeviceGetMemoryInfo(self.dev, ctypes.byref(self.mem)) != 0:
            raise OSError("nvmlDeviceGetMemoryInfo failed")
        return self.mem.used


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--expandable", action="store_true")
    ap.add_argument("--pass", dest="pass_", choices=("time", "held"), default="time")
    ap.add_argument("--json")
    try:
        args = ap.parse_args()
    except SystemExit as e:
        sys.exit(2 if e.code else 0)
    if args.expandable:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"

    events, allocations, peak_live = read_trace(args.trace)

    try:
        import torch
    except ImportError as e:
        print(f"replay_torch.py: import torch failed: {e}", file=sys.stderr)
        sys.exit(1)
    if not torch.cuda.is_available():
        print("replay_torch.py: torch.cuda is not available", file=sys.stderr)
        sys.exit(1)
    torch.cuda.init()
    torch.cuda.synchronize()
    nvml = None
    baseline = held_nvml = 0
    if args.pass_ == "held":
        try:
            nvml = Nvml(torch.cuda.get_device_properties(0))
            baseline = nvml.used()
        except (OSError, AttributeError) as e:
            print(f"replay_torch.py: NVML not used: {e}", file=sys.stderr)
            nvml = None
    torch.cuda.reset_peak_memory_stats()
    oom = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)

    slots = [None] * allocations
    refusals = 0
    first_refusal = None
    empty, u8 = torch.empty, torch.uint8
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for k, (s, n) in enumerate(events):
        if n >= 0:
            try:
                slots[s] = empty(n, dtype=u8, device="cuda")
            except oom as e:
                refusals += 1
                if first_refusal is None:
                    first_refusal = {"event": k, "bytes": n, "error": str(e).split("\n")[0][:200]}
            if nvml is not None:
                held_nvml = max(held_nvml, nvml.used() - baseline)
        else:
            slots[s] = None
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    reserved = torch.cuda.max_memory_reserved()
    live_at_end = sum(t is not None for t in slots)
    slots = None

    out = {
        "trace": args.trace,
        "events": len(events),
        "allocations": allocations,
        "peak_live_bytes": peak_live,
        "api": "torch-expandable" if args.expandable else "torch",
        "pass": args.pass_,
        # The sampling of the held pass runs inside the loop: its time is not the allocator's.
        "seconds": seconds if args.pass_ == "time" else None,
        "held_peak_bytes": reserved,
        "held_over_live": reserved / peak_live if peak_live else None,
        "held_source": "torch",
        "held_nvml_peak_bytes": held_nvml if nvml is not None else None,
        "refusals": refusals,
        "first_refusal": first_refusal,
        "live_at_end": live_at_end,
        "driver_calls": None,
        "pool": os.environ.get("CUWARDEN_POOL", "none"),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    }
    text = json.dumps(out)
    print(text, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    if refusals:
        print(f"replay_torch.py: {refusals} allocation(s) refused, the first: {first_refusal}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
