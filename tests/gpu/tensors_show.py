#!/usr/bin/env python3
"""cuwarden GPU check: what the per-tensor mode shows (tests/gpu/tensors.sh, part 5).

    python3 tests/gpu/tensors_show.py cached OUT.json       # PyTorch's cache on, no cuwarden
    CUWARDEN_CLI=cuwarden cuwarden run --tensors --callsites 16 -- \\
        python3 tests/gpu/tensors_show.py tensors OUT.json  # every tensor through cuwarden

The same seeded steps of a small MLP in both runs, with 5 marked points. At each mark the
cached run records torch.cuda.memory_allocated(); the tensors run records, from
`cuwarden snapshot PID --format json`, the live bytes of the allocations made through
libc10_cuda (each rounded up to 512 bytes, as PyTorch rounds), and apart from them what
PyTorch did not make (cuBLAS's workspace and the like). tensors.sh compares the two files.

Then a tensor made inside what PyTorch's cache would have served from a freed, larger
segment: a 64 MiB tensor at SEGMENT_LINE is freed and a 16 MiB one made at TENSOR_LINE.
With the cache, the 16 MiB lives in the 64 MiB segment, whose call site is SEGMENT_LINE;
in the tensors run the snapshot must name TENSOR_LINE for it.

What PyTorch makes through its allocator but memory_allocated() may not count, told apart by
the frames of each allocation's call site (classify()): cuBLAS's and cuBLASLt's workspaces
(a frame whose function names a workspace, or getCurrentCUDABlasHandle /
getCurrentCUDABlasLtHandle above PyTorch's allocator) and cuBLAS's own allocations (a frame in
libcublas). A sixth mark, "cleared", follows torch._C._cuda_clearCublasWorkspaces(): what it
takes away, in both runs, is what the workspaces held (a second measure that needs no frames).
The cached run records memory_stats()' allocated and requested bytes at each mark too.
"""
import json
import os
import re
import subprocess
import sys

MiB = 1 << 20
# A frame of PyTorch's cuBLAS/cuBLASLt workspace code: getNewWorkspace, allocateCUDABlasWorkspace,
# setWorkspaceForHandle, getCUDABlasLtWorkspace, ... (the names move between PyTorch versions).
WORKSPACE_FN = re.compile(r"[Ww]orkspace")
# The handle getters: above PyTorch's allocator, the only allocation they make is a workspace
# (where the workspace function itself was inlined into them).
HANDLE_FN = re.compile(r"getCurrentCUDABlas(Lt)?Handle")


