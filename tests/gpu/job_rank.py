"""cuwarden GPU job test: one rank of a job (run by tests/gpu/job.sh under libcuwarden.so
with CUWARDEN_JOB / CUWARDEN_JOB_LIMIT).

    python3 job_rank.py RANK CTRL_DIR

Waits for CTRL_DIR/go, then allocates 512 MiB tensors until PyTorch raises
torch.cuda.OutOfMemoryError, writes CTRL_DIR/rank<R>.1 = "<bytes held> <first line of the
error>", and holds them. On CTRL_DIR/again it fills again (rank<R>.2); on CTRL_DIR/done it
exits.
"""
import os
import sys
import time

import torch

rank, ctrl = int(sys.argv[1]), sys.argv[2]
CHUNK = 512 << 20
held = []


def wait_for(name):
    while not os.path.exists(os.path.join(ctrl, name)):
        time.sleep(0.01)


def fill():
    got = 0
    while True:
        try:
            held.append(torch.empty(CHUNK, dtype=torch.uint8, device="cuda"))
            got += CHUNK
        except torch.cuda.OutOfMemoryError as e:  # the job is full
            return got, str(e).splitlines()[0]


def report(round_no, got, msg):
    tmp = os.path.join(ctrl, f"rank{rank}.{round_no}.tmp")
    with open(tmp, "w") as f:
        f.write(f"{got} {msg}\n")
    os.rename(tmp, os.path.join(ctrl, f"rank{rank}.{round_no}"))


torch.cuda.init()
torch.zeros(1, device="cuda")  # context up before the race starts
with open(os.path.join(ctrl, f"rank{rank}.pid"), "w") as f:
    f.write(str(os.getpid()))
wait_for("go")
report(1, *fill())
wait_for("again")
report(2, *fill())
wait_for("done")
