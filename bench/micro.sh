#!/usr/bin/env bash
# cuwarden micro-benchmarks on the simulated driver: hooked entry points bare and with
# libcuwarden.so preloaded (same binary: bare, backend off, backend cache), and the event ring on its own.
#
#   bench/micro.sh [BUILD_DIR]        (default: build; needs `ninja cuw_bench cuwarden fakecuda cuwardend`)
#
# Environment: MIN_TIME (seconds per benchmark, default 0.2), REPS (repetitions, default 3;
# the table shows medians), MICRO_DAEMON=0 to run without cuwardend draining the ring (then
# the ring fills after 16 Ki events and later events take the cheaper "dropped" path).
# Output: Google Benchmark's console output, then a with/without table. Raw JSON is kept in
# ${OUT:-./bench-out}/micro-*.json.
set -euo pipefail

START_CWD=$(pwd)
abs_path() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$START_CWD/$1" ;; esac; }
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(abs_path "${1:-$REPO/build}")
OUT_DIR=$(abs_path "${OUT:-./bench-out}")
MIN_TIME=${MIN_TIME:-0.2}
REPS=${REPS:-3}
mkdir -p "$OUT_DIR"

for f in bin/cuw_bench_driver bin/cuw_bench_ring lib/libcuwarden.so fakecuda/libcuda.so.1; do
  [[ -e $BUILD/$f ]] || { echo "micro.sh: $BUILD/$f is missing (ninja cuw_bench cuwarden fakecuda cuwardend)" >&2; exit 1; }
done

RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/cuwarden-micro.XXXXXX")
DAEMON_PID=""
cleanup() {
  if [[ -n $DAEMON_PID ]] && kill -0 "$DAEMON_PID" 2>/dev/null; then kill "$DAEMON_PID"; wait "$DAEMON_PID" 2>/dev/null || true; fi
  rm -rf "$RUN_DIR"
}
trap cleanup EXIT

export LD_LIBRARY_PATH="$BUILD/fakecuda" CUWARDEN_FAKE_DEVICES=1 CUWARDEN_FAKE_MEMORY=16G
unset LD_PRELOAD
if [[ ${MICRO_DAEMON:-1} == 1 && -x $BUILD/bin/cuwardend ]]; then
  "$BUILD/bin/cuwardend" --run-dir "$RUN_DIR" --no-nvml --log-level warn >"$OUT_DIR/micro-daemon.log" 2>&1 &
  DAEMON_PID=$!
fi

GB=(--benchmark_min_time="$MIN_TIME" --benchmark_repetitions="$REPS" --benchmark_report_aggregates_only=true)
echo "== driver entry points, bare"
"$BUILD/bin/cuw_bench_driver" "${GB[@]}" --benchmark_out="$OUT_DIR/micro-bare.json" --benchmark_out_format=json
echo "== driver entry points, with libcuwarden.so (CUWARDEN_LIMIT=100G, backend off${DAEMON_PID:+, daemon draining})"
LD_PRELOAD="$BUILD/lib/libcuwarden.so" CUWARDEN_LIMIT=100G CUWARDEN_POOL=off CUWARDEN_RUN_DIR="$RUN_DIR" \
  "$BUILD/bin/cuw_bench_driver" "${GB[@]}" --benchmark_out="$OUT_DIR/micro-with.json" --benchmark_out_format=json
echo "== driver entry points, with libcuwarden.so and CUWARDEN_POOL=cache"
LD_PRELOAD="$BUILD/lib/libcuwarden.so" CUWARDEN_LIMIT=100G CUWARDEN_POOL=cache CUWARDEN_RUN_DIR="$RUN_DIR" \
  "$BUILD/bin/cuw_bench_driver" "${GB[@]}" --benchmark_out="$OUT_DIR/micro-cache.json" --benchmark_out_format=json
echo "== event ring"
"$BUILD/bin/cuw_bench_ring" "${GB[@]}" --benchmark_out="$OUT_DIR/micro-ring.json" --benchmark_out_format=json

python3 - "$OUT_DIR" <<'PY'
import json, sys
out = sys.argv[1]
def medians(path):
    d = json.load(open(path))
    return {b["run_name"]: b for b in d["benchmarks"] if b.get("aggregate_name") == "median"}
bare, with_, cache, ring = (medians(f"{out}/micro-{n}.json") for n in ("bare", "with", "cache", "ring"))
def ns(b):
    scale = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[b.get("time_unit", "ns")]
    return b["real_time"] * scale
print()
print(f"{'benchmark (simulated driver)':34} {'bare ns':>10} {'with ns':>10} {'added ns':>10} {'added %':>8} {'cache ns':>10}")
for name, b in bare.items():
    w = with_.get(name)
    if not w: continue
    if w.get("cuwarden", 1) != 1 or b.get("cuwarden", 0) != 0:
        print(f"{name}: the preload did not take effect", file=sys.stderr); sys.exit(1)
    x, y = ns(b), ns(w)
    c = cache.get(name)
    cs = f"{ns(c):10.1f}" if c else f"{'-':>10}"
    print(f"{name:34} {x:10.1f} {y:10.1f} {y - x:10.1f} {100 * (y - x) / x:7.1f}% {cs}")
print()
print(f"{'ring (wall time, all threads)':52} {'ns/event':>10} {'Mevents/s':>10} {'drops %':>10}")
for name, b in ring.items():
    rate = b.get("items_per_second", 0)
    per = 1e9 / rate if rate else float("nan")
    drops = f"{b['drop_pct']:10.2f}" if "drop_pct" in b else f"{'-':>10}"
    print(f"{name:52} {per:10.2f} {rate / 1e6:10.1f} {drops}")
PY
