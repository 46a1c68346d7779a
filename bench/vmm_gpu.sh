#!/usr/bin/env bash
# cuwarden: the recorded allocation traces (bench/traces/*.trace.gz) replayed on a GPU, for the
# pooling backends against the driver and PyTorch's caching allocator. Builds nothing.
#
#   BUILD_DIR=<dir> bash bench/vmm_gpu.sh                 on the GPU machine, from the repository root
#   BENCH_FAKE=1 BUILD_DIR=build bash bench/vmm_gpu.sh    the same on the simulated driver (no torch rows)
#
# Needs in BUILD_DIR: lib/libcuwarden.so, bin/cuw_trace_replay (with BENCH_FAKE=1 also
# fakecuda/libcuda.so.1); python3 for the report; PyTorch for the torch rows (skipped, and said
# so, when it does not import or sees no GPU).
# Writes under ${OUT:-./bench-out}: vmm-replay.md and vmm-replay.json (the results pair for
# bench/results/), vmm-replay.log, raw-vmm/ (every run's JSON line, errors). Prints the tables last.
#
# Per trace (TRACES, default "gpt2-train gpt2-generate cupy-grow"), the rows:
#   cudaMalloc          cuw_trace_replay --api malloc, bare: cuMemAlloc_v2/cuMemFree_v2 per event
#   cudaMallocAsync     cuw_trace_replay --api async, bare: the device's default memory pool
#   cache               --api malloc under LD_PRELOAD=libcuwarden.so, CUWARDEN_POOL=cache, no cap
#                       (every preloaded row with CUWARDEN_MEMINFO=physical, for NVML's own figures)
#   cache, cap 1.05x    the same with CUWARDEN_LIMIT = ceil(1.05 x the trace's peak live bytes)
#   vmm, vmm, cap 1.05x the same with CUWARDEN_POOL=vmm (a configuration error where this build
#                       has no vmm backend: the row says so and the script goes on)
#   torch               bench/traces/replay_torch.py: PyTorch's caching allocator
#   torch expandable    the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
#   vmm, keep K         with KEEPS="K ..." (e.g. "0 2% 10% 256M"): CUWARDEN_POOL=vmm and
#                       CUWARDEN_POOL_KEEP=K, one row per K, after the rows above (the keep
#                       setting's Pareto points; the plain vmm row is the default keep)
# ROWS_ONLY="vmm cache ..." runs only those rows (and cudaMalloc: its held pass gives the
# trace's peak live bytes).
# Each row: one held pass (what the process holds on the device, sampled after every
# allocation: NVML on a GPU, the simulated driver's own figure with BENCH_FAKE=1; torch rows:
# torch.cuda.max_memory_reserved()), then ROUNDS (3) time passes, rows interleaved per round.
# Exit status: 0 when every row that could run ran (refusals are reported, not failures), 1 otherwise.
set -uo pipefail

