#!/usr/bin/env python3
"""cuwardend's /metrics scraped by a real Prometheus server, with the site's own configuration.

    prometheus_server_test.py server    --daemon D --lib L --alloc-loop A --fakecuda DIR --repo REPO
    prometheus_server_test.py two_nodes --daemon D --lib L --alloc-loop A --fakecuda DIR --repo REPO

Processes run under the interposer on the simulated driver (cuwt_alloc_loop). Prometheus
(Debian's `prometheus`, from PATH or $PROMETHEUS; promtool from PATH or $PROMTOOL) runs with
a copy of dashboards/prometheus/prometheus.yml whose target is rewritten to the daemons'
ports and whose intervals are 1 s, the rule file beside it, its own TSDB in a temporary
directory and a free loopback port. Everything is asked through Prometheus's HTTP API.

server: one daemon (--exited-linger 0), a capped process and a second one refused by its
cap. `promtool check metrics` passes on /metrics; the capped process's used bytes are what
it allocated; once the refused process has exited and the daemon has forgotten it, its
per-process series are stale at once (gone from instant queries, though inside the 5 min
look-back), while cuwarden_ooms_total, per job and summed per user and GPU, still counts the
refusal and the alert CuwardenOutOfMemory is pending or firing for its job, and only there.

two_nodes: two daemons (two run directories, two ports) stand in for two nodes, one
Prometheus scrapes both under the one job; one member of a cuwarden job runs under each.
Both daemons name the same host here, so the series differ by `instance` only, as any site
has them. The Grafana board's "Jobs summed across nodes" queries (read from
dashboards/grafana/cuwarden.json) and the recording rules give the sum of both members'
bytes and of both nodes' job caps, and follow a member that allocates more.

Without prometheus or promtool the test fails; it never skips. Every process started here
is killed (its process group) whatever happens, and dies with this script.
"""
import argparse
import ctypes
import json
import os
import pathlib
import pwd
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

MiB = 1 << 20
DEADLINE = time.monotonic() + 100  # ctest's TIMEOUT is 120 s: leave time to clean up
TARGET = "127.0.0.1:9477"  # the one target written in prometheus.yml


class Failure(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)
    print("ok: " + msg, flush=True)


def tool(name, env):
    path = os.environ.get(env) or shutil.which(name)
    if not path or not os.access(path, os.X_OK):
        raise Failure(f"{name} not found (on PATH or in ${env}): install Debian's `prometheus` package "
                      "(scripts/setup.sh does); this test does not skip without it")
    return path


def wait_for(what, probe, timeout=15.0, every=0.2):
    """probe() -> (done, last observation); fails with the last observation after timeout."""
    end = min(time.monotonic() + timeout, DEADLINE)
    while True:
        done, seen = probe()
        if done:
            return seen
        if time.monotonic() >= end:
            raise Failure(f"timed out waiting for {what}; last seen: {seen}")
        time.sleep(every)


# ---- processes ---------------------------------------------------------------------------
_libc = ctypes.CDLL(None, use_errno=True)


def _child_setup():
    # Own process group (start_new_session), and SIGKILL when this script dies, even by
    # SIGKILL from ctest's timeout, when no finally block runs.
    _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Procs:
    """Every process started, killed by process group in reverse order."""

    def __init__(self):
        self.all = []  # (name, Popen)

    def start(self, name, argv, **kw):
        p = subprocess.Popen(argv, start_new_session=True, preexec_fn=_child_setup, **kw)
        self.all.append((name, p))
        return p

    def stop(self, p, grace=5.0):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(p.pid, signal.SIGKILL)  # whatever is left of its group
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            print(f"warning: pid {p.pid} survived SIGKILL", flush=True)

    def stop_all(self):
        for name, p in reversed(self.all):
            try:
                self.stop(p)
            except Exception as e:  # keep going: the others must go too
                print(f"warning: stopping {name} (pid {p.pid}): {e}", flush=True)


