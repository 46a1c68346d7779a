#!/usr/bin/env python3
"""cuwardend --http end to end, on the simulated driver.

--mode api: a capped program and one that is refused; every path of docs/http.md answers
what the rings say (/metrics values and families, the state, the history with its OOM mark,
a process's history, a snapshot with --http-snapshots, the event stream live and resumed
with Last-Event-ID, the dashboard's files, the errors); when the refused process is gone its
series go but the OOM counter stays.

--mode storm: hostile HTTP clients (hundreds of half-sent heads, a huge header, bursts of
connections past the cap, event streams that never read) while the test checks that the
unix socket (`cuwarden --json`) and other HTTP clients are answered all along, and that the
daemon is still there afterwards.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)
    print("ok: " + msg)


class Env:
    def __init__(self, args, extra_daemon_args):
        self.args = args
        self.tmp = tempfile.mkdtemp(prefix="cuwt-http-")
        self.run = os.path.join(self.tmp, "run")
        os.makedirs(self.run)
        self.env = dict(os.environ)
        self.env.update({"LD_LIBRARY_PATH": args.fakecuda, "CUWARDEN_RUN_DIR": self.run})
        self.procs = []
        self.log = open(os.path.join(self.tmp, "daemon.log"), "w+")
        self.daemon = subprocess.Popen(
            [args.daemon, "--run-dir", self.run, "--no-nvml", "--http", "127.0.0.1:0", "--exited-linger", "0",
             "--scan-interval-ms", "200"] + extra_daemon_args,
            stdout=self.log, stderr=self.log, env=self.env)
        self.port = None
        for _ in range(100):
            self.log.seek(0)
            m = re.search(r"serving HTTP on \S+ \(port (\d+)\)", self.log.read())
            if m:
                self.port = int(m.group(1))
                break
            if self.daemon.poll() is not None:
                break
            time.sleep(0.05)
        if not self.port:
            self.log.seek(0)
            fail("the daemon did not serve HTTP: " + self.log.read())

    def workload(self, limit, job=None):
        env = dict(self.env)
        env.update({"LD_PRELOAD": self.args.lib, "CUWARDEN_LIMIT": limit, "CUWARDEN_CALLSITES": "8"})
        if job:
            env.update({"CUWARDEN_JOB": job})
        p = subprocess.Popen([self.args.alloc_loop], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, env=env, text=True, bufsize=1)
        self.procs.append(p)
        line = p.stdout.readline()
        if not line.startswith("ready"):
            fail("workload did not start: " + line)
        p.pid_seen = int(line.split()[1])
        return p

    @staticmethod
    def ask(p, cmd):
        p.stdin.write(cmd + "\n")
        p.stdin.flush()
        return p.stdout.readline().strip()

    def get(self, path, headers=None, timeout=5):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        c.request("GET", path, headers=headers or {})
        r = c.getresponse()
        body = r.read()
        c.close()
        return r.status, dict(r.getheaders()), body

    def get_json(self, path):
        status, _, body = self.get(path)
        if status != 200:
            fail(f"{path}: HTTP {status}: {body[:300]!r}")
        return json.loads(body)

    def cli_json(self):
        out = subprocess.run([self.args.cli, "--json"], env=self.env, capture_output=True, text=True, timeout=10)
        if out.returncode != 0:
            fail("cuwarden --json failed: " + out.stderr)
        return json.loads(out.stdout)

    def wait_for(self, what, cond, timeout=30.0):
        end = time.time() + timeout
        while time.time() < end:
            v = cond()
            if v:
                return v
            time.sleep(0.1)
        fail("timed out waiting for " + what)

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        if self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            try:
                self.daemon.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                fail("the daemon did not stop on SIGTERM")
        shutil.rmtree(self.tmp, ignore_errors=True)


def metric(text, name, **labels):
    """The value of the sample `name` whose labels include `labels`, or None."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        m = re.match(r'[a-z_]+\{(.*)\} (\S+)$', line)
        got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(1)))
        if all(got.get(k) == str(v) for k, v in labels.items()):
            return int(float(m.group(2)))
    return None


