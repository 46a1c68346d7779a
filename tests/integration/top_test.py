#!/usr/bin/env python3
"""`cuwarden top` end to end: a daemon, two programs under the interposer on the simulated
driver (one capped), and the CLI.

    top_test.py once --cli C --daemon D --lib L --fakecuda DIR --workload W
    top_test.py tmux --cli C ...
    top_test.py unfold --cli C ... --app A

once: `top --once` prints one frame as plain text (no escape codes), both processes with
their used bytes, largest first, the GPU's bar with the caps; ASCII only in the C locale;
with no daemon, the message `cuwarden` prints and exit status 1.

tmux: `top` in a 160x40 tmux pane, read back with capture-pane: both rows, a new
allocation's bytes within seconds, the sparklines, each sort key and `r` changing the sort
line and the order, the selection and Enter opening a process's detail (its events, its call
sites), Esc and Backspace going back, the daemon stopping (said in the title line), and `q`
ending the program with status 0. As root, a second `top` run as nobody shows the daemon's
refusal of another user's snapshot.

unfold: `top` in a 160x90 tmux pane, on the detail view of tests/integration/snapshot_app.cpp
after its `chain` command (three sites through one 12-deep helper chain): each site's
folded line names its caller's line (`< load_weights() (...:75) (+11)`) and no frame of
the chain; `f` unfolds every frame (chain_11 .. chain_1, then the caller marked `<`, then
main and libc's), as `cuwarden snapshot --full` lists them; a second `f` folds them again.
The pane is then made 100x30: unfolded, the sites still fit, the caller's lines kept and
the outer frames cut into "(+N frames)" lines.
"""
import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

T0 = time.monotonic()


def fail(msg, screen=None):
    print("FAIL: " + msg)
    if screen is not None:
        print("---- screen ----\n" + screen + "\n----------------")
    sys.exit(1)


def check(cond, msg, screen=None):
    if not cond:
        fail(msg, screen)
    print(f"ok ({time.monotonic() - T0:4.1f} s): {msg}")


