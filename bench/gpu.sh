#!/usr/bin/env bash
# cuwarden: the whole GPU benchmark table in one call (issue 5). Builds nothing.
#
#   bash bench/gpu.sh                      on the GPU machine, from the repository root
#   BENCH_FAKE=1 bash bench/gpu.sh         the same on the simulated driver (no GPU, no
#                                          nvidia-smi, no PyTorch: those rows are skipped)
#
# Needs BUILD_DIR (default ./build, as carried: lib/libcuwarden.so, bin/cuwardend,
# bin/cuwarden, bin/cuw_bench_gpu, bin/cuw_bench_events, bin/cuw_alloc_probe; with
# BENCH_FAKE=1 also fakecuda/libcuda.so.1) and, for the training row, python3 with PyTorch.
# Writes under ${OUT:-./bench-out}: <date>-<tag>.md and <date>-<tag>.json (the results file
# pair for bench/results/), gpu-bench.log, raw/ (every program's own output).
# Prints the final table last. Finishes in about 6-6.5 minutes on an H200 (internal budget
# 450 s; the wait for 128 real CUDA holders shrinks to stay inside it).
#
# Rows: 1 hook overhead (alloc+free pairs, cuMemGetInfo; bare vs preloaded, backend off)
#       2 event pipeline (synthetic producer; daemon draining / no daemon)
#       3 CLI latency (cuwarden vs nvidia-smi with 1, 16, 128 interposed processes: real
#         CUDA holders, for 128 as many as come up within CLI_WAIT_S, the rest synthetic
#         rings; a /bin/true row gives the timing loop's own process-spawn cost)
#       4 end to end (GPT-style ~100M-parameter training, deterministic, bare vs `cuwarden run`)
#       5 interposer memory (VmRSS with 100k live allocations)
# Tunables (environment): PAIR_RUNS (5), PAIR_REPS (7), PAIR_REP_MS (60), PAIR_EXTRA (more
# cuw_bench_gpu pairs arguments, e.g. "--sizes 4K,1M"), RSS_COUNT (100000),
# EVENT_RATES ("1e6 2e6 5e6 1e7 2e7 0"; 0 = flat out), EVENT_SECONDS (1.5),
# EVENT_RATES_FAST_DRAIN ("1e7 2e7 0": the same against a daemon draining every 1 ms; "" skips),
# CLI_COUNTS ("1 16 128"), CLI_RUNS (20), CLI_WAIT_S (150: longest wait for real holders,
# largest count), CLI_REAL_MAX (all: at most this many real holders; the rest synthetic),
# TRAIN_PAIRS (2), TRAIN_STEPS (120), TRAIN_WARMUP (20), BENCH_TAG (h200; "fake" with
# BENCH_FAKE=1), BENCH_BUDGET_S (450).
# Exit status: 0 when every row was measured (targets are reported, not asserted), 1 when
# a row could not be measured (the report says which and why).
set -uo pipefail

