#!/usr/bin/env python3
"""browser.replay_server: replay_server.py answers as a recording says, at the recorded pace.

    replay_server_test.py RECORDING_DIR     (tests/browser/recording-sample)

Holds the clock until the first event client, cuts the history at the clock, paces the stream
(at --speed 10), filters it by pid and state=0, resumes after Last-Event-ID, answers snapshots
(200 recorded, 403 without, 404 unknown pid), refuses writes and paths outside the web root.
"""
import json
import pathlib
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
REC = pathlib.Path(sys.argv[1])
SPEED = 10
failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        failures.append(what)


def get(path, method="GET", headers=None):
    req = urllib.request.Request(BASE + path, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("Content-Type", "")


def stream(path, seconds, headers=None, until=None):
    """The messages of an event stream: [(receive time, {field: value})], read until
    until(messages) holds or `seconds` pass (a bound for a stream that stalls, not a pace:
    a busy machine may deliver late)."""
    req = urllib.request.Request(BASE + path, headers=headers or {})
    out, fields = [], {}
    end = time.monotonic() + seconds
    with urllib.request.urlopen(req, timeout=seconds) as r:
        check(r.headers.get("Content-Type") == "text/event-stream", f"{path} is text/event-stream")
        while time.monotonic() < end and not (until and until(out)):
            try:
                line = r.readline()
            except TimeoutError:
                break
            if not line:
                break
            line = line.decode().rstrip("\n")
            if line == "":
                if fields:
                    out.append((time.monotonic(), fields))
                fields = {}
            elif not line.startswith(":"):
                k, _, v = line.partition(": ")
                fields[k] = v
    return out


meta = json.loads((REC / "meta.json").read_text())
T0 = meta["started"]
with tempfile.TemporaryDirectory() as tmp:
    web = pathlib.Path(tmp, "web")
    web.mkdir()
    (web / "index.html").write_text("<!doctype html><title>t</title>")
    port_file = pathlib.Path(tmp, "port")
    server = subprocess.Popen([sys.executable, str(HERE / "replay_server.py"), "--web-root", str(web),
                               "--recording", str(REC), "--speed", str(SPEED), "--port-file", str(port_file)])
    try:
        for _ in range(100):
            if port_file.exists():
                break
            time.sleep(0.05)
        BASE = f"http://127.0.0.1:{port_file.read_text().strip()}"

        status, body, _ = get("/api/v1/state")
        st = json.loads(body)
        check(status == 200 and st["time_ns"] == int(T0 * 1e9), "state held at the first document until a stream client")
        time.sleep(0.3)
        check(json.loads(get("/api/v1/state")[1])["time_ns"] == int(T0 * 1e9), "still held 0.3 s later")
        hist = json.loads(get("/api/v1/history?range=hour")[1])
        last_t = max(t for p in hist["processes"] for d in p["devices"] for t in d["t"])
        # (The sample's states arrive 50 ms after their time_ns: the history's clock is 50 ms behind.)
        check(last_t <= T0 and abs(hist["time_ns"] - T0 * 1e9) < 0.1e9, f"history cut at the clock (last point {last_t})")
        ooms = [o for p in hist["processes"] for o in p["ooms"]]
        check(all(o["time_ns"] <= T0 * 1e9 for o in ooms) and len(ooms) == 1, "history keeps only the refusals before the clock")
        p = json.loads(get("/api/v1/processes/4102/history?range=day")[1])
        check(p["pid"] == 4102 and p["devices"], "one process's history")
        check(get("/api/v1/processes/9999/history")[0] == 404, "history of an unknown pid: 404")
        check(get("/api/v1/history?range=week")[0] == 400, "a bad range: 400")

        status, body, _ = get("/api/v1/processes/4101/snapshot?format=json&top=10")
        check(status == 200 and json.loads(body)["sites"], "recorded snapshot: 200 with sites")
        status, body, _ = get("/api/v1/processes/4102/snapshot?format=json&top=10")
        check(status == 403 and "--http-snapshots" in json.loads(body)["error"], "no snapshot recorded: 403, said why")
        check(get("/api/v1/processes/9999/snapshot?format=json")[0] == 404, "snapshot of an unknown pid: 404")
        check(get("/api/v1/state", method="POST")[0] == 405, "POST: 405")
        check(get("/metrics")[0] == 200, "/metrics")
        check(get("/")[0] == 200 and get("/nope.js")[0] == 404, "web root: index, 404 for a missing file")
        check(get("/%2e%2e/%2e%2e/etc/passwd")[0] == 404, "no path outside the web root")

        span = (meta["ended"] - T0) / SPEED
        t_open = time.monotonic()
        def kinds(ms, kind):
            return sum(1 for _, m in ms if m.get("event") == kind)
        msgs = stream("/api/v1/events", span + 30, until=lambda ms: kinds(ms, "state") >= 9 and kinds(ms, "memory") >= 5)
        memory = [m for _, m in msgs if m.get("event") == "memory"]
        states = [m for _, m in msgs if m.get("event") == "state"]
        check(len(states) == 9 and len(memory) == 5, f"stream: 9 states and 5 memory events ({len(states)}, {len(memory)})")
        check([int(m["id"]) for m in memory] == sorted(int(m["id"]) for m in memory), "memory events in id order")
        took = msgs[-1][0] - t_open if msgs else 0
        # Paced: not all at once (the lower bound is the point; a busy machine only delays).
        check(0.6 * (8.02 / SPEED) <= took, f"paced: the last message after {took:.2f} s")
        # The clock reaches the recording's end (8 s of it) and stays there.
        end = time.monotonic() + 30
        while json.loads(get("/api/v1/state")[1])["time_ns"] < int((T0 + 8) * 1e9) and time.monotonic() < end:
            time.sleep(0.05)
        check(json.loads(get("/api/v1/state")[1])["time_ns"] == int((T0 + 8) * 1e9), "state follows the clock")
        hist = json.loads(get("/api/v1/history?range=hour")[1])
        check(sum(len(p["ooms"]) for p in hist["processes"]) == 2, "the history's refusals follow the clock")

        msgs = stream("/api/v1/events?pid=4102&state=0", 30, {"Last-Event-ID": "1041"}, until=lambda ms: len(ms) >= 2)
        check([m["id"] for _, m in msgs] == ["1044", "1045"], f"resume after 1041, pid 4102 only: {[m.get('id') for _, m in msgs]}")
    finally:
        server.terminate()
        server.wait(5)

print("PASS" if not failures else f"{len(failures)} FAILED")
sys.exit(1 if failures else 0)
