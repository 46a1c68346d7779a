#!/usr/bin/env python3
"""Serve the web dashboard and replay a recording of cuwardend's HTTP API (docs/http.md).

    replay_server.py --web-root DIR --recording DIR [--listen 127.0.0.1:0] [--speed X]
                     [--no-hold] [--port-file FILE] [--verbose]

The web root (the staged build/share/cuwarden/web, or /usr/share/cuwarden/web) is served at
`/`; the API paths answer from the recording as the daemon answered while it was made, at the
recorded pace (`--speed 4`: four times faster). Stdlib only.

The replay clock runs in recorded time (unix seconds). It starts at the recording's first state
document and holds there until the first client opens /api/v1/events (so a browser that takes
seconds to start still sees the whole recording; `--no-hold` starts it at once). Then:

- /api/v1/state: the last recorded state document at or before the clock (the first before that);
- /api/v1/history?range=hour|day and /api/v1/processes/PID/history: the recorded history (taken
  at the end) cut to the clock: points, out-of-memory records and processes after it left out
  (the history's times are the daemon's: the clock is moved by how far the state documents'
  time_ns lie from their receive times, should the recorder's clock differ);
- /api/v1/events: the recorded messages after the clock, each sent when the clock reaches its
  receive time (`pid=` and `state=0` filter as the daemon does; a client that reconnects with
  Last-Event-ID first gets the memory events after that id up to the clock); `: keep-alive`
  every 15 s;
- /api/v1/processes/PID/snapshot: the recorded answer for that pid; for a pid with none, 403 as
  a daemon without --http-snapshots answers (404 when the pid is in no state document);
- /metrics: the recorded text.

Recording format, version 1: a directory with

  meta.json           {"format": "cuwarden-api-recording", "version": 1, "address": "127.0.0.1:9477",
                       "started": 1764633600.0, "ended": 1764633610.5, "history_time": 1764633610.2,
                       ...}  (times: unix seconds, receive times on the recording machine; other
                       keys are notes for people)
  states.tsv          one line per GET /api/v1/state: receive time <TAB> file <TAB> HTTP status
  states/NNNNNN.json  each answer's body, as received
  history-hour.json   GET /api/v1/history?range=hour at the end (meta.history_time)
  history-day.json    GET /api/v1/history?range=day at the end (optional)
  events.txt          GET /api/v1/events as received: one line per line of the stream,
                      receive time <TAB> the line without its newline (blank lines, which end
                      an SSE message, have nothing after the tab); a message's time is that of
                      its first line; or events.txt.xz, the same compressed (xz) where a
                      training's allocations make it long
  metrics.txt         GET /metrics at the end (optional)
  snapshot-PID.json   GET /api/v1/processes/PID/snapshot?format=json&top=N (optional, any
  snapshot-PID.status number of pids): the body, and the HTTP status as a decimal line

tests/gpu/dashboard_record.sh writes one from a running daemon; tests/browser/recording-sample/
is a small hand-made one (tests/browser/make_sample_recording.py).
"""
import argparse
import bisect
import copy
import json
import lzma
import pathlib
import re
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KEEPALIVE_S = 15
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".css": "text/css; charset=utf-8", ".json": "application/json", ".svg": "image/svg+xml",
                 ".png": "image/png", ".ico": "image/x-icon", ".txt": "text/plain; charset=utf-8"}


class Message:
    """One server-sent event as recorded: its lines (without the blank line that ends it)."""

    def __init__(self, t, lines):
        self.t = t
        self.lines = lines
        fields = {}
        for line in lines:
            name, _, value = line.partition(":")
            fields.setdefault(name, value[1:] if value.startswith(" ") else value)
        self.event = fields.get("event", "message")
        self.comment = all(line.startswith(":") for line in lines)
        try:
            self.id = int(fields["id"])
        except (KeyError, ValueError):
            self.id = None
        self.pid = None
        if self.event == "memory":
            try:
                self.pid = json.loads(fields.get("data", ""))["pid"]
            except (ValueError, KeyError, TypeError):
                pass

    def wire(self):
        return ("\n".join(self.lines) + "\n\n").encode()