def snapshot():
    """This process's snapshot, one site per native stack: grouped by user frames (the default),
    a workspace made at a Python line would share its site, and so its frames, with the tensors
    made there."""
    out = subprocess.run([os.environ["CUWARDEN_CLI"], "snapshot", str(os.getpid()), "--format", "json",
                          "--by", "native"], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise SystemExit(f"tensors_show: cuwarden snapshot exited {out.returncode}: {out.stderr}")
    return json.loads(out.stdout)


def frame_names(frames):
    """(module basename, function) of each frame, native and Python."""
    return [(os.path.basename(f.get("module") or f.get("file") or ""), f.get("function") or "") for f in frames]


def classify(frames):
    """What made an allocation, from its call site's frames: "workspace" (PyTorch's cuBLAS or
    cuBLASLt workspace, through its allocator), "cublas" (cuBLAS's own: its handle), "tensor"
    (anything else through libc10_cuda, PyTorch's allocator) or "other"."""
    names = frame_names(frames)
    if any(m.startswith("libcublas") for m, _ in names):
        return "cublas"
    through_c10 = any("libc10_cuda" in m for m, _ in names)
    if through_c10 and any(WORKSPACE_FN.search(fn) or HANDLE_FN.search(fn) for m, fn in names if "libc10" not in m):
        return "workspace"
    return "tensor" if through_c10 else "other"


def by_pytorch(snap):
    """The live device allocations of a snapshot, by what made them (classify()): bytes rounded
    up to 512 as PyTorch rounds ("rounded") and as requested ("requested") per class, and each
    site's class, label and bytes, with its frames for every class but "tensor" (why it is not one)."""
    sites = {s["id"]: s for s in snap["sites"]}
    out = {c: {"rounded": 0, "requested": 0, "count": 0} for c in ("tensor", "workspace", "cublas", "other")}
    detail = {}
    for a in snap["allocations"]:
        if a.get("kind") not in ("device", "pooled"):  # pooled: served by cuwarden's pool
            continue
        site = sites.get(a.get("site"), {})
        frames = site.get("frames", [])
        c = classify(frames)
        out[c]["rounded"] += (a["bytes"] + 511) // 512 * 512
        out[c]["requested"] += a["bytes"]
        out[c]["count"] += 1
        if c == "tensor":  # by label only: the run's JSON, to check a workspace was not missed
            key = f"tensor: {site.get('label', '(no call site)')}"
            d = detail.setdefault(key, {"class": c, "bytes": 0, "count": 0})
            d["bytes"] += a["bytes"]
            d["count"] += 1
        else:
            d = detail.setdefault(f"{c}: {site.get('label', '(no call site)')}", {
                "class": c, "bytes": 0, "count": 0,
                "frames": [f"{m} {fn}".strip() for m, fn in frame_names(frames)]})
            d["bytes"] += a["bytes"]
            d["count"] += 1
    return out, detail

def main():
    import torch

    mode, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(7)
    dev = torch.device("cuda")
    marks = []

    def mark(name):
        torch.cuda.synchronize()
        rec = {"mark": name}
        if mode == "cached":
            rec["memory_allocated"] = torch.cuda.memory_allocated()
            st = torch.cuda.memory_stats()
            rec["requested_bytes"] = st.get("requested_bytes.all.current")
            rec["memory_reserved"] = torch.cuda.memory_reserved()
        else:
            classes, detail = by_pytorch(snapshot())
            rec["classes"], rec["sites"] = classes, detail
            # as the first run reported them: everything through libc10_cuda, and the rest
            rec["libc10_cuda_bytes"] = classes["tensor"]["rounded"] + classes["workspace"]["rounded"]
            rec["other_bytes"] = classes["cublas"]["requested"] + classes["other"]["requested"]
            rec["other_sites"] = {k: d["bytes"] for k, d in detail.items() if d["class"] in ("cublas", "other")}
        marks.append(rec)

    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(512, 1024, device=dev)
    mark("model")
    y = model(x)
    loss = y.square().mean()
    mark("forward")
    loss.backward()
    mark("backward")
    opt.step()
    mark("optimizer")
    del y, loss
    opt.zero_grad(set_to_none=True)
    mark("freed")
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:  # this thread's (or every thread's, by PyTorch's version) workspaces
        clear()
        mark("cleared")

    big = torch.empty(64 * MiB, dtype=torch.uint8, device=dev)  # SEGMENT_LINE
    del big
    small = torch.empty(16 * MiB, dtype=torch.uint8, device=dev)  # TENSOR_LINE
    torch.cuda.synchronize()
    here = open(__file__).read().splitlines()
    lines = {tag: next(i + 1 for i, l in enumerate(here) if l.rstrip().endswith(f"# {tag}") and "empty" in l)
             for tag in ("SEGMENT_LINE", "TENSOR_LINE")}
    res = {"mode": mode, "torch": torch.__version__, "device": torch.cuda.get_device_name(dev), "marks": marks,
           "lines": lines, "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
           "cleared_workspaces": clear is not None}
    if mode == "tensors":
        snap = snapshot()
        res["small_sites"] = [s["label"] for s in snap["sites"]
                              if s.get("live_bytes", 0) >= 16 * MiB and s.get("live_bytes", 0) < 64 * MiB]
        res["names_tensor_line"] = any(f"tensors_show.py:{lines['TENSOR_LINE']}" in s["label"] for s in snap["sites"])
        res["names_segment_line"] = any(f"tensors_show.py:{lines['SEGMENT_LINE']}" in s["label"]
                                        for s in snap["sites"] if s.get("live_bytes", 0))
    else:
        res["reserved_after_small"] = torch.cuda.memory_reserved()
    del small
    json.dump(res, open(out, "w"), indent=1)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
