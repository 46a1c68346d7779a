#!/usr/bin/env bash
# cuwarden GPU tool: record a running daemon's HTTP API for the web dashboard's replay
# (tests/browser/replay_server.py, whose docstring defines the recording's format), so that
# the dashboard and its browser test can be run later, anywhere, on what a real GPU did.
#
#   tests/gpu/dashboard_record.sh ADDR OUT_DIR [SECONDS]        # SECONDS (default 60), or until Ctrl-C
#   tests/gpu/dashboard_record.sh ADDR OUT_DIR -- CMD [ARG...]  # while CMD runs, and 3 s after
#
# ADDR is what `cuwardend --http ADDR` listens on (e.g. 127.0.0.1:9477); start the daemon
# with --http-snapshots to record a snapshot too. Records into OUT_DIR (new or empty):
#   - GET /api/v1/state once a second (states/NNNNNN.json, states.tsv: receive time, file, status);
#   - GET /api/v1/events for the whole time (curl -N), each line with its receive time (events.txt);
#   - every 10 s, the snapshot (format=json, top=SNAPSHOT_TOP, default 200: the page's own) of the
#     running process that uses the most
#     (snapshot-PID.json and .status; a 403, the daemon's answer without --http-snapshots, is
#     recorded once and not asked again);
#   - at the end, /api/v1/history?range=hour and range=day, and /metrics; meta.json.
# Needs bash, curl and python3 (standard library) only; no network beyond ADDR.
# Then, on any machine with a build:
#   python3 tests/browser/replay_server.py --web-root build/share/cuwarden/web --recording OUT_DIR
#   tests/browser/run_dashboard_replay.sh . build/share/cuwarden/web ARTEFACTS OUT_DIR
set -u -o pipefail

