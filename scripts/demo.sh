#!/usr/bin/env bash
# cuwarden demo: build, start the daemon, run a training-like workload under a 2 GiB cap,
# watch it with `cuwarden`, and see the cap refuse the allocation that would exceed it.
# Uses the real GPU when nvidia-smi shows one (CUWARDEN_DEMO_SIMULATE=1: the simulated driver
# anyway), else cuwarden's simulated driver.
#
#   scripts/demo.sh
#   SKIP_BUILD=1 BUILD_DIR=some/build scripts/demo.sh    (use an existing build as it is)
#   scripts/demo.sh --targets    (print the build targets it needs, and nothing else)
set -euo pipefail

# What the demo runs, and what its closing lines tell the user to open (the web page).
DEMO_TARGETS=(cuwarden cuwardend cuwarden_cli cuw_demo_workload fakecuda cuwarden_web)
if [[ ${1:-} == --targets ]]; then
  echo "${DEMO_TARGETS[@]}"
  exit 0
fi

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"

BOLD=""; RESET=""
if [[ -t 1 ]]; then BOLD=$'\e[1m'; RESET=$'\e[0m'; fi
section() { printf '\n%s== %s ==%s\n\n' "$BOLD" "$*" "$RESET"; }
say() { printf '%s\n' "$*"; }
die() { printf 'demo: %s\n' "$*" >&2; exit 1; }

section "1. Setup and build"
if [[ ${SKIP_BUILD:-0} == 1 ]]; then
  say "SKIP_BUILD=1: using ${BUILD_DIR:-build} as it is"
else
  # Only what the demo builds and runs (the tests' tools and services come with scripts/test.sh).
  scripts/setup.sh --demo
  scripts/build.sh --target "${DEMO_TARGETS[@]}"
fi

