#!/usr/bin/env bash
# cuwarden on a GPU: call sites, snapshots and out-of-memory reports with PyTorch (issue 25).
# Builds nothing.
#
#   BUILD_DIR=<dir> OUT=<dir> bash tests/gpu/callsites.sh
#
# Needs in BUILD_DIR: bin/cuwarden, bin/cuwardend, lib/libcuwarden.so; python3 with PyTorch.
# Steps (each one line PASS/FAIL in $OUT/callsites.txt, logs beside it):
#   1. the daemon on a private run directory;
#   2. a training (callsites/train.py) under CUWARDEN_CALLSITES=16, held after its steps:
#      `cuwarden snapshot PID --format pytorch` passes `python -m torch.cuda._memory_viz`
#      stats, trace, segments and memory; the top call site's innermost frame of train.py is
#      the line it planted a 1 GiB tensor at; json, perfetto and summary are written too;
#   3. the same training under a 4G cap asking for 8 GiB at another line: the program's
#      stderr paragraph and `cuwarden oom PID` name that line;
#   4. step time with call sites on and off, interleaved rounds (medians and spread).
# memory_viz runs through callsites/memory_viz.py: `segments` and `memory` pipe through
# flamegraph.pl, which torch downloads; without a network a stand-in is written where torch
# wants it (what is checked is torch's reading of the snapshot).
set -uo pipefail
START_CWD=$(pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
abs() { case $1 in /*) echo "$1" ;; *) echo "$START_CWD/$1" ;; esac; }
BUILD=$(abs "${BUILD_DIR:-./build}")
OUT=$(abs "${OUT:-./gpu-out}")
ROUNDS=${ROUNDS:-5}
mkdir -p "$OUT"
CLI=$BUILD/bin/cuwarden
DAEMON=$BUILD/bin/cuwardend
LIB=$BUILD/lib/libcuwarden.so
TRAIN=$HERE/callsites/train.py
RES=$OUT/callsites.txt
: >"$RES"
FAILS=0
pass() { echo "PASS $*" | tee -a "$RES"; }
fail() { echo "FAIL $*" | tee -a "$RES"; FAILS=$((FAILS + 1)); }
note() { echo "$*" | tee -a "$RES"; }

note "date: $(date -u +%FT%TZ)"
note "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
note "torch: $(python3 -c 'import torch,sys; print(torch.__version__, "cuda", torch.version.cuda, "python", sys.version.split()[0])')"

# cuwardend links elfutils' libdw (its symbolizer); where the machine lacks it, a copy
# carried in BUILD_DIR/lib/fallback is used.
if ldd "$DAEMON" | grep -q 'not found' && [[ -d $BUILD/lib/fallback ]]; then
  export LD_LIBRARY_PATH=$BUILD/lib/fallback${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  note "libdw: the carried copy ($BUILD/lib/fallback)"
fi
RUN=$(mktemp -d /tmp/cuw-cs-XXXXXX)
SOCK=$RUN/daemon/cuwardend.sock
export CUWARDEN_RUN_DIR=$RUN
"$DAEMON" --run-dir "$RUN" --log-level info >"$OUT/daemon.log" 2>&1 &
DPID=$!
trap 'kill $DPID 2>/dev/null; rm -rf "$RUN"' EXIT
for _ in $(seq 100); do [[ -S $SOCK ]] && break; sleep 0.1; done
[[ -S $SOCK ]] && pass "daemon up" || { fail "daemon did not start (daemon.log)"; exit 1; }

# ---- 2. snapshot of a training --------------------------------------------------------------
GO=$RUN/go
CUWARDEN_CALLSITES=16 PYTHONUNBUFFERED=1 timeout 300 "$CLI" run --callsites 16 -- python3 "$TRAIN" --steps 10 --wait "$GO" \
  >"$OUT/train.out" 2>"$OUT/train.err" &
TP=$!
for _ in $(seq 600); do grep -q '^ready' "$OUT/train.out" 2>/dev/null && break; sleep 0.1; done
PID=$(awk '/^ready/{print $2}' "$OUT/train.out")
PLANTED=$(awk '/^planted/{print $2}' "$OUT/train.out")
if [[ -z $PID ]]; then
  fail "training did not reach its hold point (train.err)"
else
  sleep 1.5
  T0=$(date +%s%N)
  "$CLI" snapshot "$PID" --format pytorch -o "$OUT/train.pickle" --socket "$SOCK" 2>>"$OUT/cli.err"
  T1=$(date +%s%N)
  note "snapshot --format pytorch took $(( (T1 - T0) / 1000000 )) ms, $(stat -c %s "$OUT/train.pickle" 2>/dev/null) bytes"
  "$CLI" snapshot "$PID" --format json -o "$OUT/train.json" --socket "$SOCK" 2>>"$OUT/cli.err"
  "$CLI" snapshot "$PID" --format perfetto -o "$OUT/train.perfetto.json" --socket "$SOCK" 2>>"$OUT/cli.err"
  "$CLI" snapshot "$PID" -o "$OUT/train.snapshot.txt" --socket "$SOCK" 2>>"$OUT/cli.err"
  "$CLI" summary "$PID" --socket "$SOCK" >"$OUT/train.summary.txt" 2>>"$OUT/cli.err"
  for sub in stats trace segments memory; do
    args=(train.pickle)
    [[ $sub == segments || $sub == memory ]] && args+=(-o "viz-$sub.svg")
    if (cd "$OUT" && timeout 120 python3 "$HERE/callsites/memory_viz.py" "$sub" "${args[@]}" >"viz-$sub.log" 2>&1); then
      pass "memory_viz $sub reads the snapshot"
    else
      fail "memory_viz $sub: $(tail -2 "$OUT/viz-$sub.log" | tr '\n' ' ')"
    fi
  done
  python3 - "$OUT/train.json" "$TRAIN" "$PLANTED" >>"$RES" 2>&1 <<'PY'
import json, os, sys
doc = json.load(open(sys.argv[1])); script = os.path.basename(sys.argv[2]); planted = int(sys.argv[3])
sites = {s["id"]: s for s in doc["sites"]}
by = {}
for a in doc["allocations"]:
    if a["kind"] == "host": continue
    by[a["site"]] = by.get(a["site"], 0) + a["bytes"]
top = max(by, key=by.get)
frames = sites.get(top, {}).get("frames", [])
mine = [f for f in frames if f.get("python") and os.path.basename(f.get("file", "")) == script]
line = mine[0]["line"] if mine else None
ok = line == planted
print(("PASS" if ok else "FAIL") + f" top call site ({by[top] / 2**30:.2f} GiB of {sum(by.values()) / 2**30:.2f} GiB live, "
      f"{len(doc['allocations'])} allocations): innermost {script} frame line {line}, planted at {planted}")
print(f"exact={doc['exact']} events_dropped={doc['events_dropped']} sites={len(doc['sites'])} callsite_frames={doc['callsite_frames']}")
native = [f for f in frames if not f.get("python")][:6]
print("top site native frames: " + "; ".join(f"{f.get('function') or '??'} ({os.path.basename(f.get('module', ''))})" for f in native))
PY
fi
touch "$GO"
wait $TP
grep -c "^FAIL" "$RES" >/dev/null

# ---- 3. out-of-memory report ----------------------------------------------------------------
GO2=$RUN/go2
PYTHONUNBUFFERED=1 timeout 300 "$CLI" run --limit 4G --callsites 16 -- python3 "$TRAIN" --steps 3 --plant-mib 512 \
  --oom-gib 8 --wait "$GO2" >"$OUT/oom.out" 2>"$OUT/oom.err" &
TP=$!
for _ in $(seq 600); do grep -q '^ready' "$OUT/oom.out" 2>/dev/null && break; sleep 0.1; done
OPID=$(awk '/^ready/{print $2}' "$OUT/oom.out")
touch "$GO2"
wait $TP
OOMLINE=$(awk '/^oom-line/{print $2}' "$OUT/oom.out")
sleep 1.5
"$CLI" oom "$OPID" --socket "$SOCK" >"$OUT/oom.report.txt" 2>&1
grep -q "OutOfMemoryError" "$OUT/oom.out" && pass "the 8 GiB request under a 4G cap raised torch.OutOfMemoryError" \
  || fail "no OutOfMemoryError (oom.out)"
grep -q "out of memory on GPU" "$OUT/oom.err" && grep -q "Asked at: .*train.py:$OOMLINE" "$OUT/oom.err" \
  && pass "the program's stderr paragraph names train.py:$OOMLINE" || fail "stderr paragraph does not name train.py:$OOMLINE (oom.err)"
grep -q "asked at: .*train.py:$OOMLINE" "$OUT/oom.report.txt" && pass "cuwarden oom $OPID names train.py:$OOMLINE" \
  || fail "cuwarden oom does not name train.py:$OOMLINE (oom.report.txt)"
"$CLI" snapshot "$OPID" --oom 0 --format pytorch -o "$OUT/oom.pickle" --socket "$SOCK" 2>>"$OUT/cli.err" \
  && (cd "$OUT" && python3 "$HERE/callsites/memory_viz.py" stats oom.pickle >viz-oom-stats.log 2>&1) \
  && pass "the report's snapshot (taken at the refusal, the process gone since) passes memory_viz stats" \
  || fail "the report's snapshot (viz-oom-stats.log)"
sed -n '/out of memory on GPU/,/Full snapshot/p' "$OUT/oom.err" | head -12 >>"$RES"

# ---- 4. step time, call sites on and off ----------------------------------------------------
for r in $(seq "$ROUNDS"); do
  for mode in off on; do
    n=0; [[ $mode == on ]] && n=16
    PYTHONUNBUFFERED=1 timeout 300 "$CLI" run --callsites $n -- python3 "$TRAIN" --steps 40 --plant-mib 64 --timing \
      >"$OUT/time-$mode-$r.out" 2>>"$OUT/time.err"
  done
done
python3 - "$OUT" "$ROUNDS" >>"$RES" <<'PY'
import statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
res = {}
for mode in ("off", "on"):
    meds = []
    for r in range(1, rounds + 1):
        steps = [float(l.split()[1]) for l in open(f"{out}/time-{mode}-{r}.out") if l.startswith("step_ms")][10:]
        if steps: meds.append(statistics.median(steps))
    res[mode] = meds
    print(f"step time, call sites {mode}: per-round medians (steps 11-40) " + ", ".join(f"{m:.2f}" for m in meds) +
          f" ms; median {statistics.median(meds):.2f} ms, spread {min(meds):.2f}-{max(meds):.2f}")
print(f"on/off ratio of medians: {statistics.median(res['on']) / statistics.median(res['off']):.3f}")
PY
note "exit: $FAILS failure(s)"
exit $((FAILS > 0))
