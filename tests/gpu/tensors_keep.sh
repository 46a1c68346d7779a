#!/usr/bin/env bash
# cuwarden GPU check: every tensor through cuwarden's vmm pool (PyTorch's cache off), the keep
# setting's Pareto points, call sites on, and what memory_allocated() leaves out. On the GPT-style
# step of bench/train_gpt.py (6 layers, d 768, batch 8 x 512, bf16 autocast, AdamW), with the
# daemon up for the whole run (it keeps each process's allocation events):
#   1. interleaved rounds (ROUNDS, default 3) of
#        pytorch          PyTorch's caching allocator, no cuwarden (the baseline of each round)
#        vmm_keep<K>      cuwarden run --tensors --pool vmm, CUWARDEN_POOL_KEEP=K, for each K of KEEPS
#        vmm_cs16         the same at the default keep with --callsites 16 (Python frames too)
#        cache            cuwarden run --tensors --pool cache (its held over its own peak live)
#      each WARMUP + STEPS steps (ms per step: the median of the measured steps). Of each cuwarden
#      run, from its own process: the driver calls of the pool per measured step (counters read
#      before the first measured step and after the last), and from its events (fetched once it
#      exited; tests/gpu/tensors_keep_report.py): the peak of live bytes cuwarden counted (the sum
#      of requested sizes) and what the pool held from step 5 on; held over that peak beside held
#      over PyTorch's max_memory_allocated of the pytorch runs (the ratio the last GPU run gave);
#   2. what memory_allocated() counts (tests/gpu/tensors_show.py): the cached run against the
#      tensors run (vmm, --callsites 16) at 6 marks, the cuBLAS/cuBLASLt workspaces told apart
#      by their call sites' frames; then both again with CUBLAS_WORKSPACE_CONFIG=:4096:4 (a
#      smaller workspace: a difference that is workspaces moves with it).
# Writes OUT/summary.md, OUT/tensors-keep.json (every figure), OUT/run.log, OUT/runs.tar.gz (each
# run's JSON and log, the daemon's log, and one run's events: KEEP_EVENTS, default
# r1-vmm_keep5pct; KEEP_RUNS=1 leaves OUT/runs/ unpacked) and OUT/tensors-step.trace.gz (that
# run's allocations as a bench/traces/ trace: bench/keep_table.py --traces replays it on the
# simulated driver). Exit 0 when every run completed. About 5 minutes on an H100
# with ROUNDS=3 (a round is 9 runs of ~10 s); a round that would end the script past LIMIT_S
# seconds (default 480) does not start.
#
#   BUILD_DIR=build OUT=gpu-out ROUNDS=3 tests/gpu/tensors_keep.sh
set -uo pipefail

START_CWD=$(pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
abs() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$START_CWD/$1" ;; esac; }
OUT=$(abs "${OUT:-./gpu-out}")
BUILD=$(abs "${BUILD_DIR:-$REPO/build}")
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-40}
WARMUP=${WARMUP:-10}
LIMIT_S=${LIMIT_S:-480}
KEEPS=${KEEPS:-"0 1% 2% 5% 10% 256M"}
LIB=$BUILD/lib/libcuwarden.so
BIN=$BUILD/bin
REPORT=(python3 "$REPO/tests/gpu/tensors_keep_report.py")
[[ -x $BIN/cuwardend && -x $BIN/cuwarden && -f $LIB ]] || { echo "no cuwardend, cuwarden and libcuwarden.so in $BUILD"; exit 2; }
mkdir -p "$OUT/runs"
exec > >(tee "$OUT/run.log") 2>&1
unset LD_PRELOAD CUWARDEN_LIMIT CUWARDEN_POOL CUWARDEN_POOL_KEEP CUWARDEN_CALLSITES CUWARDEN_TENSORS \
  PYTORCH_NO_CUDA_MEMORY_CACHING PYTORCH_CUDA_ALLOC_CONF CUBLAS_WORKSPACE_CONFIG CUBLASLT_WORKSPACE_SIZE
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cuw-keep.XXXXXX")
export CUWARDEN_RUN_DIR=$WORK/run
mkdir -p "$CUWARDEN_RUN_DIR"
daemon=""
trap '[[ -n $daemon ]] && kill "$daemon" 2>/dev/null; rm -rf "$WORK"' EXIT
TRAIN=(python3 "${TRAIN_PY:-$REPO/bench/train_gpt.py}" --layers 6)  # TRAIN_PY, SHOW_PY: stand-ins, to try this script
SHOW=(python3 "${SHOW_PY:-$REPO/tests/gpu/tensors_show.py}")
RUN=("$BIN/cuwarden" run --lib "$LIB" --tensors --pool vmm)
RUN_CACHE=("$BIN/cuwarden" run --lib "$LIB" --tensors --pool cache)
CLI=$BIN/cuwarden
failures=0
run_seq=0
t_start=$SECONDS

echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0 2>/dev/null)"
python3 -c 'import torch; print("# torch", torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null || echo "# no torch"

# The daemon keeps every event of each process (a 50-step run makes ~75,000) for its report.
"$BIN/cuwardend" --run-dir "$CUWARDEN_RUN_DIR" --no-nvml --history 1000000 >"$OUT/cuwardend.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do [[ -S $CUWARDEN_RUN_DIR/daemon/cuwardend.sock ]] && break; sleep 0.1; done
[[ -S $CUWARDEN_RUN_DIR/daemon/cuwardend.sock ]] || { echo "the daemon did not start"; cat "$OUT/cuwardend.log"; exit 2; }

# keep_name K: a configuration name for CUWARDEN_POOL_KEEP=K (5% -> 5pct, 256M -> 256M).
keep_name() { printf 'vmm_keep%s\n' "${1//%/pct}"; }

# run NAME CONFIG KEEP [train_gpt args...]: one process; its JSON in OUT/runs/NAME.json and, under
# cuwarden, its events in OUT/runs/NAME.events.jsonl and its memory figures added to the JSON.
run() {
  local name=$1 config=$2 keep=$3
  shift 3
  local pre=()
  case $config in
    pytorch) ;;
    vmm_cs16) pre=(env "CUWARDEN_POOL_KEEP=$keep" "${RUN[@]}" --callsites 16 --) ;;  # Python frames too
    vmm_keep*) pre=(env "CUWARDEN_POOL_KEEP=$keep" "${RUN[@]}" --) ;;
    cache) pre=(env "CUWARDEN_POOL_KEEP=$keep" "${RUN_CACHE[@]}" --) ;;
    *) echo "unknown configuration $config"; return 2 ;;
  esac
  if ((SECONDS - t_start + 45 > LIMIT_S)); then  # a run that hung: leave room for part 2
    echo "note: $((SECONDS - t_start)) s gone: $name not run"
    return
  fi
  local t0 rc
  t0=$(date -u +%FT%TZ)
  timeout 120 "${pre[@]}" "${TRAIN[@]}" --json "$OUT/runs/$name.json" --cuwarden-cli "$CLI" "$@" \
    >"$OUT/runs/$name.log" 2>&1
  rc=$?
  if ((rc != 0)); then
    echo "FAIL: $name ($config) exited $rc"; tail -n 5 "$OUT/runs/$name.log"; failures=$((failures + 1))
    rm -f "$OUT/runs/$name.json"
    return
  fi
  run_seq=$((run_seq + 1))
  python3 - "$OUT/runs/$name.json" "$config" "$t0" "$keep" "$run_seq" <<'EOF'
