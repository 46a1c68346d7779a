#!/usr/bin/env bash
# cuwarden GPU validation of the first slice, on any machine with a CUDA GPU.
#
# Builds nothing: uses an existing build directory (BUILD_DIR, default <repo>/build) with
# lib/libcuwarden.so, bin/cuwardend, bin/cuwarden and the workloads (bin/cuw_alloc_probe,
# bin/cuw_alloc_probe_shared). Needs python3 with PyTorch (CUDA) for the training checks.
# Writes into ${OUT:-./gpu-out}: summary.md, run.log, cuwarden-table.txt, state.json.
# Exit status: 0 when every check passed, 1 otherwise.
#
#   OUT=/tmp/gpu-out BUILD_DIR=build tests/gpu/run.sh
set -euo pipefail

START_CWD=$(pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

abs_path() {  # abs_path PATH: absolute, relative to where the script was started
  case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$START_CWD/$1" ;; esac
}
OUT_DIR=$(abs_path "${OUT:-./gpu-out}")
BUILD=$(abs_path "${BUILD_DIR:-$REPO/build}")
mkdir -p "$OUT_DIR"
cd "$REPO"

LIMIT_BYTES=$((4 * 1024 * 1024 * 1024))
CHUNK_BYTES=$((256 * 1024 * 1024))
TRAIN_STEPS=${TRAIN_STEPS:-300}
TRAIN_PY=${TRAIN_PY:-tests/gpu/train.py}   # the training script (relative to the repo root)
LIB="$BUILD/lib/libcuwarden.so"
DAEMON="$BUILD/bin/cuwardend"
CLI="$BUILD/bin/cuwarden"
PROBE="$BUILD/bin/cuw_alloc_probe"
PROBE_SHARED="$BUILD/bin/cuw_alloc_probe_shared"

: >"$OUT_DIR/run.log"
: >"$OUT_DIR/cuwarden-table.txt"
exec > >(tee -a "$OUT_DIR/run.log") 2>&1
TEE_PID=$!

WORK=$(mktemp -d "${TMPDIR:-/tmp}/cuwarden-gpu.XXXXXX")   # private: logs, captures
RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/cuwarden-run.XXXXXX") # private CUWARDEN_RUN_DIR
SOCK="$RUN_DIR/daemon/cuwardend.sock"
export CUWARDEN_RUN_DIR="$RUN_DIR"
DAEMON_PID=""
TRAIN_PID=""

cleanup() {
  local pid
  for pid in $TRAIN_PID $DAEMON_PID; do
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$WORK" "$RUN_DIR"
  exec 1>&- 2>&-      # let tee finish writing run.log before the runner collects $OUT
  wait "$TEE_PID" 2>/dev/null || true
}
trap cleanup EXIT

section() { printf '\n===== %s =====\n' "$*"; }

# ---- checks -----------------------------------------------------------------------------
CHECK_RESULTS=()
CHECK_NAMES=()
CHECK_DETAILS=()
FAILS=0
record() {  # record PASS|FAIL NAME DETAIL
  CHECK_RESULTS+=("$1")
  CHECK_NAMES+=("$2")
  CHECK_DETAILS+=("$3")
  [[ $1 == PASS ]] || FAILS=$((FAILS + 1))
  printf '%s: %s — %s\n' "$1" "$2" "$3"
}
check() {  # check NAME DETAIL COMMAND...: PASS when COMMAND succeeds
  local name=$1 detail=$2
  shift 2
  if "$@"; then record PASS "$name" "$detail"; else record FAIL "$name" "$detail"; fi
}

COMMANDS=()
note_cmd() { COMMANDS+=("$*"); printf '+ %s\n' "$*"; }

# ---- JSON helpers (python3, no jq) -------------------------------------------------------
# probe_field FILE KEY: KEY of the last JSON line of a probe's output ("null" if absent).
probe_field() {
  python3 - "$1" "$2" <<'PY'
import json, sys
doc = None
for line in open(sys.argv[1], errors="replace"):
    line = line.strip()
    if line.startswith("{"):
        try:
            doc = json.loads(line)
        except ValueError:
            pass
v = None if doc is None else doc.get(sys.argv[2])
print("null" if v is None else (str(v).lower() if isinstance(v, bool) else v))
PY
}

# proc_stats FILE PID [MARKER]: "used peak limit ooms" of process PID (summed over its
# devices) in `cuwarden --json` output; a process whose cmdline contains MARKER stands in
# when PID is empty or absent. Prints "missing" if not found or unreadable.
proc_stats() {
  python3 - "$@" <<'PY'
import json, sys
path, pid = sys.argv[1], sys.argv[2]
marker = sys.argv[3] if len(sys.argv) > 3 else ""
try:
    state = json.load(open(path))
except Exception:
    print("missing"); sys.exit(0)

def procs(node):
    if isinstance(node, dict):
        if "pid" in node and ("devices" in node or "used_bytes" in node or "used_memory" in node):
            yield node
        for v in node.values():
            yield from procs(v)
    elif isinstance(node, list):
        for v in node:
            yield from procs(v)

def num(d, *keys):
    for k in keys:
        v = d.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return int(v)
    return None

cands = [p for p in procs(state) if pid and str(p.get("pid")) == pid]
if not cands and marker:
    cands = [p for p in procs(state) if marker in str(p.get("cmdline", "")) + str(p.get("process_name", ""))]
if not cands:
    print("missing"); sys.exit(0)
p = cands[-1]
rows = p.get("devices") if isinstance(p.get("devices"), list) and p.get("devices") else [p]
used = peak = ooms = 0
limit = None
for d in rows:
    used += num(d, "used_bytes", "used", "used_memory") or 0
    peak += num(d, "peak_bytes", "peak", "peak_memory") or 0
    ooms += num(d, "ooms", "refusals", "oom_count") or 0
    lim = num(d, "limit_bytes", "limit")
    if lim is not None:
        limit = lim if limit is None else max(limit, lim)
print(used, peak, "null" if limit is None else limit, ooms)
PY
}

# capture LABEL: `cuwarden` and `cuwarden --json` into the table file and $WORK/state-LABEL.json
capture() {
  local label=$1
  {
    printf '===== %s (%s) =====\n' "$label" "$(date -u +%H:%M:%S)"
    "$CLI" --socket "$SOCK" 2>&1 || printf '(cuwarden exited with %d)\n' "$?"
    printf '\n'
  } >>"$OUT_DIR/cuwarden-table.txt"
  "$CLI" --socket "$SOCK" --json >"$WORK/state-$label.json" 2>"$WORK/state-$label.err" || true
}

fmt_gib() { python3 -c "import sys; print(f'{int(sys.argv[1]) / 2**30:.2f} GiB')" "$1" 2>/dev/null || echo "$1"; }

# =========================================================================================
section "Machine"
DATE=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
echo "date: $DATE"
echo "host kernel: $(uname -sr)"
if command -v nvidia-smi >/dev/null; then GPU_LIST=$(nvidia-smi -L 2>&1 || true); else GPU_LIST="nvidia-smi not found"; fi
echo "$GPU_LIST"
DEVICE_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 || true)
CUDA_DRIVER=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1 || true)
NVCC=$( (command -v nvcc >/dev/null && nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') || true)
TORCH=$(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null || echo "not importable")
echo "device: ${DEVICE_NAME:-?}"
echo "driver: ${DRIVER:-?}  CUDA (driver): ${CUDA_DRIVER:-?}  nvcc: ${NVCC:-absent}"
echo "torch: $TORCH"
echo "build dir: $BUILD"
check "GPU visible to nvidia-smi" "${DEVICE_NAME:-none}" grep -q '^GPU ' <<<"$GPU_LIST"

section "Binaries and their libraries"
for f in "$LIB" "$DAEMON" "$CLI" "$PROBE" "$PROBE_SHARED"; do
  check "present: ${f#"$BUILD"/}" "$(stat -c %s "$f" 2>/dev/null || echo missing) bytes" test -e "$f"
done
for f in "$LIB" "$DAEMON" "$CLI"; do
  echo "--- ldd ${f#"$BUILD"/}"
  ldd "$f" 2>&1 || true
  check "ldd ${f#"$BUILD"/}: no missing library" "$(ldd "$f" 2>&1 | grep -c 'not found' || true) not found" \
    bash -c "! ldd '$f' 2>&1 | grep -q 'not found'"
done
if [[ ! -x $DAEMON || ! -x $CLI || ! -e $LIB ]]; then
  echo "cannot go on without libcuwarden.so, cuwardend and cuwarden" >&2
fi

section "Daemon"
note_cmd "cuwardend --run-dir \$CUWARDEN_RUN_DIR &"
"$DAEMON" --run-dir "$RUN_DIR" >"$WORK/cuwardend.log" 2>&1 &
DAEMON_PID=$!
for _ in $(seq 1 100); do
  [[ -S $SOCK ]] && break
  kill -0 "$DAEMON_PID" 2>/dev/null || break
  sleep 0.1
done
check "cuwardend listening" "socket in a private run dir, pid $DAEMON_PID" test -S "$SOCK"

# =========================================================================================
section "Training under a 4 GiB cap (PyTorch)"
TRAIN_LOG="$WORK/train.log"
note_cmd "timeout 300 cuwarden run --limit 4G -- python3 $TRAIN_PY --steps $TRAIN_STEPS --batch 16 --hold-s 8 &"
timeout 300 "$CLI" run --limit 4G -- python3 "$TRAIN_PY" --steps "$TRAIN_STEPS" --batch 16 --hold-s 8 \
  >"$TRAIN_LOG" 2>&1 &
TRAIN_PID=$!
# "From another shell": wait until the daemon shows the trainer holding memory, then look.
PY_PID=""
seen=missing
for _ in $(seq 1 240); do
  kill -0 "$TRAIN_PID" 2>/dev/null || break
  [[ -n $PY_PID ]] || PY_PID=$(sed -n 's/^train.py: pid \([0-9]*\),.*/\1/p' "$TRAIN_LOG" | head -1)
  "$CLI" --socket "$SOCK" --json >"$WORK/poll.json" 2>/dev/null || true
  seen=$(proc_stats "$WORK/poll.json" "$PY_PID" train.py)
  if [[ $seen != missing && ${seen%% *} -gt 0 ]] && grep -q '^step ' "$TRAIN_LOG"; then break; fi
  sleep 0.5
done
for i in 1 2 3; do
  note_cmd "cuwarden; cuwarden --json   # while training, capture $i"
  capture "training-$i"
  sleep 1
done
TRAIN_RC=0
wait "$TRAIN_PID" || TRAIN_RC=$?
TRAIN_PID=""
cat "$TRAIN_LOG"
[[ -n $PY_PID ]] || PY_PID=$(sed -n 's/^train.py: pid \([0-9]*\),.*/\1/p' "$TRAIN_LOG" | head -1)

check "training exit status 0" "rc=$TRAIN_RC" test "$TRAIN_RC" -eq 0
read -r T_USED T_PEAK T_LIMIT _ _ <<<"$(proc_stats "$WORK/state-training-2.json" "$PY_PID" train.py) x x x x"
if [[ $T_USED == missing ]]; then
  record FAIL "cuwarden --json shows the trainer" "pid ${PY_PID:-?} not found ($(head -c 200 "$WORK/state-training-2.err" 2>/dev/null))"
else
  check "trainer used > 0" "used=$T_USED ($(fmt_gib "$T_USED"))" test "$T_USED" -gt 0
  check "trainer peak > 0" "peak=$T_PEAK ($(fmt_gib "$T_PEAK"))" test "$T_PEAK" -gt 0
  check "trainer limit == 4 GiB" "limit=$T_LIMIT" test "$T_LIMIT" = "$LIMIT_BYTES"
fi
check "cuwarden table lists the trainer" "pid ${PY_PID:-?}" \
  grep -qw -- "${PY_PID:-no-pid}" "$OUT_DIR/cuwarden-table.txt"
TRAIN_TOTAL=$(probe_field "$TRAIN_LOG" mem_get_info_total)
TRAIN_MAXALLOC=$(probe_field "$TRAIN_LOG" max_memory_allocated)
check "torch.cuda.mem_get_info total == 4 GiB" "total=$TRAIN_TOTAL" test "$TRAIN_TOTAL" = "$LIMIT_BYTES"
check "torch max_memory_allocated > 0 and <= 4 GiB" "max_memory_allocated=$TRAIN_MAXALLOC ($(fmt_gib "${TRAIN_MAXALLOC//null/0}"))" \
  bash -c "[[ '$TRAIN_MAXALLOC' =~ ^[0-9]+$ ]] && (( $TRAIN_MAXALLOC > 0 && $TRAIN_MAXALLOC <= $LIMIT_BYTES ))"
LOSS_FIRST=$(sed -n 's/^step 1 loss \([0-9.]*\).*/\1/p' "$TRAIN_LOG" | head -1)
LOSS_LAST=$(probe_field "$TRAIN_LOG" final_loss)
STEP_MS=$(probe_field "$TRAIN_LOG" mean_step_ms)
check "loss decreased" "step 1: ${LOSS_FIRST:-?} -> final: $LOSS_LAST, mean ${STEP_MS} ms/step" \
  python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) < float(sys.argv[1]) else 1)" "${LOSS_FIRST:-nan}" "$LOSS_LAST"

# =========================================================================================
section "Training that must hit the cap (--expect-oom)"
OOM_LOG="$WORK/oom.log"
note_cmd "timeout 300 cuwarden run --limit 4G -- python3 $TRAIN_PY --expect-oom"
OOM_RC=0
timeout 300 "$CLI" run --limit 4G -- python3 "$TRAIN_PY" --expect-oom >"$OOM_LOG" 2>&1 || OOM_RC=$?
cat "$OOM_LOG"
OOM_PID=$(sed -n 's/^train.py: pid \([0-9]*\),.*/\1/p' "$OOM_LOG" | head -1)
OOM_LINE=$(grep -m1 '^OOM caught:' "$OOM_LOG" || true)
check "OOM run exit status 0" "rc=$OOM_RC" test "$OOM_RC" -eq 0
check "torch.cuda.OutOfMemoryError caught" "${OOM_LINE:0:240}" test -n "$OOM_LINE"
check "OOM message reports the 4 GiB cap as capacity" "looks for 'total capacity of 4.00 GiB'" \
  grep -q 'total capacity of 4.00 GiB' <<<"$OOM_LINE"
note_cmd "cuwarden; cuwarden --json   # after the OOM run"
capture "after-oom"
read -r O_USED O_PEAK O_LIMIT O_OOMS _ <<<"$(proc_stats "$WORK/state-after-oom.json" "$OOM_PID" expect-oom) x x x x"
if [[ $O_USED == missing ]]; then
  record FAIL "cuwarden --json shows the OOM run" "pid ${OOM_PID:-?} not found"
else
  check "OOM run: ooms counter > 0" "ooms=$O_OOMS peak=$O_PEAK limit=$O_LIMIT" test "$O_OOMS" -gt 0
  check "OOM run: peak <= limit == 4 GiB" "peak=$O_PEAK limit=$O_LIMIT" \
    bash -c "[[ '$O_LIMIT' == '$LIMIT_BYTES' ]] && (( $O_PEAK <= $LIMIT_BYTES ))"
fi

# =========================================================================================
probe_checks() {  # probe_checks LABEL LOGFILE RC EXPECTED_ERROR
  local label=$1 log=$2 rc=$3 want=$4
  local alloc err total chunks
  alloc=$(probe_field "$log" allocated_bytes)
  err=$(probe_field "$log" first_error)
  total=$(probe_field "$log" meminfo_total)
  chunks=$(probe_field "$log" chunks)
  check "$label: exit status 0" "rc=$rc" test "$rc" -eq 0
  check "$label: 4 GiB - chunk <= allocated <= 4 GiB" "allocated_bytes=$alloc ($chunks chunks of 256 MiB)" \
    bash -c "[[ '$alloc' =~ ^[0-9]+$ ]] && (( $alloc <= $LIMIT_BYTES && $alloc >= $LIMIT_BYTES - $CHUNK_BYTES ))"
  check "$label: refused with $want" "first_error=$err" test "$err" = "$want"
  check "$label: meminfo total == 4 GiB" "meminfo_total=$total" test "$total" = "$LIMIT_BYTES"
}

run_probe() {  # run_probe LABEL EXPECTED_ERROR BINARY ARGS...
  local label=$1 want=$2 bin=$3
  shift 3
  local log="$WORK/probe-$label.log" rc=0
  section "Probe: $label under a 4 GiB cap"
  note_cmd "cuwarden run --limit 4G -- ${bin#"$BUILD"/} $*"
  "$CLI" run --limit 4G -- "$bin" "$@" >"$log" 2>&1 || rc=$?
  grep -v '^alloc ' "$log" || true
  grep '^alloc ' "$log" | tail -2 || true
  probe_checks "$label" "$log" "$rc" "$want"
  note_cmd "cuwarden --json   # after the $label probe"
  capture "after-probe-$label"
  local pid peak limit ooms
  pid=$(probe_field "$log" pid)
  read -r _ peak limit ooms _ <<<"$(proc_stats "$WORK/state-after-probe-$label.json" "$pid") x x x x"
  check "$label: daemon saw the refusal and the cap" "pid=$pid ooms=$ooms peak=$peak limit=$limit" \
    bash -c "[[ '$ooms' =~ ^[0-9]+$ ]] && (( $ooms > 0 )) && [[ '$limit' == $LIMIT_BYTES ]]"
}

# --hold-ms: a process that exits before the daemon first sees its ring is never listed
# (the interposer removes an unwatched ring at exit), so the probes linger a moment.
run_probe "static-cudart" cudaErrorMemoryAllocation "$PROBE" --chunk 256M --max 16G --hold-ms 1500
run_probe "shared-cudart" cudaErrorMemoryAllocation "$PROBE_SHARED" --chunk 256M --max 16G --hold-ms 1500
run_probe "driver-api" CUDA_ERROR_OUT_OF_MEMORY "$PROBE" --api driver --chunk 256M --max 16G --hold-ms 1500
# nvcc-built programs with a real kernel writing every buffer (static and shared cudart).
for kind in static shared; do
  if [[ -x "$BUILD/bin/cuw_nvcc_probe_$kind" ]]; then
    run_probe "nvcc-$kind" cudaErrorMemoryAllocation "$BUILD/bin/cuw_nvcc_probe_$kind" --chunk 256 --max 16384 --hold-ms 1500
    check "nvcc-$kind: kernels wrote every buffer" "kernel_checked=$(probe_field "$WORK/probe-nvcc-$kind.log" kernel_checked)" \
      test "$(probe_field "$WORK/probe-nvcc-$kind.log" kernel_checked)" = true
  else
    record FAIL "nvcc-$kind probe present" "$BUILD/bin/cuw_nvcc_probe_$kind missing (build needs nvcc)"
  fi
done
section "Probe without cuwarden: 8 GiB must fit (so the cap, not the GPU, stopped it)"
NOCAP_LOG="$WORK/probe-nocap.log"
NOCAP_RC=0
note_cmd "${PROBE#"$BUILD"/} --chunk 256M --max 8G   # no cuwarden"
env -u LD_PRELOAD -u CUWARDEN_LIMIT "$PROBE" --chunk 256M --max 8G >"$NOCAP_LOG" 2>&1 || NOCAP_RC=$?
grep -v '^alloc ' "$NOCAP_LOG" || true
NC_ALLOC=$(probe_field "$NOCAP_LOG" allocated_bytes)
NC_ERR=$(probe_field "$NOCAP_LOG" first_error)
NC_TOTAL=$(probe_field "$NOCAP_LOG" meminfo_total)
NC_LOADED=$(probe_field "$NOCAP_LOG" cuwarden_loaded)
check "uncapped: exit status 0" "rc=$NOCAP_RC" test "$NOCAP_RC" -eq 0
check "uncapped: 8 GiB allocated, no error" "allocated_bytes=$NC_ALLOC first_error=$NC_ERR cuwarden_loaded=$NC_LOADED" \
  bash -c "[[ '$NC_ALLOC' == $((2 * LIMIT_BYTES)) && '$NC_ERR' == null ]]"
check "uncapped: meminfo total is the GPU's (> 4 GiB)" "meminfo_total=$NC_TOTAL ($(fmt_gib "${NC_TOTAL//null/0}"))" \
  bash -c "[[ '$NC_TOTAL' =~ ^[0-9]+$ ]] && (( $NC_TOTAL > $LIMIT_BYTES ))"

# =========================================================================================
section "Final state"
capture "final"
tail -n 20 "$OUT_DIR/cuwarden-table.txt"
echo "--- cuwardend log (last 40 lines)"
tail -n 40 "$WORK/cuwardend.log" || true

# state.json: every `cuwarden --json` capture, by label (unparsable ones as text).
python3 - "$WORK" "$OUT_DIR/state.json" <<'PY'
import glob, json, os, sys
work, out = sys.argv[1], sys.argv[2]
doc = {}
for path in sorted(glob.glob(os.path.join(work, "state-*.json"))):
    label = os.path.basename(path)[len("state-"):-len(".json")]
    text = open(path, errors="replace").read()
    try:
        doc[label] = json.loads(text)
    except ValueError:
        err = path[:-5] + ".err"
        doc[label] = {"unparsable": text[:4000],
                      "stderr": open(err, errors="replace").read()[:4000] if os.path.exists(err) else ""}
json.dump(doc, open(out, "w"), indent=1)
PY

section "Summary"
PASSED=$(( ${#CHECK_RESULTS[@]} - FAILS ))
for i in "${!CHECK_RESULTS[@]}"; do
  printf '%-4s  %-55s  %s\n' "${CHECK_RESULTS[$i]}" "${CHECK_NAMES[$i]}" "${CHECK_DETAILS[$i]:0:120}"
done
echo "$PASSED passed, $FAILS failed   (${SECONDS}s)"

{
  echo "# cuwarden GPU validation — first slice"
  echo
  echo "| | |"
  echo "| --- | --- |"
  echo "| date | $DATE |"
  echo "| device | ${DEVICE_NAME:-?} |"
  echo "| GPUs | $(tr '\n' ';' <<<"$GPU_LIST" | sed 's/;$//; s/|/\\|/g') |"
  echo "| driver | ${DRIVER:-?} |"
  echo "| CUDA (driver) | ${CUDA_DRIVER:-?} |"
  echo "| nvcc | ${NVCC:-absent} |"
  echo "| torch | $TORCH |"
  echo "| result | **$PASSED passed, $FAILS failed** in ${SECONDS} s |"
  echo
  echo "## Commands"
  echo
  echo "CUWARDEN_RUN_DIR is a fresh private directory; \`cuwarden\` is \`build/bin/cuwarden\`."
  echo
  echo '```'
  printf '%s\n' "${COMMANDS[@]}"
  echo '```'
  echo
  echo "## Checks"
  echo
  echo "| result | check | numbers |"
  echo "| --- | --- | --- |"
  for i in "${!CHECK_RESULTS[@]}"; do
    printf '| %s | %s | %s |\n' "${CHECK_RESULTS[$i]}" "${CHECK_NAMES[$i]//|/\\|}" "${CHECK_DETAILS[$i]//|/\\|}"
  done
  echo
  echo "Files: run.log (everything printed), cuwarden-table.txt (the table, captured during and after"
  echo "the runs), state.json (\`cuwarden --json\` at the same moments)."
} >"$OUT_DIR/summary.md"

[[ $FAILS -eq 0 ]]