BUILD=${BUILD_DIR:-$REPO/build}
[[ $BUILD == /* ]] || BUILD="$REPO/$BUILD"
DAEMON="$BUILD/bin/cuwardend"
CLI="$BUILD/bin/cuwarden"
WORKLOAD="$BUILD/bin/cuw_demo_workload"
for f in "$DAEMON" "$CLI" "$WORKLOAD" "$BUILD/lib/libcuwarden.so" "$BUILD/share/cuwarden/web/index.html"; do
  [[ -e $f ]] || die "missing $f — did the build finish? (scripts/build.sh)"
done

# Private run directory: rings and the daemon socket live here, nothing is shared with
# any other cuwarden on this machine. The interposer, daemon and CLI all read this variable.
RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/cuwarden-demo.XXXXXX")
export CUWARDEN_RUN_DIR="$RUN_DIR"
SOCK="$RUN_DIR/daemon/cuwardend.sock"
DAEMON_PID=""
WORKLOAD_PID=""
JOB_PIDS=""
cleanup() {
  local pid
  for pid in $WORKLOAD_PID $JOB_PIDS $DAEMON_PID; do
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$RUN_DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

section "2. GPU"
if [[ ${CUWARDEN_DEMO_SIMULATE:-0} != 1 ]] && command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  say "Using the real GPU driver:"
  nvidia-smi -L
else
  say "No GPU found: using cuwarden's simulated driver (tests/fakecuda) with one 16 GiB device"
  [[ -e $BUILD/fakecuda/libcuda.so.1 ]] || die "missing $BUILD/fakecuda/libcuda.so.1 (built with the tests)"
  export LD_LIBRARY_PATH="$BUILD/fakecuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CUWARDEN_FAKE_DEVICES=1 CUWARDEN_FAKE_MEMORY=16G
fi

section "3. Start the daemon"
say "\$ cuwardend --run-dir $RUN_DIR &"
"$DAEMON" --run-dir "$RUN_DIR" >"$RUN_DIR/cuwardend.log" 2>&1 &
DAEMON_PID=$!
for _ in $(seq 1 50); do
  [[ -S $SOCK ]] && break
  kill -0 "$DAEMON_PID" 2>/dev/null || { cat "$RUN_DIR/cuwardend.log" >&2; die "cuwardend exited"; }
  sleep 0.1
done
[[ -S $SOCK ]] || die "cuwardend did not open $SOCK within 5 s"
say "cuwardend is running (pid $DAEMON_PID)."

section "4. Run a training-like workload capped at 2 GiB"
say "\$ cuwarden run --limit 2G -- cuw_demo_workload --sleep-ms 300"
say ""
WL_LOG="$RUN_DIR/workload.log"
"$CLI" run --limit 2G -- "$WORKLOAD" --sleep-ms 300 >"$WL_LOG" 2>&1 &
WORKLOAD_PID=$!
# Let it get a few steps in, so the table has something to show.
for _ in $(seq 1 100); do
  grep -q '^step 4:' "$WL_LOG" 2>/dev/null && break
  kill -0 "$WORKLOAD_PID" 2>/dev/null || break
  sleep 0.1
done
SHOWN=$(wc -l <"$WL_LOG")
sed 's/^/    /' "$WL_LOG"

section "5. Meanwhile, in another shell: cuwarden"
say "\$ cuwarden"
"$CLI" --socket "$SOCK" || say "(cuwarden exited with status $?)"

section "6. The workload goes on, then asks for more than its cap"
RC=0
wait "$WORKLOAD_PID" || RC=$?
WORKLOAD_PID=""
tail -n +"$((SHOWN + 1))" "$WL_LOG" | sed 's/^/    /'
say ""
if REFUSAL=$(grep -m1 '^refused:' "$WL_LOG"); then
  say "The cap held. The refusal, as the program saw it:"
  say ""
  say "    $BOLD$REFUSAL$RESET"
  say ""
  say "cudaMalloc returned cudaErrorMemoryAllocation, exactly as if the GPU were full:"
  say "PyTorch turns it into torch.cuda.OutOfMemoryError; memory beyond the cap stays free for other jobs."
else
  say "No allocation was refused (workload exit status $RC)."
fi
[[ $RC -eq 0 ]] || say "(the workload exited with status $RC)"

section "7. cuwarden after the run"
say "\$ cuwarden"
"$CLI" --socket "$SOCK" || say "(cuwarden exited with status $?)"

section "8. A job: two processes share one 2 GiB cap"
say "\$ cuwarden run --job demo --job-limit 2G -- cuw_demo_workload --sleep-ms 300 --final 64M   # twice, at once"
say ""
for i in 1 2; do
  "$CLI" run --job demo --job-limit 2G -- "$WORKLOAD" --sleep-ms 300 --final 64M \
    >"$RUN_DIR/job$i.log" 2>&1 &
  JOB_PIDS="$JOB_PIDS $!"
done
for _ in $(seq 1 100); do
  grep -q '^step 3:' "$RUN_DIR/job1.log" "$RUN_DIR/job2.log" 2>/dev/null && break
  sleep 0.1
done
say "\$ cuwarden      # the job row: what both hold together, against the job's cap"
"$CLI" --socket "$SOCK" || say "(cuwarden exited with status $?)"
for pid in $JOB_PIDS; do wait "$pid" || true; done
JOB_PIDS=""
refused=0
for i in 1 2; do
  if REFUSAL=$(grep -m1 -A1 '^refused:' "$RUN_DIR/job$i.log"); then
    refused=$((refused + 1))
    say "process $i:"
    printf '%s\n' "$REFUSAL" | sed 's/^/    /'
  else
    say "process $i: ran to the end ($(grep -c '^step' "$RUN_DIR/job$i.log") steps, peak $(grep -o 'peak [0-9.]* [KMG]iB' "$RUN_DIR/job$i.log" | tail -1 | cut -d' ' -f2-))"
  fi
done
say ""
case $refused in
  0) say "Neither was refused this time: their peaks did not meet. The job's cap still held both.";;
  1) say "Each fits a 2 GiB cap alone; together they do not: the one whose allocation would take the"
     say "job past 2 GiB was refused, as if the GPU were full (free memory counts the other's use).";;
  *) say "Each fits a 2 GiB cap alone; together they do not: each allocation that would take the job"
     say "past 2 GiB was refused, in both processes, as if the GPU were full (free memory counts the"
     say "other's use).";;
esac
say "Change a running job's cap with: cuwarden limit job:demo 3G"

section "Keep exploring"
say "The demo's daemon stops with the demo. To try things yourself, from this checkout:"
say ""
say "    source scripts/env.sh          # build/bin on PATH; without a GPU, the simulated driver"
say "    cuwardend --http 127.0.0.1:9477 2>cuwardend.log &    # the daemon, its log in a file"
say "    cuwarden run --limit 2G -- cuw_demo_workload --hold >workload.log 2>&1 &   # holds until stopped"
say "    cuwarden -l 1                  # the table every second (Ctrl-C stops it)"
say "    cuwarden limit PID 1G          # lower a running process's cap"
say "    cuwarden events --follow       # allocations as they happen"
say "    kill %1 %2                     # stop the workload and the daemon"
say ""
say "The web page: http://127.0.0.1:9477/ (the same processes, charts, jobs)."
say ""
say "Your own program: cuwarden run --limit 8G -- python train.py (README.md: install, limits, jobs)."
