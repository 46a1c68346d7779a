#!/usr/bin/env python3
"""cuwarden bench: cuwardend's HTTP side with many interposed processes (simulated driver).

  python3 bench/http_metrics.py [--build build] [--out bench-out] [--procs 1000]
        [--scrapes 50] [--cpu-s 60] [--empty-s 30] [--long-idle-s 0] [--churn-s 180] [--churn-warm-s 20]

Builds nothing; copies <build>/bin/cuwardend, <build>/bin/cuwt_alloc_loop,
<build>/lib/libcuwarden.so and <build>/fakecuda to a temporary directory first (a rebuild
during the run cannot change them). One fresh run directory under /dev/shm; the rings of
1,000 processes take about 1 GiB there (a ring's size is fixed).

 1. cuwardend --http 127.0.0.1:<free port>; its CPU over --empty-s with no process; then
    --procs cuwt_alloc_loop processes under libcuwarden.so, started in batches: every third
    capped (CUWARDEN_LIMIT=64M), the first 40% in four jobs (CUWARDEN_JOB=bench-0..3,
    CUWARDEN_JOB_LIMIT=1G), each allocating 1-4 MiB; then they sit idle. The daemon's RSS
    before and after: its cost per process, everything included.
 2. /metrics: --scrapes GETs on one keep-alive connection (http.client), each timed from
    the request to the last byte of the body; the body's size; the daemon's CPU per scrape;
    the same with curl (one connection for all URLs). /api/v1/state and
    /api/v1/history?range=hour, 10 GETs each.
 3. The daemon's CPU (utime + stime from /proc/PID/stat, per thread too) over --cpu-s with
    nothing asking it anything, then over --cpu-s with a scrape every 15 s (what a
    Prometheus server does); RssAnon every 5 s meanwhile, and the history's points counted
    through the API before and after.
 3b. With --long-idle-s S: the same daemon left alone for S more seconds, RssAnon every 30 s
    (the samples `snapshot --leaks` keeps, one per process every 30 s, fill for ten
    minutes), and its CPU over the whole window.
 4. The daemon restarted with --drain-interval-ms 100: the idle CPU again (how much of it is
    the drain tick).
 5. The history alone: the daemon restarted with --history 16 --leak-sample 3600 (events
    and leak samples then stop growing: what grows is the series). Idle for --cpu-s (RSS,
    points); then, after a warm-up that leaves each process's event history at a different
    fill, every process's used bytes change twice a second in a cycle of four values (any
    two samples a second apart differ: a point a second) whose base grows by 1 MiB a minute
    (a point a minute in the day range), for --churn-s: RssAnon's growth rate against the
    points counted through the API, per process-hour, and the daemon's CPU meanwhile.

Everything it started is stopped and the run directory removed at the end, on failure or
on SIGINT/SIGTERM/SIGHUP too. Writes <out>/http-metrics.md and .json (raw figures; the RSS
samples and the last /metrics body in <out>/raw) and prints the markdown. Targets
(reported, not asserted): /metrics at most 50 ms and 5 MB with 1,000 processes; at most 1%
of a core with 1,000 idle processes.
"""
import argparse
import http.client
import json
import os
import platform
import random
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

# A history point of a process's series: uint32_t t + 4 x uint64_t, padded to 8 bytes
# (daemon/src/model/series.hpp: Series<4>::Point). Bound: 3,602 + 1,442 points.
POINT_BYTES_PACKED = 4 + 8 * 4
POINT_BYTES = 40
BOUND_POINTS = 3602 + 1442
CLK_TCK = os.sysconf("SC_CLK_TCK")


def now():
    return time.monotonic()


def raise_fd_limit(procs):
    """Enough open files for `procs` programs with two pipes each, or exit saying why."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * procs + 64
    if soft < need:
        if hard < need:
            sys.exit(f"need {need} open files (two pipes a process); the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def cpu_ticks(pid):
    """utime + stime of a process (all its threads), in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return int(rest[11]) + int(rest[12])


def thread_ticks(pid):
    """{tid: (name, utime + stime)} for each thread of pid."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                s = f.read()
        except FileNotFoundError:
            continue
        name = s[s.index("(") + 1:s.rindex(")")]
        rest = s.rsplit(")", 1)[1].split()
        out[int(tid)] = (name, int(rest[11]) + int(rest[12]))
    return out


def rss(pid):
    """{'VmRSS': kB, 'RssAnon': kB, 'RssFile': kB, 'RssShmem': kB}."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[k] = int(v.split()[0])
    return out


