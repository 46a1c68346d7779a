#!/usr/bin/env bash
# cuwarden GPU test: CUWARDEN_POOL=cache never hands out a block that work queued before its
# free can still write, whichever way the program queued that work. One call on a CUDA
# machine; builds tests/gpu/cache_reuse/canary.cu with the machine's nvcc (legacy and
# per-thread default stream) into a temporary directory.
#
#   BUILD_DIR=<dir> OUT=<dir> bash tests/gpu/cache_reuse.sh
#
# Cases: canary.cu for kernel, memset, memcpy, graph at 4 KiB (packed slabs), 64 MiB and
# 1 GiB (whole blocks), both default-stream flavours, and peer (the late write from a
# kernel on device 1, through peer access); peer_access.cu (device 1 reads and writes
# device 0's blocks and the reverse: packed, whole, reused); framework_canary.py for PyTorch
# (cudaMalloc per tensor) and CuPy (pool off), where cuBLAS writes the block. Every case
# also runs bare (no cuwarden) as a control. The interposer log (CUWARDEN_LOG=info) of each
# case is searched for "does not hook": a program that obtained a work entry point cuwarden
# does not track (the cache then always waits for events; reported, not a failure).
# The peer cases need two GPUs that can reach each other, and are reported as skipped
# otherwise. ONLY=REGEX runs only the cases whose name matches (e.g. ONLY=peer).
# REUSE_POOL=vmm runs the cases under CUWARDEN_POOL=vmm instead of cache (the same promise).
# Writes $OUT/cache-reuse.md, cache-reuse.json, cache-reuse.log. Exit 0 when every case
# under cuwarden is ok (or skipped), 1 otherwise.
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
POOL=${REUSE_POOL:-cache}
[[ $POOL == cache || $POOL == vmm ]] || { echo "cache_reuse.sh: REUSE_POOL must be cache or vmm"; exit 2; }

echo "== build (nvcc: $("$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p'))"
"$NVCC" -O2 -arch=native -o "$WORK/canary" "$REPO/tests/gpu/cache_reuse/canary.cu" || exit 1
"$NVCC" -O2 -arch=native --default-stream per-thread -o "$WORK/canary_pt" "$REPO/tests/gpu/cache_reuse/canary.cu" || exit 1
"$NVCC" -O2 -arch=native -o "$WORK/peer_access" "$REPO/tests/gpu/cache_reuse/peer_access.cu" || exit 1

