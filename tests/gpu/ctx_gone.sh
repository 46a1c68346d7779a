#!/usr/bin/env bash
# cuwarden GPU test: memory the driver frees with a context stops counting against the cap
# (cudaDeviceReset, cuCtxDestroy, the last cuDevicePrimaryCtxRelease; device memory and CUDA
# arrays; a primary context made active again keeps counting its new arrays), under each
# backend of POOLS (default: off cache vmm), with a 4 GiB cap. One call on a CUDA machine with 8 GiB free on device 0;
# builds tests/gpu/ctx_gone/ctx_gone.cu with the machine's nvcc into a temporary directory.
#
#   BUILD_DIR=<dir> OUT=<dir> [POOLS="off cache vmm"] bash tests/gpu/ctx_gone.sh
#
# Writes $OUT/ctx-gone.md and ctx-gone.jsonl. Exit 0 when every case is ok.
set -u -o pipefail
START_CWD=$(pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
abs_path() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$START_CWD/$1" ;; esac; }
BUILD=$(abs_path "${BUILD_DIR:-$REPO/build}")
OUT_DIR=$(abs_path "${OUT:-./gpu-out}")
mkdir -p "$OUT_DIR"
LIB="$BUILD/lib/libcuwarden.so"
[[ -e $LIB ]] || { echo "ctx_gone.sh: $LIB is missing"; exit 1; }
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cuwarden-ctxgone.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
unset LD_PRELOAD CUWARDEN_LIMIT CUWARDEN_POOL CUWARDEN_JOB CUWARDEN_JOB_LIMIT
export CUWARDEN_RUN_DIR="$WORK/run"
"$NVCC" -O2 -arch=native -o "$WORK/ctx_gone" "$REPO/tests/gpu/ctx_gone/ctx_gone.cu" -lcuda || exit 1
: >"$OUT_DIR/ctx-gone.jsonl"
fail=0
{
  echo "# Memory freed with its context stops counting (tests/gpu/ctx_gone.sh)"
  echo
  echo "Cap 4 GiB (\`CUWARDEN_LIMIT=4G\`): hold 3 GiB, be refused 2 GiB more, lose the 3 GiB with the context, get 3 GiB again."
  echo
  echo "| case | pool | result |"
  echo "| --- | --- | --- |"
} >"$OUT_DIR/ctx-gone.md"
for mode in reset destroy release array_reset array_destroy array_release; do
  for pool in ${POOLS:-off cache vmm}; do
    line=$(timeout 120 env LD_PRELOAD="$LIB" CUWARDEN_LIMIT=4G CUWARDEN_POOL=$pool "$WORK/ctx_gone" "$mode" 2>"$WORK/err" | tail -1)
    rc=$?
    [[ -n $line ]] || line="{\"mode\":\"$mode\",\"error\":\"exit $rc: $(tail -1 "$WORK/err" | tr '"' ' ')\",\"ok\":false}"
    echo "${line%\}},\"pool\":\"$pool\"}" >>"$OUT_DIR/ctx-gone.jsonl"
    echo "| $mode | $pool | \`$line\` |" >>"$OUT_DIR/ctx-gone.md"
    echo "$pool $line"
    [[ $line == *'"ok":true'* ]] || fail=1
  done
done
exit $fail
