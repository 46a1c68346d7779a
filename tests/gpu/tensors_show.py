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
"""
import json
import os
import subprocess
import sys

import torch

MiB = 1 << 20


def snapshot():
    out = subprocess.run([os.environ["CUWARDEN_CLI"], "snapshot", str(os.getpid()), "--format", "json"],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise SystemExit(f"tensors_show: cuwarden snapshot exited {out.returncode}: {out.stderr}")
    return json.loads(out.stdout)


def by_pytorch(snap):
    """Live device bytes of allocations made through libc10_cuda (rounded to 512) and of the rest."""
    sites = {s["id"]: s for s in snap["sites"]}
    ours = others = 0
    other_sites = {}
    for a in snap["allocations"]:
        if a.get("kind") not in ("device", "pooled"):  # pooled: served by cuwarden's pool
            continue
        frames = sites.get(a.get("site"), {}).get("frames", [])
        if any("libc10_cuda" in (f.get("module") or "") for f in frames):
            ours += (a["bytes"] + 511) // 512 * 512
        else:
            others += a["bytes"]
            label = sites.get(a.get("site"), {}).get("label", "?")
            mods = sorted({os.path.basename(f.get("module") or "") for f in frames} - {""})[:6]
            key = f"{label} [{', '.join(mods)}]"  # what the site's frames name, to see why it is not PyTorch's
            other_sites[key] = other_sites.get(key, 0) + a["bytes"]
    return ours, others, other_sites


def main():
    mode, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(7)
    dev = torch.device("cuda")
    marks = []

    def mark(name):
        torch.cuda.synchronize()
        rec = {"mark": name}
        if mode == "cached":
            rec["memory_allocated"] = torch.cuda.memory_allocated()
        else:
            rec["libc10_cuda_bytes"], rec["other_bytes"], rec["other_sites"] = by_pytorch(snapshot())
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

    big = torch.empty(64 * MiB, dtype=torch.uint8, device=dev)  # SEGMENT_LINE
    del big
    small = torch.empty(16 * MiB, dtype=torch.uint8, device=dev)  # TENSOR_LINE
    torch.cuda.synchronize()
    here = open(__file__).read().splitlines()
    lines = {tag: next(i + 1 for i, l in enumerate(here) if l.rstrip().endswith(f"# {tag}") and "empty" in l)
             for tag in ("SEGMENT_LINE", "TENSOR_LINE")}
    res = {"mode": mode, "torch": torch.__version__, "device": torch.cuda.get_device_name(dev), "marks": marks,
           "lines": lines}
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
