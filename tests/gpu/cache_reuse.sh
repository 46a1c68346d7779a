#!/usr/bin/env bash
# cuwarden GPU test: CUWARDEN_POOL=cache never hands out a block that work queued before its
# free can still write, whichever way the program queued that work. One call on a CUDA
# machine; builds tests/gpu/cache_reuse/canary.cu with the machine's nvcc (legacy and
# per-thread default stream) into a temporary directory.
#
#   BUILD_DIR=<dir> OUT=<dir> bash tests/gpu/cache_reuse.sh
#
# Cases: canary.cu for kernel, memset, memcpy, graph at 4 KiB (packed slabs), 64 MiB and
# 1 GiB (whole blocks), both default-stream flavours; framework_canary.py for PyTorch
# (cudaMalloc per tensor) and CuPy (pool off), where cuBLAS writes the block. Every case
# also runs bare (no cuwarden) as a control. The interposer log (CUWARDEN_LOG=info) of each
# case is searched for "does not hook": a program that obtained a work entry point cuwarden
# does not track (the cache then always waits for events; reported, not a failure).
# Writes $OUT/cache-reuse.md, cache-reuse.json, cache-reuse.log. Exit 0 when every case
# under cuwarden is ok, 1 otherwise.
set -u -o pipefail
START_CWD=$(pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
abs_path() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$START_CWD/$1" ;; esac; }
BUILD=$(abs_path "${BUILD_DIR:-$REPO/build}")
OUT_DIR=$(abs_path "${OUT:-./gpu-out}")
mkdir -p "$OUT_DIR"
LIB="$BUILD/lib/libcuwarden.so"
[[ -e $LIB ]] || { echo "cache_reuse.sh: $LIB is missing"; exit 1; }
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cuwarden-reuse.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
exec > >(tee "$OUT_DIR/cache-reuse.log") 2>&1
unset LD_PRELOAD CUWARDEN_LIMIT CUWARDEN_POOL CUWARDEN_JOB CUWARDEN_JOB_LIMIT
export CUWARDEN_RUN_DIR="$WORK/run"

echo "== build (nvcc: $("$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p'))"
"$NVCC" -O2 -arch=native -o "$WORK/canary" "$REPO/tests/gpu/cache_reuse/canary.cu" || exit 1
"$NVCC" -O2 -arch=native --default-stream per-thread -o "$WORK/canary_pt" "$REPO/tests/gpu/cache_reuse/canary.cu" || exit 1

RESULTS="$WORK/results.jsonl"
: >"$RESULTS"
# one MODE NAME CMD...: run a case; append {"case", "mode", "untracked", ...its JSON line}.
one() {
  local mode=$1 name=$2; shift 2
  local log="$WORK/$name-$mode.interposer.log" line rc
  rm -f "$log"
  if [[ $mode == cache ]]; then
    timeout 180 env LD_PRELOAD="$LIB" CUWARDEN_POOL=cache CUWARDEN_LOG=info CUWARDEN_LOG_FILE="$log" "$@" >"$WORK/out" 2>"$WORK/err"
  else
    timeout 180 "$@" >"$WORK/out" 2>"$WORK/err"
  fi
  rc=$?
  line=$(grep '^{' "$WORK/out" | tail -1)
  [[ -n $line ]] || line="{\"error\": \"no result (exit $rc): $(tail -2 "$WORK/err" | tr '\n"' ' ' | cut -c1-200)\"}"
  local untracked=false
  [[ -f $log ]] && grep -q "does not hook" "$log" && untracked=true
  python3 - "$name" "$mode" "$untracked" "$line" >>"$RESULTS" <<'PY'
import json, sys
name, mode, untracked, line = sys.argv[1:5]
try:
    r = json.loads(line)
except ValueError:
    r = {"error": line}
r.update({"case": name, "mode": mode, "untracked": untracked == "true"})
print(json.dumps(r))
PY
  echo "$mode $name: $line (untracked work entry points: $untracked)"
}

for flavour in canary canary_pt; do
  for path in kernel memset memcpy graph; do
    for bytes in 4096 67108864 1073741824; do
      for mode in bare cache; do one "$mode" "$flavour-$path-$bytes" "$WORK/$flavour" "$path" "$bytes"; done
    done
  done
done
if timeout 120 python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  for mode in bare cache; do
    one "$mode" torch-cublas env PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 "$REPO/tests/gpu/cache_reuse/framework_canary.py" torch
  done
else
  echo "torch: not available, skipped"
fi
if timeout 120 python3 -c 'import cupy' 2>/dev/null; then
  for mode in bare cache; do one "$mode" cupy-cublas python3 "$REPO/tests/gpu/cache_reuse/framework_canary.py" cupy; done
else
  echo "cupy: not available, skipped"
fi

python3 - "$RESULTS" "$OUT_DIR" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out = sys.argv[2]
cache = [r for r in rows if r["mode"] == "cache"]
bad = [r for r in cache if not r.get("ok")]
md = ["# CUWARDEN_POOL=cache: no reuse under queued work (tests/gpu/cache_reuse.sh)", "",
      f"{len(cache)} cases under cuwarden, {len(cache) - len(bad)} ok; every case also run bare as a control.", "",
      "| case | mode | late write pending at free | reused the block | reused while pending | cudaMalloc us | non-zero words | untracked entry points | ok |",
      "| --- | --- | --- | --- | --- | ---: | ---: | --- | --- |"]
for r in rows:
    if "error" in r:
        md.append(f"| {r['case']} | {r['mode']} | error: {r['error']} | | | | | | **no** |")
        continue
    md.append(f"| {r['case']} | {r['mode']} | {r['late_write_pending_at_free']} | {r['reused']} | "
              f"{r['reused_while_pending']} | {r['alloc_us']} | {r['nonzero_words']} | {r['untracked']} | "
              f"{'yes' if r['ok'] else '**no**'} |")
open(f"{out}/cache-reuse.md", "w").write("\n".join(md) + "\n")
json.dump(rows, open(f"{out}/cache-reuse.json", "w"), indent=1)
print("\n".join(md))
sys.exit(1 if bad or not cache else 0)
PY
