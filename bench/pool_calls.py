#!/usr/bin/env python3
"""cuwarden bench: the driver calls each pool makes on the recorded traces, with and without
GPU work queued on each allocation (cuw_trace_replay --use memset), on the simulated driver.

    python3 bench/pool_calls.py [BUILD_DIR] [--pools cache,vmm] [--json FILE]

The per-tensor mode's stable proxy (issue "Every tensor through cuwarden"): a training step
queues kernels that use each tensor while the CPU runs ahead, so the pool's frees find work
still queued. What costs a GPU step its overlap is a synchronizing call (cuEventSynchronize,
cuStreamSynchronize, cuCtxSynchronize, and cuMemFree, which waits for the device) and a
driver allocation; event records and polls cost microseconds. Printed per 1,000 replayed
events: each pool's calls, bare (no work queued) and used (a 4 KiB memset per allocation on
the legacy stream), and the replay's seconds. The simulated driver runs queued work on a
thread of its own, so the counts of calls that depend on when work completes (queries,
waits) move a little from run to run; allocations and frees do not.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys

TRACES = ("gpt2-train", "gpt2-generate", "cupy-grow")
SYNCS = ("cuEventSynchronize", "cuStreamSynchronize", "cuCtxSynchronize")


def replay(build, trace, pool, use):
    env = dict(os.environ)
    env.update({"LD_LIBRARY_PATH": f"{build}/fakecuda", "LD_PRELOAD": f"{build}/lib/libcuwarden.so",
                "CUWARDEN_POOL": pool, "CUWARDEN_RUN_DIR": env.get("CUWARDEN_RUN_DIR", "/tmp/cuw-pool-calls")})
    os.makedirs(env["CUWARDEN_RUN_DIR"], exist_ok=True)
    cmd = [f"{build}/bin/cuw_trace_replay", str(trace), "--use", use, "--use-bytes", "4096"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"pool_calls: {' '.join(cmd)} exited {out.returncode}: {out.stderr.strip()}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build", nargs="?", default="build")
    ap.add_argument("--pools", default="cache,vmm")
    ap.add_argument("--json")
    a = ap.parse_args()
    traces_dir = pathlib.Path(__file__).resolve().parent / "traces"
    rows = []
    for name in TRACES:
        for pool in a.pools.split(","):
            for use in ("none", "memset"):
                r = replay(a.build, traces_dir / f"{name}.trace.gz", pool, use)
                if r["refusals"] or r["free_errors"] or r.get("use_errors"):
                    sys.exit(f"pool_calls: {name} {pool} {use}: refusals {r['refusals']}, free errors "
                             f"{r['free_errors']}, use errors {r.get('use_errors')}")
                c = r["driver_calls"]
                k = 1000 / r["events"]
                rows.append({"trace": name, "pool": pool, "use": use, "events": r["events"], "seconds": r["seconds"],
                             "calls": c, "per_1000": {
                                 "alloc": (c["cuMemAlloc"] + c["cuMemCreate"]) * k,
                                 "map": c["cuMemMap"] * k, "unmap": c["cuMemUnmap"] * k,
                                 "free": (c["cuMemFree"] + c["cuMemRelease"]) * k,
                                 "record": c["cuEventRecord"] * k, "query": c["cuEventQuery"] * k,
                                 # the replay's own final cuCtxSynchronize (--use memset) is not the pool's
                                 "sync": (sum(c[s] for s in SYNCS) - (use == "memset")) * k}})
    print("| trace | pool | work queued | seconds | alloc | free | map | unmap | record | query | sync |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        p = r["per_1000"]
        print(f"| {r['trace']} | {r['pool']} | {'yes' if r['use'] == 'memset' else 'no'} | {r['seconds']:.3f} | "
              f"{p['alloc']:.1f} | {p['free']:.1f} | {p['map']:.1f} | {p['unmap']:.1f} | {p['record']:.1f} | "
              f"{p['query']:.1f} | {p['sync']:.1f} |")
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