class Workload:
    """tests/integration/alloc_loop.cpp under the interposer, driven line by line."""

    def __init__(self, path, env):
        self.p = subprocess.Popen([path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True,
                                  bufsize=1)
        first = self.p.stdout.readline()
        if not first.startswith("ready "):
            fail(f"the workload did not start ({first!r})")
        self.pid = self.p.pid

    def say(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def stop(self):
        if self.p.poll() is None:
            self.p.stdin.close()
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()


def wait_for(pred, timeout=30.0, step=0.1):
    """pred() until it returns something true, or its last value after `timeout` seconds."""
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() >= end:
            return v
        time.sleep(step)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["once", "tmux", "unfold"])
    for a in ("cli", "daemon", "lib", "fakecuda", "workload"):
        ap.add_argument("--" + a, required=True)
    ap.add_argument("--app", help="unfold: tests/integration/snapshot_app.cpp's program")
    args = ap.parse_args()
    if args.mode == "unfold" and not args.app:
        fail("unfold needs --app")
    if args.mode != "once" and not shutil.which("tmux"):
        fail("tmux is not installed (scripts/setup.sh installs it)")

    tmp = tempfile.mkdtemp(prefix="cuwt-top-")
    run = os.path.join(tmp, "run")
    os.makedirs(run)
    sock = os.path.join(run, "daemon", "cuwardend.sock")
    env = dict(os.environ)
    env.update({"LD_LIBRARY_PATH": args.fakecuda, "CUWARDEN_RUN_DIR": run, "CUWARDEN_FAKE_MEMORY": "1G"})
    for k in ("LD_PRELOAD", "CUWARDEN_LIMIT", "CUWARDEN_POOL", "CUWARDEN_JOB", "CUWARDEN_CALLSITES"):
        env.pop(k, None)
    daemon = None
    work = []
    tmux = None
    try:
        # The CLI's own checks first: no daemon is the same message and status as `cuwarden`'s.
        for argv in (["top", "--once"], ["top"]) if args.mode != "unfold" else ():
            r = subprocess.run([args.cli, *argv, "--socket", sock], env=env, capture_output=True, text=True,
                               timeout=30)
            check(r.returncode == 1 and "no daemon is running" in r.stderr and "cuwardend" in r.stderr
                  and r.stdout == "", f"`cuwarden {' '.join(argv)}` without a daemon: the message, exit 1")

        daemon = subprocess.Popen([args.daemon, "--run-dir", run, "--no-nvml",
                                   "--scan-interval-ms", "100"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "d.log"), "w"))

        def answers():
            try:
                s = socket.socket(socket.AF_UNIX)
                s.connect(sock)
                s.close()
                return True
            except OSError:
                return False

        if not wait_for(answers, 30):
            fail("the daemon did not start")
        wenv = dict(env, LD_PRELOAD=args.lib)
        if args.mode == "unfold":
            tmux = Tmux(tmp, env)
            run_unfold(args, tmp, sock, tmux, wenv, work)
            return
        a = Workload(args.workload, dict(wenv, CUWARDEN_LIMIT="256M"))
        work.append(a)
        b = Workload(args.workload, wenv)
        work.append(b)
        check(a.say("alloc 16") == "ok" and b.say("alloc 48") == "ok", "two programs allocated 16 and 48 MiB")

        def state():
            r = subprocess.run([args.cli, "--json", "--socket", sock], env=env, capture_output=True, text=True,
                               timeout=30)
            return json.loads(r.stdout) if r.returncode == 0 else {}

        def used(st, pid):
            for p in st.get("processes", []):
                if p["pid"] == pid and p["devices"]:
                    return p["devices"][0]["used_bytes"]
            return None

        st = wait_for(lambda: (lambda s: s if used(s, a.pid) == 16 << 20 and used(s, b.pid) == 48 << 20 else None)(
            state()))
        check(st, "the daemon sees both")

        if args.mode == "once":
            run_once(args, env, sock, a, b)
        else:
            tmux = Tmux(tmp, env)
            run_tmux(args, tmp, sock, tmux, a, b, daemon)
    finally:
        if tmux:
            tmux.kill()
        for w in work:
            w.stop()
        if daemon:
            daemon.terminate()
            daemon.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"passed in {time.monotonic() - T0:.1f} s")


def row_of(screen, pid):
    """The line of `screen` that is pid's process row, or ''."""
    for line in screen.splitlines():
        if re.match(rf"\s*\d+\s+{pid}\s", line):
            return line
    return ""


def run_once(args, env, sock, a, b):
    r = subprocess.run([args.cli, "top", "--once", "--socket", sock], env=dict(env, LANG="C.UTF-8", LC_ALL=""),
                       capture_output=True, timeout=30)
    out = r.stdout.decode()
    check(r.returncode == 0 and r.stderr == b"", "`top --once` exits 0, nothing on stderr", out)
    check("\x1b" not in out and "\r" not in out, "plain text: no escape codes", out)
    check(out.startswith("cuwarden top ") and "2 processes running" in out, "its title counts the processes", out)
    ra, rb = row_of(out, a.pid), row_of(out, b.pid)
    check("16.00 MiB" in ra and "256.00 MiB" in ra and "running" in ra,
          f"pid {a.pid}: used 16.00 MiB, cap 256.00 MiB", out)
    check("48.00 MiB" in rb and "running" in rb, f"pid {b.pid}: used 48.00 MiB", out)
    check(out.index(rb) < out.index(ra), "sorted by used, largest first", out)
    check(re.search(r"Used▼", out) is not None, "the header marks the sort column", out)
    gpu = [line for line in out.splitlines() if line.startswith("GPU 0")]
    check(len(gpu) == 1 and "█" in gpu[0] and "│" in gpu[0] and "64.00 MiB / 1.00 GiB" in gpu[0]
          and "caps 256.00 MiB (1 of 2 processes)" in gpu[0], "the GPU's bar: used, total, where the caps end", out)
    check("Used, last" not in out and "Sort:" not in out, "no sparkline and no key help in one frame", out)

    r = subprocess.run([args.cli, "top", "--once", "--socket", sock], env=dict(env, LANG="C", LC_ALL="C"),
                       capture_output=True, timeout=30)
    check(r.returncode == 0 and all(c < 0x80 for c in r.stdout), "in the C locale, ASCII only", r.stdout.decode())
    out = r.stdout.decode()
    check("Usedv" in out and re.search(r"\[#+\.*\|\.+\]", out) is not None, "ASCII marks and bar", out)

    r = subprocess.run([args.cli, "top", "--socket", sock], env=env, capture_output=True, stdin=subprocess.DEVNULL,
                       text=True, timeout=30)
    check(r.returncode == 1 and "needs a terminal" in r.stderr and "--once" in r.stderr,
          "without a terminal, `top` says so and points at --once")


