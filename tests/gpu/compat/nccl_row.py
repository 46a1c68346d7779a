"""compat.sh row 15: two processes, one GPU each, NCCL all-reduce through torch.distributed,
each process under its own cuwarden cap (CUWARDEN_LIMIT, inherited by both ranks).

Each rank: all-reduce (checks the sum), then grows COMPAT_CHUNK_MIB tensors on its GPU until
refused, frees them, and all-reduces again (NCCL still works after the refusal).
Prints one JSON part per rank (format in cuwq.py). The parent never touches CUDA.
NVLink multicast stays off (cuwq sets NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1 before torch is imported; the ranks inherit them).
"""
import datetime
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuwq  # noqa: E402

WORLD = 2
ELEMS = 1 << 24  # 64 MiB of float32 per all-reduce


def init_group(dist, torch, rank, port, dev):
    kw = dict(backend="nccl", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=WORLD,
              timeout=datetime.timedelta(seconds=60))
    try:
        dist.init_process_group(device_id=dev, **kw)
    except TypeError:  # a torch without device_id
        dist.init_process_group(**kw)


def all_reduce_ok(dist, torch, rank, dev):
    x = torch.full((ELEMS,), float(rank + 1), device=dev)
    dist.all_reduce(x)
    torch.cuda.synchronize(dev)
    return bool((x == float(WORLD * (WORLD + 1) // 2)).all().item())


def worker(rank, port):
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_row  # the same growth and figures as the single-GPU rows

    torch_row.torch = torch
    dev = torch.device("cuda", rank)
    checks = {}
    try:
        torch.cuda.set_device(dev)
        _, total = torch.cuda.mem_get_info(dev)
        init_group(dist, torch, rank, port, dev)
        checks["all-reduce sum correct"] = all_reduce_ok(dist, torch, rank, dev)
        dist.barrier()
        held = []
        outcome, oom, message = torch_row.grow(dev, held)
        cw = cuwq.cuwarden_self()
        part = torch_row.part_for(dev, held, outcome, oom, message, total, cw, checks,
                                  {"rank": rank, "api": "torch.distributed nccl"})
        cuwq.hold()
        del held
        torch.cuda.empty_cache()
        dist.barrier()
        checks["all-reduce sum correct after the refusal"] = all_reduce_ok(dist, torch, rank, dev)
        dist.barrier()
        part["checks"] = checks
        # Ranks share the parent's stdout: print one at a time so lines never interleave.
        for turn in range(WORLD):
            if turn == rank:
                cuwq.emit(**part)
            dist.barrier()
    except BaseException as e:  # noqa: BLE001
        cuwq.emit(device=rank, rank=rank, api="torch.distributed nccl", held_bytes=None, framework_bytes=None,
                  framework_figure=None, outcome="error: %s" % cuwq.exc_name(e), oom=cuwq.looks_oom(e),
                  message=cuwq.first_line(e), checks=checks)
        raise
    finally:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


def main():
    torch = cuwq.import_or_skip("torch", "torch.distributed nccl")
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print("nccl_row: parent pid %d, torch %s, port %d, NCCL_NVLS_ENABLE=%s" %
          (os.getpid(), torch.__version__, port, os.environ.get("NCCL_NVLS_ENABLE")), file=sys.stderr, flush=True)
    try:
        mp.spawn(worker, args=(port,), nprocs=WORLD, join=True)
    except Exception as e:  # noqa: BLE001 - a rank failed; its own part says how
        print("nccl_row: a rank failed: %s: %s" % (cuwq.exc_name(e), cuwq.first_line(e)), file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    cuwq.run_main(main, "torch.distributed nccl")
