#!/usr/bin/env python3
"""Snapshots, out-of-memory reports and leaks, end to end on the simulated driver.

One program (snapshot_app.cpp, built with -g) runs under the interposer with call sites on,
a cap and CUWARDEN_LEAKS=report; the daemon starts only after the program has overflowed
its ring (events dropped). Checked:
  - `cuwarden snapshot PID --format json`: exact despite the dropped events (every live
    allocation, byte for byte), the big allocation's call site named to function and
    file:line (the line the program printed), the small ones' likewise;
  - text, pytorch (the pickle checked by check_pytorch_snapshot.py and read back here),
    perfetto (Chrome trace JSON), and `cuwarden summary`;
  - a refusal: the program's stderr paragraph (what was asked, the cap, the top call site
    named by dladdr, the snapshot command), `cuwarden oom PID` naming the line, and the
    snapshot kept with the report;
  - `cuwarden snapshot --leaks`: the call site whose live bytes only grew across the daemon's
    samples;
  - at exit, the leak report naming what was never freed.
"""
import argparse
import json
import os
import pickle
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

MiB = 1 << 20


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)
    print("ok: " + msg)


def main():
    ap = argparse.ArgumentParser()
    for a in ("app", "cli", "daemon", "lib", "fakecuda", "checker"):
        ap.add_argument("--" + a, required=True)
    # A sanitizer build's library cannot be preloaded into python3 (not instrumented: the
    # sanitizer's runtime would have to come first): its Python step is left out.
    ap.add_argument("--sanitize", default="")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cuwt-snap-")
    run = os.path.join(tmp, "run")
    os.makedirs(run)
    sock = os.path.join(run, "daemon", "cuwardend.sock")
    env = dict(os.environ)
    env.update({"LD_LIBRARY_PATH": args.fakecuda, "CUWARDEN_RUN_DIR": run})
    app_env = dict(env)
    app_env.update({"LD_PRELOAD": args.lib, "CUWARDEN_CALLSITES": "24", "CUWARDEN_LIMIT": "128M",
                    "CUWARDEN_LEAKS": "report"})
    errpath = os.path.join(tmp, "app.stderr")
    errf = open(errpath, "w")
    started = time.monotonic()
    app = subprocess.Popen([args.app], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errf, env=app_env,
                           text=True, bufsize=1)
    daemon = None
    try:
        lines = {}

        def ask(cmd, want):
            app.stdin.write(cmd + "\n")
            app.stdin.flush()
            while True:
                line = app.stdout.readline()
                if not line:
                    fail(f"the program ended before answering '{cmd}' (stderr: {open(errpath).read()})")
                m = re.match(r"line (\w+) (\d+)", line)
                if m:
                    lines[m.group(1)] = int(m.group(2))
                if line.startswith(want):
                    return line.strip()

        ask("churn 20000", "churned")  # 40,000 events, no daemon: the 16,384-slot ring drops
        check("big_buffer" in lines and "small_buffers" in lines, "the program printed its allocation lines")

        daemon = subprocess.Popen([args.daemon, "--run-dir", run, "--log-level", "info",
                                   "--leak-sample", "1"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "d.log"), "w"))
        for _ in range(200):
            if os.path.exists(sock):
                try:
                    s = socket.socket(socket.AF_UNIX)
                    s.connect(sock)
                    s.close()
                    break
                except OSError:
                    pass
            time.sleep(0.05)
        else:
            fail("the daemon did not start")
        ask("ready", "ready")
        time.sleep(1.5)  # a scan finds the ring

        def cli(*a, binary=False):
            r = subprocess.run([args.cli, *a, "--socket", sock], env=env, capture_output=True, text=not binary,
                               timeout=60)
            if r.returncode != 0:
                fail(f"cuwarden {' '.join(a)}: exit {r.returncode}: {r.stderr}")
            return r.stdout

        pid = str(app.pid)
        doc = json.loads(cli("snapshot", pid, "--format", "json"))
        check(doc["exact"] is True, "the snapshot is exact")
        check(doc["events_dropped"] > 0, f"events were dropped ({doc['events_dropped']}) before the daemon came")
        dev = [a for a in doc["allocations"] if a["kind"] == "device"]
        check(len(dev) == 11, f"11 live device allocations ({len(dev)})")
        check(sum(a["bytes"] for a in dev) == 64 * MiB + 10 * 64 * 1024, "their bytes add up exactly")
        sites = {s["id"]: s for s in doc["sites"]}
        big = [a for a in dev if a["bytes"] == 64 * MiB][0]
        frames = sites[big["site"]]["frames"]

        def names(frames, fn, line):
            return any(fn in f.get("function", "") and f.get("file", "").endswith("snapshot_app.cpp")
                       and f.get("line") == line for f in frames)

        check(names(frames, "big_buffer", lines["big_buffer"]),
              f"the 64 MiB allocation's call site is big_buffer at snapshot_app.cpp:{lines['big_buffer']}")
        small = [a for a in dev if a["bytes"] == 64 * 1024]
        check(len({a["site"] for a in small}) == 1 and names(sites[small[0]["site"]]["frames"], "small_buffers",
                                                             lines["small_buffers"]),
              f"the small ones share one call site, small_buffers at line {lines['small_buffers']}")

        text = cli("snapshot", pid)
        check(f"snapshot_app.cpp:{lines['big_buffer']}" in text and "big_buffer" in text,
              "the text report names the big allocation's line")
        pk = os.path.join(tmp, "snap.pickle")
        cli("snapshot", pid, "--format", "pytorch", "-o", pk)
        r = subprocess.run([sys.executable, args.checker, pk], capture_output=True, text=True)
        check(r.returncode == 0, f"the pickle passes the memory_viz checks ({r.stdout.strip()})")
        with open(pk, "rb") as f:
            snap = pickle.load(f)
        blocks = [b for s in snap["segments"] for b in s["blocks"] if b["size"] >= 64 * MiB]
        check(any(any(fr["line"] == lines["big_buffer"] and fr["filename"].endswith("snapshot_app.cpp")
                      for fr in b["frames"]) for b in blocks), "the pickle's 64 MiB block has the line as a frame")
        perf = json.loads(cli("snapshot", pid, "--format", "perfetto"))
        evs = perf["traceEvents"] if isinstance(perf, dict) else perf
        check(any(e.get("ph") == "C" for e in evs) and all("ph" in e and "pid" in e for e in evs),
              "the perfetto trace has counter events, each with ph and pid")
        summ = cli("summary", pid)
        m = re.search(r"\| Allocations\s+\|\s+(\d+)", summ)
        check("Allocated memory" in summ and m is not None and int(m.group(1)) == 11,
              f"the summary's table counts the 11 live allocations ({m.group(1) if m else None})")

        # Three sites through one 12-deep helper chain: each view leads with the chain's
        # innermost frame and tells them apart by the caller's line, 11 frames out.
        ask("chain", "chained")
        lw, lw2, mb = lines["load_weights"], lines["load_weights_2"], lines["make_buffers"]
        text = cli("snapshot", pid)
        def fn_re(name):  # a function as the symbolizer or dladdr names it, with or without its arguments
            return rf"{name}(\([^)]*\))?"

        for fn, line in (("load_weights", lw), ("load_weights", lw2), ("make_buffers", mb)):
            check(re.search(rf"\n      {fn_re('chain_12')} \([^()]*snapshot_app\.cpp:\d+\)\n(      \(.*\)\n)?"
                            rf"      < {fn_re(fn)} \([^()]*snapshot_app\.cpp:{line}\)  \(\+11 frames\)\n", text) is not None,
                  f"the text report tells the chain's site from {fn} at line {line} apart ({text})")
        check("chain_5" not in text, "the default text does not list the folded chain")
        check("chain_5" in cli("snapshot", pid, "--full"), "--full lists every frame")
        doc = json.loads(cli("snapshot", pid, "--format", "json"))
        labels = [s["label"] for s in doc["sites"] if s["label"].startswith("chain_12")]
        check(len(labels) == 3 and len(set(labels)) == 3, f"three distinct labels in the JSON ({labels})")
        check(all(f["class"] in ("user", "framework", "cuda", "interpreter", "libc", "cuwarden")
                  for s in doc["sites"] for f in s["frames"]), "every frame carries its class")
        # Grouping: each of these sites has user frames of its own, so --by native (one site per
        # native stack) lists the same sites as the default grouping by user frames.
        native = json.loads(cli("snapshot", pid, "--format", "json", "--by", "native"))
        check(sorted((s["id"], s["live_bytes"]) for s in native["sites"])
              == sorted((s["id"], s["live_bytes"]) for s in doc["sites"]),
              "--by native lists the same sites here (none shares its user frames)")
        r = subprocess.run([args.cli, "snapshot", pid, "--by", "stack", "--socket", sock], env=env,
                           capture_output=True, text=True, timeout=60)
        check(r.returncode != 0 and "--by" in r.stderr, f"--by takes user or native ({r.stderr.strip()})")
        once = subprocess.run([args.cli, "top", "--once", "--pid", pid, "--socket", sock], env=env,
                              capture_output=True, text=True, timeout=60)
        for fn, line in (("load_weights", lw), ("load_weights", lw2), ("make_buffers", mb)):
            check(re.search(rf"{fn_re('chain_12')} \([^()]*snapshot_app\.cpp:\d+\) < {fn_re(fn)} "
                            rf"\([^()]*snapshot_app\.cpp:{line}\) \(\+11\)", once.stdout) is not None,
                  f"`top --once --pid` names {fn} at line {line} ({once.stdout}{once.stderr})")
        # Folded stacks, read back as flamegraph.pl does: count after the last space, frames
        # split at ';', root first; they add up to the live device bytes.
        folded = cli("snapshot", pid, "--format", "folded")
        total, stacks = 0, []
        for ln in folded.splitlines():
            stack, _, count = ln.rpartition(" ")
            check(count.isdigit() and stack, f"a folded line is 'frames count' ({ln})")
            total += int(count)
            stacks.append(stack.split(";"))
        check(total == sum(a["bytes"] for a in doc["allocations"] if a["kind"] != "host"),
              "the folded stacks add up to the live device bytes")
        check(any(st[-1].startswith("chain_12") or any(f.startswith("chain_12") for f in st[-3:]) for st in stacks)
              and any("main" in st[0] or "main" in st[1] or "main" in st[2] for st in stacks if len(st) > 3),
              "folded stacks run from the root to the allocating frame")

        res = ask("oom 1073741824", "oom result")
        check(res.endswith(" 2"), "a 1 GiB request under the 128 MiB cap is refused (CUDA_ERROR_OUT_OF_MEMORY)")
        time.sleep(1.5)  # the daemon drains the refusal and keeps the report
        oom = cli("oom", pid)
        check("big_buffer" in oom and f"snapshot_app.cpp:{lines['big_buffer']}" in oom,
              "`cuwarden oom` names the largest call site's line")
        check(re.search(r"asked at: .*oversized", oom) is not None, "`cuwarden oom` names where the refused call came from")
        kept = json.loads(cli("snapshot", pid, "--oom", "0", "--format", "json"))
        check(kept["exact"] and any(a["bytes"] == 64 * MiB for a in kept["allocations"]),
              "the report's snapshot holds the allocations of that moment")

        # A leak growing between the daemon's samples (one a second here), beside what was
        # allocated once and held (big_buffer, the chain: a model's weights). Within the default
        # warm-up (60 s after the first allocation) nothing is a leak; with none, the grower is.
        leaked = 0
        ask("leak 1", "leaked")
        leaked += 1
        warm = cli("snapshot", pid, "--leaks")
        if time.monotonic() - started < 50:  # the first allocation was made at the program's start
            check("leaky" not in warm and "warm-up" in warm, f"within the warm-up no site is a leak ({warm})")
        else:
            print("skipped: the warm-up check (the machine is slow: the warm-up is over)")
        grow = []
        for _ in range(60):
            ask("leak 1", "leaked")
            leaked += 1
            time.sleep(0.5)
            lj = json.loads(cli("snapshot", pid, "--leaks", "--leak-warmup", "0", "--format", "json"))
            grow = [s for s in lj["sites"] if any("leaky" in f.get("function", "") for f in s["frames"])]
            if grow:
                break
        check(len(grow) == 1 and grow[0]["growth_bytes"] >= 1 * MiB and len(grow[0]["bytes"]) == 3,
              f"`snapshot --leaks --leak-warmup 0` lists the grower ({grow})")
        check(all("leaky" in s["label"] for s in lj["sites"]),
              f"and nothing allocated once and held ({[s['label'] for s in lj['sites']]})")
        leaks = cli("snapshot", pid, "--leaks", "--leak-warmup", "0")
        check("leaky" in leaks and "big_buffer" not in leaks and "chain_12" not in leaks,
              "the text lists the grower, not the steady sites")

        # What grew: the sample of two seconds ago against now.
        ask("leak 2", "leaked")
        leaked += 2
        since = cli("snapshot", pid, "--since", "2s")
        check(re.search(r"\n  \+\d+\.\d+ MiB  .*\n      leaky", since) is not None and "big_buffer" not in since,
              f"`snapshot --since 2s` lists the site that grew, not the steady ones ({since})")
        both = subprocess.run([args.cli, "snapshot", pid, "--since", "2s", "--leaks", "--socket", sock], env=env,
                              capture_output=True, text=True, timeout=60)
        check(both.returncode == 2 and "two views" in both.stderr and not both.stdout,
              f"--since with --leaks is refused, not one of them ignored ({both.returncode}: {both.stderr})")
        sj = json.loads(cli("snapshot", pid, "--since", "2s", "--format", "json"))
        up = [s for s in sj["sites"] if "leaky" in s["label"]]
        check(len(up) == 1 and up[0]["after_bytes"] - up[0]["before_bytes"] >= 2 * MiB,
              f"its change is counted ({up})")

        app.stdin.write("exit\n")
        app.stdin.flush()
        app.wait(timeout=30)
        err = open(errpath).read()
        check("out of memory on GPU 0" in err and "asked for 1.00 GiB" in err and "cap of 128" in err,
              "the program's stderr got the out-of-memory paragraph")
        check("big_buffer" in err.split("never freed")[0], "the paragraph names the top call site (dladdr)")
        check(re.search(r"Asked at: oversized", err) is not None, "the paragraph names where the refused call came from")
        para = err.split("never freed")[0]
        chain = re.findall(rf"\d\) .* allocations?: ({fn_re('chain_12')}\+0x[0-9a-f]+ \(cuwt_snapshot_app\) < "
                           rf"{fn_re('load_weights')}\+0x[0-9a-f]+ \(cuwt_snapshot_app\) \(\+11\))", para)
        check(len(chain) == 2 and chain[0][0] != chain[1][0],
              f"the paragraph tells the two load_weights sites of the chain apart ({para})")
        check(f"cuwarden snapshot {pid}" in err, "the paragraph gives the snapshot command")
        check(err.count("out of memory on GPU") == 1, "one paragraph for one refusal")
        leak = err.split("never freed", 1)
        check(len(leak) == 2 and "big_buffer" in leak[1] and "small_buffers" in leak[1],
              "at exit, the leak report lists what was never freed by call site")
        live = 11 + 3 + leaked  # big_buffer and small_buffers, the chain, the leaks
        check(f"{live} allocations never freed" in err, f"the leak report counts the {live} live allocations")

        # From Python (ctypes releases the GIL around the call, as PyTorch does): the leak
        # report names the script's own line, read from the interpreter's frames.
        if args.sanitize:
            print(f"skipped: the Python step ({args.sanitize} build)")
            return
        script = os.path.join(tmp, "py_leak.py")
        with open(script, "w") as f:
            f.write("import ctypes\n"
                    "cuda = ctypes.CDLL('libcuda.so.1')\n"
                    "dev, ctx, p = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()\n"
                    "assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0\n"
                    "assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0\n"
                    "assert cuda.cuCtxSetCurrent(ctx) == 0\n"
                    "def py_leaker():\n"
                    "    return cuda.cuMemAlloc_v2(ctypes.byref(p), 3 << 20)  # line 8\n"
                    "assert py_leaker() == 0\n"
                    "assert py_leaker() == 0\n")
        py_env = dict(app_env)
        py_env.pop("CUWARDEN_LIMIT")
        r = subprocess.run([sys.executable, script], env=py_env, capture_output=True, text=True, timeout=60)
        for line in (9, 10):
            check(r.returncode == 0 and re.search(rf"3\.00 MiB in 1 allocation: py_leaker \(.*py_leak\.py:8\) "
                                                  rf"< <module> \(.*py_leak\.py:{line}\)", r.stderr) is not None,
                  f"from Python, the leak report names the script's lines, 8 called from {line} "
                  f"({r.stderr.strip()[-600:]})")
    finally:
        if app.poll() is None:
            app.kill()
        if daemon:
            daemon.terminate()
            daemon.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
    print("all passed")


if __name__ == "__main__":
    main()