def sse_reader(env, path, headers, out, stop):
    """Read server-sent events into `out` (dicts with id/event/data) until `stop` is set."""
    s = socket.create_connection(("127.0.0.1", env.port), timeout=10)
    req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{env.port}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    s.sendall(req.encode())
    buf = b""
    s.settimeout(0.2)
    while not stop.is_set():
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            continue
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            block, buf = buf.split(b"\n\n", 1)
            ev = {}
            for line in block.decode().splitlines():
                if line.startswith("HTTP/") or ":" not in line or line.startswith(":"):
                    continue
                k, v = line.split(":", 1)
                ev[k] = v[1:] if v.startswith(" ") else v
            if "data" in ev:
                out.append(ev)
    s.close()


def mode_api(args):
    web = tempfile.mkdtemp(prefix="cuwt-web-")
    with open(os.path.join(web, "index.html"), "w") as f:
        f.write("<!doctype html><title>cuwarden test page</title>\n")
    with open(os.path.join(web, "flame.js"), "w") as f:  # a module of the page
        f.write("export const x = 1;\n")
    e = Env(args, ["--http-snapshots", "--web-root", web])
    try:
        capped = e.workload("64M", job="slurm-4242")  # named as the Slurm plugin names jobs
        check(e.ask(capped, "alloc 16") == "ok", "the capped program allocates 16 MiB")
        refused = e.workload("8M")
        check(e.ask(refused, "alloc 16") == "refused", "the second program is refused 16 MiB over its 8 MiB cap")
        pid, rpid = capped.pid_seen, refused.pid_seen

        # /metrics reads the State the daemon last published (every scan): wait for the one
        # that has both programs' doings.
        text = e.wait_for("both processes in /metrics", lambda: (lambda t: t if metric(
            t, "cuwarden_process_memory_used_bytes", pid=rpid) is not None and metric(
            t, "cuwarden_process_memory_used_bytes", pid=pid) and metric(
            t, "cuwarden_ooms_total", cuwarden_job="") else None)(e.get("/metrics")[2].decode()))
        status, headers, _ = e.get("/metrics")
        check(headers.get("Content-Type", "").startswith("text/plain; version=0.0.4"), "/metrics is Prometheus text 0.0.4")
        # DNS rebinding: a page whose name now points here names itself in Host, and is refused.
        for host, want in (("attacker.example", 421), (f"attacker.example:{e.port}", 421), ("localhost", 200),
                           (f"127.0.0.1:{e.port}", 200), (f"[::1]:{e.port}", 200)):
            got = e.get("/api/v1/state", headers={"Host": host})[0]
            check(got == want, f"Host: {host} is answered {want} (got {got})")
        check(metric(text, "cuwarden_process_memory_used_bytes", pid=pid, gpu=0, cuwarden_job="slurm-4242",
                     slurm_job_id="4242") == 16 << 20,
              "used bytes of the capped program, labelled with its GPU, its job and the Slurm job id")
        check(metric(text, "cuwarden_process_memory_used_bytes", pid=rpid, slurm_job_id="") is None,
              "no Slurm job id on a process outside a Slurm job")
        check(metric(text, "cuwarden_process_memory_limit_bytes", pid=pid) == 64 << 20, "its cap")
        check(metric(text, "cuwarden_process_memory_peak_bytes", pid=pid) == 16 << 20, "its peak")
        check(metric(text, "cuwarden_process_allocations", pid=pid) == 1, "its live allocations")
        check(metric(text, "cuwarden_ooms_total", cuwarden_job="") == 1, "one refusal counted for the unjobbed user: "
              + " ".join(l for l in text.splitlines() if l.startswith("cuwarden_ooms_total")))
        check(metric(text, "cuwarden_allocations_total", cuwarden_job="slurm-4242", slurm_job_id="4242") == 1,
              "allocations counted per job")
        check(metric(text, "cuwarden_job_memory_used_bytes", cuwarden_job="slurm-4242", slurm_job_id="4242") == 16 << 20,
              "the job's used bytes")
        check(metric(text, "cuwarden_job_memory_peak_bytes", cuwarden_job="slurm-4242") == 16 << 20, "the job's peak")
        check(metric(text, "cuwarden_device_memory_total_bytes", gpu=0) is not None, "the device's total")
        check(metric(text, "cuwarden_processes") == 2, "two processes running")
        for fam in ("process_memory_used_bytes", "process_memory_peak_bytes", "process_memory_limit_bytes",
                    "process_memory_reserved_bytes", "process_allocations", "allocations_total", "ooms_total",
                    "events_dropped_total", "job_memory_used_bytes", "job_memory_peak_bytes", "job_memory_limit_bytes",
                    "device_memory_total_bytes"):
            check(f"# TYPE cuwarden_{fam} " in text, f"family cuwarden_{fam} is declared")
        if shutil.which("promtool"):
            r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
            check(r.returncode == 0, "promtool check metrics accepts /metrics: " + (r.stdout + r.stderr).strip())

        state, cli = e.get_json("/api/v1/state"), e.cli_json()

        def used_by_pid(doc):
            return {p["pid"]: [d["used_bytes"] for d in p["devices"]] for p in doc["processes"]}
        check(set(state) == set(cli) and used_by_pid(state) == used_by_pid(cli) == {pid: [16 << 20], rpid: [0]},
              "/api/v1/state is the document `cuwarden --json` prints")

        hist = e.wait_for("the refusal's mark in the history", lambda: (lambda h: h if any(
            p["pid"] == rpid and p["ooms"] for p in h["processes"]) else None)(e.get_json("/api/v1/history")))
        check(hist["range"] == "hour" and hist["interval_s"] == 1, "the hour range, a point a second")
        hp = next(p for p in hist["processes"] if p["pid"] == pid)
        dev = hp["devices"][0]
        check(dev["used_bytes"][-1] == 16 << 20 and dev["limit_bytes"][-1] == 64 << 20,
              "the process's series ends at its used bytes and cap")
        check(len(dev["t"]) == len(dev["used_bytes"]) == len(dev["peak_bytes"]), "parallel arrays")
        oom = next(p for p in hist["processes"] if p["pid"] == rpid)["ooms"][0]
        check(oom["kind"] == "refuse" and oom["bytes"] == 16 << 20, "the OOM mark: a refusal of 16 MiB")
        check(any(j["name"] == "slurm-4242" for j in hist["jobs"]), "the job has a series")
        check(hist["gpus"] and hist["gpus"][0]["used_bytes"][-1] >= 16 << 20, "the GPU has a series")
        one = e.get_json(f"/api/v1/processes/{pid}/history?range=day")
        check(one["pid"] == pid and one["range"] == "day" and one["interval_s"] == 60, "one process's day history")
        check(e.get("/api/v1/processes/999999999/history")[0] == 404, "an unknown pid: 404")
        check(e.get("/api/v1/history?range=week")[0] == 400, "a bad range: 400")

        snap = e.get_json(f"/api/v1/processes/{pid}/snapshot?format=json&top=5")
        check(snap["pid"] == pid and snap["sites"] and snap["sites"][0]["live_bytes"] == 16 << 20,
              "a snapshot over HTTP (--http-snapshots) names the call site holding the 16 MiB")
        status, _, body = e.get(f"/api/v1/processes/{pid}/snapshot?format=summary")
        check(status == 200 and b"Allocations" in body, "the summary format")
        native = e.get_json(f"/api/v1/processes/{pid}/snapshot?format=json&top=5&by=native")
        check([(s["id"], s["live_bytes"]) for s in native["sites"]] == [(s["id"], s["live_bytes"]) for s in snap["sites"]],
              "by=native: one site per native stack (the same sites here)")
        status, _, body = e.get(f"/api/v1/processes/{pid}/snapshot?format=json&by=stack")
        check(status == 400 and json.loads(body)["error"] == "by must be user or native", "a bad by: 400 saying why")

        # The event stream: live, and resumed with Last-Event-ID.
        events, stop = [], threading.Event()
        t = threading.Thread(target=sse_reader, args=(e, f"/api/v1/events?pid={pid}", {}, events, stop))
        t.start()
        time.sleep(0.3)
        check(e.ask(capped, "alloc 4") == "ok", "the capped program allocates 4 MiB more")
        e.wait_for("the allocation on the stream", lambda: any(
            ev.get("event") == "memory" and json.loads(ev["data"])["bytes"] == 4 << 20 for ev in events))
        e.wait_for("a state document on the stream", lambda: any(ev.get("event") == "state" for ev in events))
        stop.set()
        t.join()
        mem = [json.loads(ev["data"]) for ev in events if ev.get("event") == "memory"]
        check(all(m["pid"] == pid for m in mem), "?pid= keeps one process's events")
        check(all(ev.get("id") == str(json.loads(ev["data"])["seq"]) for ev in events if ev.get("event") == "memory"),
              "each memory event carries its number as the SSE id")
        resumed, stop = [], threading.Event()
        t = threading.Thread(target=sse_reader, args=(e, "/api/v1/events?state=0", {"Last-Event-ID": "0"}, resumed, stop))
        t.start()
        e.wait_for("the backlog after Last-Event-ID 0", lambda: len(resumed) >= 3)
        stop.set()
        t.join()
        seqs = [int(ev["id"]) for ev in resumed]
        check(seqs == sorted(seqs) and seqs[0] == 1, "Last-Event-ID 0 replays the kept events in order")
        check(all(ev.get("event") == "memory" for ev in resumed), "state=0: no state documents")

        status, headers, body = e.get("/")
        check(status == 200 and b"cuwarden test page" in body and headers["Content-Type"].startswith("text/html"),
              "/ serves the dashboard's index.html from --web-root")
        check(e.get("/nope.js")[0] == 404, "a missing file: 404")
        status, headers, body = e.get("/flame.js")
        check(status == 200 and headers["Content-Type"].startswith("text/javascript"),
              "the page's modules are served as JavaScript (module scripts need it)")
        status, _, body = e.get("/api/v1/%97%ff")
        check(status == 404 and json.loads(body)["error"].startswith("no such path"),
              "a path that is not UTF-8: 404 with a JSON error")
        check(e.get("/../etc/passwd")[0] == 404, "no way out of the web root")
        c = http.client.HTTPConnection("127.0.0.1", e.port, timeout=5)
        c.request("POST", "/metrics", body=b"")
        r = c.getresponse()
        check(r.status == 405 and b"read only" in r.read(), "POST: 405, the HTTP interface is read only")

        # The refused process goes: its series go, its refusal stays counted.
        refused.stdin.close()
        refused.wait(timeout=5)
        e.wait_for("the refused process gone from /metrics", lambda: metric(
            e.get("/metrics")[2].decode(), "cuwarden_process_memory_used_bytes", pid=rpid) is None, timeout=30)
        text = e.get("/metrics")[2].decode()
        check(metric(text, "cuwarden_ooms_total", cuwarden_job="") == 1,
              "cuwarden_ooms_total still counts the refusal of the process that is gone")
        check(metric(text, "cuwarden_processes") == 1, "one process running")

        # One refused that exits at once, before any scan publishes its refusal: still counted.
        quick = e.workload("8M", job="quick")
        check(e.ask(quick, "alloc 16") == "refused", "a third program is refused and exits at once")
        quick.stdin.close()
        quick.wait(timeout=5)
        e.wait_for("its refusal in cuwarden_ooms_total", lambda: metric(
            e.get("/metrics")[2].decode(), "cuwarden_ooms_total", cuwarden_job="quick") == 1, timeout=30)
        check(metric(e.get("/metrics")[2].decode(), "cuwarden_process_memory_used_bytes", pid=quick.pid_seen) is None,
              "its refusal is counted though its series are gone")
    finally:
        e.close()
        shutil.rmtree(web, ignore_errors=True)


