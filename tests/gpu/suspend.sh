#!/usr/bin/env bash
# cuwarden suspend / resume on a real GPU (the driver's checkpoint API, driver 570 or later):
#   1. the host-device copy bandwidth of this machine (pinned and pageable), for comparison;
#   2. a PyTorch process holding GIB GiB (for each size in SIZES): the GPU's used memory
#      before, while suspended and after, what `cuwarden --json` says, the process's CUDA call
#      waiting while suspended, its tensor intact after, the times (the command end to end and
#      the daemon's lock / checkpoint / restore / unlock), the process's stderr line;
#   3. a deterministic training run three times: twice uninterrupted, once suspended mid-run
#      and resumed; the three loss lists must be equal bit for bit.
# Writes summary.md, run.log and each run's files into OUT. Exit status 0 when every check held.
#
#   BUILD_DIR=build OUT=gpu-out SIZES="2 8 24" tests/gpu/suspend.sh
#
# Runs the daemon as the caller with its own state directory under OUT and a run directory
# under /tmp (the victims are the caller's own processes, so no root is needed). As root:
#   DAEMON_CAPS=unit  the daemon keeps only the capabilities the systemd unit keeps
#                     (packaging/systemd/cuwardend.service.in's CapabilityBoundingSet), no new
#                     privileges; its W+X mappings are counted (the unit's MemoryDenyWriteExecute)
#   VICTIM_USER=NAME  the sized victims run as that user: root's daemon suspends another
#                     user's process
set -uo pipefail

START_CWD=$(pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
abs() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$START_CWD/$1" ;; esac; }
OUT=$(abs "${OUT:-./gpu-out}")
BUILD=$(abs "${BUILD_DIR:-$REPO/build}")
SIZES=${SIZES:-"2 8 24"}
TRAIN_STEPS=${TRAIN_STEPS:-300}
TRAIN_HOLD_GIB=${TRAIN_HOLD_GIB:-4}
LIB=$BUILD/lib/libcuwarden.so
[[ -f $LIB ]] || LIB=$BUILD/libcuwarden.so
BIN=$BUILD/bin
[[ -x $BIN/cuwardend ]] || BIN=$BUILD
[[ -x $BIN/cuwardend && -x $BIN/cuwarden && -f $LIB ]] || { echo "no cuwardend, cuwarden and libcuwarden.so in $BUILD"; exit 2; }
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1

DAEMON_CAPS=${DAEMON_CAPS:-all}
VICTIM_USER=${VICTIM_USER:-}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cuw-suspend.XXXXXX")  # reachable by VICTIM_USER
chmod 0755 "$WORK"
export CUWARDEN_RUN_DIR=$WORK/run
mkdir -m 1777 "$CUWARDEN_RUN_DIR"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
used_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }

echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0)"
python3 -c 'import torch; print("# torch", torch.__version__, "cuda", torch.version.cuda)'

