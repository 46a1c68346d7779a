#!/usr/bin/env bash
# cuwarden on a GPU: `cuwarden fit` against the same search done inside PyTorch (issue 25).
# Builds nothing.
#
#   BUILD_DIR=<dir> OUT=<dir> LIMIT_GIB=8 bash tests/gpu/fit_resnet.sh
#
# The largest ResNet-50 inference batch (torchvision, callsites/infer.py) that fits in
# LIMIT_GIB, found twice: `cuwarden fit --limit ${LIMIT_GIB}G --try BATCH=1..4096`, and the same
# bisection over infer.py --fraction-gib (torch.cuda.set_per_process_memory_fraction, an
# out-of-memory error meaning "does not fit"). Writes $OUT/fit.txt (the two answers, their
# ratio, the tries) and $OUT/fit.svg (fit's plot).
set -uo pipefail
START_CWD=$(pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
abs() { case $1 in /*) echo "$1" ;; *) echo "$START_CWD/$1" ;; esac; }
BUILD=$(abs "${BUILD_DIR:-./build}")
OUT=$(abs "${OUT:-./gpu-out}")
LIMIT_GIB=${LIMIT_GIB:-8}
HI=${HI:-4096}
mkdir -p "$OUT"
CLI=$BUILD/bin/cuwarden
INFER=$HERE/callsites/infer.py
RES=$OUT/fit.txt
: >"$RES"
echo "date: $(date -u +%FT%TZ); device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)" >>"$RES"

T0=$(date +%s)
"$CLI" fit --limit "${LIMIT_GIB}G" --try "BATCH=1..$HI" --plot "$OUT/fit.svg" --json -- \
  python3 "$INFER" --batch '{BATCH}' >"$OUT/fit.json" 2>"$OUT/fit.err"
T1=$(date +%s)
FIT=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get("answer") if d.get("answer") is not None else d.get("largest_fitting", ""))' "$OUT/fit.json" 2>/dev/null)
echo "cuwarden fit --limit ${LIMIT_GIB}G: answer ${FIT:-?} ($((T1 - T0)) s)" >>"$RES"

# The same bisection inside PyTorch.
lo=1; hi=$HI; best=0; tries=""
fits() { python3 "$INFER" --batch "$1" --fraction-gib "$LIMIT_GIB" >/dev/null 2>>"$OUT/torch-fit.err"; }
if fits $lo; then best=$lo; tries="$lo:fits"; else tries="$lo:no"; fi
if fits $hi; then best=$hi; tries="$tries $hi:fits"; lo=$hi; else tries="$tries $hi:no"; fi
while ((best > 0 && hi - lo > 1)); do
  mid=$(((lo + hi) / 2))
  if fits $mid; then lo=$mid; best=$mid; tries="$tries $mid:fits"; else hi=$mid; tries="$tries $mid:no"; fi
done
T2=$(date +%s)
echo "torch set_per_process_memory_fraction(${LIMIT_GIB} GiB): answer $best ($((T2 - T1)) s); tries $tries" >>"$RES"
python3 - "$FIT" "$best" >>"$RES" <<'PY'
import sys
try:
    a, b = int(sys.argv[1]), int(sys.argv[2])
    r = a / b
    print(f"{'PASS' if abs(r - 1) <= 0.02 else 'FAIL'} answers agree within 2%: fit {a} / torch {b} = {r:.3f}")
except Exception as e:
    print(f"FAIL cannot compare: {e}")
PY
sed -n '1,200p' "$OUT/fit.err" | grep -v '^$' | tail -30 >>"$RES"