class Tmux:
    """A tmux server of our own (its socket in the test's directory): nothing of the user's is touched."""

    def __init__(self, tmp, env):
        self.sock = os.path.join(tmp, "tmux.sock")
        self.conf = os.path.join(tmp, "tmux.conf")
        with open(self.conf, "w") as f:
            f.write("set -g remain-on-exit on\nset -g status off\n")
        self.env = env

    def __call__(self, *argv, check_rc=True):
        r = subprocess.run(["tmux", "-S", self.sock, "-f", self.conf, *argv], env=self.env, capture_output=True,
                           text=True, timeout=30)
        if check_rc and r.returncode != 0:
            fail(f"tmux {' '.join(argv)}: {r.stderr.strip()}")
        return r.stdout

    def screen(self, target):
        return self("capture-pane", "-p", "-t", target)

    def kill(self):
        self("kill-server", check_rc=False)


def run_tmux(args, tmp, sock, tmux, a, b, daemon):
    cmd = f"env LANG=C.UTF-8 LC_ALL= {args.cli} top --socket {sock}"
    status_file = os.path.join(tmp, "top.status")
    tmux("-u", "new-session", "-d", "-x", "160", "-y", "40", "-s", "top", f"{cmd}; echo $? > {status_file}")

    def until(pred, what, timeout=30.0):
        last = [""]

        def probe():
            last[0] = tmux.screen("top")
            return pred(last[0])

        if not wait_for(probe, timeout):
            fail(what, last[0])
        check(True, what)
        return last[0]

    # The key line is the last drawn: a capture can come between the rows and it.
    scr = until(lambda s: "16.00 MiB" in row_of(s, a.pid) and "48.00 MiB" in row_of(s, b.pid) and "Sort:" in s,
                "both processes' rows with their used bytes")
    check("GPU 0" in scr and "caps 256.00 MiB" in scr, "the GPU's line with its caps", scr)
    check("Sort: used, largest first" in scr, "the key line names the sort", scr)
    check(scr.index(row_of(scr, b.pid)) < scr.index(row_of(scr, a.pid)), "48 MiB above 16 MiB", scr)

    check(a.say("alloc 64") == "ok", "the capped program allocates 64 MiB more")
    scr = until(lambda s: "80.00 MiB" in row_of(s, a.pid), "its row shows 80.00 MiB within seconds")
    check(scr.index(row_of(scr, a.pid)) < scr.index(row_of(scr, b.pid)), "and moves above the 48 MiB one", scr)
    scr = until(lambda s: re.search(r"[▁▂▃▄▅▆▇]+█\s*$", row_of(s, a.pid)) is not None,
                "its sparkline rises to the full block")

    def order(s):
        return s.index(row_of(s, a.pid)) < s.index(row_of(s, b.pid))  # a above b

    small, large = sorted([a.pid, b.pid])
    for key, line, a_first in (("P", "Sort: pid, smallest first", a.pid == small),
                               ("r", "Sort: pid, largest first", a.pid == large),
                               ("r", "Sort: pid, smallest first", a.pid == small),
                               ("c", "Sort: cap, largest first", True),  # only a has a cap
                               ("r", "Sort: cap, smallest first", True),  # the uncapped still last
                               ("s", "Sort: name, Z to A", a.pid == small),  # same names: pid decides
                               ("p", "Sort: peak, smallest first", False),
                               ("r", "Sort: peak, largest first", True),
                               ("u", "Sort: used, largest first", True)):
        tmux("send-keys", "-t", "top", key)
        until(lambda s: line in s and order(s) == a_first, f"`{key}`: '{line}', pid {a.pid} {'above' if a_first else 'below'}")
    check("PID" in scr and "Used▼" in tmux.screen("top"), "the header marks the sort column")

    # The selection starts on the first row (a); j moves to b, Enter opens b's detail.
    tmux("send-keys", "-t", "top", "j", "Enter")
    scr = until(lambda s: f"pid {b.pid}" in s and "Recent events:" in s and
                re.search(rf"\s{b.pid}\s+\S+\s+alloc\s+0\s+48\.00 MiB", s) is not None,
                "j, Enter: pid b's detail lists its allocation event")
    until(lambda s: "call sites off" in s and "48.00 MiB" in s.split("Top call sites")[1],
          "and its live memory by call site (call sites off)")
    check("Esc/Backspace" in scr, "the detail view's key line", scr)
    tmux("send-keys", "-t", "top", "Escape")
    until(lambda s: "Sort: used" in s and "Recent events:" not in s, "Esc: back to the list")
    tmux("send-keys", "-t", "top", "k", "Enter")
    until(lambda s: f"pid {a.pid}" in s and re.search(rf"\s{a.pid}\s+\S+\s+alloc\s+0\s+64\.00 MiB", s),
          "k, Enter: pid a's detail, its 64 MiB allocation")
    tmux("send-keys", "-t", "top", "BSpace")
    until(lambda s: "Sort: used" in s and "Recent events:" not in s, "Backspace: back to the list")

    if os.geteuid() == 0 and shutil.which("setpriv"):
        # Another user's `top`: the daemon lists the processes but keeps their call sites.
        os.chmod(tmp, 0o755)
        os.chmod(os.path.dirname(sock), 0o755)
        tmux("new-window", "-t", "top", "-n", "nobody",
             f"exec setpriv --reuid=65534 --regid=65534 --clear-groups {cmd}")
        t = "top:nobody"
        wait_for(lambda: str(a.pid) in tmux.screen(t))
        tmux("send-keys", "-t", t, "Enter")
        scr = wait_for(lambda: (lambda s: s if "refused" in s.split("Top call sites")[-1] else "")(tmux.screen(t)))
        check(scr and "Recent events:" in scr, "as another user: the snapshot's refusal is shown, events still",
              tmux.screen(t))
        tmux("send-keys", "-t", t, "q")
        tmux("kill-window", "-t", t)
    else:
        print("skipped: the refusal of another user's snapshot (needs root to run as nobody)")

    # The daemon goes away: the view stays, and says so.
    daemon.terminate()
    daemon.wait(timeout=10)
    until(lambda s: "no daemon is running" in s.splitlines()[0] and str(a.pid) in s,
          "the daemon stopped: the title line says so, the last rows stay")

    # The exit status comes through the shell around the program: tmux may leave a pane's
    # process unreaped (then it reports the pane dead without a status).
    tmux("send-keys", "-t", "top", "q")
    status = wait_for(lambda: open(status_file).read().strip() if os.path.exists(status_file) else "", 30)
    check(status == "0", f"q: the program ended, status 0 ({status!r})", tmux.screen("top"))
    dead = wait_for(lambda: tmux("list-panes", "-t", "top", "-F", "#{pane_dead}").strip() == "1", 30)
    check(dead, "and its pane with it")