def mode_storm(args):
    e = Env(args, [])
    hostile = []
    try:
        capped = e.workload("64M")
        check(e.ask(capped, "alloc 8") == "ok", "a program holds 8 MiB")
        pid = capped.pid_seen
        e.wait_for("the program in /metrics", lambda: metric(
            e.get("/metrics")[2].decode(), "cuwarden_process_memory_used_bytes", pid=pid) == 8 << 20)

        stop = threading.Event()
        failures = []
        rounds = [0]
        ok_rounds = [0]
        bursting = threading.Event()  # during a burst past the cap, a 503 that says so is the answer

        def good_clients():
            while not stop.is_set():
                rounds[0] += 1
                t0 = time.time()
                try:
                    burst = bursting.is_set()
                    status, _, body = e.get("/metrics", timeout=10)
                    if status == 503 and (burst or bursting.is_set()) and b"too many connections" in body:
                        pass
                    elif status != 200 or metric(body.decode(), "cuwarden_process_memory_used_bytes", pid=pid) != 8 << 20:
                        failures.append(f"/metrics answered {status}")
                    else:
                        ok_rounds[0] += 1
                    if e.cli_json()["processes"][0]["pid"] != pid:
                        failures.append("cuwarden --json lost the process")
                except Exception as ex:  # noqa: BLE001 - any failure is the finding
                    failures.append(f"{type(ex).__name__}: {ex}")
                # Starvation, not slowness: a round takes milliseconds, seconds on a busy
                # machine beside the flood; the rounds' own requests give up at 10 s.
                if time.time() - t0 > 20:
                    failures.append(f"a round took {time.time() - t0:.1f} s")
                time.sleep(0.05)

        # 200 half-sent heads (slowloris), kept open.
        for _ in range(200):
            s = socket.create_connection(("127.0.0.1", e.port))
            s.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
            hostile.append(s)
        good = threading.Thread(target=good_clients)
        good.start()
        # Event streams that never read: they fall behind and are dropped, or refused past the cap.
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", e.port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(b"GET /api/v1/events HTTP/1.1\r\n\r\n")
            hostile.append(s)
        # A huge header, and garbage.
        s = socket.create_connection(("127.0.0.1", e.port))
        s.sendall(b"GET / HTTP/1.1\r\nX: " + b"a" * 100000 + b"\r\n\r\n")
        reply = s.recv(100)
        check(reply.startswith(b"HTTP/1.1 431"), "a 100 kB header: 431")
        s.close()
        s = socket.create_connection(("127.0.0.1", e.port))
        s.sendall(bytes(range(256)) * 8)
        check(s.recv(100).startswith(b"HTTP/1.1 400"), "binary garbage: 400")
        s.close()
        # Bursts of connections well past the cap (256): each one is answered or told why.
        # The slow clients' heads are a second old by now: ordinary clients take their slots.
        time.sleep(1.2)
        before = ok_rounds[0]
        time.sleep(1)
        check(ok_rounds[0] > before, f"with 200 slow clients holding connections, /metrics answered "
                                     f"{ok_rounds[0] - before} times in a second")
        refused = answered = 0
        bursting.set()
        for _ in range(3):
            burst = []
            for _ in range(600):
                try:
                    burst.append(socket.create_connection(("127.0.0.1", e.port), timeout=5))
                except OSError:
                    refused += 1
            for s in burst:
                try:
                    s.sendall(b"GET /api/v1/state HTTP/1.1\r\nConnection: close\r\n\r\n")
                    head = s.recv(16)
                    if head.startswith(b"HTTP/1.1 200") or head.startswith(b"HTTP/1.1 503"):
                        answered += 1
                except OSError:
                    refused += 1
                s.close()
        check(answered > 0, f"connection bursts: {answered} answered (200 or 503), {refused} reset")
        time.sleep(0.5)
        bursting.clear()
        before = ok_rounds[0]
        time.sleep(1)
        check(ok_rounds[0] > before, "after the bursts, /metrics answers 200 again")
        stop.set()
        good.join()
        check(rounds[0] >= 5, f"{rounds[0]} rounds of ordinary clients during the storm")
        check(not failures, "the unix socket and /metrics answered all along" + (": " + "; ".join(failures[:5]) if failures else ""))
        check(e.daemon.poll() is None, "the daemon is still running")
        check(e.get("/metrics")[0] == 200, "and still serves HTTP")
    finally:
        for s in hostile:
            s.close()
        e.close()


def main():
    ap = argparse.ArgumentParser()
    for a in ("daemon", "cli", "lib", "fakecuda", "alloc-loop"):
        ap.add_argument("--" + a, required=True)
    ap.add_argument("--mode", choices=("api", "storm"), required=True)
    args = ap.parse_args()
    {"api": mode_api, "storm": mode_storm}[args.mode](args)
    print("PASS")


if __name__ == "__main__":
    main()