import json, sys
p, config, t0, keep, seq = sys.argv[1:]
r = json.load(open(p))
r["config_name"], r["timestamp"], r["keep"] = config, t0, (keep if config != "pytorch" else None)
r["seq"] = int(seq)  # the order the runs ran in
json.dump(r, open(p, "w"))
print(f"{t0} {config:16s} median {r['median_ms']:.2f} ms/step  loss {r['first_loss']:.4f} -> {r['last_loss']:.4f}")
EOF
  [[ $config == pytorch ]] && return
  local pid
  pid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$OUT/runs/$name.json")
  # The exited process stays known to the daemon for a minute: its snapshot (its counters as it
  # left them, events dropped), then its events, again until the daemon has drained its ring
  # (the report exits 3 while an allocation or free has no event yet).
  local attempt rc_ev=1
  for attempt in 1 2 3 4 5 6 7 8 9 10; do
    timeout 60 "$CLI" snapshot "$pid" --format json >"$OUT/runs/$name.snapshot.json" 2>"$OUT/runs/$name.snapshot.err" ||
      echo "note: no snapshot of $name (pid $pid)"
    if ! timeout 60 "$CLI" events --pid "$pid" --json --max 100000 >"$OUT/runs/$name.events.jsonl" \
      2>"$OUT/runs/$name.events.err"; then
      echo "FAIL: $name: cuwarden events"; cat "$OUT/runs/$name.events.err"; failures=$((failures + 1))
      break
    fi
    "${REPORT[@]}" events "$OUT/runs/$name.json" "$OUT/runs/$name.events.jsonl" "$OUT/runs/$name.snapshot.json"
    rc_ev=$?
    ((rc_ev == 3 && attempt < 10)) || break
    sleep 0.5
  done
  ((rc_ev == 0 || rc_ev == 3)) || { echo "FAIL: $name: the events' report"; failures=$((failures + 1)); }
  if [[ -s $OUT/runs/$name.events.jsonl ]]; then
    # One run's events are kept (KEEP_EVENTS, gzipped: ~2 MB), and as an allocation trace
    # (bench/traces/ format) to replay the step's requests on any machine; the others' figures
    # are in their JSON.
    if [[ $name == "${KEEP_EVENTS:-r1-vmm_keep5pct}" ]]; then
      "${REPORT[@]}" trace "$OUT/runs/$name.events.jsonl" "$OUT/tensors-step.trace.gz" \
        "bench/train_gpt.py --layers 6 under cuwarden run --tensors --pool vmm ($name), cuwarden's events" ||
        { echo "FAIL: $name: the trace"; failures=$((failures + 1)); }
      gzip -f "$OUT/runs/$name.events.jsonl"
    else
      rm -f "$OUT/runs/$name.events.jsonl"
    fi
  fi
  rm -f "$OUT/runs/$name.snapshot.json"  # large (every site); its figures are in the run's JSON
}

echo "== 1. interleaved rounds: batch 8 x 512, $WARMUP warm-up + $STEPS measured steps; keeps: $KEEPS"
for r in $(seq "$ROUNDS"); do
  # A round starts only if, at the pace of the rounds so far, it and part 2 (~45 s) end by LIMIT_S.
  gone=$((SECONDS - t_start))
  if ((r > 1 && gone + gone / (r - 1) + 45 > LIMIT_S)); then
    echo "note: $gone s gone; round $r would end past LIMIT_S=$LIMIT_S: no more rounds"
    break
  fi
  run "r$r-pytorch" pytorch - --steps "$STEPS" --warmup "$WARMUP"
  for k in $KEEPS; do
    run "r$r-$(keep_name "$k")" "$(keep_name "$k")" "$k" --steps "$STEPS" --warmup "$WARMUP"
  done
  run "r$r-vmm_cs16" vmm_cs16 5% --steps "$STEPS" --warmup "$WARMUP"
  run "r$r-cache" cache 5% --steps "$STEPS" --warmup "$WARMUP"
done

echo "== 2. what memory_allocated() counts (tests/gpu/tensors_show.py)"
for ws in default small_ws; do
  tag=""
  envs=()
  if [[ $ws == small_ws ]]; then tag="-small_ws"; envs=(CUBLAS_WORKSPACE_CONFIG=:4096:4); fi
  env "${envs[@]}" timeout 90 "${SHOW[@]}" cached "$OUT/runs/show-cached$tag.out" >/dev/null 2>"$OUT/runs/show-cached$tag.err" ||
    { echo "FAIL: tensors_show.py cached $ws"; tail -n 5 "$OUT/runs/show-cached$tag.err"; failures=$((failures + 1)); }
  env "${envs[@]}" CUWARDEN_CLI="$CLI" timeout 120 "${RUN[@]}" --callsites 16 -- "${SHOW[@]}" tensors \
    "$OUT/runs/show-tensors$tag.out" >/dev/null 2>"$OUT/runs/show-tensors$tag.err" ||
    { echo "FAIL: tensors_show.py tensors $ws"; tail -n 5 "$OUT/runs/show-tensors$tag.err"; failures=$((failures + 1)); }
done
kill "$daemon" 2>/dev/null
wait "$daemon" 2>/dev/null
daemon=""

"${REPORT[@]}" summary "$OUT" || { echo "FAIL: the summary"; failures=$((failures + 1)); }
echo "tensors_keep.sh: $((SECONDS - t_start)) s, $failures failed runs"
# The runs in one archive, a handful of files to copy off the machine (KEEP_RUNS=1: the folder stays).
if [[ ${KEEP_RUNS:-0} != 1 ]]; then
  cp "$OUT/cuwardend.log" "$OUT/runs/" 2>/dev/null && rm -f "$OUT/cuwardend.log"
  tar -C "$OUT" -czf "$OUT/runs.tar.gz" runs && rm -rf "$OUT/runs"
fi
exit $((failures > 0))