class Recording:
    def __init__(self, root):
        self.root = pathlib.Path(root)
        self.meta = json.loads((self.root / "meta.json").read_text())
        if self.meta.get("format") != "cuwarden-api-recording" or self.meta.get("version") != 1:
            raise SystemExit(f"{root}: not a version 1 cuwarden-api-recording (meta.json)")
        self.states = []  # (time, bytes)
        for line in (self.root / "states.tsv").read_text().splitlines():
            if not line.strip():
                continue
            t, name, status = line.split("\t")[:3]
            if status.strip() == "200":
                self.states.append((float(t), (self.root / name).read_bytes()))
        if not self.states:
            raise SystemExit(f"{root}: no state document answered 200 (states.tsv)")
        self.state_times = [t for t, _ in self.states]
        self.pids = set()
        # The daemon's clock less the recorder's (0 when both ran on one machine): the history's
        # times are the daemon's, the receive times the recorder's.
        offsets = []
        for t, body in self.states:
            try:
                doc = json.loads(body)
            except ValueError:
                continue
            self.pids.update(p["pid"] for p in doc.get("processes", []))
            if isinstance(doc.get("time_ns"), int):
                offsets.append(doc["time_ns"] / 1e9 - t)
        self.offset = sorted(offsets)[len(offsets) // 2] if offsets else 0.0
        self.history = {}
        for rng in ("hour", "day"):
            f = self.root / f"history-{rng}.json"
            if f.exists():
                self.history[rng] = json.loads(f.read_text())
        self.messages = self._read_events(self.root / "events.txt")
        self.message_times = [m.t for m in self.messages]
        f = self.root / "metrics.txt"
        self.metrics = f.read_bytes() if f.exists() else None
        self.snapshots = {}
        for f in self.root.glob("snapshot-*.json"):
            m = re.fullmatch(r"snapshot-(\d+)\.json", f.name)
            if not m:
                continue
            status_file = f.with_suffix(".status")
            status = int(status_file.read_text().strip()) if status_file.exists() else 200
            self.snapshots[int(m.group(1))] = (status, f.read_bytes())
        self.start = float(self.meta.get("started", self.states[0][0]))
        self.start = min(self.start, self.states[0][0])

    @staticmethod
    def _read_events(path):
        messages, lines, first = [], [], None
        xz = path.with_name(path.name + ".xz")  # a long recording's stream, compressed
        if path.exists():
            text = path.read_text(encoding="utf-8", errors="replace")
        elif xz.exists():
            with lzma.open(xz, "rt", encoding="utf-8", errors="replace") as f:
                text = f.read()
        else:
            return messages
        for raw in text.splitlines():
            t, sep, line = raw.partition("\t")
            if not sep:
                continue
            if line == "":
                if lines:
                    messages.append(Message(first, lines))
                lines, first = [], None
                continue
            if first is None:
                first = float(t)
            lines.append(line)
        if lines:  # the stream was cut mid-message: keep what came
            messages.append(Message(first, lines))
        return [m for m in messages if not m.comment]

    def state_at(self, now):
        i = bisect.bisect_right(self.state_times, now) - 1
        return self.states[max(i, 0)][1]

    def history_at(self, rng, now):
        now += self.offset  # in the daemon's time
        h = copy.deepcopy(self.history[rng])
        h["time_ns"] = int(now * 1e9)

        def cut(obj):
            ts = obj.get("t") or []
            n = bisect.bisect_right(ts, now)
            for k, v in list(obj.items()):
                if isinstance(v, list) and len(v) == len(ts):
                    obj[k] = v[:n]
            return n > 0

        procs = []
        for p in h.get("processes", []):
            p["devices"] = [d for d in p.get("devices", []) if cut(d)]
            p["ooms"] = [o for o in p.get("ooms", []) if o.get("time_ns", 0) <= now * 1e9]
            if p["devices"] or p["ooms"]:
                procs.append(p)
        h["processes"] = procs
        for j in h.get("jobs", []):
            j["gpus"] = [g for g in j.get("gpus", []) if cut(g)]
        h["jobs"] = [j for j in h.get("jobs", []) if j["gpus"]]
        for g in h.get("gpus", []):
            cut(g)
        return h


class Clock:
    """Recorded time: held at `start` until started, then advancing `speed` times real time."""

    def __init__(self, start, speed, hold):
        self.t0, self.speed = start, speed
        self.lock = threading.Lock()
        self.started = None if hold else time.monotonic()

    def run(self):
        with self.lock:
            if self.started is None:
                self.started = time.monotonic()

    def now(self):
        with self.lock:
            s = self.started
        return self.t0 if s is None else self.t0 + (time.monotonic() - s) * self.speed


class Handler(BaseHTTPRequestHandler):
    server_version = "cuwarden-replay/1"
    rec: Recording = None
    clock: Clock = None
    web_root: pathlib.Path = None
    verbose = False

    def log_message(self, fmt, *args):
        if self.verbose:
            sys.stderr.write("replay: " + fmt % args + "\n")

    def send(self, status, body, ctype="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def error(self, status, text):
        self.send(status, json.dumps({"error": text}).encode())

    def do_HEAD(self):
        self.do_GET()

    def do_POST(self):
        self.error(405, "read only: GET or HEAD")

    do_PUT = do_DELETE = do_PATCH = do_POST

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        q = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        path = url.path
        now = self.clock.now()
        try:
            if path == "/api/v1/state":
                return self.send(200, self.rec.state_at(now))
            if path == "/api/v1/history":
                return self.history(q, now, None)
            m = re.fullmatch(r"/api/v1/processes/(\d+)/(history|snapshot)", path)
            if m and m.group(2) == "history":
                return self.history(q, now, int(m.group(1)))
            if m:
                return self.snapshot(int(m.group(1)), q)
            if path == "/api/v1/events":
                return self.events(q)
            if path == "/metrics":
                if self.rec.metrics is None:
                    return self.error(404, "no /metrics in this recording")
                return self.send(200, self.rec.metrics, "text/plain; version=0.0.4; charset=utf-8")
            if path.startswith("/api/"):
                return self.error(404, f"no such path: {path}")
            return self.static(path)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def history(self, q, now, pid):
        rng = q.get("range", "hour")
        if rng not in ("hour", "day"):
            return self.error(400, "range must be hour or day")
        if rng not in self.rec.history:
            return self.error(404, f"this recording has no {rng} history")
        h = self.rec.history_at(rng, now)
        if pid is None:
            return self.send(200, json.dumps(h).encode())
        for p in h["processes"]:
            if p["pid"] == pid:
                return self.send(200, json.dumps(p).encode())
        return self.error(404, f"no process {pid}")

    def snapshot(self, pid, q):
        if q.get("format", "text") not in ("json", "text", "pytorch", "perfetto", "summary"):
            return self.error(400, "format must be json, text, pytorch, perfetto, summary or folded")
        if pid in self.rec.snapshots:
            status, body = self.rec.snapshots[pid]
            return self.send(status, body)
        if pid not in self.rec.pids:
            return self.error(404, f"no process {pid}")
        return self.error(403, "snapshots are served over HTTP only when cuwardend runs with --http-snapshots")

    def events(self, q):
        want_state = q.get("state", "1") != "0"
        pid = int(q["pid"]) if q.get("pid", "").isdigit() else None

        def wanted(m):
            if m.event == "state":
                return want_state
            return pid is None or m.event != "memory" or m.pid == pid

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.flush()
        self.clock.run()
        rec, now = self.rec, self.clock.now()
        i = bisect.bisect_right(rec.message_times, now)
        last = self.headers.get("Last-Event-ID", "")
        if last.isdigit():
            for m in rec.messages[:i]:
                if m.event == "memory" and m.id is not None and m.id > int(last) and wanted(m):
                    self.wfile.write(m.wire())
        self.wfile.flush()
        quiet_since = time.monotonic()
        while True:
            if i < len(rec.messages):
                wait = (rec.messages[i].t - self.clock.now()) / self.clock.speed
            else:
                wait = KEEPALIVE_S
            wait = min(wait, KEEPALIVE_S - (time.monotonic() - quiet_since))
            if wait > 0:
                time.sleep(wait)
            if i < len(rec.messages) and rec.messages[i].t <= self.clock.now():
                if wanted(rec.messages[i]):
                    self.wfile.write(rec.messages[i].wire())
                    self.wfile.flush()
                    quiet_since = time.monotonic()
                i += 1
            elif time.monotonic() - quiet_since >= KEEPALIVE_S:
                self.wfile.write(b": keep-alive\n\n")
                self.wfile.flush()
                quiet_since = time.monotonic()

    def static(self, path):
        rel = urllib.parse.unquote(path).lstrip("/") or "index.html"
        f = (self.web_root / rel).resolve()
        if self.web_root not in f.parents or not f.is_file():
            return self.error(404, f"no such file: {path}")
        ctype = CONTENT_TYPES.get(f.suffix, "text/plain; charset=utf-8")
        return self.send(200, f.read_bytes(), ctype)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--web-root", required=True)
    ap.add_argument("--recording", required=True)
    ap.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0: any free one)")
    ap.add_argument("--speed", type=float, default=1.0, help="replay this many times faster")
    ap.add_argument("--no-hold", action="store_true", help="start the clock now, not at the first event client")
    ap.add_argument("--port-file", help="write the port here once listening")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    if a.speed <= 0:
        ap.error("--speed must be positive")
    rec = Recording(a.recording)
    web_root = pathlib.Path(a.web_root).resolve()
    if not (web_root / "index.html").is_file():
        raise SystemExit(f"{web_root}: no index.html (stage the web root first: cmake --build BUILD --target cuwarden_web)")
    Handler.rec, Handler.web_root, Handler.verbose = rec, web_root, a.verbose
    Handler.clock = Clock(rec.start, a.speed, hold=not a.no_hold)
    host, _, port = a.listen.rpartition(":")
    server = ThreadingHTTPServer((host or "127.0.0.1", int(port)), Handler)
    server.daemon_threads = True
    port = server.server_address[1]
    if a.port_file:
        tmp = pathlib.Path(a.port_file + ".tmp")
        tmp.write_text(f"{port}\n")
        tmp.replace(a.port_file)
    print(f"replay: http://{host or '127.0.0.1'}:{port}/ ({len(rec.states)} states, {len(rec.messages)} events, "
          f"{rec.meta.get('ended', rec.states[-1][0]) - rec.start:.1f} s recorded, speed {a.speed})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
