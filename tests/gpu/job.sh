#!/usr/bin/env bash
# cuwarden GPU validation of job caps (issue 7), on any machine with a CUDA GPU and PyTorch.
#
# Four PyTorch processes in one job with a 16 GiB job cap race to fill the GPU with 512 MiB
# tensors: together they must stop at the cap, each with its own OutOfMemoryError; cuwarden
# must show the job and its members while they hold; then one rank is killed with SIGKILL
# and the other three must be able to take its share.
#
# Uses an existing build (BUILD_DIR, default <repo>/build: lib/libcuwarden.so,
# bin/cuwardend, bin/cuwarden). Writes into ${OUT:-./gpu-out}: job-summary.md, job.log,
# job-table.txt, job-state.json. Exit status 0 when every check passed.
#
#   OUT=/tmp/gpu-out BUILD_DIR=build tests/gpu/job.sh
set -euo pipefail

START_CWD=$(pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
abs_path() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$START_CWD/$1" ;; esac; }
OUT_DIR=$(abs_path "${OUT:-./gpu-out}")
BUILD=$(abs_path "${BUILD_DIR:-$REPO/build}")
mkdir -p "$OUT_DIR"
cd "$REPO"

JOB=train4
JOB_LIMIT=16G
CAP=$((16 * 1024 * 1024 * 1024))
CHUNK=$((512 * 1024 * 1024))
RANKS=4
LIB="$BUILD/lib/libcuwarden.so"
DAEMON="$BUILD/bin/cuwardend"
CLI="$BUILD/bin/cuwarden"

: >"$OUT_DIR/job.log"
exec > >(tee -a "$OUT_DIR/job.log") 2>&1
TEE_PID=$!
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cuwarden-job.XXXXXX")
RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/cuwarden-run.XXXXXX")
export CUWARDEN_RUN_DIR="$RUN_DIR"
CTRL="$WORK/ctrl"
mkdir -p "$CTRL"
PIDS=()
DAEMON_PID=""
cleanup() {
  touch "$CTRL/done" 2>/dev/null || true
  for pid in "${PIDS[@]}" $DAEMON_PID; do kill "$pid" 2>/dev/null || true; done
  # Only our own children: a bare `wait` would also wait for the tee below, which waits
  # for this shell's output to close.
  for pid in "${PIDS[@]}" $DAEMON_PID; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK" "$RUN_DIR"
  exec 1>&- 2>&-
  wait "$TEE_PID" 2>/dev/null || true
}
trap cleanup EXIT

RESULTS=()
FAILS=0
check() {  # check NAME DETAIL COMMAND...
  local name=$1 detail=$2
  shift 2
  if "$@"; then RESULTS+=("| PASS | $name | $detail |"); echo "PASS: $name — $detail"
  else RESULTS+=("| FAIL | $name | $detail |"); echo "FAIL: $name — $detail"; FAILS=$((FAILS + 1)); fi
}
wait_files() {  # wait_files SUFFIX COUNT TIMEOUT_S
  local deadline=$((SECONDS + $3))
  while (( SECONDS < deadline )); do
    local n=0
    for r in $(seq 0 $((RANKS - 1))); do [[ -e "$CTRL/rank$r.$1" ]] && n=$((n + 1)); done
    (( n >= $2 )) && return 0
    sleep 0.1
  done
  return 1
}
got() { cut -d' ' -f1 "$CTRL/rank$1.$2"; }

echo "== devices"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

"$DAEMON" --run-dir "$RUN_DIR" >"$WORK/daemon.log" 2>&1 &
DAEMON_PID=$!
sleep 0.5

echo "== $RANKS ranks, CUWARDEN_JOB=$JOB CUWARDEN_JOB_LIMIT=$JOB_LIMIT"
for r in $(seq 0 $((RANKS - 1))); do
  LD_PRELOAD="$LIB" CUWARDEN_JOB=$JOB CUWARDEN_JOB_LIMIT=$JOB_LIMIT \
    python3 tests/gpu/job_rank.py "$r" "$CTRL" >"$WORK/rank$r.log" 2>&1 &
  PIDS+=($!)
done
wait_files pid $RANKS 120 || { echo "ranks did not start"; cat "$WORK"/rank*.log; exit 1; }
touch "$CTRL/go"
wait_files 1 $RANKS 120 || { echo "ranks did not fill"; cat "$WORK"/rank*.log; exit 1; }
sum1=0
for r in $(seq 0 $((RANKS - 1))); do
  echo "rank $r round 1: $(cat "$CTRL/rank$r.1")"
  sum1=$((sum1 + $(got $r 1)))
done
echo "sum round 1: $sum1 bytes (cap $CAP)"
check "together they stop at the cap" "sum of 512 MiB tensors held = $sum1 bytes; cap $CAP; within one chunk per rank of it" \
  test "$sum1" -le "$CAP" -a "$sum1" -gt $((CAP - RANKS * CHUNK))
ooms=$(grep -l "CUDA out of memory" "$CTRL"/rank*.1 | wc -l)
check "each rank gets its own OutOfMemoryError" "$ooms of $RANKS ranks raised torch.cuda.OutOfMemoryError" test "$ooms" -eq $RANKS
head -c 400 "$CTRL/rank0.1"; echo

sleep 1.5  # the daemon scans the run directory
"$CLI" >"$OUT_DIR/job-table.txt" 2>&1 || true
"$CLI" --json >"$OUT_DIR/job-state.json" 2>&1 || true
cat "$OUT_DIR/job-table.txt"
check "cuwarden shows the job and its members" "job row '$JOB' with $RANKS members in \`cuwarden\` and \`cuwarden --json\`" \
  python3 - "$OUT_DIR/job-state.json" "$OUT_DIR/job-table.txt" "$JOB" "$RANKS" "$CAP" <<'PY'
import json, sys
state = json.load(open(sys.argv[1])); table = open(sys.argv[2]).read()
job, ranks, cap = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
jobs = [j for j in state.get("jobs", []) if j.get("name") == job]
assert jobs, "no job row in --json"
j = jobs[0]
print("job json:", json.dumps(j)[:600])
assert len(j.get("members", [])) == ranks, "members"
assert job in table, "job missing from table"
PY

victim=${PIDS[0]}
echo "== SIGKILL rank 0 (pid $victim), holding $(got 0 1) bytes"
kill -KILL "$victim"
wait "$victim" 2>/dev/null || true
touch "$CTRL/again"
wait_files 2 $((RANKS - 1)) 120 || { echo "ranks did not refill"; cat "$WORK"/rank*.log; exit 1; }
sum2=0; total=0
for r in $(seq 1 $((RANKS - 1))); do
  echo "rank $r round 2: $(cat "$CTRL/rank$r.2")"
  sum2=$((sum2 + $(got $r 2)))
  total=$((total + $(got $r 1) + $(got $r 2)))
done
share=$(got 0 1)
echo "killed rank's share $share; taken by the others $sum2; now held $total"
check "a killed rank's share goes to the others" "rank 0 held $share bytes; after SIGKILL ranks 1-3 took $sum2 more" \
  test "$sum2" -ge $((share - CHUNK))
check "still within the cap after the kill" "ranks 1-3 hold $total bytes, cap $CAP" test "$total" -le "$CAP"
"$CLI" >"$OUT_DIR/job-table-after-kill.txt" 2>&1 || true
cat "$OUT_DIR/job-table-after-kill.txt"

{
  echo "# cuwarden job caps on a GPU: $RANKS PyTorch ranks, one job, $JOB_LIMIT"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  echo "- $(python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)')"
  echo "- command: \`OUT=<dir> BUILD_DIR=<build> tests/gpu/job.sh\`"
  echo
  echo "| result | check | detail |"
  echo "| --- | --- | --- |"
  printf '%s\n' "${RESULTS[@]}"
  echo
  echo "Round 1 (each rank: bytes held, first line of its OutOfMemoryError):"
  echo '```'
  for r in $(seq 0 $((RANKS - 1))); do echo "rank $r: $(cat "$CTRL/rank$r.1")"; done
  echo '```'
  echo "After SIGKILL of rank 0:"
  echo '```'
  for r in $(seq 1 $((RANKS - 1))); do echo "rank $r: $(cat "$CTRL/rank$r.2")"; done
  echo '```'
  echo "\`cuwarden\` while the four ranks held the job full:"
  echo '```'
  cat "$OUT_DIR/job-table.txt"
  echo '```'
} >"$OUT_DIR/job-summary.md"
echo "== $((${#RESULTS[@]} - FAILS)) of ${#RESULTS[@]} checks passed"
exit $(( FAILS > 0 ))