RESULTS="$WORK/results.jsonl"
: >"$RESULTS"
# one MODE NAME CMD...: run a case; append {"case", "mode", "untracked", ...its JSON line}.
one() {
  local mode=$1 name=$2; shift 2
  [[ -z ${ONLY:-} || $name =~ $ONLY ]] || return 0
  local log="$WORK/$name-$mode.interposer.log" line rc
  rm -f "$log"
  if [[ $mode != bare ]]; then
    timeout 180 env LD_PRELOAD="$LIB" CUWARDEN_POOL="$mode" CUWARDEN_LOG=info CUWARDEN_LOG_FILE="$log" "$@" >"$WORK/out" 2>"$WORK/err"
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
  for path in kernel memset memcpy graph peer; do
    [[ $path == peer && $flavour == canary_pt ]] && continue  # one flavour: the path is the device
    for bytes in 4096 67108864 1073741824; do
      for mode in bare $POOL; do one "$mode" "$flavour-$path-$bytes" "$WORK/$flavour" "$path" "$bytes"; done
    done
  done
done
for mode in bare $POOL; do one "$mode" peer-access "$WORK/peer_access"; done
if timeout 120 python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  for mode in bare $POOL; do
    one "$mode" torch-cublas env PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 "$REPO/tests/gpu/cache_reuse/framework_canary.py" torch
  done
else
  echo "torch: not available, skipped"
fi
if timeout 120 python3 -c 'import cupy' 2>/dev/null; then
  for mode in bare $POOL; do one "$mode" cupy-cublas python3 "$REPO/tests/gpu/cache_reuse/framework_canary.py" cupy; done
else
  echo "cupy: not available, skipped"
fi

python3 - "$RESULTS" "$OUT_DIR" "$POOL" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out = sys.argv[2]
pool = sys.argv[3]
skipped = [r for r in rows if "skipped" in r]
# The peer path shows what cudaFree promises about another device's work on the block: the
# bare run is the driver's answer, and the cache is held to it, not counted with the rest.
peer = [r for r in rows if r.get("path") == "peer" and "skipped" not in r]
def no_weaker(r):
    """A peer case under the cache: ok, or the driver itself (bare) handed the block out under that work."""
    bare = [b for b in peer if b["case"] == r["case"] and b["mode"] == "bare" and "error" not in b]
    return r.get("ok") or any(b.get("reused_while_pending") or b.get("nonzero_words") for b in bare)
cache = [r for r in rows if r["mode"] == pool and "skipped" not in r and r not in peer]
bad = [r for r in cache if not r.get("ok")] + [r for r in peer if r["mode"] == pool and not no_weaker(r)]
header = ["| case | mode | late write pending at free | cudaFree us | still pending after free | reused the block | reused while pending | cudaMalloc us | non-zero words | untracked entry points | ok |",
          "| --- | --- | --- | ---: | --- | --- | --- | ---: | ---: | --- | --- |"]
md = [f"# CUWARDEN_POOL={pool}: no reuse under queued work (tests/gpu/cache_reuse.sh)", "",
      f"{len(cache)} cases under cuwarden, {len(cache) - len([r for r in bad if r in cache])} ok; every case also run bare as a control."
      + (f" {len(skipped)} runs skipped ({skipped[0]['skipped']})." if skipped else ""), "",
      *header]
def row(r, ok):
    if "error" in r:
        return f"| {r['case']} | {r['mode']} | error: {r['error']} | | | | | | | | **no** |"
    return (f"| {r['case']} | {r['mode']} | {r['late_write_pending_at_free']} | {r.get('free_us', '')} | "
            f"{r.get('pending_after_free', '')} | {r['reused']} | "
            f"{r['reused_while_pending']} | {r['alloc_us']} | {r['nonzero_words']} | {r['untracked']} | {ok} |")
access = [r for r in rows if "blocks" in r]  # peer_access.cu
main = [r for r in rows if "skipped" not in r and r not in peer and r not in access]
if not main:
    del md[-2:]  # no table of canary cases (ONLY= left none)
for r in main:
    md.append(row(r, "yes" if r.get("ok") else "**no**"))
if peer:
    md += ["", "cudaFree and another device's work (canary.cu peer: the late write is a kernel on device 1 "
           "writing device 0's block through peer access; bare is what the driver does, and the cache "
           "is held to that: ok when it reused nothing under that work, or the driver did too):", "",
           header[0], header[1]]
    for r in peer:
        ok = "" if r["mode"] == "bare" else ("yes" if r.get("ok") else "as the driver" if no_weaker(r) else "**no**")
        md.append(row(r, ok))
if access:
    md += ["", "Peer access (peer_access.cu: each GPU writes the other's blocks of 4 KiB, 1 MiB and 64 MiB, "
           "allocated before and after enabling access and reused, then reads them back by cudaMemcpyPeer):", "",
           "| case | mode | blocks | wrong words (written by the peer) | wrong words (copied back) | untracked entry points | ok |",
           "| --- | --- | ---: | ---: | ---: | --- | --- |"]
    for r in access:
        md.append(f"| {r['case']} | {r['mode']} | {r['blocks']} | {r['wrong_words']} | {r['wrong_words_copy']} | "
                  f"{r['untracked']} | {'yes' if r['ok'] else '**no**'} |")
open(f"{out}/cache-reuse.md", "w").write("\n".join(md) + "\n")
json.dump(rows, open(f"{out}/cache-reuse.json", "w"), indent=1)
print("\n".join(md))
sys.exit(1 if bad or not (cache or skipped) else 0)
PY
