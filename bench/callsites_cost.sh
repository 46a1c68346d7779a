#!/usr/bin/env bash
# cuwarden bench: what CUWARDEN_CALLSITES=16 adds per allocation, side by side in one run.
#
#   BUILD_DIR=build [ROUNDS=5] bash bench/callsites_cost.sh      (simulated driver; any machine)
#
# Rows, interleaved per round, each the time of one cuMemAlloc_v2 + cuMemFree_v2 pair of
# 1 MiB averaged over PAIRS pairs made 20 frames deep (one capture per pair: the allocation):
#   native off / on      bin/cuw_bench_callsites pairs, CUWARDEN_CALLSITES unset / 16
#   python off / on-native / on-python   bench/callsites_py.py (ctypes), CUWARDEN_CALLSITES
#                        unset, 16 with CUWARDEN_PYFRAMES=0, 16 with Python frames
# and the unwinders alone (bin/cuw_bench_callsites unwind): glibc's backtrace(), the call sites'
# walk (interposer/src/core/callsites/unwind.hpp) and a bounded frame-pointer walk, 16 frames, warm and
# with the caches cold, and the walk with its rule table emptied; then one more native-on and
# python-on-native run each with CUWARDEN_LOG=debug, whose last line says how the walks went
# (return addresses looked up, walks left to backtrace() and why).
# Writes ${OUT:-./bench-out}/callsites-cost.md; prints it.
set -euo pipefail
START_CWD=$(pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
abs() { case $1 in /*) echo "$1" ;; *) echo "$START_CWD/$1" ;; esac; }
BUILD=$(abs "${BUILD_DIR:-./build}")
OUT=$(abs "${OUT:-./bench-out}")
ROUNDS=${ROUNDS:-5}
PAIRS=${PAIRS:-20000}
mkdir -p "$OUT"
RUN=$(mktemp -d)
trap 'rm -rf "$RUN"' EXIT
export LD_LIBRARY_PATH=$BUILD/fakecuda CUWARDEN_RUN_DIR=$RUN
B=$BUILD/bin/cuw_bench_callsites
PY=$REPO/bench/callsites_py.py
raw=$OUT/callsites-cost.raw
: >"$raw"
for r in $(seq "$ROUNDS"); do
  echo "native-off $(LD_PRELOAD=$BUILD/lib/libcuwarden.so $B pairs --pairs "$PAIRS" | awk '{print $2}')" >>"$raw"
  echo "native-on $(LD_PRELOAD=$BUILD/lib/libcuwarden.so CUWARDEN_CALLSITES=16 $B pairs --pairs "$PAIRS" | awk '{print $2}')" >>"$raw"
  echo "python-off $(LD_PRELOAD=$BUILD/lib/libcuwarden.so python3 "$PY" --pairs "$PAIRS" | awk '{print $2}')" >>"$raw"
  echo "python-on-native $(LD_PRELOAD=$BUILD/lib/libcuwarden.so CUWARDEN_CALLSITES=16 CUWARDEN_PYFRAMES=0 python3 "$PY" --pairs "$PAIRS" | awk '{print $2}')" >>"$raw"
  echo "python-on-python $(LD_PRELOAD=$BUILD/lib/libcuwarden.so CUWARDEN_CALLSITES=16 python3 "$PY" --pairs "$PAIRS" | awk '{print $2}')" >>"$raw"
done
$B unwind --reps 2000 >"$OUT/callsites-unwind.txt"
walks=$OUT/callsites-walks.txt
{
  echo "native-on: $(LD_PRELOAD=$BUILD/lib/libcuwarden.so CUWARDEN_CALLSITES=16 CUWARDEN_LOG=debug $B pairs --pairs "$PAIRS" 2>&1 >/dev/null | grep -o 'call sites:.*')"
  echo "python-on-native: $(LD_PRELOAD=$BUILD/lib/libcuwarden.so CUWARDEN_CALLSITES=16 CUWARDEN_PYFRAMES=0 CUWARDEN_LOG=debug python3 "$PY" --pairs "$PAIRS" 2>&1 >/dev/null | grep -o 'call sites:.*')"
} >"$walks"
python3 - "$raw" "$OUT/callsites-unwind.txt" "$ROUNDS" "$PAIRS" "$walks" >"$OUT/callsites-cost.md" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    k, v = line.split()
    rows.setdefault(k, []).append(float(v))
med = {k: statistics.median(v) for k, v in rows.items()}
print(f"rounds {sys.argv[3]}, {sys.argv[4]} pairs each, interleaved; ns per cuMemAlloc_v2 + cuMemFree_v2 pair (median of rounds, spread)\n")
print("| row | ns per pair | spread | added by call sites |")
print("| --- | --- | --- | --- |")
base = {"native-on": "native-off", "python-on-native": "python-off", "python-on-python": "python-off"}
for k in ("native-off", "native-on", "python-off", "python-on-native", "python-on-python"):
    v = rows[k]
    add = f"{med[k] - med[base[k]]:.0f} ns" if k in base else ""
    print(f"| {k} | {med[k]:.0f} | {min(v):.0f}-{max(v):.0f} | {add} |")
print(f"\nPython frames alone (python-on-python less python-on-native): {med['python-on-python'] - med['python-on-native']:.0f} ns\n")
print("Unwinders alone, 16 frames (bin/cuw_bench_callsites unwind, median of 2000):\n")
for line in open(sys.argv[2]):
    print(f"    {line.rstrip()}")
print(f"\nThe walks of one more run each (CUWARDEN_LOG=debug, {sys.argv[4]} pairs):\n")
for line in open(sys.argv[5]):
    print(f"    {line.rstrip()}")
PY
cat "$OUT/callsites-cost.md"
