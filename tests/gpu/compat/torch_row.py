"""compat.sh rows 5-8 and 16: PyTorch under a cuwarden cap, allocating until refused.

  torch_row.py --mode default     caching allocator (PYTORCH_CUDA_ALLOC_CONF as the caller set it:
                                  unset, expandable_segments:True or backend:cudaMallocAsync)
  torch_row.py --mode graphs      capture a few matmuls with torch.cuda.graph, replay and check
                                  them, then grow until refused, then replay again
  torch_row.py --mode two-gpu     one process, devices 0 and 1 (caps per ordinal): grow on each
                                  until refused, holding both

Grows in COMPAT_CHUNK_MIB tensors (written with fill_) up to COMPAT_MAX_MIB per device.
Prints one JSON part per device (format in cuwq.py).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuwq  # noqa: E402

torch = None


def oom_outcome(e):
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return "torch.cuda.OutOfMemoryError"
    return cuwq.exc_name(e)


def grow(dev, held):
    """Appends CHUNK tensors to held until refused or MAX; returns (outcome, oom, message)."""
    while (len(held) + 1) * cuwq.CHUNK <= cuwq.MAX_BYTES:
        try:
            t = torch.empty(cuwq.CHUNK, dtype=torch.uint8, device=dev)
            t.fill_(1)
            held.append(t)
        except Exception as e:  # noqa: BLE001 - torch.cuda.OutOfMemoryError or anything else
            return oom_outcome(e), cuwq.looks_oom(e), cuwq.first_line(e)
    torch.cuda.synchronize(dev)
    return "no error (reached %d MiB)" % (cuwq.MAX_BYTES >> 20), False, ""


def figures(dev):
    return {
        "max_memory_reserved": torch.cuda.max_memory_reserved(dev),
        "memory_reserved": torch.cuda.memory_reserved(dev),
        "max_memory_allocated": torch.cuda.max_memory_allocated(dev),
        "memory_allocated": torch.cuda.memory_allocated(dev),
    }


def part_for(dev, held, outcome, oom, message, total, cw, checks=None, extra=None):
    f = figures(dev)
    part = dict(device=dev.index, api="torch", held_bytes=len(held) * cuwq.CHUNK, chunks=len(held),
                framework_bytes=f["max_memory_reserved"], framework_figure="torch.cuda.max_memory_reserved",
                framework=f, outcome=outcome, oom=oom, message=message, meminfo_total=total,
                cuwarden_at_oom=cw, checks=checks or {},
                alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                allocator_backend=backend())
    part.update(extra or {})
    return part


def backend():
    try:
        return torch.cuda.memory.get_allocator_backend()
    except Exception:  # noqa: BLE001
        return None


def warm_up(dev):
    a = torch.randn(1024, 1024, device=dev)
    (a @ a).sum().item()  # loads cuBLAS, allocates its workspace through the allocator


def step(a, b):
    x = a @ b
    x = torch.relu(x) @ b
    return x + a


def rel_err(x, ref):
    return float((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def mode_default(dev):
    torch.cuda.set_device(dev)
    warm_up(dev)
    _, total = torch.cuda.mem_get_info(dev)
    held = []
    outcome, oom, message = grow(dev, held)
    cw = cuwq.cuwarden_self()
    part = part_for(dev, held, outcome, oom, message, total, cw)
    cuwq.hold()
    del held
    torch.cuda.empty_cache()
    cuwq.emit(**part)
    return 0


def mode_graphs(dev):
    torch.cuda.set_device(dev)
    warm_up(dev)
    _, total = torch.cuda.mem_get_info(dev)
    n = 4096
    a = torch.randn(n, n, device=dev)
    b = torch.randn(n, n, device=dev) / 64
    s = torch.cuda.Stream(dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(s):
        for _ in range(3):
            step(a, b)
    torch.cuda.current_stream(dev).wait_stream(s)
    torch.cuda.synchronize(dev)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step(a, b)
    checks = {}
    g.replay()
    torch.cuda.synchronize(dev)
    checks["graph replay == eager"] = rel_err(out, step(a, b)) < 1e-3
    a.normal_()
    g.replay()
    torch.cuda.synchronize(dev)
    checks["graph replay on new input == eager"] = rel_err(out, step(a, b)) < 1e-3
    reserved_with_graph = torch.cuda.memory_reserved(dev)
    held = []
    outcome, oom, message = grow(dev, held)
    cw = cuwq.cuwarden_self()
    held_at_refusal = [None] * len(held)  # what the report counts (a count, not references)
    try:
        # The graph replays in its own pool while the cap is full; the eager reference
        # needs fresh memory, so it is computed after one held chunk is given back.
        a.normal_()
        g.replay()
        torch.cuda.synchronize(dev)
        replayed = out.cpu()  # host copy: needs no device memory
        if held:
            held.pop()
        torch.cuda.empty_cache()
        checks["graph replay after the refusal == eager"] = rel_err(replayed, step(a, b).cpu()) < 1e-3
    except Exception as e:  # noqa: BLE001
        checks["graph replay after the refusal == eager"] = False
        message = (message + " | replay after refusal: " + cuwq.first_line(e))[:400]
    part = part_for(dev, held_at_refusal, outcome, oom, message, total, cw, checks,
                    {"reserved_before_grow": reserved_with_graph})
    del held_at_refusal
    cuwq.hold()
    del held
    torch.cuda.empty_cache()
    cuwq.emit(**part)
    return 0


def mode_two_gpu():
    if torch.cuda.device_count() < 2:
        cuwq.emit(device=0, api="torch", held_bytes=None, framework_bytes=None, framework_figure=None,
                  outcome="error: fewer than 2 CUDA devices visible", oom=False, message="")
        return 2
    devs = [torch.device("cuda", 0), torch.device("cuda", 1)]
    held = {0: [], 1: []}
    results = {}
    for dev in devs:
        torch.cuda.set_device(dev)
        _, total = torch.cuda.mem_get_info(dev)
        outcome, oom, message = grow(dev, held[dev.index])
        results[dev.index] = (outcome, oom, message, total)
    cw = cuwq.cuwarden_self()  # both devices held at once
    parts = [part_for(dev, held[dev.index], *results[dev.index], cw) for dev in devs]
    cuwq.hold()
    held.clear()
    torch.cuda.empty_cache()
    for p in parts:
        cuwq.emit(**p)
    return 0


def main():
    global torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("default", "graphs", "two-gpu"), default="default")
    args = ap.parse_args()
    torch = cuwq.import_or_skip("torch", "torch")
    if not torch.cuda.is_available():
        cuwq.emit(device=0, api="torch", held_bytes=None, framework_bytes=None, framework_figure=None,
                  outcome="error: torch.cuda.is_available() is False", oom=False,
                  message="torch %s, built for CUDA %s" % (torch.__version__, torch.version.cuda))
        return 2
    print("torch_row: pid %d, torch %s (CUDA %s), mode %s, PYTORCH_CUDA_ALLOC_CONF=%r" %
          (os.getpid(), torch.__version__, torch.version.cuda, args.mode,
           os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")), file=sys.stderr, flush=True)
    if args.mode == "two-gpu":
        return mode_two_gpu()
    dev = torch.device("cuda", 0)
    return mode_graphs(dev) if args.mode == "graphs" else mode_default(dev)


if __name__ == "__main__":
    cuwq.run_main(main, "torch")
