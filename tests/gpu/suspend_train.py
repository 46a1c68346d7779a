"""A deterministic training whose losses two runs can compare bit for bit.

tests/gpu/suspend.sh runs it three times: twice uninterrupted (to show the run is itself
reproducible) and once suspended with `cuwarden suspend` mid-run and resumed; the three loss
lists must be equal. Fixed seed, fixed data order, deterministic algorithms
(CUBLAS_WORKSPACE_CONFIG must be set before CUDA starts; the script sets it when missing).

    python3 tests/gpu/suspend_train.py STEPS OUT_FILE [HOLD_GIB]

Writes one line per step, "step N loss X" with X as float.hex() (exact), flushed, to OUT_FILE;
the last line is "done". HOLD_GIB (default 4) more GiB are held in a tensor that is checked at
the end, so the suspended footprint is large enough to time.
"""
import os
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402


def main() -> int:
    steps = int(sys.argv[1])
    out = open(sys.argv[2], "w", buffering=1)
    hold_gib = float(sys.argv[3]) if len(sys.argv) > 3 else 4.0
    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    dev = torch.device("cuda")
    layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True,
                                             dropout=0.0)
    model = torch.nn.Sequential(torch.nn.Embedding(8192, 512), torch.nn.TransformerEncoder(layer, num_layers=6),
                                torch.nn.Linear(512, 8192)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    gen = torch.Generator().manual_seed(99)  # the data order: drawn on the host, same every run
    held = torch.full((int(hold_gib * (1 << 28)),), 3.0, device=dev)
    for step in range(steps):
        tokens = torch.randint(0, 8192, (16, 257), generator=gen).to(dev)
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 8192), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        out.write(f"step {step} loss {loss.item().hex()}\n")
    ok = bool((held == 3.0).all().item())
    out.write(f"held intact {ok}\n")
    out.write("done\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
