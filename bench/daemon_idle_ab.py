#!/usr/bin/env python3
"""cuwardend's CPU with many idle interposed processes, two builds' daemons taken in turn.

  bench/daemon_idle_ab.py --a BUILD_A --b BUILD_B [--procs 1000] [--window-s 60] [--rounds 2]

Starts --procs cuwt_alloc_loop programs under BUILD_A's libcuwarden.so on the simulated
driver (as bench/http_metrics.py does: a third capped, four jobs, each holding 1-4 MiB),
then runs BUILD_A's cuwardend and BUILD_B's in turn (A B A B ...) on the same processes and
the same run directory. Each daemon is started, waits until it sees every process, is left
5 s, and is measured for --window-s: its utime + stime (/proc/PID/stat) over the window, as a
share of one core. Prints a Markdown table and writes the figures to --out/daemon-idle-ab.json.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import http_metrics as hm  # noqa: E402  (same directory)

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    return hm.cpu_ticks(pid) / TICK


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", required=True, help="build directory A (its programs run the processes)")
    ap.add_argument("--b", required=True, help="build directory B")
    ap.add_argument("--out", default="bench-out")
    ap.add_argument("--procs", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--window-s", type=float, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    hm.raise_fd_limit(a.procs)

    bench = hm.Bench(argparse.Namespace(build=a.a, out=a.out, procs=a.procs, batch=a.batch))
    daemons = {}
    for tag, src in (("A", a.a), ("B", a.b)):
        dst = os.path.join(bench.build, f"cuwardend-{tag}")
        with open(os.path.join(src, "bin", "cuwardend"), "rb") as s, open(dst, "wb") as d:
            d.write(s.read())
        os.chmod(dst, 0o755)
        daemons[tag] = dst
    results = {"A": [], "B": []}
    try:
        bench.start_processes()
        for r in range(a.rounds):
            for tag in ("A", "B"):
                os.replace(daemons[tag], os.path.join(bench.build, "bin", "cuwardend"))
                bench.start_daemon(f"{tag}{r}")
                bench.wait_count(a.procs, 60)
                bench.conn.close()  # nothing asks during the window
                bench.conn = None
                time.sleep(5)
                c0, t0 = cpu_s(bench.daemon.pid), time.monotonic()
                time.sleep(a.window_s)
                c1, t1 = cpu_s(bench.daemon.pid), time.monotonic()
                share = 100 * (c1 - c0) / (t1 - t0)
                results[tag].append({"round": r, "cpu_s": round(c1 - c0, 2), "wall_s": round(t1 - t0, 1),
                                     "percent_of_a_core": round(share, 2), "load": hm.loadavg()})
                print(f"round {r} {tag}: {c1 - c0:.2f} s CPU in {t1 - t0:.1f} s = {share:.2f}% of a core", flush=True)
                bench.stop_daemon()
                os.replace(os.path.join(bench.build, "bin", "cuwardend"), daemons[tag])
    finally:
        bench.cleanup()
    med = {t: statistics.median(x["percent_of_a_core"] for x in v) for t, v in results.items()}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "daemon-idle-ab.json"), "w") as f:
        json.dump({"procs": a.procs, "window_s": a.window_s, "results": results, "median": med}, f, indent=1)
    print(f"\n| build | rounds (% of a core) | median |\n| --- | --- | --- |")
    for t in ("A", "B"):
        print(f"| {t} | {', '.join(str(x['percent_of_a_core']) for x in results[t])} | {med[t]:.2f}% |")


if __name__ == "__main__":
    main()
