#!/usr/bin/env python3
"""cuwarden bench: the keep setting's Pareto points on the recorded traces, memory side, on the
simulated driver (no GPU): held over peak live and the driver calls of CUWARDEN_POOL=vmm for
each CUWARDEN_POOL_KEEP, each trace replayed per event by cuw_trace_replay.

    python3 bench/keep_table.py [BUILD_DIR] [--keeps 0,1%,2%,5%,10%,256M] [--pools vmm]
                                [--traces NAME|PATH.trace.gz,...] [--use none|memset] [--json FILE]

Per trace and keep, two replays: `--pass held` (held over the trace's peak of live requested
bytes: the most the process held, the simulated driver's own count, after every allocation;
no work queued, as that pass allows) and a time pass whose driver calls are counted
(cuMemCreate, cuMemMap, cuMemUnmap, cuMemRelease; cuMemAlloc and cuMemFree for `cache`), per
1,000 replayed events. With `--use memset` (the default) each allocation of the time pass
queues a 4 KiB memset on the legacy stream, so frees meet queued work as a training step's do. The simulated driver's seconds say nothing
about a GPU's; the held figure and the calls are the driver-independent part (a keep of "0"
is the pool's floor, 16 MiB: budget.hpp's kKeepFloor).
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

TRACES = ("gpt2-train", "gpt2-generate", "cupy-grow")


def replay(build, trace, pool, keep, held, use, run_dir):
    env = dict(os.environ)
    env.update({"LD_LIBRARY_PATH": f"{build}/fakecuda", "LD_PRELOAD": f"{build}/lib/libcuwarden.so",
                "CUWARDEN_POOL": pool, "CUWARDEN_POOL_KEEP": keep, "CUWARDEN_RUN_DIR": run_dir,
                "CUWARDEN_MEMINFO": "physical", "CUWARDEN_FAKE_DEVICES": "1",
                # about an H200, as bench/traces/check_replay.py's replays
                "CUWARDEN_FAKE_MEMORY": "140G", "CUWARDEN_FAKE_DIR": os.path.join(run_dir, "fake")})
    os.makedirs(env["CUWARDEN_FAKE_DIR"], mode=0o700, exist_ok=True)
    cmd = [f"{build}/bin/cuw_trace_replay", str(trace), "--pass", "held" if held else "time"]
    if use == "memset" and not held:  # the held pass samples between events, with no work queued
        cmd += ["--use", "memset", "--use-bytes", "4096"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        sys.exit(f"keep_table: {' '.join(cmd)} (keep {keep}) exited {out.returncode}: {out.stderr.strip()}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build", nargs="?", default="build")
    ap.add_argument("--keeps", default="0,1%,2%,5%,10%,256M")
    ap.add_argument("--pools", default="vmm")
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--use", choices=("none", "memset"), default="memset")
    ap.add_argument("--json")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    traces_dir = pathlib.Path(__file__).resolve().parent / "traces"
    rows = []
    with tempfile.TemporaryDirectory(prefix="cuw-keep-table.") as run_dir:
        for name in a.traces.split(","):
            trace = traces_dir / f"{name}.trace.gz"
            if name.endswith(".trace.gz"):  # a trace of one's own (tests/gpu/tensors_keep_report.py trace)
                trace, name = pathlib.Path(name).resolve(), os.path.basename(name)[:-len(".trace.gz")]
            for pool in a.pools.split(","):
                for keep in a.keeps.split(","):
                    h = replay(build, trace, pool, keep, True, a.use, run_dir)
                    t = replay(build, trace, pool, keep, False, a.use, run_dir)
                    if h["refusals"] or t["refusals"] or h["free_errors"] or t["free_errors"]:
                        sys.exit(f"keep_table: {name} {pool} keep {keep}: refusals or free errors")
                    c = t["driver_calls"] or {}
                    k = 1000 / t["events"]
                    rows.append({
                        "trace": name, "pool": pool, "keep": keep, "events": t["events"],
                        "peak_live_bytes": h["peak_live_bytes"], "held_peak_bytes": h["held_peak_bytes"],
                        "held_over_live": h["held_over_live"], "seconds_simulated": t["seconds"], "calls": c,
                        "per_1000": {"take": (c.get("cuMemCreate", 0) + c.get("cuMemAlloc", 0)) * k,
                                     "map": c.get("cuMemMap", 0) * k, "unmap": c.get("cuMemUnmap", 0) * k,
                                     "give_back": (c.get("cuMemRelease", 0) + c.get("cuMemFree", 0)) * k,
                                     "sync": (c.get("cuEventSynchronize", 0) + c.get("cuStreamSynchronize", 0)) * k}})
                    r = rows[-1]
                    print(f"{name} {pool} keep {keep}: held/live {r['held_over_live']:.4f}", file=sys.stderr, flush=True)
    print(f"work queued on each allocation: {'a 4 KiB memset' if a.use == 'memset' else 'none'}\n")
    print("| trace | pool | keep | held / peak live | held GiB | create or alloc | map | unmap | release or free "
          "| event syncs |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        p = r["per_1000"]
        print(f"| {r['trace']} | {r['pool']} | {r['keep']} | {r['held_over_live']:.4f} | "
              f"{r['held_peak_bytes'] / 2**30:.3f} | {p['take']:.2f} | {p['map']:.2f} | {p['unmap']:.2f} | "
              f"{p['give_back']:.2f} | {p['sync']:.2f} |")
    print("\n(driver calls per 1,000 replayed events, from the time pass)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