daemon_cmd=("$BIN/cuwardend" --state-dir "$OUT/state" --log-level debug)
if [[ $DAEMON_CAPS == unit ]]; then
  caps=$(sed -n 's/^CapabilityBoundingSet=//p' "$REPO/packaging/systemd/cuwardend.service.in")
  [[ -n $caps ]] || { echo "no CapabilityBoundingSet in $REPO/packaging/systemd/cuwardend.service.in"; exit 2; }
  bset=-all
  for c in $caps; do c=${c#CAP_}; bset+=",+${c,,}"; done
  daemon_cmd=(setpriv --bounding-set "$bset" --inh-caps -all --no-new-privs "${daemon_cmd[@]}")
  echo "# the daemon keeps the unit's capabilities only: $caps"
fi
"${daemon_cmd[@]}" 2>"$OUT/daemon.log" &
daemon=$!
victim=""
# Not a bare `wait`: it would wait for the tee above, which waits for this script to end.
trap 'kill $victim $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 200); do "$BIN/cuwarden" --json >/dev/null 2>&1 && break; sleep 0.1; done

echo "## host-device copy bandwidth (8 GiB, torch, best of 3)"
python3 - <<'PY' | tee "$OUT/bandwidth.txt"
import time, torch
n = 8 << 30
d = torch.empty(n, dtype=torch.uint8, device="cuda")
for pinned in (True, False):
    h = torch.empty(n, dtype=torch.uint8, pin_memory=pinned)
    for name, f in (("device to host", lambda: h.copy_(d)), ("host to device", lambda: d.copy_(h))):
        best = 1e9
        for _ in range(3):
            torch.cuda.synchronize(); t = time.perf_counter(); f(); torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
        print(f"{'pinned' if pinned else 'pageable'} {name}: {n / best / 2**30:.1f} GiB/s")
    del h
PY

cat >"$WORK/victim.py" <<'PY'
import sys, time, torch
gib = float(sys.argv[1])
x = torch.full((int(gib * (1 << 28)),), 7.0, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "check":
        print(f"check {bool((x == 7.0).all().item())} at {time.monotonic():.3f}", flush=True)
    elif line.strip() == "exit":
        break
PY

as_victim=()
if [[ -n $VICTIM_USER ]]; then
  as_victim=(setpriv --reuid="$VICTIM_USER" --regid="$(id -g "$VICTIM_USER")" --clear-groups env HOME="$WORK")
  cp "$LIB" "$WORK/" && LIB=$WORK/$(basename "$LIB")  # the build may be where that user cannot read
  echo "# the sized victims run as $VICTIM_USER (uid $(id -u "$VICTIM_USER"))"
fi
echo "## suspend and resume a process holding GIB GiB"
echo "| GiB | GPU MiB before | while suspended | after | suspend ms | lock s | checkpoint s | resume ms | restore s | unlock s | data intact |" >"$OUT/sizes.md"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |" >>"$OUT/sizes.md"
for gib in $SIZES; do
  echo "### $gib GiB"
  # exec: VICTIM_PID is then python's pid, not a subshell's.
  coproc VICTIM { exec "${as_victim[@]}" env LD_PRELOAD="$LIB" python3 "$WORK/victim.py" "$gib" 2>"$OUT/victim-$gib.err"; }
  victim=$VICTIM_PID
  in=${VICTIM[1]} out=${VICTIM[0]}
  read -r -t 180 _ <&"$out" || { fail "$gib GiB victim did not start"; continue; }
  for _ in $(seq 100); do "$BIN/cuwarden" --json | grep -qE "\"pid\": ?${victim}[,}]" && break; sleep 0.1; done
  before=$(used_mib)
  t=$(now_ms)
  "$BIN/cuwarden" suspend "$victim" --timeout 30s || fail "$gib GiB: suspend exited $?"
  suspend_ms=$(($(now_ms) - t))
  during=$(used_mib)
  grep -E "^Cap(Prm|Eff|Bnd)" "/proc/$daemon/status" | tr '\n' ' '
  echo "daemon W+X mappings: $(grep -c ' rwxp ' "/proc/$daemon/maps")"
  "$BIN/cuwarden" --json >"$OUT/state-suspended-$gib.json"
  python3 - "$OUT/state-suspended-$gib.json" "$victim" <<'PY' || fail "$gib GiB: --json does not say suspended"
import json, sys
p = [p for p in json.load(open(sys.argv[1]))["processes"] if p["pid"] == int(sys.argv[2])][0]
used = [d.get("used_bytes") for d in p.get("devices", [])]
print("json: state", p.get("state"), "host bytes", p.get("suspended_host_bytes"), "device used", used)
sys.exit(0 if p.get("state") == "suspended" and all(u == 0 for u in used) else 1)
PY
  "$BIN/cuwarden" | grep -w "$victim"
  echo check >&"$in"
  answer=""
  if read -r -t 3 answer <&"$out"; then fail "$gib GiB: the victim's CUDA call ran while suspended ($answer)"; else
    echo "the victim's CUDA call waits while suspended"; fi
  t=$(now_ms)
  "$BIN/cuwarden" resume "$victim" || fail "$gib GiB: resume exited $?"
  resume_ms=$(($(now_ms) - t))
  after=$(used_mib)
  # The answer to the check sent while suspended (already read if the call did not wait).
  [[ -n $answer ]] || read -r -t 120 answer <&"$out" || answer=""
  echo "after resume: $answer"
  [[ $answer == "check True"* ]] || fail "$gib GiB: data not intact after resume ($answer)"
  echo exit >&"$in"
  wait "$victim"
  victim=""
  grep -h "resumed" "$OUT/victim-$gib.err" || fail "$gib GiB: no resume line on the process's stderr"
  pid_line=$(grep -E "suspend: pid [0-9]+ .*lock" "$OUT/daemon.log" | tail -1)
  res_line=$(grep -E "resume: pid [0-9]+: restore" "$OUT/daemon.log" | tail -1)
  lock_s=$(sed -E 's/.*lock ([0-9.]+) s.*/\1/' <<<"$pid_line")
  ckpt_s=$(sed -E 's/.*checkpoint ([0-9.]+) s.*/\1/' <<<"$pid_line")
  rest_s=$(sed -E 's/.*restore ([0-9.]+) s.*/\1/' <<<"$res_line")
  unl_s=$(sed -E 's/.*unlock ([0-9.]+) s.*/\1/' <<<"$res_line")
  echo "GPU used: $before -> $during -> $after MiB; suspend $suspend_ms ms (lock $lock_s s, checkpoint $ckpt_s s); resume $resume_ms ms (restore $rest_s s, unlock $unl_s s)"
  echo "| $gib | $before | $during | $after | $suspend_ms | $lock_s | $ckpt_s | $resume_ms | $rest_s | $unl_s | ${answer%% at*} |" >>"$OUT/sizes.md"
done
cat "$OUT/sizes.md"

echo "## a deterministic training, suspended mid-run"
(( TRAIN_STEPS > 0 )) || { echo "skipped (TRAIN_STEPS=0)"; echo "## result: $failures failure(s)"; exit $((failures > 0)); }
export CUBLAS_WORKSPACE_CONFIG=:4096:8
for run in plain-1 plain-2 suspended; do
  LD_PRELOAD=$LIB python3 "$REPO/tests/gpu/suspend_train.py" "$TRAIN_STEPS" "$OUT/train-$run.txt" "$TRAIN_HOLD_GIB" \
    2>"$OUT/train-$run.err" &
  victim=$!
  if [[ $run == suspended ]]; then
    half=$((TRAIN_STEPS / 2))
    for _ in $(seq 1200); do grep -q "^step $half " "$OUT/train-$run.txt" 2>/dev/null && break; sleep 0.05; done
    "$BIN/cuwarden" suspend "$victim" --timeout 30s || fail "training: suspend exited $?"
    at=$(grep -c "^step" "$OUT/train-$run.txt")
    sleep 5
    [[ $(grep -c "^step" "$OUT/train-$run.txt") == "$at" ]] || fail "training: steps went on while suspended"
    echo "suspended after step $((at - 1)) of $TRAIN_STEPS for 5 s (GPU used $(used_mib) MiB)"
    "$BIN/cuwarden" resume "$victim" || fail "training: resume exited $?"
  fi
  wait "$victim" || fail "training $run exited $?"
  victim=""
  echo "$run: $(grep -c '^step' "$OUT/train-$run.txt") steps, last $(grep '^step' "$OUT/train-$run.txt" | tail -1), $(grep held "$OUT/train-$run.txt")"
done
cmp -s "$OUT/train-plain-1.txt" "$OUT/train-plain-2.txt" && echo "the two uninterrupted runs' losses are equal" ||
  fail "the uninterrupted runs differ: the training is not reproducible"
cmp -s "$OUT/train-plain-1.txt" "$OUT/train-suspended.txt" && echo "the suspended run's losses equal the uninterrupted runs'" ||
  fail "the suspended run's losses differ"
grep -h "resumed" "$OUT/train-suspended.err" || fail "training: no resume line on stderr"
grep -E "suspend|resume" "$OUT/daemon.log" | grep -vi debug | head -20

echo "## result: $failures failure(s)"
exit $((failures > 0))
