"""CUDA tensors shared between processes with torch.multiprocessing, both ways.

    python torch_share.py [--mib N]

Parent to child: the parent puts a tensor on a queue; the child checks its values, adds 1 in
place, and says so; the parent sees the change. Child to parent: the child makes a tensor and
puts it on a queue, keeping it alive until the parent is done (as PyTorch asks); the parent
checks its values, adds 1 in place, and says so; the child sees the change. Sizes: a small
tensor (4 KiB) and one of N MiB. Prints one JSON line {"ok": bool, "checks": [...]}; exit 0
when every check passed.
"""
import argparse
import json
import sys

import torch
import torch.multiprocessing as mp


def child_import(q_in, q_out):
    t = q_in.get()
    ok = bool(torch.all(t == 7).item())
    t.add_(1)
    torch.cuda.synchronize()
    del t
    q_out.put(ok)


def child_export(q_out, done, result, numel):
    t = torch.full((numel,), 11, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    q_out.put(t)
    done.wait(60)
    torch.cuda.synchronize()
    result.put(bool(torch.all(t == 12).item()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    checks = []
    for numel in (1024, args.mib * (1 << 20) // 4):
        # Parent to child.
        t = torch.full((numel,), 7, dtype=torch.int32, device="cuda")
        torch.cuda.synchronize()
        q_in, q_out = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=child_import, args=(q_in, q_out))
        p.start()
        q_in.put(t)
        seen = q_out.get(timeout=60)
        p.join(60)
        torch.cuda.synchronize()
        checks.append({"direction": "parent->child", "bytes": numel * 4, "child_saw": seen,
                       "parent_sees_child_write": bool(torch.all(t == 8).item()), "exit": p.exitcode})
        del t
        # Child to parent.
        q, done, result = ctx.Queue(), ctx.Event(), ctx.Queue()
        p = ctx.Process(target=child_export, args=(q, done, result, numel))
        p.start()
        r = q.get(timeout=60)
        saw = bool(torch.all(r == 11).item())
        r.add_(1)
        torch.cuda.synchronize()
        del r
        done.set()
        child_sees = result.get(timeout=60)
        p.join(60)
        checks.append({"direction": "child->parent", "bytes": numel * 4, "parent_saw": saw,
                       "child_sees_parent_write": child_sees, "exit": p.exitcode})
    ok = all(all(v is True or (k == "exit" and v == 0) or k in ("direction", "bytes") for k, v in c.items())
             for c in checks)
    print(json.dumps({"ok": ok, "checks": checks}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
