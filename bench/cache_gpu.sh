#!/usr/bin/env bash
# cuwarden: the CUWARDEN_POOL=cache benchmark (issue 4) in one call. Builds nothing.
#
#   BUILD_DIR=<dir> bash bench/cache_gpu.sh            on the GPU machine, from the repository root
#   BENCH_FAKE=1 BUILD_DIR=build bash bench/cache_gpu.sh   the same on the simulated driver
#
# Needs in BUILD_DIR: lib/libcuwarden.so, bin/cuw_bench_gpu, bin/cuw_bench_e2e (with
# BENCH_FAKE=1 also fakecuda/libcuda.so.1); python3 for the report; CuPy for the CuPy row
# (skipped, and said so, when `import cupy` fails).
# Writes under ${OUT:-./bench-out}: <date>-<tag>-cache.md and <date>-<tag>-cache.json (the
# results pair for bench/results/), cache-bench.log, raw/ (every program's JSON line).
# Prints the table last. About 2-3 minutes on an H200.
#
# Parts:
#   1 pairs: median alloc+free pair time for 4 KiB, 1 MiB, 64 MiB, 1 GiB through the driver
#     (cuMemAlloc_v2/cuMemFree_v2) and the runtime (cudaMalloc/cudaFree), plus
#     cudaMallocAsync/cudaFreeAsync: bare (native), cuwarden off, cuwarden cache;
#     PAIR_RUNS (3) runs per mode, interleaved, each PAIR_REPS (5) repetitions of PAIR_REP_MS (40).
#   1b hookcost: cuw_bench_gpu hookcost, bare (the method's noise) and off: the same
#     driver-API pairs through cuwarden's hooks and through libcuda's own entry points in
#     one process, alternating batches: what `off` adds, free of run-to-run drift.
#   2 e2e: cuw_bench_e2e (cudaMalloc x4, device fill, kernel, a 16 KiB slice read back,
#     cudaFree x4 per step), bare vs cache (and off), E2E_RUNS (2) runs of E2E_STEPS (2000)
#     steps; checksums must agree. Then the same with --upload (the 4 MiB input copied from
#     pageable host memory every step, which dominates the step): part e2e_upload.
#   3 cupy: CuPy with its memory pool disabled (cupy.cuda.set_allocator(None)), a loop of
#     elementwise ops and a reduction per step, bare vs cache; results must agree.
#   Parts 2 and 3 also run with the results read back every 10th step only (e2e_check10,
#   cupy_check10): a loop whose GPU work runs ahead of the host between checks.
#   Parts 2 and 3 also run a floor: the same work with no allocation in the loop (buffers
#   allocated once; CuPy with its own pool), the best any allocator can do there.
# Exit status: 0 when every part was measured and the checksums agree, 1 otherwise.
set -uo pipefail

START_CWD=$(pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
abs_path() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$START_CWD/$1" ;; esac; }
BUILD=$(abs_path "${BUILD_DIR:-./build}")
OUT_DIR=$(abs_path "${OUT:-./bench-out}")
FAKE=${BENCH_FAKE:-0}
TAG=${BENCH_TAG:-$([[ $FAKE == 1 ]] && echo fake || echo h200)}
DATE=$(date -u +%Y-%m-%d)
PAIR_RUNS=${PAIR_RUNS:-3}
PAIR_REPS=${PAIR_REPS:-5}
PAIR_REP_MS=${PAIR_REP_MS:-40}
E2E_RUNS=${E2E_RUNS:-2}
HOOKCOST_RUNS=${HOOKCOST_RUNS:-3}
E2E_STEPS=${E2E_STEPS:-2000}
CUPY_STEPS=${CUPY_STEPS:-2000}

RAW="$OUT_DIR/raw-cache"
rm -rf "$RAW"
mkdir -p "$RAW"
LOG="$OUT_DIR/cache-bench.log"
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1

LIB="$BUILD/lib/libcuwarden.so"
BENCH="$BUILD/bin/cuw_bench_gpu"
E2E="$BUILD/bin/cuw_bench_e2e"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cuwarden-cache-bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
unset LD_PRELOAD CUWARDEN_LIMIT CUWARDEN_POOL CUWARDEN_JOB CUWARDEN_JOB_LIMIT CUWARDEN_CALLSITES CUWARDEN_MEMINFO
export CUWARDEN_RUN_DIR="$WORK/run"

FAILED=0
note() { echo "$1: $2" | tee -a "$RAW/errors.txt"; FAILED=1; }
for f in "$LIB" "$BENCH" "$E2E"; do [[ -e $f ]] || { echo "cache_gpu.sh: $f is missing (build it, carry BUILD_DIR)"; exit 1; }; done
if [[ $FAKE == 1 ]]; then
  export LD_LIBRARY_PATH="$BUILD/fakecuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CUWARDEN_FAKE_DEVICES=1 CUWARDEN_FAKE_MEMORY=${CUWARDEN_FAKE_MEMORY:-16G}
fi

# mode_env MODE: the environment prefix of a mode (bare, off, cache).
mode_env() {
  case $1 in
    bare) echo env ;;
    off) echo env LD_PRELOAD="$LIB" CUWARDEN_POOL=off ;;
    cache) echo env LD_PRELOAD="$LIB" CUWARDEN_POOL=cache ;;
  esac
}