def slope(points):
    """Least-squares slope of [(x, y)]."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


def max_rise(log):
    """The largest rise between two consecutive (t, kib) samples."""
    return max([b - a for (_, a), (_, b) in zip(log, log[1:])] + [0])


def pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Bench:
    def __init__(self, a):
        self.a = a
        self.source_build = os.path.abspath(a.build)
        # The programs are copied first: a rebuild of the build directory during the run
        # cannot change them under the bench.
        self.build = tempfile.mkdtemp(prefix="cuwarden-bench-http-bin-")
        try:
            for sub in ("bin/cuwardend", "bin/cuwt_alloc_loop", "lib/libcuwarden.so", "fakecuda"):
                src, dst = os.path.join(self.source_build, sub), os.path.join(self.build, sub)
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                if os.path.isdir(src):
                    shutil.copytree(src, dst, symlinks=True)
                else:
                    shutil.copy2(src, dst)
        except BaseException:
            shutil.rmtree(self.build, ignore_errors=True)
            raise
        self.out = os.path.abspath(a.out)
        self.raw = os.path.join(self.out, "raw")
        os.makedirs(self.raw, exist_ok=True)
        self.run_dir = tempfile.mkdtemp(prefix="cuwarden-bench-http-", dir="/dev/shm")
        self.port = free_port()
        self.daemon = None
        self.daemon_log = None
        self.procs = []  # Popen objects of cuwt_alloc_loop
        self.pids = []
        self.base_mib = []
        self.conn = None
        self.reconnects = 0
        self.r = {"procs": a.procs}
        self.errlog = open(os.path.join(self.raw, "processes.stderr"), "wb")

    # ---- the daemon --------------------------------------------------------------------
    def env(self):
        e = {k: v for k, v in os.environ.items() if not k.startswith("CUWARDEN_") and k != "LD_PRELOAD"}
        e["LD_LIBRARY_PATH"] = os.path.join(self.build, "fakecuda")
        e["CUWARDEN_RUN_DIR"] = self.run_dir
        return e

    def start_daemon(self, tag, extra=()):
        self.daemon_log = open(os.path.join(self.raw, f"cuwardend-{tag}.log"), "wb")
        cmd = [os.path.join(self.build, "bin", "cuwardend"), "--run-dir", self.run_dir,
               "--http", f"127.0.0.1:{self.port}", "--log-level", "warn", *extra]
        self.r.setdefault("daemon_commands", []).append(" ".join(cmd))
        self.daemon = subprocess.Popen(cmd, env=self.env(), stdout=self.daemon_log, stderr=subprocess.STDOUT)
        deadline = now() + 20
        while now() < deadline:
            if self.daemon.poll() is not None:
                raise RuntimeError(f"cuwardend exited with {self.daemon.returncode}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/metrics")
                c.getresponse().read()
                c.close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError("cuwardend did not answer HTTP within 20 s")
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)

    def stop_daemon(self):
        if self.conn:
            self.conn.close()
            self.conn = None
        if self.daemon and self.daemon.poll() is None:
            self.daemon.terminate()
            try:
                self.daemon.wait(10)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait()
        self.daemon = None

    def get(self, path):
        """(seconds from request to the body's last byte, body). A connection the server
        closed after its 30 s idle limit is opened again (counted in self.reconnects)."""
        for attempt in (0, 1):
            try:
                t = time.perf_counter()
                self.conn.request("GET", path)
                resp = self.conn.getresponse()
                body = resp.read()
                dt = time.perf_counter() - t
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                if attempt:
                    raise
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                self.reconnects += 1
        if resp.status != 200:
            raise RuntimeError(f"GET {path}: {resp.status} {body[:200]!r}")
        if resp.getheader("Connection", "").lower() == "close":
            raise RuntimeError(f"GET {path}: the server closed the connection (no keep-alive)")
        return dt, body

    def running_count(self):
        _, body = self.get("/metrics")
        m = re.search(rb"^cuwarden_processes\{[^}]*\} (\d+)$", body, re.M)
        return int(m.group(1)) if m else 0

    def wait_count(self, n, timeout):
        deadline = now() + timeout
        while now() < deadline:
            c = self.running_count()
            if c >= n:
                return c
            time.sleep(0.5)
        raise RuntimeError(f"the daemon saw {self.running_count()} processes, not {n}, after {timeout} s")

    # ---- the processes ---------------------------------------------------------------
    def start_processes(self):
        lib = os.path.join(self.build, "lib", "libcuwarden.so")
        exe = os.path.join(self.build, "bin", "cuwt_alloc_loop")
        n = self.a.procs
        capped = jobbed = 0
        t0 = now()
        for start in range(0, n, self.a.batch):
            batch = []
            for i in range(start, min(n, start + self.a.batch)):
                e = self.env()
                e["LD_PRELOAD"] = lib
                if i % 3 == 0:
                    e["CUWARDEN_LIMIT"] = "64M"
                    capped += 1
                if i < n * 4 // 10:
                    e["CUWARDEN_JOB"] = f"bench-{i % 4}"
                    e["CUWARDEN_JOB_LIMIT"] = "1G"
                    jobbed += 1
                p = subprocess.Popen([exe], env=e, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.errlog)
                self.procs.append(p)
                batch.append((i, p))
            for i, p in batch:
                line = p.stdout.readline().decode()
                if not line.startswith("ready "):
                    raise RuntimeError(f"process {i}: {line!r}")
                self.pids.append(int(line.split()[1]))
                mib = 1 + i % 4
                self.base_mib.append(mib)
                p.stdin.write(f"alloc {mib}\n".encode())
                p.stdin.flush()
            for i, p in batch:
                line = p.stdout.readline().decode().strip()
                if line != "ok":
                    raise RuntimeError(f"process {i}: alloc answered {line!r}")
        self.r["start_s"] = round(now() - t0, 1)
        self.r["capped"] = capped
        self.r["in_jobs"] = jobbed

    def stop_processes(self):
        for p in self.procs:
            try:
                p.stdin.close()
            except OSError:
                pass
        deadline = now() + 10
        for p in self.procs:
            try:
                p.wait(max(0.01, deadline - now()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            try:
                p.stdout.close()
            except OSError:
                pass
        self.procs = []

    def shm_kib(self):
        total = 0
        for name in os.listdir(self.run_dir):
            try:
                total += os.stat(os.path.join(self.run_dir, name)).st_blocks * 512
            except FileNotFoundError:
                pass
        return total // 1024

    # ---- phases ----------------------------------------------------------------------
    def history_points(self, pid=None):
        """The points the API answers for the hour and day ranges, summed over the process
        series (of one process with `pid`) and over the job and GPU series."""
        res = []
        for rng in ("hour", "day"):
            path = f"/api/v1/processes/{pid}/history?range={rng}" if pid else f"/api/v1/history?range={rng}"
            _, body = self.get(path)
            doc = json.loads(body)
            procs = [doc] if pid else doc["processes"]
            series = [d for p in procs for d in p["devices"]]
            other = [] if pid else [g for j in doc["jobs"] for g in j["gpus"]] + doc["gpus"]
            res.append((len(series), sum(len(s["t"]) for s in series), len(other), sum(len(s["t"]) for s in other)))
        (ns, hour, nother, hour_other), (_, day, _, day_other) = res
        return {"process_series": ns, "hour_points": hour, "day_points": day, "other_series": nother,
                "other_hour_points": hour_other, "other_day_points": day_other}

    def phase_start(self):
        self.r["versions"] = self.versions()
        self.r["load_start"] = loadavg()
        self.start_daemon("main")
        time.sleep(2)
        self.r["rss_daemon_empty_kib"] = rss(self.daemon.pid)
        self.r["cpu_empty"] = self.cpu_window(self.a.empty_s, 0, [])
        self.start_processes()
        self.r["seen"] = self.wait_count(self.a.procs, 120)
        self.t_seen = now()
        time.sleep(3)  # a few scans, so that the history holds every series
        self.r["rss_daemon_full_kib"] = rss(self.daemon.pid)
        self.r["shm_kib"] = self.shm_kib()
        sample = [rss(p) for p in self.pids[:: max(1, len(self.pids) // 20)]]
        self.r["process_rss_anon_kib_median"] = statistics.median(s["RssAnon"] for s in sample)

    def phase_scrapes(self):
        d = self.daemon.pid
        # one cold scrape (first on this connection), then the timed ones
        self.conn.close()
        t_first, _ = self.get("/metrics")
        self.reconnects = 0
        times, sizes = [], []
        c0 = cpu_ticks(d)
        for k in range(self.a.scrapes):
            dt, body = self.get("/metrics")
            times.append(dt)
            sizes.append(len(body))
        c1 = cpu_ticks(d)
        _, body = self.get("/metrics")
        with open(os.path.join(self.raw, "metrics.txt"), "wb") as f:
            f.write(body)
        samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        self.r["metrics"] = {
            "first_ms": t_first * 1e3,
            "median_ms": statistics.median(times) * 1e3, "p90_ms": pct(times, 0.9) * 1e3,
            "max_ms": max(times) * 1e3, "min_ms": min(times) * 1e3,
            "bytes": sizes[-1], "bytes_max": max(sizes), "samples": samples,
            "daemon_cpu_ms_per_scrape": (c1 - c0) * 1000 / CLK_TCK / len(times),
            "n": len(times), "load": loadavg(), "reconnects": self.reconnects,
        }
        curl = shutil.which("curl")
        if curl:
            # The same with curl, one connection reused for every URL of one invocation.
            url = f"http://127.0.0.1:{self.port}/metrics"
            args = [curl, "-s", "-w", "%{time_total} %{num_connects}\\n"]
            for _ in range(self.a.scrapes):
                args += ["-o", "/dev/null", url]
            out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
            rows = [line.split() for line in out.splitlines() if line.strip()]
            ct = [float(x[0]) for x in rows]
            self.r["metrics_curl"] = {"median_ms": statistics.median(ct) * 1e3, "p90_ms": pct(ct, 0.9) * 1e3,
                                      "max_ms": max(ct) * 1e3, "connects": sum(int(x[1]) for x in rows),
                                      "n": len(ct)}
        for name, path, n in (("state", "/api/v1/state", 10), ("history_hour", "/api/v1/history?range=hour", 10)):
            ts, size = [], 0
            for _ in range(n):
                dt, body = self.get(path)
                ts.append(dt)
                size = len(body)
            self.r[name] = {"median_ms": statistics.median(ts) * 1e3, "max_ms": max(ts) * 1e3, "bytes": size, "n": n}

    def cpu_window(self, seconds, scrape_every, rss_log):
        d = self.daemon.pid
        th0, c0, t0 = thread_ticks(d), cpu_ticks(d), now()
        next_scrape = t0 if scrape_every else None
        next_rss = t0
        scrapes = 0
        while True:
            t = now()
            if t - t0 >= seconds:
                break
            if next_scrape is not None and t >= next_scrape:
                self.get("/metrics")
                scrapes += 1
                next_scrape += scrape_every
            if t >= next_rss:
                rss_log.append((t, rss(d)["RssAnon"]))
                next_rss += 5
            time.sleep(min(0.2, max(0.0, min(x for x in (next_scrape, next_rss, t0 + seconds) if x is not None) - now())))
        c1, th1, t1 = cpu_ticks(d), thread_ticks(d), now()
        per_thread = []
        for tid, (name, ticks) in sorted(th1.items()):
            before = th0.get(tid, (name, 0))[1]
            per_thread.append({"tid": tid, "name": "main" if tid == d else name, "cpu_s": (ticks - before) / CLK_TCK})
        wall = t1 - t0
        cpu = (c1 - c0) / CLK_TCK
        return {"wall_s": wall, "cpu_s": cpu, "core_pct": 100 * cpu / wall, "scrapes": scrapes,
                "threads": per_thread, "load": loadavg()}

    def save_rss(self, name, rss_log):
        with open(os.path.join(self.raw, f"rss-{name}.txt"), "w") as f:
            for t, kib in rss_log:
                f.write(f"{t - rss_log[0][0]:.1f} {kib}\n")

    def idle_memory(self, name, seconds, scrape_every=0):
        """A CPU window with RssAnon every 5 s and the history's points before and after."""
        p0 = self.history_points()
        rss_log = []
        cpu = self.cpu_window(seconds, scrape_every, rss_log)
        rss_log.append((now(), rss(self.daemon.pid)["RssAnon"]))
        p1 = self.history_points()
        self.save_rss(name, rss_log)
        return cpu, {
            "span_s": rss_log[-1][0] - rss_log[0][0], "rss_anon_kib_first": rss_log[0][1],
            "rss_anon_kib_last": rss_log[-1][1], "rss_anon_slope_bytes_per_s": slope(rss_log) * 1024,
            "samples": len(rss_log), "points_before": p0, "points_after": p1,
            "max_rise_kib": max_rise(rss_log),
        }

    def phase_idle(self):
        """The daemon as started (defaults): nothing asking, then a scrape every 15 s; RssAnon
        sampled every 5 s across both (after the big GETs above)."""
        p0 = self.history_points()
        rss_log = []
        self.r["cpu_idle"] = self.cpu_window(self.a.cpu_s, 0, rss_log)
        self.r["cpu_scraped"] = self.cpu_window(self.a.cpu_s, 15, rss_log)
        rss_log.append((now(), rss(self.daemon.pid)["RssAnon"]))
        p1 = self.history_points()
        self.save_rss("idle-default", rss_log)
        self.r["idle_memory"] = {
            "span_s": rss_log[-1][0] - rss_log[0][0], "rss_anon_kib_first": rss_log[0][1],
            "rss_anon_kib_last": rss_log[-1][1], "rss_anon_slope_bytes_per_s": slope(rss_log) * 1024,
            "samples": len(rss_log), "points_before": p0, "points_after": p1,
            "max_rise_kib": max_rise(rss_log),
        }

    def phase_long_idle(self):
        """The daemon as started, left alone for --long-idle-s: RssAnon every 30 s, from the
        moment it had seen every process (the samples for `snapshot --leaks` fill for ten
        minutes), and its CPU over the whole window."""
        d = self.daemon.pid
        log = [(0.0, self.r["rss_daemon_full_kib"]["RssAnon"])]
        c0, t0 = cpu_ticks(d), now()
        while now() - t0 < self.a.long_idle_s:
            log.append((now() - self.t_seen, rss(d)["RssAnon"]))
            time.sleep(max(0.0, min(30.0, t0 + self.a.long_idle_s - now())))
        log.append((now() - self.t_seen, rss(d)["RssAnon"]))
        c1, t1 = cpu_ticks(d), now()
        self.save_rss("long-idle", log)
        last_rise = max([t for (_, a), (t, b) in zip(log, log[1:]) if b - a > 64] + [0.0])
        self.r["long_idle"] = {"wall_s": t1 - t0, "cpu_s": (c1 - c0) / CLK_TCK,
                               "core_pct": 100 * (c1 - c0) / CLK_TCK / (t1 - t0), "load": loadavg(),
                               "log": log, "last_rise_s": last_rise, "end_s": log[-1][0]}

    def restart(self, tag, extra):
        self.stop_daemon()
        self.start_daemon(tag, extra)
        self.wait_count(self.a.procs, 120)
        time.sleep(3)

    def phase_drain(self):
        """How much of the idle CPU is the drain tick: the same window at --drain-interval-ms 100."""
        self.restart("drain100", ["--drain-interval-ms", "100"])
        self.r["cpu_drain100"] = self.cpu_window(self.a.cpu_s, 0, [])

    def phase_churn(self):
        """The history alone: the daemon restarted with a small event history and no leak
        samples after the first; idle for a window, then every process's used bytes changing
        twice a second."""
        self.restart("churn", ["--history", "16", "--leak-sample", "3600"])
        d = self.daemon.pid
        self.r["cpu_history_only_idle"], self.r["idle_memory_history_only"] = self.idle_memory(
            "idle-history-only", self.a.cpu_s)
        # Warm-up: 136-263 x (alloc 1 MiB, free everything) per process (272-526 events): each
        # event history (capacity 16, in chunks of 256) is past its first chunk, with its
        # partial chunk at a different fill per process, so that the chunks' sum stays flat
        # while the window adds events.
        rnd = random.Random(1)
        for i, p in enumerate(self.procs):
            p.stdin.write(b"alloc 1\nfree\n" * (136 + rnd.randrange(128)))
            p.stdin.flush()
        rnd = random.Random(1)
        for i, p in enumerate(self.procs):
            for _ in range(2 * (136 + rnd.randrange(128))):
                p.stdout.readline()
            p.stdin.write(f"alloc {self.base_mib[i]}\n".encode())  # back to its base holding
            p.stdin.flush()
        for p in self.procs:
            p.stdout.readline()
        cycle = ["alloc 1\n", "alloc 1\n", "alloc 1\n", None]  # None: free, then the base again
        step = 0
        rss_log = []
        warm = self.a.churn_warm_s
        t_start = now()
        c0 = th0 = None
        p_sample = self.pids[:: max(1, len(self.pids) // 10)]
        late = 0
        next_tick = t_start
        next_rss = t_start + warm
        while True:
            t = now()
            if t - t_start >= warm + self.a.churn_s:
                break
            if c0 is None and t - t_start >= warm:
                c0, th0, tc0 = cpu_ticks(d), thread_ticks(d), t
                pts0 = [self.history_points(pid) for pid in p_sample]
                tp0 = now()
            if t >= next_tick:
                c = cycle[step % 4]
                # The base grows by 1 MiB a minute, so that each minute's largest value differs
                # from the last minute's too: a point a minute in the day range.
                level = step // 120
                for i, p in enumerate(self.procs):
                    p.stdin.write(c.encode() if c else f"free\nalloc {self.base_mib[i] + level}\n".encode())
                    p.stdin.flush()
                for p in self.procs:
                    p.stdout.readline()
                    if not c:
                        p.stdout.readline()
                step += 1
                next_tick += 0.5
                if now() > next_tick:
                    late += 1
            if c0 is not None and t >= next_rss:
                rss_log.append((t, rss(d)["RssAnon"]))
                next_rss += 5
            time.sleep(max(0.0, min(next_tick, next_rss) - now()))
        c1, th1, tc1 = cpu_ticks(d), thread_ticks(d), now()
        rss_log.append((tc1, rss(d)["RssAnon"]))
        pts1 = [self.history_points(pid) for pid in p_sample]
        tp1 = now()
        full = self.history_points()
        h0 = sum(x["hour_points"] for x in pts0) / len(pts0)
        h1 = sum(x["hour_points"] for x in pts1) / len(pts1)
        d0 = sum(x["day_points"] for x in pts0) / len(pts0)
        d1 = sum(x["day_points"] for x in pts1) / len(pts1)
        self.save_rss("churn", rss_log)
        self.r["churn"] = {
            "window_s": tc1 - tc0, "warm_s": warm, "ticks": step, "late_ticks": late,
            "cpu_s": (c1 - c0) / CLK_TCK, "core_pct": 100 * (c1 - c0) / CLK_TCK / (tc1 - tc0),
            "threads": [{"tid": tid, "name": "main" if tid == d else name,
                         "cpu_s": (ticks - th0.get(tid, (name, 0))[1]) / CLK_TCK}
                        for tid, (name, ticks) in sorted(th1.items())],
            "rss_anon_kib_first": rss_log[0][1], "rss_anon_kib_last": rss_log[-1][1],
            "rss_anon_slope_bytes_per_s": slope(rss_log) * 1024, "rss_samples": len(rss_log),
            "hour_points_per_s_per_series": (h1 - h0) / (tp1 - tp0),
            "day_points_per_s_per_series": (d1 - d0) / (tp1 - tp0),
            "sampled_processes": len(p_sample), "points_end": full, "load": loadavg(),
        }

    # ---- report ----------------------------------------------------------------------
    def versions(self):
        v = {}
        try:
            v["cuwardend"] = subprocess.run([os.path.join(self.build, "bin", "cuwardend"), "--version"],
                                            capture_output=True, text=True).stdout.strip()
        except OSError:
            v["cuwardend"] = "?"
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        try:
            v["commit"] = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True,
                                         text=True).stdout.strip()
        except OSError:
            v["commit"] = "?"
        cache = os.path.join(self.source_build, "CMakeCache.txt")
        if os.path.exists(cache):
            for line in open(cache):
                if line.startswith("CMAKE_BUILD_TYPE:"):
                    v["build_type"] = line.split("=", 1)[1].strip()
                if line.startswith("CMAKE_CXX_COMPILER:"):
                    cxx = line.split("=", 1)[1].strip()
                    v["compiler"] = subprocess.run([cxx, "--version"], capture_output=True,
                                                   text=True).stdout.splitlines()[0]
        with open("/proc/meminfo") as f:
            mem_kib = int(f.readline().split()[1])
        v["machine"] = (f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
                        f"{mem_kib / 1048576:.0f} GiB, Linux {platform.release()}")
        v["python"] = platform.python_version()
        return v

    def report(self):
        r = self.r
        r["command"] = "python3 bench/http_metrics.py " + " ".join(sys.argv[1:])
        n = r["procs"]
        m = r["metrics"]
        v = r["versions"]
        L = [f"# cuwardend's HTTP side with {n} interposed processes (simulated driver)", "",
             f"- machine: {v['machine']}",
             f"- build: {v.get('build_type', '?')}, {v.get('compiler', '?')}, commit {v['commit']}; "
             f"{v['cuwardend']}; Python {v['python']}",
             f"- command: `{r['command']}`",
             f"- load average (1, 5, 15 min) at the start: {r['load_start']}, at the end: {r['load_end']}; "
             f"per phase below", "",
             f"{n} `cuwt_alloc_loop` processes under `libcuwarden.so` on the simulated driver, {r['capped']} capped "
             f"(64M), {r['in_jobs']} in four jobs (1G each), each holding 1-4 MiB; started in {r['start_s']} s, all "
             f"{r['seen']} seen by the daemon. Their rings and live segments: {r['shm_kib'] / 1024:.0f} MiB of "
             f"/dev/shm (a ring is 1 MiB of events + 16 KiB; its size is fixed). One process's RssAnon (median of "
             f"a sample): {r['process_rss_anon_kib_median']:.0f} KiB.", ""]
        e, f = r["rss_daemon_empty_kib"], r["rss_daemon_full_kib"]
        per_proc = (f["RssAnon"] - e["RssAnon"]) * 1024 / n
        L += [f"Daemon RSS with no process: {e['VmRSS']} KiB (anonymous {e['RssAnon']} KiB); with {n}: "
              f"{f['VmRSS']} KiB (anonymous {f['RssAnon']} KiB; the rings' pages it has read: {f['RssShmem']} KiB): "
              f"{per_proc:,.0f} bytes of heap per process, all its state included, 3 s after the last one started.",
              ""]
        met = m["median_ms"] <= 50 and m["p90_ms"] <= 50 and m["bytes"] <= 5e6
        L += ["## /metrics", "",
              f"{m['n']} GETs on one keep-alive connection (Python http.client), timed from the request to the last "
              f"byte; load {m['load']}.", "",
              "| what | median | p90 | max | body | target | met |", "| --- | --- | --- | --- | --- | --- | --- |",
              f"| `/metrics` | {m['median_ms']:.1f} ms | {m['p90_ms']:.1f} ms | {m['max_ms']:.1f} ms | "
              f"{m['bytes']:,} bytes, {m['samples']:,} samples | ≤ 50 ms, ≤ 5 MB | "
              f"{'yes' if met else 'no'}{'' if m['max_ms'] <= 50 else ' (the max is over 50 ms)'} |"]
        if "metrics_curl" in r:
            c = r["metrics_curl"]
            L.append(f"| `/metrics` with curl ({c['n']} URLs, {c['connects']} connection) | {c['median_ms']:.1f} ms | "
                     f"{c['p90_ms']:.1f} ms | {c['max_ms']:.1f} ms | | | |")
        for k, path in (("state", "/api/v1/state"), ("history_hour", "/api/v1/history?range=hour")):
            x = r[k]
            L.append(f"| `{path}` ({x['n']} GETs) | {x['median_ms']:.1f} ms | | {x['max_ms']:.1f} ms | "
                     f"{x['bytes']:,} bytes | | |")
        L += ["", f"The first scrape, on a new connection: {m['first_ms']:.1f} ms. The daemon's CPU per scrape: "
              f"{m['daemon_cpu_ms_per_scrape']:.1f} ms (its utime + stime over the {m['n']} scrapes).", ""]
        L += ["## The daemon's CPU", "",
              "utime + stime of every thread, from /proc/PID/stat (10 ms ticks), over the window.", "",
              "| processes | daemon | asked | wall | CPU | share of a core | target ≤ 1% | load |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        rows = [("cpu_empty", "0", "defaults", "nothing", False),
                ("cpu_idle", f"{n} idle", "defaults", "nothing", True),
                ("cpu_scraped", f"{n} idle", "defaults", "/metrics every 15 s", True),
                ("long_idle", f"{n} idle", "defaults", "nothing", True),
                ("cpu_drain100", f"{n} idle", "`--drain-interval-ms 100`", "nothing", False),
                ("cpu_history_only_idle", f"{n} idle", "`--history 16 --leak-sample 3600`", "nothing", False),
                ("churn", f"{n}, used bytes changing twice a second ({n * 5 // 2:,} events/s)",
                 "`--history 16 --leak-sample 3600`", "nothing", False)]
        for k, procs, daemon, asked, target in rows:
            if k not in r:
                continue
            c = r[k]
            wall = c.get("wall_s", c.get("window_s"))
            met = ("yes" if c["core_pct"] <= 1 else "**no**") if target else "—"
            L.append(f"| {procs} | {daemon} | {asked} | {wall:.0f} s | {c['cpu_s']:.2f} s | {c['core_pct']:.2f}% | "
                     f"{met} | {c['load']} |")
        L.append("")
        for k, what in (("cpu_idle", f"{n} idle, nothing asking"), ("cpu_scraped", f"{n} idle, scraped")):
            th = ", ".join(f"{t['name']} {t['cpu_s']:.2f} s" for t in r[k]["threads"])
            L.append(f"Per thread, {what} (main: the scan and drain loop; the others: the unix socket's and "
                     f"HTTP's): {th}.")
        L.append("")

        def pts(x):
            a, b = x["points_before"], x["points_after"]
            return (f"{a['process_series']} process series held {a['hour_points']} → {b['hour_points']} hour points "
                    f"and {a['day_points']} → {b['day_points']} day points (the API adds the newest sample to each "
                    f"range)")

        im, ih, ch = r["idle_memory"], r["idle_memory_history_only"], r["churn"]
        idle_h_ph = ih["rss_anon_slope_bytes_per_s"] * 3600 / n
        ps = ch["rss_anon_slope_bytes_per_s"] / n
        hour_h = ch["hour_points_per_s_per_series"] * 3600
        day_h = ch["day_points_per_s_per_series"] * 3600
        L += ["## The history's memory", "",
              f"- Idle, defaults, {im['span_s']:.0f} s, {im['samples']} RssAnon samples: {im['rss_anon_kib_first']} → "
              f"{im['rss_anon_kib_last']} KiB, the largest rise between two samples {im['max_rise_kib']} KiB "
              f"(slope {im['rss_anon_slope_bytes_per_s']:,.0f} bytes/s); {pts(im)}.",
              *([f"- Idle, defaults, left alone for {r['long_idle']['wall_s']:.0f} s: RssAnon from the moment the "
                 f"daemon had seen every process: "
                 + ", ".join(f"{kib} KiB at {t:.0f} s" for t, kib in r["long_idle"]["log"][::4])
                 + f", {r['long_idle']['log'][-1][1]} KiB at {r['long_idle']['end_s']:.0f} s; the last rise of more "
                 f"than 64 KiB in 30 s at {r['long_idle']['last_rise_s']:.0f} s: "
                 f"{(r['long_idle']['log'][-1][1] - r['long_idle']['log'][0][1]) * 1024 / n:,.0f} bytes per process "
                 f"in all since discovery."] if "long_idle" in r else []),
              f"- Idle, `--history 16 --leak-sample 3600` (one leak sample per process, taken at discovery), "
              f"{ih['span_s']:.0f} s: {ih['rss_anon_kib_first']} → {ih['rss_anon_kib_last']} KiB, slope "
              f"{ih['rss_anon_slope_bytes_per_s']:,.0f} bytes/s ({idle_h_ph:,.0f} bytes per process-hour), the largest "
              f"rise between two samples {ih['max_rise_kib']} KiB; {pts(ih)}.",
              f"- Worst case, the same daemon, every process's used bytes changing twice a second in a cycle of four "
              f"values (so that any two samples a second apart differ) whose base grows by 1 MiB a minute (so that "
              f"each minute's largest value differs from the last one's), after a warm-up that leaves each process's "
              f"event history at a different fill (its chunks' sum then stays flat): {ch['window_s']:.0f} s after "
              f"{ch['warm_s']:.0f} s, {ch['ticks']} half-second ticks ({ch['late_ticks']} late), load {ch['load']}: "
              f"RssAnon {ch['rss_anon_kib_first']} → {ch['rss_anon_kib_last']} KiB over {ch['rss_samples']} samples, "
              f"slope {ch['rss_anon_slope_bytes_per_s']:,.0f} bytes/s = {ps:.1f} bytes/s per process. Points "
              f"counted through the API on {ch['sampled_processes']} processes: {hour_h:,.0f} hour points and "
              f"{day_h:.1f} day points per series-hour.", ""]
        bound = BOUND_POINTS * POINT_BYTES
        L += [f"A process on one device has one series of 4 values; a point is `uint32_t` + 4 × `uint64_t` = "
              f"{POINT_BYTES_PACKED} bytes, {POINT_BYTES} with its padding.", "",
              "| per process | bytes per process-hour | held at most |", "| --- | --- | --- |",
              f"| measured, worst case, RssAnon slope | {ps * 3600:,.0f} | |",
              f"| measured, worst case, points counted × {POINT_BYTES} bytes | {(hour_h + day_h) * POINT_BYTES:,.0f} | |",
              f"| bound, first hour: 3,600 + 60 points × {POINT_BYTES} bytes | {3660 * POINT_BYTES:,} | |",
              f"| bound, later hours (the hour range is full: the day range only) | {60 * POINT_BYTES:,} | "
              f"{bound:,} (3,602 + 1,442 points × {POINT_BYTES}; × {POINT_BYTES_PACKED} unpadded: "
              f"{BOUND_POINTS * POINT_BYTES_PACKED:,}) |",
              f"| measured, idle, RssAnon slope (`--leak-sample 3600`) | {idle_h_ph:,.0f} | |", ""]
        self.r["markdown"] = "\n".join(L)
        with open(os.path.join(self.out, "http-metrics.json"), "w") as f:
            json.dump(r, f, indent=1, default=str)
        with open(os.path.join(self.out, "http-metrics.md"), "w") as f:
            f.write(r["markdown"])
        print(r["markdown"])

    def cleanup(self):
        try:
            self.stop_processes()
        finally:
            try:
                self.stop_daemon()
            finally:
                shutil.rmtree(self.run_dir, ignore_errors=True)
                shutil.rmtree(self.build, ignore_errors=True)
                self.errlog.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="bench-out")
    ap.add_argument("--procs", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=50, help="processes started at once")
    ap.add_argument("--scrapes", type=int, default=50)
    ap.add_argument("--cpu-s", type=float, default=60, help="each CPU window")
    ap.add_argument("--empty-s", type=float, default=30, help="the CPU window with no process")
    ap.add_argument("--long-idle-s", type=float, default=0,
                    help="then the daemon left alone this long (RSS every 30 s; 0: skipped)")
    ap.add_argument("--churn-s", type=float, default=180)
    ap.add_argument("--churn-warm-s", type=float, default=20)
    a = ap.parse_args()
    raise_fd_limit(a.procs)

    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    b = Bench(a)
    try:
        b.phase_start()
        b.phase_scrapes()
        b.phase_idle()
        if a.long_idle_s > 0:
            b.phase_long_idle()
        b.phase_drain()
        b.phase_churn()
        b.r["load_end"] = loadavg()
    finally:
        b.cleanup()
        with open(os.path.join(b.out, "http-metrics.partial.json"), "w") as f:
            json.dump(b.r, f, indent=1, default=str)
    b.report()  # after cleanup: the programs' copies are gone, the version was read before


if __name__ == "__main__":
    main()