START_CWD=$(pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
abs_path() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$START_CWD/$1" ;; esac; }
BUILD=$(abs_path "${BUILD_DIR:-./build}")
OUT_DIR=$(abs_path "${OUT:-./bench-out}")
FAKE=${BENCH_FAKE:-0}
ROUNDS=${ROUNDS:-3}
TRACES=${TRACES:-gpt2-train gpt2-generate cupy-grow}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
ROWS=(cudaMalloc cudaMallocAsync cache cache-cap vmm vmm-cap torch torch-expandable)
if [[ -n ${ROWS_ONLY:-} ]]; then
  ROWS=(cudaMalloc)
  for row in $ROWS_ONLY; do [[ $row == cudaMalloc ]] || ROWS+=("$row"); done
fi
for k in ${KEEPS:-}; do ROWS+=("vmm-keep-${k//%/pct}"); done
COMMAND="BUILD_DIR=${BUILD_DIR:-./build} OUT=${OUT:-./bench-out} ROUNDS=$ROUNDS TRACES='$TRACES'${ROWS_ONLY:+ ROWS_ONLY='$ROWS_ONLY'}${KEEPS:+ KEEPS='$KEEPS'}$([[ $FAKE == 1 ]] && echo ' BENCH_FAKE=1') bash bench/vmm_gpu.sh"

RAW="$OUT_DIR/raw-vmm"
rm -rf "$RAW"
mkdir -p "$RAW"
LOG="$OUT_DIR/vmm-replay.log"
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1

LIB="$BUILD/lib/libcuwarden.so"
REPLAY="$BUILD/bin/cuw_trace_replay"
TORCH_PY="$REPO/bench/traces/replay_torch.py"
for f in "$LIB" "$REPLAY"; do [[ -e $f ]] || { echo "vmm_gpu.sh: $f is missing (build it, carry BUILD_DIR)"; exit 1; }; done
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cuwarden-vmm-bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
unset LD_PRELOAD CUWARDEN_LIMIT CUWARDEN_POOL CUWARDEN_POOL_KEEP CUWARDEN_JOB CUWARDEN_JOB_LIMIT CUWARDEN_CALLSITES \
  CUWARDEN_MEMINFO CUWARDEN_CAP_SCOPE PYTORCH_CUDA_ALLOC_CONF
export CUWARDEN_RUN_DIR="$WORK/run"
if [[ $FAKE == 1 ]]; then
  export LD_LIBRARY_PATH="$BUILD/fakecuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # About an H200's memory: what a pool without a bound holds grows with the device.
  export CUWARDEN_FAKE_DEVICES=1 CUWARDEN_FAKE_MEMORY=${CUWARDEN_FAKE_MEMORY:-140G}
fi

FAILED=0
note() { echo "$1: $2" | tee -a "$RAW/errors.txt"; }

echo "== environment"
{
  echo "date=$(date -u +%Y-%m-%d)"
  echo "command=$COMMAND"
  echo "fake=$FAKE"
  echo "rounds=$ROUNDS"
  # BENCH_COMMIT: the commit the tree is at, when this copy of it has no git history.
  echo "commit=${BENCH_COMMIT:-$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$REPO" diff --quiet HEAD 2>/dev/null || echo '+local changes')}"
  echo "cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')"
  if [[ $FAKE != 1 ]] && command -v nvidia-smi >/dev/null; then
    echo "gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
    echo "gpu_memory=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader | head -1)"
    echo "driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
    echo "cuda_driver=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1)"
  fi
  echo "torch=$(timeout 120 python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)"
} >"$RAW/env.txt"
cat "$RAW/env.txt"

TORCH_OK=0
if [[ $FAKE == 1 ]]; then
  TORCH_WHY="simulated driver"
elif timeout 120 python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  TORCH_OK=1
else
  TORCH_WHY="PyTorch does not import or sees no GPU"
fi

# set_cmd ROW TRACE PASS CAP: the command of one run, in CMD.
set_cmd() {
  local row=$1 trace=$2 pass=$3 cap=$4
  # CUWARDEN_MEMINFO=physical: under a cap the interposer otherwise answers NVML with its own
  # view (used = its tracked bytes), and the held pass would read that, not the device.
  local pre=(env LD_PRELOAD="$LIB" CUWARDEN_MEMINFO=physical)
  case $row in
    cudaMalloc) CMD=(env "$REPLAY" "$trace" --api malloc --pass "$pass") ;;
    cudaMallocAsync) CMD=(env "$REPLAY" "$trace" --api async --pass "$pass") ;;
    cache) CMD=("${pre[@]}" CUWARDEN_POOL=cache "$REPLAY" "$trace" --api malloc --pass "$pass") ;;
    cache-cap) CMD=("${pre[@]}" CUWARDEN_POOL=cache CUWARDEN_LIMIT="$cap" "$REPLAY" "$trace" --api malloc --pass "$pass") ;;
    vmm) CMD=("${pre[@]}" CUWARDEN_POOL=vmm "$REPLAY" "$trace" --api malloc --pass "$pass") ;;
    vmm-cap) CMD=("${pre[@]}" CUWARDEN_POOL=vmm CUWARDEN_LIMIT="$cap" "$REPLAY" "$trace" --api malloc --pass "$pass") ;;
    vmm-keep-*)
      local keep=${row#vmm-keep-}
      CMD=("${pre[@]}" CUWARDEN_POOL=vmm CUWARDEN_POOL_KEEP="${keep//pct/%}" "$REPLAY" "$trace" --api malloc --pass "$pass") ;;
    torch) CMD=(env python3 "$TORCH_PY" "$trace" --pass "$pass") ;;
    torch-expandable) CMD=(env python3 "$TORCH_PY" "$trace" --expandable --pass "$pass") ;;
  esac
}