# run_json FILE TIMEOUT CMD...: keep the last JSON line of stdout in FILE.
run_json() {
  local file=$1 limit=$2; shift 2
  timeout "$limit" "$@" >"$WORK/out" 2>"$WORK/err"
  local rc=$?
  grep '^{' "$WORK/out" | tail -1 >"$file"
  if [[ $rc -ne 0 || ! -s $file ]]; then
    note "$(basename "$file")" "exited $rc: $(tail -3 "$WORK/err" | tr '\n' ' ')"
    rm -f "$file"
    return 1
  fi
}

echo "== environment"
{
  echo "date=$DATE"
  echo "tag=$TAG"
  echo "fake=$FAKE"
  # BENCH_COMMIT: the commit the tree is at, when this copy of it has no git history.
  echo "commit=${BENCH_COMMIT:-$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$REPO" diff --quiet HEAD 2>/dev/null || echo '+local changes')}"
  echo "cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')"
  if [[ $FAKE != 1 ]] && command -v nvidia-smi >/dev/null; then
    echo "gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
    echo "driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
    echo "cuda_driver=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1)"
  fi
  echo "cupy=$(timeout 60 python3 -c 'import cupy; print(cupy.__version__)' 2>/dev/null || echo none)"
} >"$RAW/env.txt"
cat "$RAW/env.txt"

echo "== 1 pairs: $PAIR_RUNS runs x (bare, off, cache), interleaved"
PAIR_ARGS=(pairs --reps "$PAIR_REPS" --rep-ms "$PAIR_REP_MS")
[[ $FAKE == 1 ]] && PAIR_ARGS+=(--async-sync-every 16)
for r in $(seq "$PAIR_RUNS"); do
  for m in bare off cache; do
    # shellcheck disable=SC2046
    run_json "$RAW/pairs-$m-$r.json" 240 $(mode_env $m) "$BENCH" "${PAIR_ARGS[@]}" && echo "run $r $m: ok"
  done
done

echo "== 1b hookcost: what the hooks add to a driver-API pair, in one process (HOOKCOST_RUNS=$HOOKCOST_RUNS runs)"
for r in $(seq "$HOOKCOST_RUNS"); do
  for m in bare off; do
    # shellcheck disable=SC2046
    run_json "$RAW/hookcost-$m-$r.json" 240 $(mode_env $m) "$BENCH" hookcost --rounds 400 && echo "run $r $m: ok"
  done
done

echo "== 2 e2e: cuw_bench_e2e, $E2E_RUNS runs x (bare, off, cache), $E2E_STEPS steps"
for r in $(seq "$E2E_RUNS"); do
  for m in bare off cache; do
    # shellcheck disable=SC2046
    run_json "$RAW/e2e-$m-$r.json" 240 $(mode_env $m) "$E2E" --steps "$E2E_STEPS" && echo "run $r $m: $(cat "$RAW/e2e-$m-$r.json")"
  done
  # The floor: the same work with the buffers allocated once (no allocator in the loop).
  run_json "$RAW/e2e-floor-$r.json" 240 env "$E2E" --steps "$E2E_STEPS" --hoist && echo "run $r floor: $(cat "$RAW/e2e-floor-$r.json")"