START_CWD=$(pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
abs_path() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$START_CWD/$1" ;; esac; }
BUILD=$(abs_path "${BUILD_DIR:-./build}")
OUT_DIR=$(abs_path "${OUT:-./bench-out}")
FAKE=${BENCH_FAKE:-0}
TAG=${BENCH_TAG:-$([[ $FAKE == 1 ]] && echo fake || echo h200)}
DATE=$(date -u +%Y-%m-%d)
BUDGET_S=${BENCH_BUDGET_S:-450}
PAIR_RUNS=${PAIR_RUNS:-5}
PAIR_REPS=${PAIR_REPS:-7}
PAIR_REP_MS=${PAIR_REP_MS:-60}
RSS_COUNT=${RSS_COUNT:-100000}
EVENT_RATES=${EVENT_RATES:-"1e6 2e6 5e6 1e7 2e7 0"}
EVENT_SECONDS=${EVENT_SECONDS:-1.5}
CLI_COUNTS=${CLI_COUNTS:-"1 16 128"}
CLI_RUNS=${CLI_RUNS:-20}
CLI_WAIT_S=${CLI_WAIT_S:-150}
CLI_REAL_MAX=${CLI_REAL_MAX:-1000000}
TRAIN_PAIRS=${TRAIN_PAIRS:-2}
TRAIN_STEPS=${TRAIN_STEPS:-120}
TRAIN_WARMUP=${TRAIN_WARMUP:-20}
LIMIT=100G

RAW="$OUT_DIR/raw"
rm -rf "$RAW"
mkdir -p "$RAW"
LOG="$OUT_DIR/gpu-bench.log"
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1
TEE_PID=$!

LIB="$BUILD/lib/libcuwarden.so"
DAEMON="$BUILD/bin/cuwardend"
CLI="$BUILD/bin/cuwarden"
BENCH="$BUILD/bin/cuw_bench_gpu"
EVENTS="$BUILD/bin/cuw_bench_events"
PROBE="$BUILD/bin/cuw_alloc_probe"
TRAIN_PY="$REPO/bench/train_gpt.py"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/cuwarden-bench.XXXXXX")
RUN_DIR="$WORK/run"           # private CUWARDEN_RUN_DIR: rings and the daemon socket
RUN_NODAEMON="$WORK/run-nodaemon"
mkdir -p "$RUN_DIR" "$RUN_NODAEMON"
export CUWARDEN_RUN_DIR="$RUN_DIR"
unset LD_PRELOAD CUWARDEN_LIMIT CUWARDEN_POOL CUWARDEN_JOB CUWARDEN_JOB_LIMIT CUWARDEN_CALLSITES CUWARDEN_MEMINFO
DAEMON_PID=""
HOLDERS=()

cleanup() {
  local p
  for p in "${HOLDERS[@]}" $DAEMON_PID; do kill "$p" 2>/dev/null || true; done
  for p in "${HOLDERS[@]}" $DAEMON_PID; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
  exec 1>&- 2>&-
  wait "$TEE_PID" 2>/dev/null || true
}
trap cleanup EXIT

section() { printf '\n===== %s (t=%ss) =====\n' "$*" "$SECONDS"; }
note_error() { echo "$1: $2" | tee -a "$RAW/errors.txt"; }
left() { echo $(( BUDGET_S - SECONDS )); }

# Commands as the report shows them: build and run directories by name, not by path.
show() {
  local s="$*"
  s=${s//$BUILD/BUILD_DIR}
  s=${s//$RUN_NODAEMON/RUN_DIR_NO_DAEMON}
  s=${s//$WORK\/run-drain1/RUN_DIR_2}
  s=${s//$WORK\/run-cli/RUN_DIR_CLI}
  s=${s//$RUN_DIR/RUN_DIR}
  s=${s//$REPO\//}
  s=${s//$RAW/OUT\/raw}
  printf '%s\n' "$s"
}
record() { local part=$1; shift; printf '%s\t%s\n' "$part" "$(show "$*")" >>"$RAW/commands.tsv"; }

# run_json PART FILE TIMEOUT CMD...: run, keep the last JSON line of stdout in FILE.
run_json() {
  local part=$1 file=$2 limit=$3; shift 3
  record "$part" "$@"
  local out="$WORK/stdout.$$"
  timeout "$limit" "$@" >"$out" 2>"$WORK/stderr.$$"
  local rc=$?
  grep '^{' "$out" | tail -1 >"$file"
  if [[ $rc -ne 0 || ! -s $file ]]; then
    note_error "$part" "$(show "$*") exited $rc: $(tail -3 "$WORK/stderr.$$" | tr '\n' ' ')"
    rm -f "$file"
    return 1
  fi
  return 0
}

need() { [[ -x $1 || -f $1 ]] || { note_error setup "$(show "$1") is missing (build it, carry BUILD_DIR)"; MISSING=1; }; }
MISSING=0
for f in "$LIB" "$DAEMON" "$CLI" "$BENCH" "$EVENTS" "$PROBE"; do need "$f"; done
if [[ $FAKE == 1 ]]; then
  need "$BUILD/fakecuda/libcuda.so.1"
  export LD_LIBRARY_PATH="$BUILD/fakecuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CUWARDEN_FAKE_DEVICES=1 CUWARDEN_FAKE_MEMORY=${CUWARDEN_FAKE_MEMORY:-16G}
fi
[[ $MISSING -eq 0 ]] || { echo "gpu.sh: missing files, see above"; exit 1; }

# ---- environment -------------------------------------------------------------------------
section "environment"
{
  echo "date=$DATE"
  echo "tag=$TAG"
  echo "fake=$FAKE"
  echo "kernel=$(uname -r)"
  echo "cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')"
  echo "cpus=$(nproc)"
  echo "os=$( (. /etc/os-release && echo "$PRETTY_NAME") 2>/dev/null)"
  echo "commit=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$REPO" diff --quiet HEAD 2>/dev/null || echo '+local changes')"
  echo "hyperfine=$(hyperfine --version 2>/dev/null | head -1)"
  if [[ $FAKE != 1 ]] && command -v nvidia-smi >/dev/null; then
    echo "gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
    echo "gpu_count=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)"
    echo "gpu_memory=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader | head -1)"
    echo "driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
    echo "cuda_driver=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1)"
  fi
  echo "nvcc=$( (command -v nvcc || echo /usr/local/cuda/bin/nvcc) | xargs -I{} sh -c '{} --version 2>/dev/null' | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  if [[ $FAKE != 1 ]]; then
    echo "torch=$(timeout 60 python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null)"
  fi
  echo "python=$(python3 --version 2>&1)"
} >"$RAW/env.txt"
cat "$RAW/env.txt"

# ---- the daemon --------------------------------------------------------------------------
DAEMON_ARGS=(--run-dir "$RUN_DIR" --log-level warn)
[[ $FAKE == 1 ]] && DAEMON_ARGS+=(--no-nvml)
record daemon "$DAEMON" "${DAEMON_ARGS[@]}"
"$DAEMON" "${DAEMON_ARGS[@]}" >"$RAW/daemon.log" 2>&1 &
DAEMON_PID=$!
for _ in $(seq 100); do [[ -S $RUN_DIR/daemon/cuwardend.sock ]] && break; sleep 0.05; done
[[ -S $RUN_DIR/daemon/cuwardend.sock ]] || { note_error daemon "cuwardend did not start: $(tail -3 "$RAW/daemon.log")"; exit 1; }
CLK_TCK=$(getconf CLK_TCK)
daemon_ticks() { awk '{ print $14 + $15 }' "/proc/${1:-$DAEMON_PID}/stat" 2>/dev/null || echo 0; }

WITH=(env LD_PRELOAD="$LIB" CUWARDEN_LIMIT="$LIMIT" CUWARDEN_POOL=off CUWARDEN_RUN_DIR="$RUN_DIR")

# ---- 1: hook overhead --------------------------------------------------------------------
section "1 hook overhead: cuw_bench_gpu pairs, bare and preloaded, $PAIR_RUNS runs each, interleaved"
PAIR_ARGS=(pairs --reps "$PAIR_REPS" --rep-ms "$PAIR_REP_MS")
[[ $FAKE == 1 ]] && PAIR_ARGS+=(--async-sync-every 16)  # the simulated pool has no same-stream reuse
# shellcheck disable=SC2206
PAIR_ARGS+=(${PAIR_EXTRA:-})
for r in $(seq "$PAIR_RUNS"); do
  # Leave about 330 s for the rest (memory 10, events 35, training 90, CLI 195).
  if (( r > 1 && $(left) < 345 )); then note_error hook "stopped after $((r - 1)) runs per side: time budget"; break; fi
  run_json hook "$RAW/pairs-bare-$r.json" 120 "$BENCH" "${PAIR_ARGS[@]}" && echo "run $r bare: ok"
  run_json hook "$RAW/pairs-with-$r.json" 120 "${WITH[@]}" "$BENCH" "${PAIR_ARGS[@]}" && echo "run $r with: ok"
done

# ---- 5: interposer memory ----------------------------------------------------------------
section "5 memory: cuw_bench_gpu rss, $RSS_COUNT live 4 KiB allocations"
for r in 1 2; do
  if (( r > 1 && $(left) < 300 )); then note_error rss "one run per side only: time budget"; break; fi
  run_json rss "$RAW/rss-bare-$r.json" 120 "$BENCH" rss --count "$RSS_COUNT" --size 4K && echo "run $r bare: ok"
  run_json rss "$RAW/rss-with-$r.json" 120 "${WITH[@]}" "$BENCH" rss --count "$RSS_COUNT" --size 4K && echo "run $r with: ok"
done

# ---- 2: event pipeline -------------------------------------------------------------------
section "2 event pipeline: cuw_bench_events with cuwardend draining, then without a daemon"
# event_sweep PID RUN_DIR DRAIN_MS RATES...: one producer run per rate against that daemon.
event_sweep() {
  local pid=$1 dir=$2 drain_ms=$3 rate t0 t1; shift 3
  for rate in "$@"; do
    t0=$(daemon_ticks "$pid")
    if run_json events "$WORK/ev.json" 60 "$EVENTS" --run-dir "$dir" --seconds "$EVENT_SECONDS" --rate "$rate"; then
      sleep 0.3   # the daemon notices the exit and drains the rest within its scan interval
      t1=$(daemon_ticks "$pid")
      printf '{"daemon":true,"drain_interval_ms":%s,"daemon_ticks":%s,"clk_tck":%s,"result":%s}\n' "$drain_ms" \
        "$((t1 - t0))" "$CLK_TCK" "$(cat "$WORK/ev.json")" >"$RAW/events-daemon-${drain_ms}ms-$rate.json"
      cat "$WORK/ev.json"
    fi
  done
}
# shellcheck disable=SC2086
event_sweep "$DAEMON_PID" "$RUN_DIR" 10 $EVENT_RATES
# The same with a daemon draining every 1 ms instead of its default 10 ms: the ring holds
# 16 Ki events, so a 10 ms drain period alone caps a process near 1.6 M events/s.
if [[ -n ${EVENT_RATES_FAST_DRAIN:-"1e7 2e7 0"} ]]; then
  RUN_FAST="$WORK/run-drain1"
  mkdir -p "$RUN_FAST"
  FAST_ARGS=(--run-dir "$RUN_FAST" --log-level warn --drain-interval-ms 1)
  [[ $FAKE == 1 ]] && FAST_ARGS+=(--no-nvml)
  record events "$DAEMON" "${FAST_ARGS[@]}"
  "$DAEMON" "${FAST_ARGS[@]}" >"$RAW/daemon-drain1.log" 2>&1 &
  FAST_PID=$!
  for _ in $(seq 100); do [[ -S $RUN_FAST/daemon/cuwardend.sock ]] && break; sleep 0.05; done
  # shellcheck disable=SC2086
  event_sweep "$FAST_PID" "$RUN_FAST" 1 ${EVENT_RATES_FAST_DRAIN:-1e7 2e7 0}
  kill "$FAST_PID" 2>/dev/null; wait "$FAST_PID" 2>/dev/null
fi
for rate in 1e6 0; do
  if run_json events "$WORK/ev.json" 60 "$EVENTS" --run-dir "$RUN_NODAEMON" --seconds "$EVENT_SECONDS" --rate "$rate" \
       --drain-wait-ms 0; then
    printf '{"daemon":false,"result":%s}\n' "$(cat "$WORK/ev.json")" >"$RAW/events-nodaemon-$rate.json"
    cat "$WORK/ev.json"
  fi
done

# ---- 4: end to end -----------------------------------------------------------------------
section "4 end to end: GPT-style training, bare and under cuwarden run --limit $LIMIT"
# Deterministic: train_gpt.py seeds, enables deterministic algorithms, runs attention through
# the math SDPA backend; cuBLAS needs its workspace config before CUDA initialises.
TRAIN_ENV=(env CUBLAS_WORKSPACE_CONFIG=:4096:8)
TRAIN_ARGS=(--steps "$TRAIN_STEPS" --warmup "$TRAIN_WARMUP")
if [[ $FAKE == 1 && -z ${TRAIN_FAKE_PY:-} ]]; then
  echo "skipped: simulated driver (no kernels)" | tee "$RAW/train-skipped.txt"
elif [[ $FAKE != 1 ]] && ! timeout 60 python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  note_error train "python3 with CUDA PyTorch is not available"
else
  # TRAIN_FAKE_PY (dry runs only): a python with CPU PyTorch, to try the row's plumbing.
  TRAIN_PY_BIN=python3
  # shellcheck disable=SC2206  # TRAIN_FAKE_ARGS: extra arguments, split on spaces
  [[ $FAKE == 1 ]] && TRAIN_PY_BIN=$TRAIN_FAKE_PY && TRAIN_ARGS+=(--device cpu ${TRAIN_FAKE_ARGS:-})
  pair_s=60  # a pair's time until the first one is measured
  for r in $(seq "$TRAIN_PAIRS"); do
    # Leave the CLI row about 200 s (150 s wait for real holders + timings) after this pair.
    # (The first pair only needs to fit with a shorter wait.)
    if (( $(left) < pair_s + (r > 1 ? 200 : 90) )); then note_error train "stopped after $((r - 1)) pairs: time budget"; break; fi
    s0=$SECONDS
    # Order alternates (bare first, then cuwarden first) so drift over the section cancels.
    # train_gpt.py writes the full record (every step time and loss) with --json; its last
    # stdout line is only a summary.
    order=(bare with)
    (( r % 2 == 0 )) && order=(with bare)
    for kind in "${order[@]}"; do
      if [[ $kind == bare ]]; then
        run_json train "$WORK/train.json" 240 "${TRAIN_ENV[@]}" "$TRAIN_PY_BIN" "$TRAIN_PY" "${TRAIN_ARGS[@]}" \
          --json "$RAW/train-bare-$r.json" && echo "pair $r bare: $(grep -o '"median_ms": [0-9.]*' "$WORK/train.json")"
      else
        run_json train "$WORK/train.json" 240 "${TRAIN_ENV[@]}" "$CLI" run --limit $LIMIT -- "$TRAIN_PY_BIN" "$TRAIN_PY" \
          "${TRAIN_ARGS[@]}" --json "$RAW/train-with-$r.json" \
          && echo "pair $r with: $(grep -o '"median_ms": [0-9.]*' "$WORK/train.json")"
      fi
    done
    pair_s=$((SECONDS - s0))
    echo "pair $r took $pair_s s"
  done
fi

# ---- 3: CLI latency ----------------------------------------------------------------------
section "3 CLI latency with $(echo $CLI_COUNTS | sed 's/ /, /g') interposed processes"
# time_cmd FILE CMD...: CLI_RUNS timings (ms) of CMD, output discarded, after 2 warm-up runs.
# Without hyperfine: a bash loop reading $EPOCHREALTIME (no process of its own) around the
# command, or `date +%s%N` where bash lacks it; its own cost is the /bin/true row.
time_cmd() {
  local file=$1; shift
  record cli "$@"
  "$@" >"$file.txt" 2>&1 || { note_error cli "$(show "$*") failed: $(tail -2 "$file.txt" | tr '\n' ' ')"; return 1; }
  if command -v hyperfine >/dev/null; then
    local q="" a
    for a in "$@"; do q+=" $(printf '%q' "$a")"; done
    hyperfine --style none --warmup 2 --runs "$CLI_RUNS" --export-json "$file.hf.json" -- "${q# }" >/dev/null 2>&1 &&
      python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["results"][0]; print(json.dumps({"tool":"hyperfine","times_ms":[t*1e3 for t in r["times"]]}))' \
        "$file.hf.json" >"$file" && return 0
  fi
  "$@" >/dev/null 2>&1; "$@" >/dev/null 2>&1
  local times="" t0 t1 tool
  if [[ -n ${EPOCHREALTIME:-} ]]; then
    tool="bash EPOCHREALTIME loop"
    for _ in $(seq "$CLI_RUNS"); do
      t0=$EPOCHREALTIME; "$@" >/dev/null 2>&1; t1=$EPOCHREALTIME
      times+="${times:+,}$(( ${t1/[.,]/} - ${t0/[.,]/} ))"
    done
  else
    tool="date loop"
    for _ in $(seq "$CLI_RUNS"); do
      t0=$(date +%s%N); "$@" >/dev/null 2>&1; t1=$(date +%s%N)
      times+="${times:+,}$(( (t1 - t0) / 1000 ))"
    done
  fi
  python3 -c 'import json,sys; print(json.dumps({"tool":sys.argv[2],"times_ms":[int(x)/1e3 for x in sys.argv[1].split(",")]}))' \
    "$times" "$tool" >"$file"
}
# A fresh daemon on a fresh run directory, started as the first one was: the earlier rows'
# programs (exited, but listed for the daemon's 60 s linger time) would otherwise sit in
# `cuwarden`'s table.
kill "$DAEMON_PID" 2>/dev/null; wait "$DAEMON_PID" 2>/dev/null
RUN_DIR="$WORK/run-cli"
mkdir -p "$RUN_DIR"
export CUWARDEN_RUN_DIR="$RUN_DIR"
DAEMON_ARGS=(--run-dir "$RUN_DIR" --log-level warn)
[[ $FAKE == 1 ]] && DAEMON_ARGS+=(--no-nvml)
record cli "$DAEMON" "${DAEMON_ARGS[@]}"
"$DAEMON" "${DAEMON_ARGS[@]}" >"$RAW/daemon-cli.log" 2>&1 &
DAEMON_PID=$!
for _ in $(seq 100); do [[ -S $RUN_DIR/daemon/cuwardend.sock ]] && break; sleep 0.05; done
[[ -S $RUN_DIR/daemon/cuwardend.sock ]] || note_error cli "cuwardend did not start: $(tail -3 "$RAW/daemon-cli.log")"
WITH=(env LD_PRELOAD="$LIB" CUWARDEN_LIMIT="$LIMIT" CUWARDEN_POOL=off CUWARDEN_RUN_DIR="$RUN_DIR")
# Real holders: cuw_alloc_probe under the interposer, each holding one 2 MiB allocation.
# REAL holds their pids in start order; a holder is up once its output says "holding".
HOLD_ARGS=(--api driver --chunk 2M --max 2M --hold-ms 900000)
record cli "${WITH[@]}" "$PROBE" "${HOLD_ARGS[@]}"
REAL=()
SYNTH=()
declare -A OUTF  # holder pid -> its output file
n_out=0
is_up() { grep -q '^holding' "${OUTF[$1]}" 2>/dev/null; }
real_up() { local c=0 p; for p in "${REAL[@]}"; do is_up "$p" && c=$((c + 1)); done; echo $c; }
start_real() {  # start_real N: start real holders, all at once, until N have been started
  local f
  while (( ${#REAL[@]} < $1 )); do
    n_out=$((n_out + 1)); f="$WORK/holder-$n_out.out"
    "${WITH[@]}" "$PROBE" "${HOLD_ARGS[@]}" >"$f" 2>&1 &
    OUTF[$!]=$f
    REAL+=("$!")
    HOLDERS+=("$!")
  done
}
# Synthetic holders: cuw_bench_events --hold-used, a ring created as the interposer creates
# it, device slot 0 as after one 2 MiB allocation under the 100G cap (GPU identity copied
# from a real holder's ring), pid = its own; no CUDA context, so nvidia-smi does not list it.
SYNTH_ARGS=(--run-dir "$RUN_DIR" --hold-used $((2 << 20)) --hold-limit $((100 << 30)))
start_synth() {  # start_synth N: start synthetic holders until N are running; SYNTH_UP: how many are up
  local like="" p f up deadline
  for p in "${REAL[@]}"; do
    if is_up "$p"; then
      for f in "$RUN_DIR"/ring-"$p"-*; do [[ -e $f ]] && like=$f && break 2; done
    fi
  done
  if (( ${#SYNTH[@]} < $1 )); then
    if [[ -n $like ]]; then record cli "$EVENTS" "${SYNTH_ARGS[@]}" --like "RUN_DIR/ring-<pid of a real holder>-<start>.cwr"
    else record cli "$EVENTS" "${SYNTH_ARGS[@]}"; fi
  fi
  while (( ${#SYNTH[@]} < $1 )); do
    n_out=$((n_out + 1)); f="$WORK/synth-$n_out.out"
    "$EVENTS" "${SYNTH_ARGS[@]}" ${like:+--like "$like"} >"$f" 2>&1 &
    OUTF[$!]=$f
    SYNTH+=("$!")
    HOLDERS+=("$!")
  done
  deadline=$((SECONDS + 10))
  while :; do
    up=0
    for p in "${SYNTH[@]}"; do is_up "$p" && up=$((up + 1)); done
    (( up >= $1 || SECONDS >= deadline )) && break
    sleep 0.1
  done
  SYNTH_UP=$up
  if (( up < $1 )); then
    for p in "${SYNTH[@]}"; do
      is_up "$p" || { note_error cli "synthetic holder failed: $(tail -2 "${OUTF[$p]}" | tr '\n' ' ')"; break; }
    done
  fi
}
# Stop the real holders that are not up yet, so that none comes up (or burns CPU starting
# a context) while the commands are timed: SIGTERM, SIGKILL after 15 s; those that still have
# not exited 5 s later are left to the cleanup. Sets STOPPED to how many.
alive() { local st; st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 1; [[ -n $st && ${st%% *} != Z ]]; }
stop_stragglers() {
  local p sig keep=() gone=() left_alive deadline
  for p in "${REAL[@]}"; do
    if is_up "$p"; then keep+=("$p"); else gone+=("$p"); fi
  done
  for p in "${gone[@]}"; do kill "$p" 2>/dev/null; done
  for sig in KILL ""; do  # wait up to 15 s, SIGKILL the rest; then up to 5 s more
    if [[ -n $sig ]]; then deadline=$((SECONDS + 15)); else deadline=$((SECONDS + 5)); fi
    while (( SECONDS < deadline )); do
      left_alive=0
      for p in "${gone[@]}"; do alive "$p" && left_alive=$((left_alive + 1)); done
      (( left_alive == 0 )) && break
      sleep 0.2
    done
    [[ -n $sig ]] && for p in "${gone[@]}"; do alive "$p" && kill -KILL "$p" 2>/dev/null; done
  done
  for p in "${gone[@]}"; do alive "$p" || wait "$p" 2>/dev/null; done
  REAL=("${keep[@]}")
  STOPPED=${#gone[@]}
}
CLI_MAX=0
for n in $CLI_COUNTS; do (( n > CLI_MAX )) && CLI_MAX=$n; done
for n in $CLI_COUNTS; do
  if (( $(left) < 25 )); then note_error cli "skipped $n processes: time budget"; break; fi
  # Real holders first: all of those still missing started at once, then a bounded wait
  # (real CUDA processes come up slowly once many contexts exist); the largest count may
  # wait longest, the others up to 60 s. CLI_REAL_MAX caps how many real ones are started.
  want_real=$(( n < CLI_REAL_MAX ? n : CLI_REAL_MAX ))
  start_real "$want_real"
  if (( n == CLI_MAX )); then cap=$CLI_WAIT_S; else cap=60; fi
  wait_s=$(( $(left) - 45 < cap ? $(left) - 45 : cap ))  # 45 s: stopping stragglers, timings, report
  deadline=$((SECONDS + wait_s))
  t_wait=$SECONDS
  while (( $(real_up) < want_real && SECONDS < deadline )); do sleep 0.5; done
  waited=$((SECONDS - t_wait))
  stop_stragglers
  stopped=$STOPPED
  real=${#REAL[@]}
  # The rest, up to n, synthetic.
  synth=$(( n - real > 0 ? n - real : 0 ))
  start_synth "$synth"
  have=$(( real + SYNTH_UP ))
  rows=0
  for _ in $(seq 40); do  # the daemon sees new rings at once (inotify) or within its 1 s rescan
    rows=$(timeout 10 "$CLI" --query-compute-apps=pid --format=csv,noheader 2>/dev/null | grep -c '[0-9]')
    (( rows >= have )) && break
    sleep 0.25
  done
  listed=$(timeout 10 "$CLI" --json 2>/dev/null | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["processes"]))' 2>/dev/null || echo null)
  smi_rows=null
  if [[ $FAKE != 1 ]]; then
    smi_rows=$(timeout 20 nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | grep -c '[0-9]')
  fi
  echo "$n processes: $real real CUDA holders up (of $want_real started; waited ${waited} s, stopped $stopped not yet up)" \
       "+ $SYNTH_UP synthetic rings; $rows rows in cuwarden's query, $listed processes in its table," \
       "$smi_rows in nvidia-smi's (t=${SECONDS}s)"
  printf '{"requested":%s,"real":%s,"real_started":%s,"real_stopped":%s,"wait_s":%s,"synthetic":%s,"holding":%s,"rows":%s,"table_processes":%s,"nvidia_smi_rows":%s}\n' \
    "$n" "$real" "$want_real" "$stopped" "$waited" "$SYNTH_UP" "$have" "$rows" "$listed" "$smi_rows" >"$RAW/cli-$n-procs.json"
  (( have < n )) && note_error cli "only $have of $n holder processes came up"
  time_cmd "$RAW/cli-$n-baseline_true.json" /bin/true
  time_cmd "$RAW/cli-$n-cuwarden_table.json" "$CLI"
  time_cmd "$RAW/cli-$n-cuwarden_query.json" "$CLI" --query-compute-apps=pid,used_memory --format=csv
  if [[ $FAKE != 1 ]]; then
    time_cmd "$RAW/cli-$n-nvidia_smi_table.json" nvidia-smi
    time_cmd "$RAW/cli-$n-nvidia_smi_query.json" nvidia-smi --query-compute-apps=pid,used_memory --format=csv
  fi
done
for p in "${HOLDERS[@]}"; do kill "$p" 2>/dev/null || true; done
for p in "${HOLDERS[@]}"; do wait "$p" 2>/dev/null || true; done
HOLDERS=()

# ---- report ------------------------------------------------------------------------------
section "report"
python3 "$REPO/bench/gpu_report.py" --raw "$RAW" --out "$OUT_DIR" --name "$DATE-$TAG" --elapsed "$SECONDS"
rc=$?
[[ -s $RAW/errors.txt ]] && rc=1
exit $rc