die() { echo "dashboard_record.sh: $*" >&2; exit 1; }
[[ $# -ge 2 ]] || die "usage: dashboard_record.sh ADDR OUT_DIR [SECONDS | -- CMD ARGS...]"
ADDR=$1 OUT=$2
shift 2
DURATION=60
CMD=()
if [[ ${1:-} == -- ]]; then
  shift
  [[ $# -gt 0 ]] || die "no command after --"
  CMD=("$@")
elif [[ $# -gt 0 ]]; then
  [[ $1 =~ ^[0-9]+$ ]] || die "SECONDS must be a whole number (got '$1')"
  DURATION=$1
fi
SNAPSHOT_EVERY=${SNAPSHOT_EVERY:-10}
BASE="http://$ADDR"
for tool in curl python3 date; do command -v $tool >/dev/null || die "$tool not found"; done

mkdir -p "$OUT" || die "cannot create $OUT"
[[ -z $(ls -A "$OUT") ]] || die "$OUT is not empty"
OUT=$(cd "$OUT" && pwd)
mkdir -p "$OUT/states"
: >"$OUT/states.tsv"
LOG=$OUT/record.log
curl -fsS -m 5 -o /dev/null "$BASE/api/v1/state" 2>>"$LOG" \
  || die "no answer from $BASE/api/v1/state (is cuwardend running with --http $ADDR?): $(tail -1 "$LOG")"

now() { date +%s.%6N; }
STARTED=$(now)

# The event stream: curl -N, each line stamped with its receive time as it arrives. Stopped
# with SIGTERM (it stops curl and writes what came).
python3 - "$BASE/api/v1/events" "$OUT/events.txt" <<'PY' 2>>"$LOG" &
import signal
import subprocess
import sys
import time

url, path = sys.argv[1], sys.argv[2]
curl = subprocess.Popen(["curl", "-sS", "-N", "-H", "Accept: text/event-stream", url], stdout=subprocess.PIPE)
signal.signal(signal.SIGTERM, lambda *_: curl.terminate())
with open(path, "w", encoding="utf-8") as out:
    for raw in iter(curl.stdout.readline, b""):
        out.write(f"{time.time():.6f}\t{raw.decode('utf-8', 'replace').rstrip(chr(13) + chr(10))}\n")
        out.flush()
curl.wait()
PY
SSE=$!

CMD_PID=""
if [[ ${#CMD[@]} -gt 0 ]]; then
  echo "dashboard_record.sh: running ${CMD[*]}" | tee -a "$LOG"
  "${CMD[@]}" &
  CMD_PID=$!
fi

# The process that uses the most on all its GPUs in a state document (nothing if none runs).
biggest() {
  python3 -c '
import json, sys
try:
    st = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    sys.exit(0)
best = max(((sum(d.get("used_bytes") or 0 for d in p.get("devices", [])), p["pid"])
            for p in st.get("processes", []) if p.get("state") == "running"), default=None)
if best and best[0] > 0:
    print(best[1])' "$1"
}

SNAP_FORBIDDEN=0
snapshot() {
  local pid=$1 code
  code=$(curl -sS -m 60 -o "$OUT/snapshot.tmp" -w '%{http_code}' \
    "$BASE/api/v1/processes/$pid/snapshot?format=json&top=${SNAPSHOT_TOP:-200}" 2>>"$LOG") || code=000
  case $code in
    200) mv "$OUT/snapshot.tmp" "$OUT/snapshot-$pid.json"; echo 200 >"$OUT/snapshot-$pid.status" ;;
    403) mv "$OUT/snapshot.tmp" "$OUT/snapshot-$pid.json"; echo 403 >"$OUT/snapshot-$pid.status"; SNAP_FORBIDDEN=1
         echo "dashboard_record.sh: snapshots answer 403 (cuwardend runs without --http-snapshots): recorded once" | tee -a "$LOG" ;;
    *) rm -f "$OUT/snapshot.tmp"; echo "snapshot of $pid: HTTP $code" >>"$LOG" ;;
  esac
}

STOP=0
trap 'STOP=1' INT TERM
echo "dashboard_record.sh: recording $BASE into $OUT ($([[ -n $CMD_PID ]] && echo "while the command runs" || echo "${DURATION} s, Ctrl-C stops"))"
start_ns=$(date +%s%N)
i=0 after=0 cmd_status=""
while (( ! STOP )); do
  file=$(printf 'states/%06d.json' "$i")
  t=$(now)
  code=$(curl -sS -m 5 -o "$OUT/$file" -w '%{http_code}' "$BASE/api/v1/state" 2>>"$LOG") || code=000
  printf '%s\t%s\t%s\n' "$t" "$file" "$code" >>"$OUT/states.tsv"
  if [[ $code == 200 ]] && (( SNAP_FORBIDDEN == 0 && i % SNAPSHOT_EVERY == SNAPSHOT_EVERY - 1 )); then
    pid=$(biggest "$OUT/$file")
    [[ -n $pid ]] && snapshot "$pid"
  fi
  i=$((i + 1))
  if [[ -n $CMD_PID ]]; then
    if [[ -z $cmd_status ]] && ! kill -0 "$CMD_PID" 2>/dev/null; then
      wait "$CMD_PID"
      cmd_status=$?
      echo "dashboard_record.sh: the command exited with status $cmd_status" | tee -a "$LOG"
    fi
    [[ -n $cmd_status ]] && after=$((after + 1))
    (( after > 3 )) && break
  else
    (( i >= DURATION )) && break
  fi
  # The next whole second after the start (curl's time does not accumulate).
  rest=$(( start_ns + i * 1000000000 - $(date +%s%N) ))
  (( rest > 0 )) && sleep "$(printf '%d.%09d' $((rest / 1000000000)) $((rest % 1000000000)))"
done
trap - INT TERM
if [[ -n $CMD_PID && -z $cmd_status ]]; then
  echo "dashboard_record.sh: stopping the command (pid $CMD_PID)" | tee -a "$LOG"
  kill "$CMD_PID" 2>/dev/null
  wait "$CMD_PID" 2>/dev/null
  cmd_status=$?
fi

# The largest process's snapshot at the end too, when snapshots are served and it still runs.
last=$(printf 'states/%06d.json' $((i - 1)))
if (( SNAP_FORBIDDEN == 0 )); then
  pid=$(biggest "$OUT/$last")
  [[ -n $pid ]] && snapshot "$pid"
fi
HISTORY_TIME=$(now)
for range in hour day; do
  code=$(curl -sS -m 30 -o "$OUT/history-$range.json" -w '%{http_code}' "$BASE/api/v1/history?range=$range" 2>>"$LOG") || code=000
  [[ $code == 200 ]] || { echo "history ($range): HTTP $code" | tee -a "$LOG"; rm -f "$OUT/history-$range.json"; }
done
code=$(curl -sS -m 30 -o "$OUT/metrics.txt" -w '%{http_code}' "$BASE/metrics" 2>>"$LOG") || code=000
[[ $code == 200 ]] || { echo "/metrics: HTTP $code" | tee -a "$LOG"; rm -f "$OUT/metrics.txt"; }
sleep 0.5   # the stream's last messages
kill -TERM "$SSE" 2>/dev/null
wait "$SSE" 2>/dev/null
ENDED=$(now)

python3 - "$OUT" "$ADDR" "$STARTED" "$ENDED" "$HISTORY_TIME" "${cmd_status:-}" "${CMD[@]}" <<'PY'
import json, pathlib, sys
out, addr, started, ended, history_time, status, *cmd = sys.argv[1:]
out = pathlib.Path(out)
rows = [l.split("\t") for l in (out / "states.tsv").read_text().splitlines() if l]
ok = [r for r in rows if r[2] == "200"]
last = {}
if ok:
    try:
        last = json.loads((out / ok[-1][1]).read_text())
    except ValueError:
        pass
meta = {"format": "cuwarden-api-recording", "version": 1, "address": addr,
        "started": float(started), "ended": float(ended), "history_time": float(history_time),
        "hostname": last.get("hostname"), "cuwarden_version": last.get("version"),
        "gpus": [g.get("name") for g in last.get("gpus", [])],
        "states": len(rows), "states_ok": len(ok),
        "command": cmd or None, "command_status": int(status) if status else None,
        "note": "recorded by tests/gpu/dashboard_record.sh"}
(out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
events = (out / "events.txt").read_text(errors="replace").splitlines() if (out / "events.txt").exists() else []
kinds = {}
for l in events:
    _, _, line = l.partition("\t")
    if line.startswith("event: "):
        kinds[line[7:]] = kinds.get(line[7:], 0) + 1
snaps = sorted(p.name for p in out.glob("snapshot-*.json"))
print(f"dashboard_record.sh: {len(ok)}/{len(rows)} state documents, stream {kinds or 'empty'}, "
      f"snapshots {snaps or 'none'}, {float(ended) - float(started):.0f} s -> {out}")
PY