done
# The residual read back every 10th step only (the GPU runs ahead of the host in between).
for r in $(seq "$E2E_RUNS"); do
  for m in bare off cache; do
    # shellcheck disable=SC2046
    run_json "$RAW/e2e_check10-$m-$r.json" 240 $(mode_env $m) "$E2E" --steps "$E2E_STEPS" --check-every 10 && echo "run $r $m --check-every 10: $(cat "$RAW/e2e_check10-$m-$r.json")"
  done
  run_json "$RAW/e2e_check10-floor-$r.json" 240 env "$E2E" --steps "$E2E_STEPS" --check-every 10 --hoist && echo "run $r floor --check-every 10: $(cat "$RAW/e2e_check10-floor-$r.json")"
done
for r in $(seq "$E2E_RUNS"); do
  for m in bare off cache; do
    # shellcheck disable=SC2046
    run_json "$RAW/e2e_upload-$m-$r.json" 240 $(mode_env $m) "$E2E" --steps "$E2E_STEPS" --upload && echo "run $r $m --upload: $(cat "$RAW/e2e_upload-$m-$r.json")"
  done
  run_json "$RAW/e2e_upload-floor-$r.json" 240 env "$E2E" --steps "$E2E_STEPS" --upload --hoist && echo "run $r floor --upload: $(cat "$RAW/e2e_upload-floor-$r.json")"
done

echo "== 3 cupy: pool disabled, $CUPY_STEPS steps, bare vs cache"
CUPY_PY="$WORK/cupy_steps.py"
cat >"$CUPY_PY" <<'PY'
import hashlib, json, sys, time
import cupy as cp
import os
if os.environ.get("CUPY_OWN_POOL") != "1":  # the floor keeps CuPy's own pool
    cp.cuda.set_allocator(None)          # every array is a cudaMalloc, every release a cudaFree
    cp.cuda.set_pinned_memory_allocator(None)
steps = int(sys.argv[1])
check = int(sys.argv[2]) if len(sys.argv) > 2 else 1  # read the results back every N-th step
def step(k):
    x = cp.arange(1 << 18, dtype=cp.float32)
    y = x * 1.0001 + (k % 97)
    z = cp.sqrt(cp.abs(y - x)) + x[::-1]
    if k % check:
        return None
    return float(z.sum()) + float(cp.max(y))
for k in range(20):
    step(k)
cp.cuda.Device().synchronize()
h = hashlib.sha256()
t0 = time.perf_counter()
for k in range(steps):
    h.update(repr(step(k)).encode())
cp.cuda.Device().synchronize()
secs = time.perf_counter() - t0
print(json.dumps({"program": "cupy_steps", "steps": steps, "seconds": round(secs, 4),
                  "us_per_step": round(secs * 1e6 / steps, 2), "checksum": h.hexdigest()[:16]}))
PY
if [[ $FAKE != 1 ]] && timeout 120 python3 -c 'import cupy' >/dev/null 2>&1; then
  for r in 1 2; do
    for m in bare cache; do
      # shellcheck disable=SC2046
      run_json "$RAW/cupy-$m-$r.json" 240 $(mode_env $m) python3 "$CUPY_PY" "$CUPY_STEPS" && echo "run $r $m: $(cat "$RAW/cupy-$m-$r.json")"
    done
    # The floor: CuPy with its own memory pool (no cudaMalloc in the loop).
    run_json "$RAW/cupy-floor-$r.json" 240 env CUPY_OWN_POOL=1 python3 "$CUPY_PY" "$CUPY_STEPS" && echo "run $r floor: $(cat "$RAW/cupy-floor-$r.json")"
    for m in bare cache; do
      # shellcheck disable=SC2046
      run_json "$RAW/cupy_check10-$m-$r.json" 240 $(mode_env $m) python3 "$CUPY_PY" "$CUPY_STEPS" 10 && echo "run $r $m check 10: $(cat "$RAW/cupy_check10-$m-$r.json")"
    done
    run_json "$RAW/cupy_check10-floor-$r.json" 240 env CUPY_OWN_POOL=1 python3 "$CUPY_PY" "$CUPY_STEPS" 10 && echo "run $r floor check 10: $(cat "$RAW/cupy_check10-floor-$r.json")"
  done
else
  echo "cupy: skipped ($([[ $FAKE == 1 ]] && echo 'simulated driver' || echo 'import cupy failed'))" | tee "$RAW/cupy-skipped.txt"
fi

echo "== report"
python3 "$REPO/bench/cache_report.py" "$RAW" "$OUT_DIR/$DATE-$TAG-cache" || FAILED=1
exit $FAILED