class App:
    """tests/integration/snapshot_app.cpp under the interposer with call sites on."""

    def __init__(self, path, env):
        self.p = subprocess.Popen([path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True,
                                  bufsize=1)
        self.pid = self.p.pid
        self.lines = {}  # "line NAME N": the source line of each allocation

    def ask(self, cmd, want):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        while True:
            line = self.p.stdout.readline()
            if not line:
                fail(f"the program ended before answering '{cmd}'")
            m = re.match(r"line (\w+) (\d+)", line)
            if m:
                self.lines[m.group(1)] = int(m.group(2))
            if line.startswith(want):
                return

    def stop(self):
        if self.p.poll() is None:
            self.p.stdin.close()
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()


def run_unfold(args, tmp, sock, tmux, wenv, work):
    app = App(args.app, dict(wenv, CUWARDEN_CALLSITES="24"))
    work.append(app)
    app.ask("chain", "chained")
    lw, lw2, mb = app.lines["load_weights"], app.lines["load_weights_2"], app.lines["make_buffers"]
    callers = (("load_weights", lw), ("load_weights", lw2), ("make_buffers", mb))
    check(True, f"the program allocated through its helper chain from lines {lw}, {lw2} and {mb}")

    cmd = f"env LANG=C.UTF-8 LC_ALL= {args.cli} top --socket {sock}"
    tmux("-u", "new-session", "-d", "-x", "160", "-y", "90", "-s", "top", cmd)

    def until(pred, what, timeout=60.0):
        last = [""]

        def probe():
            last[0] = tmux.screen("top")
            return pred(last[0])

        if not wait_for(probe, timeout):
            fail(what, last[0])
        check(True, what)
        return last[0]

    def fn_re(name):  # a function as the symbolizer names it, with its arguments
        return rf"{name}(\([^)]*\))?"

    def folded(s):
        return all(re.search(rf"{fn_re('chain_12')} \([^()]*snapshot_app\.cpp:\d+\) < {fn_re(fn)} "
                             rf"\([^()]*snapshot_app\.cpp:{line}\) \(\+11\)", s) for fn, line in callers)

    until(lambda s: str(app.pid) in s and "Sort:" in s, "the program's row")
    tmux("send-keys", "-t", "top", "Enter")
    # The key line is the last drawn: a capture can come between the sites and it.
    scr = until(lambda s: "Top call sites" in s and folded(s) and "f: unfold call sites" in s,
                "Enter: the detail view's call sites, folded: each names its caller's line (+11)")
    check("chain_5" not in scr and "chain_11" not in scr, "no frame of the chain is listed", scr)
    check("f: unfold call sites" in scr.splitlines()[-1], "the key line offers f: unfold", scr)

    def unfolded(s):
        # Each site: its head, the chain's frames chain_11 .. chain_1 on lines of their own,
        # then its caller marked "<", then main.
        for fn, line in callers:
            m = re.search(rf"{fn_re('chain_12')} \([^()]*snapshot_app\.cpp:\d+\)\n"
                          + "".join(rf" +{fn_re(f'chain_{k}')} \([^()]*snapshot_app\.cpp:\d+\)  \[user\]\n"
                                    for k in range(11, 0, -1))
                          + rf" +< {fn_re(fn)} \([^()]*snapshot_app\.cpp:{line}\)  \[user\]\n"
                          + r" +main \(", s)
            if not m:
                return False
        return "every frame" in s and "f: fold call sites" in s

    tmux("send-keys", "-t", "top", "f")
    scr = until(unfolded, "f: every frame of each site, the chain's on lines of their own, the caller marked <")
    check(scr.count("chain_5(") == 3 and "(+11)" not in scr, "the chain listed once per site, no fold count", scr)
    check("__libc_start_main" in scr, "and the outer frames, to libc's", scr)
    check("f: fold call sites" in scr.splitlines()[-1], "the key line offers f: fold", scr)

    tmux("send-keys", "-t", "top", "f")
    until(lambda s: folded(s) and "chain_5" not in s and "every frame" not in s and "f: unfold call sites" in s,
          "a second f: folded again, each site on one line")

    # A smaller pane: unfolded, the frames give way from the outer end; the caller stays.
    tmux("resize-window", "-t", "top", "-x", "100", "-y", "30")
    tmux("send-keys", "-t", "top", "f")

    def cut(s):
        lines = s.splitlines()
        return (len(lines) <= 30 and "every frame" in s and "f: fold call sites" in s
                and all(re.search(rf"^ +< {fn_re(fn)} \([^()]*snapshot_app\.cpp:{line}\)", s, re.M)
                        for fn, line in callers)
                and re.search(r"^ +\(\+\d+ frames\)$", s, re.M) is not None)
    scr = until(cut, "100x30, unfolded: each caller's line kept, the outer frames cut into (+N frames)")
    check("Recent events:" in scr, "and the events' title still shows", scr)
    tmux("send-keys", "-t", "top", "q")


if __name__ == "__main__":
    main()
