#!/usr/bin/env bash
# cuwarden on a real GPU: a higher-priority PyTorch program that needs memory a lower-priority
# one holds gets it (the daemon suspends the lower one by policy), finishes, and the lower one
# resumes by itself and finishes with its data intact.
#
#   BUILD_DIR=build OUT=gpu-out LOW_GIB=40 HIGH_GIB=45 tests/gpu/suspend_priority.sh
#
# LOW_GIB + HIGH_GIB must exceed the GPU's free memory (defaults for an 80 GB card). The
# daemon runs as the caller, with a policy giving the default priority 0 and allowing up to
# 10; the low program runs at 0, the high one asks CUWARDEN_PRIORITY=10. Each runs in a session
# of its own (setsid): the daemon never suspends a process of the asker's session for it.
set -uo pipefail
START_CWD=$(pwd)
abs() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$START_CWD/$1" ;; esac; }
OUT=$(abs "${OUT:-./gpu-out}")
BUILD=$(abs "${BUILD_DIR:-build}")
LOW_GIB=${LOW_GIB:-40}
HIGH_GIB=${HIGH_GIB:-45}
BIN=$BUILD/bin
LIB=$BUILD/lib/libcuwarden.so
[[ -x $BIN/cuwardend && -x $BIN/cuwarden && -f $LIB ]] || { echo "no cuwardend, cuwarden and libcuwarden.so in $BUILD"; exit 2; }
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cuw-priority.XXXXXX")
export CUWARDEN_RUN_DIR=$WORK/run
mkdir -p "$CUWARDEN_RUN_DIR"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
used_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0; }
echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0)"

cat >"$WORK/policy.toml" <<'TOML'
[default]
priority = 0
max_priority = 10
resume_after = "2s"
room_wait = "90s"
TOML
"$BIN/cuwardend" --config "$WORK/policy.toml" --state-dir "$OUT/state" --log-level debug 2>"$OUT/daemon.log" &
daemon=$!
trap 'kill $low $high $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$WORK"' EXIT
low="" high=""
for _ in $(seq 200); do "$BIN/cuwarden" --json >/dev/null 2>&1 && break; sleep 0.1; done

# Each program: hold GIB GiB of 7.0, run STEPS matmul steps (printing each; PAUSE seconds
# after each, so that the low one is still running when the high one asks), check the data.
cat >"$WORK/prog.py" <<'PY'
import sys, time, torch
name, gib, steps, pause = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
t0 = time.monotonic()
x = torch.full((int(gib * (1 << 28)),), 7.0, device="cuda")
print(f"{name} holds {gib:g} GiB at {time.monotonic() - t0:.2f} s", flush=True)
a = torch.randn(4096, 4096, device="cuda")
for i in range(steps):
    a = torch.tanh(a @ a)
    torch.cuda.synchronize()
    print(f"{name} step {i} at {time.monotonic() - t0:.2f} s", flush=True)
    time.sleep(pause)
print(f"{name} done at {time.monotonic() - t0:.2f} s, data intact {bool((x == 7.0).all().item())}", flush=True)
PY

setsid env LD_PRELOAD="$LIB" python3 "$WORK/prog.py" low "$LOW_GIB" 1500 0.01 >"$OUT/low.log" 2>"$OUT/low.err" &
low=$!
for _ in $(seq 600); do grep -q "low step 20 " "$OUT/low.log" 2>/dev/null && break; sleep 0.1; done
echo "low (pid $low) running: GPU used $(used_mib) MiB"
t=$(date +%s%N)
setsid env CUWARDEN_PRIORITY=10 LD_PRELOAD="$LIB" python3 "$WORK/prog.py" high "$HIGH_GIB" 50 0 >"$OUT/high.log" 2>"$OUT/high.err" &
high=$!
for _ in $(seq 600); do
  "$BIN/cuwarden" --json >"$OUT/state-during.json" 2>/dev/null
  python3 -c "
import json,sys
for p in json.load(open('$OUT/state-during.json'))['processes']:
    if p['pid']==$low and p.get('state')=='suspended': sys.exit(0)
sys.exit(1)" && break
  kill -0 "$high" 2>/dev/null || break
  sleep 0.1
done
python3 - "$OUT/state-during.json" "$low" "$high" <<'PYC' || fail "the low program was not suspended by policy"
import json, sys
d = json.load(open(sys.argv[1]))
by = {p["pid"]: p for p in d["processes"]}
lo, hi = by.get(int(sys.argv[2]), {}), by.get(int(sys.argv[3]), {})
print("low:", lo.get("state"), "by", lo.get("suspended_by"), "priority", lo.get("priority"),
      "host bytes", lo.get("suspended_host_bytes"), "| high: priority", hi.get("priority"))
sys.exit(0 if lo.get("state") == "suspended" and lo.get("suspended_by") == "policy" else 1)
PYC
echo "GPU used with low suspended: $(used_mib) MiB"
wait "$high"; rc=$?
echo "high exited $rc after $((($(date +%s%N) - t) / 1000000)) ms: $(tail -1 "$OUT/high.log")"
[[ $rc == 0 ]] && grep -q "high done .*data intact True" "$OUT/high.log" || fail "the high program did not finish (high.err)"
steps_at_high_end=$(grep -c "^low step" "$OUT/low.log")
wait "$low"; rc=$?
echo "low exited $rc: $(tail -1 "$OUT/low.log") ($steps_at_high_end steps before the high one ended)"
[[ $rc == 0 ]] && grep -q "low done .*data intact True" "$OUT/low.log" || fail "the low program did not finish intact (low.err)"
grep -h "resumed" "$OUT/low.err" || fail "no resume line on the low program's stderr"
grep -E "room|suspend|resume" "$OUT/daemon.log" | grep -v " debug " | head -12
echo "## result: $failures failure(s)"
exit $((failures > 0))