# run_row NAME ROW PASS TAG CAP: one run; its JSON line in $RAW/NAME--ROW--TAG.json, or the
# reason in $RAW/NAME--ROW--TAG.err (exit 78: the interposer refused its configuration).
run_row() {
  local name=$1 row=$2 pass=$3 tag=$4 cap=$5
  local file="$RAW/$name--$row--$tag"
  set_cmd "$row" "$REPO/bench/traces/$name.trace.gz" "$pass" "$cap"
  timeout "$RUN_TIMEOUT" "${CMD[@]}" >"$WORK/out" 2>"$WORK/err"
  local rc=$?
  grep '^{' "$WORK/out" | tail -1 >"$file.json"
  if [[ $rc -ne 0 || ! -s $file.json ]]; then
    rm -f "$file.json"
    local why
    why=$(grep -v '^\s*$' "$WORK/err" | tail -3 | tr '\n' ' ' | cut -c1-400)
    if [[ $rc -eq 78 ]]; then
      echo "configuration error: $why" >"$file.err"
    else
      echo "exited $rc: $why" >"$file.err"
    fi
    echo "$name $row $tag: $(cat "$file.err")"
    return 1
  fi
  echo "$name $row $tag: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("held/live %.4f" % r["held_over_live"] if r.get("held_over_live") is not None and r["pass"] == "held" else "%.4f s" % (r["seconds"] or 0), "refusals", r["refusals"])' "$file.json")"
}

for name in $TRACES; do
  trace="$REPO/bench/traces/$name.trace.gz"
  [[ -e $trace ]] || { note "$name" "no $trace"; FAILED=1; continue; }
  echo "== $name: held passes"
  run_row "$name" cudaMalloc held held "" || FAILED=1
  peak=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["peak_live_bytes"])' "$RAW/$name--cudaMalloc--held.json" 2>/dev/null ||
         gzip -dc "$trace" | sed -n 's/^# events: .*peak live bytes: \([0-9]*\).*/\1/p' | head -1)
  cap=$(( (peak * 105 + 99) / 100 ))   # ceil(1.05 x peak live), in bytes
  echo "$name: peak live $peak bytes, cap $cap bytes"
  echo "$cap" >"$RAW/$name--cap.txt"
  live_rows=(cudaMalloc)
  for row in "${ROWS[@]:1}"; do
    if [[ $row == torch* && $TORCH_OK != 1 ]]; then
      echo "skipped: $TORCH_WHY" >"$RAW/$name--$row--held.err"
      continue
    fi
    if run_row "$name" "$row" held held "$cap"; then
      live_rows+=("$row")
    elif ! grep -q '^configuration error' "$RAW/$name--$row--held.err"; then
      FAILED=1
    fi
  done
  for r in $(seq "$ROUNDS"); do
    echo "== $name: time passes, round $r of $ROUNDS"
    for row in "${live_rows[@]}"; do
      run_row "$name" "$row" time "time-$r" "$cap" || FAILED=1
    done
  done
done

echo "== report"
python3 "$REPO/bench/vmm_report.py" "$RAW" "$OUT_DIR/vmm-replay" || FAILED=1
exit $FAILED