class Workload:
    """cuwt_alloc_loop under the interposer: one command line in, one answer line out."""

    def __init__(self, procs, args, run_dir, tmp, name, env_extra):
        env = dict(os.environ)
        env.update({"LD_LIBRARY_PATH": args.fakecuda, "CUWARDEN_RUN_DIR": run_dir, "LD_PRELOAD": args.lib})
        env.update(env_extra)
        self.name = name
        self.err_path = os.path.join(tmp, f"{name}.stderr")
        self.p = procs.start(name, [args.alloc_loop], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=open(self.err_path, "w"), env=env)
        self.buf = b""
        line = self.read_line(10)
        m = re.fullmatch(r"ready (\d+)", line)
        if not m:
            raise Failure(f"{name}: expected 'ready PID', got {line!r} ({self.stderr()})")
        self.pid = int(m.group(1))
        check(self.pid == self.p.pid, f"{name} runs under the interposer as pid {self.pid}")

    def stderr(self):
        try:
            return open(self.err_path).read().strip()[-2000:]
        except OSError:
            return ""

    def read_line(self, timeout):
        end = time.monotonic() + timeout
        fd = self.p.stdout.fileno()
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise Failure(f"{self.name}: no answer within {timeout} s ({self.stderr()})")
            chunk = os.read(fd, 4096)
            if not chunk:
                raise Failure(f"{self.name}: ended (exit {self.p.wait()}) without answering ({self.stderr()})")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def ask(self, cmd, want):
        self.p.stdin.write((cmd + "\n").encode())
        self.p.stdin.flush()
        got = self.read_line(10)
        check(got == want, f"{self.name}: '{cmd}' -> '{got}' (expected '{want}')")

    def finish(self):
        """End of input: the program frees what it holds and exits 0."""
        self.p.stdin.close()
        rc = self.p.wait(timeout=10)
        check(rc == 0, f"{self.name} (pid {self.pid}) exited with {rc}")


class Daemon:
    def __init__(self, procs, args, tmp, name):
        self.run = os.path.join(tmp, name)
        os.makedirs(self.run)
        self.log = os.path.join(tmp, f"{name}.log")
        env = dict(os.environ, LD_LIBRARY_PATH=args.fakecuda)
        # --exited-linger 0: an exited process is forgotten at the next scan (its series go);
        # scans every 250 ms rather than 1 s find exits sooner.
        self.p = procs.start(name, [args.daemon, "--run-dir", self.run, "--no-nvml", "--http", "127.0.0.1:0",
                                    "--exited-linger", "0", "--scan-interval-ms", "250", "--log-level", "info"],
                             stdin=subprocess.DEVNULL, stdout=open(self.log, "w"), stderr=subprocess.STDOUT, env=env)

        def port():
            if self.p.poll() is not None:
                raise Failure(f"{name} exited with {self.p.returncode}: {self.log_tail()}")
            m = re.search(r"serving HTTP on \S+ \(port (\d+)\)", open(self.log).read())
            return bool(m), m and int(m.group(1))
        self.port = wait_for(f"{name} to serve HTTP", port, timeout=10, every=0.05)
        self.address = f"127.0.0.1:{self.port}"
        print(f"{name}: /metrics on {self.address}", flush=True)

    def log_tail(self):
        try:
            return open(self.log).read()[-3000:]
        except OSError:
            return ""

    def metrics(self):
        with urllib.request.urlopen(f"http://{self.address}/metrics", timeout=5) as r:
            ctype = r.headers.get("Content-Type", "")
            return r.read().decode(), ctype


def sample_value(text, name, **labels):
    """The value of the one sample of `name` whose labels include `labels`, else None."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        body, value = line[len(name) + 1:].rsplit("} ", 1)
        have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', body))
        if all(have.get(k) == v for k, v in labels.items()):
            return float(value)
    return None


# ---- Prometheus --------------------------------------------------------------------------
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def site_config(repo, addresses):
    """dashboards/prometheus/prometheus.yml with the target and intervals rewritten."""
    text = (repo / "dashboards/prometheus/prometheus.yml").read_text()
    out, counts = [], {"target": 0, "scrape_interval": 0, "evaluation_interval": 0, "scrape_timeout": 0}
    targets = ", ".join(f"'{a}'" for a in addresses)
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            out.append(line)
            continue
        if f"'{TARGET}'" in line:
            line = line.replace(f"'{TARGET}'", targets)
            counts["target"] += 1
        for key in ("scrape_interval", "evaluation_interval", "scrape_timeout"):
            line, n = re.subn(rf"^(\s*{key}:\s*)\S+", r"\g<1>1s", line)
            counts[key] += n
        out.append(line)
    for key, n in counts.items():
        if n == 0:
            raise Failure(f"prometheus.yml: found no {key} to rewrite (its layout changed?)")
    if not re.search(r"^\s*-\s*job_name:\s*['\"]?cuwarden['\"]?\s*$", text, re.M):
        raise Failure("prometheus.yml: no scrape job named cuwarden")
    if not re.search(r"^\s*-\s*cuwarden\.rules\.yml\s*$", text, re.M):
        raise Failure("prometheus.yml: does not name the rule file cuwarden.rules.yml")
    return "\n".join(out) + "\n"


class Prometheus:
    def __init__(self, procs, repo, tmp, addresses):
        d = pathlib.Path(tmp) / "prometheus"
        d.mkdir()
        shutil.copy(repo / "dashboards/prometheus/cuwarden.rules.yml", d / "cuwarden.rules.yml")
        config = d / "prometheus.yml"
        config.write_text(site_config(repo, addresses))
        r = subprocess.run([tool("promtool", "PROMTOOL"), "check", "config", str(config)], capture_output=True,
                           text=True, timeout=60)
        check(r.returncode == 0, f"promtool check config on the rewritten copy ({', '.join(addresses)})"
              + ("" if r.returncode == 0 else f":\n{r.stdout}{r.stderr}"))
        self.log = d / "prometheus.log"
        binary = tool("prometheus", "PROMETHEUS")
        for attempt in range(3):  # a free port can be taken before Prometheus binds it
            self.port = free_port()
            self.p = procs.start("prometheus", [
                binary, f"--config.file={config}", f"--storage.tsdb.path={d / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdin=subprocess.DEVNULL, stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
            self.base = f"http://127.0.0.1:{self.port}"

            def ready():
                if self.p.poll() is not None:
                    return True, f"exited with {self.p.returncode}"
                try:
                    with urllib.request.urlopen(self.base + "/-/ready", timeout=2) as r:
                        return r.status == 200, r.status
                except (urllib.error.URLError, OSError) as e:
                    return False, str(e)
            seen = wait_for("Prometheus to be ready (/-/ready)", ready, timeout=20, every=0.05)
            if self.p.poll() is None:
                break
            if "address already in use" not in self.log_tail() or attempt == 2:
                raise Failure(f"prometheus {seen}: {self.log_tail()}")
        print(f"prometheus: ready on {self.base}", flush=True)

    def log_tail(self):
        try:
            return self.log.read_text()[-3000:]
        except OSError:
            return ""

    def api(self, path, **params):
        url = f"{self.base}/api/v1/{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                doc = json.load(r)
        except urllib.error.HTTPError as e:  # a query Prometheus refused: its reason
            raise Failure(f"{url}: {e.code} {e.read().decode(errors='replace')}")
        if doc.get("status") != "success":
            raise Failure(f"{url}: {doc}")
        return doc["data"]

    def query(self, expr):
        """[(labels, value)] of an instant vector query."""
        data = self.api("query", query=expr)
        if data["resultType"] != "vector":
            raise Failure(f"{expr}: a {data['resultType']}, not a vector")
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def wait_value(self, what, expr, want, timeout=15.0):
        """Wait until `expr` gives exactly one series whose value is `want`."""
        def probe():
            res = self.query(expr)
            return len(res) == 1 and res[0][1] == want, res
        res = wait_for(f"{what} ({expr} == {want:.0f})", probe, timeout)
        check(True, f"{what}: {expr} = {want:.0f}")
        return res[0][0]

    def wait_targets_up(self, addresses):
        """Every daemon scraped, healthy, with no scrape error (the exposition parsed)."""
        def probe():
            active = self.api("targets", state="active")["activeTargets"]
            seen = {t["labels"].get("instance"): (t["health"], t["lastError"]) for t in active}
            return all(seen.get(a) == ("up", "") for a in addresses), seen
        # Prometheus 2.42 applies its targets on the scrape manager's first 5 s tick.
        wait_for("Prometheus to scrape " + ", ".join(addresses), probe, timeout=20)
        check(True, f"Prometheus scrapes {', '.join(addresses)} (health up, no scrape error)")
        for a in addresses:
            check(self.query(f'up{{job="cuwarden", instance="{a}"}}') == [({"__name__": "up", "job": "cuwarden",
                                                                              "instance": a}, 1.0)],
                  f'up{{job="cuwarden", instance="{a}"}} is 1')


def promtool_check_metrics(text, what):
    r = subprocess.run([tool("promtool", "PROMTOOL"), "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    out = (r.stdout + r.stderr).strip()
    if out:
        print(f"promtool check metrics ({what}) says:\n{out}", flush=True)
    check(r.returncode == 0 and not out, f"promtool check metrics: no errors, no lint warnings ({what})")


def user_name():
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


# ---- server: one node, a capped process and a refused one ---------------------------------
def test_server(args, procs, tmp):
    repo = pathlib.Path(args.repo)
    user = user_name()
    d = Daemon(procs, args, tmp, "daemon")
    prom = Prometheus(procs, repo, tmp, [d.address])  # its first scrape comes ~5 s later: start the rest now

    capped = Workload(procs, args, d.run, tmp, "capped", {"CUWARDEN_LIMIT": "64M"})
    capped.ask("alloc 10", "ok")
    capped.ask("alloc 20", "ok")
    capped_bytes = 30 * MiB
    refused = Workload(procs, args, d.run, tmp, "refused", {"CUWARDEN_LIMIT": "16M", "CUWARDEN_JOB": "oomtest"})
    refused.ask("alloc 8", "ok")

    def daemon_sees(pid, value):
        text, _ = d.metrics()
        v = sample_value(text, "cuwarden_process_memory_used_bytes", pid=str(pid))
        return v == value, v
    wait_for("the daemon to find both processes", lambda: (daemon_sees(capped.pid, capped_bytes)[0] and
                                                           daemon_sees(refused.pid, 8 * MiB)[0], None), timeout=10)
    text, ctype = d.metrics()
    check(ctype.startswith("text/plain") and "version=0.0.4" in ctype, f"/metrics Content-Type: {ctype}")
    promtool_check_metrics(text, "two running processes")

    prom.wait_targets_up([d.address])
    # The counter's series exists at 0 before the refusal: increase() needs two samples.
    job_oom = f'cuwarden_ooms_total{{cuwarden_job="oomtest", user="{user}", gpu="0"}}'
    prom.wait_value("the refused process's job has its counter at 0 before", job_oom, 0)
    prom.wait_value("the refused process's used bytes", f'cuwarden_process_memory_used_bytes{{pid="{refused.pid}"}}',
                    8 * MiB)
    labels = prom.wait_value("the capped process's used bytes are what it allocated",
                             f'cuwarden_process_memory_used_bytes{{pid="{capped.pid}"}}', capped_bytes)
    check(labels.get("process") == "cuwt_alloc_loop" and labels.get("user") == user and labels.get("gpu") == "0"
          and labels.get("uuid", "").startswith("GPU-") and labels.get("cuwarden_job") is None
          and labels.get("job") == "cuwarden" and labels.get("instance") == d.address and labels.get("hostname"),
          f"its labels: {labels}")
    prom.wait_value("the capped process's cap", f'cuwarden_process_memory_limit_bytes{{pid="{capped.pid}"}}', 64 * MiB)
    prom.wait_value("the capped process's peak", f'cuwarden_process_memory_peak_bytes{{pid="{capped.pid}"}}',
                    capped_bytes)
    prom.wait_value("the capped process's live allocations", f'cuwarden_process_allocations{{pid="{capped.pid}"}}', 2)

    refused.ask("alloc 32", "refused")
    check("out of memory" in refused.stderr(), "the refused process was told why on stderr")
    # The daemon keeps a forgotten process's counters as it last published them: with
    # --exited-linger 0, a process that exits before a scan has published its refusal is
    # forgotten with the refusal uncounted (a defect of the daemon's, not what this test is
    # about). So the process exits only once /metrics has shown the refusal.
    wait_for("the daemon to count the refusal",
             lambda: (sample_value(d.metrics()[0], "cuwarden_ooms_total", cuwarden_job="oomtest") == 1, None), 10)
    promtool_check_metrics(d.metrics()[0], "after a refusal")
    prom.wait_value("Prometheus has the refusal while the process runs", job_oom, 1)
    refused.finish()

    per_process = f'{{__name__=~"cuwarden_.+", pid="{refused.pid}"}}'
    wait_for("the daemon to forget the refused process",
             lambda: (f'pid="{refused.pid}"' not in d.metrics()[0], None), timeout=10)
    promtool_check_metrics(d.metrics()[0], "after the refused process was forgotten")
    seen = wait_for(f"its series to go stale ({per_process} empty)",
                    lambda: (lambda r: (r == [], r))(prom.query(per_process)), timeout=10)
    check(seen == [], f"no per-process series of pid {refused.pid} in an instant query")
    # The look-back is 5 minutes: without staleness markers the last samples would still
    # answer. They are there to be found over a range.
    held = prom.query(f'count_over_time(cuwarden_process_memory_used_bytes{{pid="{refused.pid}"}}[5m])')
    check(len(held) == 1 and held[0][1] >= 1, f"its samples are still stored ({held}): the series went stale, "
          "they did not merely go unscraped")
    check(prom.query(f'cuwarden_process_memory_used_bytes{{pid="{capped.pid}"}}')[0][1] == capped_bytes,
          "the capped process's series stay")

    prom.wait_value("the refusal is still counted per job after the process went", job_oom, 1, timeout=5)
    prom.wait_value("and summed for its user and GPU",
                    f'sum by (user, gpu) (cuwarden_ooms_total{{user="{user}", gpu="0"}})', 1, timeout=5)

    def alert():
        res = prom.query('ALERTS{alertname="CuwardenOutOfMemory"}')
        return any(m.get("cuwarden_job") == "oomtest" and m.get("alertstate") in ("pending", "firing")
                   for m, _ in res), res
    res = wait_for("CuwardenOutOfMemory for job oomtest", alert, timeout=10)
    check(True, "CuwardenOutOfMemory is " + ", ".join(sorted({m["alertstate"] for m, _ in res})))
    check(all(m.get("cuwarden_job") == "oomtest" and m.get("user") == user and m.get("gpu") == "0"
              and m.get("severity") == "critical" for m, _ in res),
          f"only for the job, user and GPU refused (not the capped process): {[m for m, _ in res]}")
    listed = [a for a in prom.api("alerts")["alerts"] if a["labels"].get("alertname") == "CuwardenOutOfMemory"]
    check(len(listed) == 1 and listed[0]["labels"].get("cuwarden_job") == "oomtest"
          and "refused GPU memory" in listed[0]["annotations"].get("summary", ""),
          f"/api/v1/alerts lists it with its summary: {[a['annotations'].get('summary') for a in listed]}")
    capped.finish()


# ---- two_nodes: one job, a member on each node -------------------------------------------
def board_job_sums(repo, job, user):
    """The Grafana board's "Jobs summed across nodes" queries (used, caps), its variables set to
    one job and user."""
    doc = json.loads((repo / "dashboards/grafana/cuwarden.json").read_text())

    def panels(ps):
        for p in ps:
            yield p
            yield from panels(p.get("panels", []))
    found = [p for p in panels(doc["panels"]) if "summed across nodes" in p.get("title", "").lower()]
    if len(found) != 1:
        raise Failure(f"cuwarden.json: expected one panel 'Jobs summed across nodes', found {len(found)}")
    values = {"cuwarden_job": re.escape(job), "user": re.escape(user)}
    out = {}
    for what, metric in (("used", "cuwarden_job_memory_used_bytes"), ("caps", "cuwarden_job_memory_limit_bytes")):
        exprs = [t["expr"] for t in found[0].get("targets", []) if metric in t.get("expr", "")]
        if len(exprs) != 1:
            raise Failure(f"cuwarden.json: 'Jobs summed across nodes' has {len(exprs)} queries of {metric}, not one")
        out[what] = re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), ".*"), exprs[0])
        print(f"the board's {what} query: {exprs[0]}\n  as run: {out[what]}", flush=True)
    return out


def test_two_nodes(args, procs, tmp):
    repo = pathlib.Path(args.repo)
    user = user_name()
    nodes = [Daemon(procs, args, tmp, "node1"), Daemon(procs, args, tmp, "node2")]
    addresses = [n.address for n in nodes]
    prom = Prometheus(procs, repo, tmp, addresses)

    job = {"CUWARDEN_JOB": "train", "CUWARDEN_JOB_LIMIT": "100M"}
    members = [Workload(procs, args, nodes[0].run, tmp, "member1", job),
               Workload(procs, args, nodes[1].run, tmp, "member2", job)]
    members[0].ask("alloc 12", "ok")
    members[1].ask("alloc 20", "ok")
    total = 32 * MiB

    prom.wait_targets_up(addresses)

    def per_node():
        res = prom.query('cuwarden_job_memory_used_bytes{cuwarden_job="train"}')
        return {m["instance"]: v for m, v in res} == {addresses[0]: 12 * MiB, addresses[1]: 20 * MiB}, res
    res = wait_for("each node's share of the job", per_node)
    check(True, f"each node reports its member: {[(m['instance'], v) for m, v in res]}")
    hostnames = {m["hostname"] for m, _ in res}
    print(f"hostname labels: {sorted(hostnames)} (one machine: the instance label tells the nodes apart)", flush=True)

    board = board_job_sums(repo, "train", user)
    labels = prom.wait_value("the board's job summed across nodes", board["used"], total)
    check(labels == {"cuwarden_job": "train", "user": user}, f"one series per job and user: {labels}")
    prom.wait_value("the board's job caps summed across nodes", board["caps"], 2 * 100 * MiB)
    prom.wait_value("the recording rule of used bytes",
                    f'cuwarden_job_user:cuwarden_job_memory_used_bytes:sum{{cuwarden_job="train"}}', total)
    prom.wait_value("the recording rule of caps",
                    f'cuwarden_job_user:cuwarden_job_memory_limit_bytes:sum{{cuwarden_job="train"}}', 2 * 100 * MiB)
    prom.wait_value("the members' own series add up alike",
                    'sum(cuwarden_process_memory_used_bytes{cuwarden_job="train"})', total)

    # The sum follows a member: node 2's grows by 4 MiB.
    members[1].ask("alloc 4", "ok")
    prom.wait_value("the board's sum after member 2 allocated 4 MiB more", board["used"], total + 4 * MiB)
    prom.wait_value("the recording rule likewise",
                    f'cuwarden_job_user:cuwarden_job_memory_used_bytes:sum{{cuwarden_job="train"}}', total + 4 * MiB)
    for m in members:
        m.finish()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("server", "two_nodes"))
    for a in ("daemon", "lib", "alloc-loop", "fakecuda", "repo"):
        ap.add_argument("--" + a, required=True)
    args = ap.parse_args()

    def on_signal(signum, _frame):
        raise SystemExit(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    started = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="cuwt-prom-")
    procs = Procs()
    ok = False
    try:
        tool("prometheus", "PROMETHEUS")
        tool("promtool", "PROMTOOL")
        (test_server if args.mode == "server" else test_two_nodes)(args, procs, tmp)
        ok = True
    except Failure as e:
        print(f"FAIL: {e}", flush=True)
    finally:
        procs.stop_all()
        if not ok:
            for f in sorted(pathlib.Path(tmp).rglob("*")):
                if f.is_file() and (f.suffix in (".log", ".stderr")):
                    print(f"---- {f.relative_to(tmp)}\n{f.read_text(errors='replace')[-3000:]}")
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'OK' if ok else 'FAILED'} ({time.monotonic() - started:.1f} s)", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
