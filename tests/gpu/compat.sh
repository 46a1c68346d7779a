#!/usr/bin/env bash
# cuwarden GPU compatibility matrix: every path into the driver, every framework, under a cap
# each program exceeds. One call on a CUDA machine; writes a markdown matrix and its JSON.
#
# Builds nothing in the build directory: uses BUILD_DIR (default <repo>/build) for
# lib/libcuwarden.so, bin/cuwardend, bin/cuwarden and the carried probes bin/cuw_alloc_probe,
# bin/cuw_nvcc_probe_static, bin/cuw_nvcc_probe_shared (+ bin/libcudart.so.13). The small
# programs of tests/gpu/compat/ (driver_probe.c, cuda_rows.cu) are compiled at run time with
# the machine's gcc and nvcc into a temporary directory (a few seconds).
# Needs python3 with PyTorch, JAX (CUDA plugin) and CuPy for their rows; a missing framework
# makes its rows "not run", never a failure of the script.
#
# Rows (ROWS selects; default: every row that fits the GPU count):
#    1 nvcc-static      2 nvcc-shared      3 driver-api        4 dlopen-dlsym
#    5 torch-default    6 torch-expandable 7 torch-async       8 torch-graphs
#    9 jax-default     10 jax-platform    11 cupy-pool        12 cupy-nopool
#   13 managed         14 mempool         15 nccl (2 GPUs)    16 two-gpu (2 GPUs)
#   17 driver-linked   18 graph-memnode   (extra rows: libcuda linked directly; CUDA graph memory nodes)
#   ROWS=single (1-14,17,18) | multi (15,16) | all | a list: ROWS=1,5-8,jax-default
#
# Environment: OUT (default ./gpu-out), BUILD_DIR, ROWS, ROW_TIMEOUT (120 s per row),
# TIME_BUDGET_S (450: rows that would start later are reported "not run"), MERGE_JSON (a
# compat.json of an earlier run whose rows not run here are merged into this matrix),
# NVCC, DRIVER_SLACK_MIB (2048), KEEP_WORK=1 (keep the temporary directory), COMPAT_POOL
# (off: the allocation backend every row runs with, `cuwarden run --pool`).
# Writes into $OUT: compat.md, compat.json, compat.log (everything printed),
# compat-cuwarden.txt (the `cuwarden` table after each row).
# Exit status: 0 when every row run passed, 1 otherwise.
#
#   BUILD_DIR=build bash tests/gpu/compat.sh                 # one GPU: rows 1-14, 17, 18
#   BUILD_DIR=build ROWS=multi OUT=gpu-out-x2 MERGE_JSON=gpu-out/compat.json bash tests/gpu/compat.sh
set -u -o pipefail

START_CWD=$(pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
abs_path() {  # abs_path PATH: absolute, relative to where the script was started
  case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$START_CWD/$1" ;; esac
}
OUT_DIR=$(abs_path "${OUT:-./gpu-out}")
BUILD=$(abs_path "${BUILD_DIR:-$REPO/build}")
MERGE=""
[[ -n ${MERGE_JSON:-} ]] && MERGE=$(abs_path "$MERGE_JSON")
mkdir -p "$OUT_DIR"
cd "$REPO" || exit 1

COMPAT=tests/gpu/compat
ROW_TIMEOUT=${ROW_TIMEOUT:-120}
TIME_BUDGET_S=${TIME_BUDGET_S:-450}
HOLD_MS=1500
LIB="$BUILD/lib/libcuwarden.so"
POOL=${COMPAT_POOL:-off}
DAEMON="$BUILD/bin/cuwardend"
CLI="$BUILD/bin/cuwarden"

: >"$OUT_DIR/compat.log"
: >"$OUT_DIR/compat-cuwarden.txt"
exec > >(tee -a "$OUT_DIR/compat.log") 2>&1
TEE_PID=$!

WORK=$(mktemp -d "${TMPDIR:-/tmp}/cuwarden-compat.XXXXXX")   # logs, snapshots, compiled programs
RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/cuwarden-run.XXXXXX")   # private CUWARDEN_RUN_DIR
SOCK="$RUN_DIR/daemon/cuwardend.sock"
CBIN="$WORK/bin"
mkdir -p "$CBIN"
export CUWARDEN_RUN_DIR="$RUN_DIR"
export CUWARDEN_CLI="$CLI"
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# NVLink multicast stays off everywhere (NCCL, PyTorch symmetric memory, NVSHMEM).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ROWS_FILE="$WORK/rows.jsonl"
: >"$ROWS_FILE"
DAEMON_PID=""
POLL_PID=""

cleanup() {
  local pid
  for pid in $POLL_PID $DAEMON_PID; do
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  if [[ ${KEEP_WORK:-0} == 1 ]]; then echo "kept: $WORK $RUN_DIR"; else rm -rf "$WORK" "$RUN_DIR"; fi
  exec 1>&- 2>&-      # let tee finish writing compat.log
  wait "$TEE_PID" 2>/dev/null || true
}
trap cleanup EXIT

section() { printf '\n===== %s =====\n' "$*"; }
report() { python3 "$COMPAT/report.py" "$@"; }

# =========================================================================================
section "Machine"
DATE=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
echo "date: $DATE"
echo "host kernel: $(uname -sr)"
GPU_LIST=$(nvidia-smi -L 2>&1 || true)
echo "$GPU_LIST"
NGPU=$(grep -c '^GPU ' <<<"$GPU_LIST" || true)
DEVICE_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 || true)
CUDA_DRIVER=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1 || true)
COMPUTE_CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .' || true)
[[ $COMPUTE_CAP =~ ^[0-9]+$ ]] || COMPUTE_CAP=90
FREE_MIB=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits -i 0 2>/dev/null | head -1 | tr -d ' ' || true)
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
NVCC_VERSION=$( ("$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p') || true)
echo "GPUs: $NGPU  device: ${DEVICE_NAME:-?}  driver: ${DRIVER:-?}  CUDA (driver): ${CUDA_DRIVER:-?}  sm_$COMPUTE_CAP"
echo "GPU 0 free: ${FREE_MIB:-?} MiB  nvcc: ${NVCC_VERSION:-absent} ($NVCC)"
echo "build dir: ${BUILD_DIR:-build}"
echo "pool: $POOL (every row runs under cuwarden run --pool $POOL)"
VERSIONS=$(timeout 120 python3 "$COMPAT/versions.py" 2>/dev/null || true)
echo "$VERSIONS"
version_of() { sed -n "s/^$1=//p" <<<"$VERSIONS" | head -1; }
for f in lib/libcuwarden.so bin/cuwardend bin/cuwarden bin/cuw_alloc_probe bin/cuw_nvcc_probe_static \
  bin/cuw_nvcc_probe_shared bin/libcudart.so.13; do
  echo "  ${BUILD_DIR:-build}/$f: $(stat -c %s "$BUILD/$f" 2>/dev/null || echo missing) bytes"
done
BUILD_OK=1
for f in "$LIB" "$DAEMON" "$CLI"; do [[ -e $f ]] || BUILD_OK=0; done
[[ $BUILD_OK == 1 ]] || echo "MISSING: libcuwarden.so, cuwardend or cuwarden under $BUILD: every row is reported not run"

# =========================================================================================
section "Daemon"
# cuwardend links elfutils' libdw (its symbolizer); where the machine lacks it, a copy carried in
# BUILD_DIR/lib/fallback serves the daemon alone (the rows' programs keep their own library path).
DAEMON_LIBS=${LD_LIBRARY_PATH:-}
if [[ -x $DAEMON ]] && ldd "$DAEMON" | grep -q 'not found' && [[ -d $BUILD/lib/fallback ]]; then
  DAEMON_LIBS=$BUILD/lib/fallback${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "libdw: the carried copy ($BUILD/lib/fallback), for cuwardend"
fi
DAEMON_HELP=$(LD_LIBRARY_PATH=$DAEMON_LIBS "$DAEMON" --help 2>&1 || true)
DAEMON_ARGS=(--run-dir "$RUN_DIR")
grep -q -- '--scan-interval-ms' <<<"$DAEMON_HELP" && DAEMON_ARGS+=(--scan-interval-ms 200)
grep -q -- '--exited-linger' <<<"$DAEMON_HELP" && DAEMON_ARGS+=(--exited-linger 1800)
if [[ -x $DAEMON ]]; then
  printf '+ cuwardend %s &\n' "${DAEMON_ARGS[*]}"
  LD_LIBRARY_PATH=$DAEMON_LIBS "$DAEMON" "${DAEMON_ARGS[@]}" >"$WORK/cuwardend.log" 2>&1 &
  DAEMON_PID=$!
  for _ in $(seq 1 100); do
    [[ -S $SOCK ]] && break
    kill -0 "$DAEMON_PID" 2>/dev/null || break
    sleep 0.1
  done
fi
if [[ -S $SOCK ]]; then echo "cuwardend listening (pid $DAEMON_PID, private run dir)"
else echo "cuwardend NOT listening: cuwarden's own figures will be missing"; tail -5 "$WORK/cuwardend.log" 2>/dev/null; fi

# =========================================================================================
# Rows. define_row ID sets: R_KEY R_PROG R_CAP R_CAP_BYTES R_GPUS R_PARTS R_REACH R_NEEDS R_ENV R_CMD
ALL_IDS=(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18)
GIB4=$((4 * 1024 * 1024 * 1024))
define_row() {
  R_ENV=() R_PARTS=1 R_REACH=0 R_CAP=4G R_CAP_BYTES=$GIB4 R_GPUS=1 R_NEEDS=""
  local py=python3
  case $1 in
    1) R_KEY=nvcc-static R_PROG="nvcc program with a kernel, static cudart" R_REACH=1
       R_CMD=("$BUILD/bin/cuw_nvcc_probe_static" --chunk 256 --max 16384 --hold-ms "$HOLD_MS") ;;
    2) R_KEY=nvcc-shared R_PROG="nvcc program with a kernel, shared cudart" R_REACH=1
       R_CMD=("$BUILD/bin/cuw_nvcc_probe_shared" --chunk 256 --max 16384 --hold-ms "$HOLD_MS") ;;
    3) R_KEY=driver-api R_PROG="driver API program (cuw_alloc_probe --api driver; reaches libcuda by dlopen+dlsym)" R_REACH=1
       R_CMD=("$BUILD/bin/cuw_alloc_probe" --api driver --chunk 256M --max 16G --hold-ms "$HOLD_MS") ;;
    4) R_KEY=dlopen-dlsym R_PROG="C program: dlopen(libcuda.so.1) + dlsym(cuInit, cuDevicePrimaryCtxRetain, cuCtxSetCurrent, cuMemAlloc_v2)" R_REACH=1
       R_CMD=("$CBIN/cuw_dlopen_probe" --chunk-mib 256 --max-mib 16384 --hold-ms "$HOLD_MS") ;;
    5) R_KEY=torch-default R_PROG="PyTorch, default caching allocator"
       R_CMD=("$py" "$COMPAT/torch_row.py" --mode default) ;;
    6) R_KEY=torch-expandable R_PROG="PyTorch, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
       R_ENV=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
       R_CMD=("$py" "$COMPAT/torch_row.py" --mode default) ;;
    7) R_KEY=torch-async R_PROG="PyTorch, PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync"
       R_ENV=(PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync)
       R_CMD=("$py" "$COMPAT/torch_row.py" --mode default) ;;
    8) R_KEY=torch-graphs R_PROG="PyTorch CUDA graphs (torch.cuda.graph of matmuls, replayed), then growth"
       R_CMD=("$py" "$COMPAT/torch_row.py" --mode graphs) ;;
    9) R_KEY=jax-default R_PROG="JAX, default allocator (preallocates 75% of what the driver reports)"
       R_CMD=("$py" "$COMPAT/jax_row.py" --mode default) ;;
    10) R_KEY=jax-platform R_PROG="JAX, XLA_PYTHON_CLIENT_ALLOCATOR=platform"
        R_ENV=(XLA_PYTHON_CLIENT_ALLOCATOR=platform)
        R_CMD=("$py" "$COMPAT/jax_row.py" --mode platform) ;;
    11) R_KEY=cupy-pool R_PROG="CuPy, default memory pool"
        R_CMD=("$py" "$COMPAT/cupy_row.py" --mode pool) ;;
    12) R_KEY=cupy-nopool R_PROG="CuPy, pool disabled (cupy.cuda.set_allocator(None))"
        R_CMD=("$py" "$COMPAT/cupy_row.py" --mode nopool) ;;
    13) R_KEY=managed R_PROG="cudaMallocManaged (nvcc program, kernel writes each buffer; at most 8 GiB asked)" R_REACH=1
        R_CMD=("$CBIN/cuw_cuda_rows" --mode managed --chunk-mib 256 --max-mib 8192 --hold-ms "$HOLD_MS") ;;
    14) R_KEY=mempool R_PROG="RMM-style pool user: cudaMemPoolCreate + cudaMallocFromPoolAsync (cuMemAllocFromPoolAsync)" R_REACH=1
        R_CMD=("$CBIN/cuw_cuda_rows" --mode mempool --chunk-mib 256 --max-mib 16384 --hold-ms "$HOLD_MS") ;;
    15) R_KEY=nccl R_PROG="two processes, NCCL all-reduce (torch.distributed, mp.spawn), 4 GiB cap each" R_GPUS=2 R_PARTS=2
        R_CMD=("$py" "$COMPAT/nccl_row.py") ;;
    16) R_KEY=two-gpu R_PROG="one process, two GPUs, caps per ordinal (PyTorch)" R_GPUS=2 R_PARTS=2 R_REACH=1
        R_CAP="0=4G,1=2G" R_CAP_BYTES=0
        R_CMD=("$py" "$COMPAT/torch_row.py" --mode two-gpu) ;;
    17) R_KEY=driver-linked R_PROG="C program linked to libcuda (exported cuMemAlloc_v2, no dlsym)" R_REACH=1
        R_CMD=("$CBIN/cuw_linked_probe" --chunk-mib 256 --max-mib 16384 --hold-ms "$HOLD_MS") ;;
    18) R_KEY=graph-memnode R_PROG="CUDA graph memory nodes: cudaMallocAsync captured into graphs, launched"
        R_CMD=("$CBIN/cuw_cuda_rows" --mode graphmem --chunk-mib 256 --max-mib 16384 --hold-ms "$HOLD_MS") ;;
    *) return 1 ;;
  esac
  [[ ${R_CMD[0]} == "$py" ]] || R_NEEDS=${R_CMD[0]}
  return 0
}

# ---- selection ---------------------------------------------------------------------------
SELECTED=()
NOT_RUN_HERE=()
add_id() { local i; for i in "${SELECTED[@]}"; do [[ $i == "$1" ]] && return; done; SELECTED+=("$1"); }
select_rows() {
  local spec=${ROWS:-all} item id a b
  local -a items
  IFS=',' read -r -a items <<<"$spec"
  for item in "${items[@]}"; do
    item=${item// /}
    case $item in
      "" ) ;;
      all) for id in "${ALL_IDS[@]}"; do define_row "$id"
             if ((R_GPUS <= NGPU)); then add_id "$id"; else NOT_RUN_HERE+=("$id"); fi; done ;;
      single) for id in "${ALL_IDS[@]}"; do define_row "$id"; ((R_GPUS == 1)) && add_id "$id"; done ;;
      multi) for id in "${ALL_IDS[@]}"; do define_row "$id"; ((R_GPUS >= 2)) && add_id "$id"; done ;;
      *-*) a=${item%-*} b=${item#*-}
           if [[ $a =~ ^[0-9]+$ && $b =~ ^[0-9]+$ ]]; then
             for ((id = a; id <= b; id++)); do define_row "$id" && add_id "$id"; done
           else
             for id in "${ALL_IDS[@]}"; do define_row "$id"; [[ $R_KEY == "$item" ]] && add_id "$id"; done
           fi ;;
      *) if [[ $item =~ ^[0-9]+$ ]] && define_row "$item"; then add_id "$item"
         else
           local found=0
           for id in "${ALL_IDS[@]}"; do define_row "$id"; [[ $R_KEY == "$item" ]] && { add_id "$id"; found=1; }; done
           ((found)) || echo "ROWS: unknown row '$item' (ignored)"
         fi ;;
    esac
  done
}
select_rows
echo "rows selected: ${SELECTED[*]:-none}${NOT_RUN_HERE[*]:+  (not run here, need more GPUs: ${NOT_RUN_HERE[*]})}"

# =========================================================================================
section "Compiling the small programs of $COMPAT (into a temporary directory)"
CUDA_HOME_GUESS=$(cd "$(dirname "$NVCC")/.." 2>/dev/null && pwd || echo /usr/local/cuda)
compile() {  # compile NAME COMMAND...: logs, never fails the script
  local name=$1
  shift
  printf '+ %s\n' "$*"
  if "$@" >"$WORK/compile-$name.log" 2>&1; then
    echo "  built $name"
  else
    echo "  FAILED to build $name:"
    tail -n 20 "$WORK/compile-$name.log" | sed 's/^/    /'
  fi
}
NEED_COMPILE=0
for id in "${SELECTED[@]}"; do define_row "$id" && [[ $R_NEEDS == "$CBIN"/* ]] && NEED_COMPILE=1; done
if ((NEED_COMPILE == 0)); then echo "(no selected row needs them)"; fi
((NEED_COMPILE)) && compile cuw_dlopen_probe gcc -O2 -std=c11 -o "$CBIN/cuw_dlopen_probe" "$COMPAT/driver_probe.c" -ldl
((NEED_COMPILE)) && compile cuw_linked_probe gcc -O2 -std=c11 -DCUW_LINKED -o "$CBIN/cuw_linked_probe" "$COMPAT/driver_probe.c" \
  -L"$CUDA_HOME_GUESS/lib64/stubs" -L"$CUDA_HOME_GUESS/targets/x86_64-linux/lib/stubs" -lcuda
if ((NEED_COMPILE)) && [[ ! -x $CBIN/cuw_linked_probe ]]; then  # no stub: link the installed driver itself
  compile cuw_linked_probe gcc -O2 -std=c11 -DCUW_LINKED -o "$CBIN/cuw_linked_probe" "$COMPAT/driver_probe.c" -l:libcuda.so.1
fi
((NEED_COMPILE)) && compile cuw_cuda_rows "$NVCC" -O2 -arch="sm_$COMPUTE_CAP" -o "$CBIN/cuw_cuda_rows" "$COMPAT/cuda_rows.cu"


# ---- one row -----------------------------------------------------------------------------
snapshot() { "$CLI" --socket "$SOCK" --json >"$1" 2>/dev/null || : >"$1"; }

skip_row() {  # skip_row ID REASON
  report skip --rows-file "$ROWS_FILE" --id "$1" --key "$R_KEY" --program "$R_PROG" --cap "$R_CAP" --reason "$2"
}

run_row() {  # run_row ID
  local id=$1 log pre poll post rc t0 t1 secs left tmo cmdline
  define_row "$id" || return
  section "Row $id: $R_KEY — $R_PROG (cap $R_CAP)"
  if [[ $BUILD_OK != 1 ]]; then skip_row "$id" "libcuwarden.so / cuwarden / cuwardend missing in the build dir"; return; fi
  if ((R_GPUS > NGPU)); then skip_row "$id" "needs $R_GPUS GPUs; this machine shows $NGPU"; return; fi
  if [[ -n $R_NEEDS && ! -x $R_NEEDS ]]; then skip_row "$id" "program not built: $(basename "$R_NEEDS")"; return; fi
  if [[ $R_KEY == managed && ${FREE_MIB:-0} =~ ^[0-9]+$ ]] && ((FREE_MIB < 16384)); then
    skip_row "$id" "GPU 0 has only ${FREE_MIB} MiB free; managed memory is never asked past what is free"; return
  fi
  left=$((TIME_BUDGET_S - SECONDS))
  if ((left < 30)); then skip_row "$id" "time budget (${TIME_BUDGET_S} s) spent"; return; fi
  tmo=$ROW_TIMEOUT
  ((tmo > left - 10)) && tmo=$((left - 10))

  log="$WORK/row-$id.log" pre="$WORK/row-$id-pre.json" poll="$WORK/row-$id-poll.json" post="$WORK/row-$id-post.json"
  snapshot "$pre"
  python3 "$COMPAT/poll.py" "$CLI" "$poll" 0.5 &
  POLL_PID=$!
  cmdline="${R_ENV[*]:+${R_ENV[*]} }cuwarden run --limit $R_CAP --pool $POOL -- ${R_CMD[*]}"
  cmdline=${cmdline//"$BUILD"\//${BUILD_DIR:-build}\/}
  cmdline=${cmdline//"$WORK"\//\$WORK\/}
  printf '+ timeout %s %s\n' "$tmo" "$cmdline"
  t0=$(date +%s.%N)
  env -u PYTORCH_CUDA_ALLOC_CONF -u XLA_PYTHON_CLIENT_ALLOCATOR -u XLA_PYTHON_CLIENT_PREALLOCATE \
    -u XLA_PYTHON_CLIENT_MEM_FRACTION -u CUWARDEN_LIMIT -u CUWARDEN_POOL -u CUWARDEN_MEMINFO \
    COMPAT_CAP_BYTES="$R_CAP_BYTES" COMPAT_CHUNK_MIB=256 COMPAT_MAX_MIB=16384 COMPAT_HOLD_S=1.5 "${R_ENV[@]}" \
    timeout -k 10 "$tmo" "$CLI" run --limit "$R_CAP" --pool "$POOL" -- "${R_CMD[@]}" >"$log" 2>&1 </dev/null
  rc=$?
  t1=$(date +%s.%N)
  secs=$(python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$t0" "$t1")
  sleep 1   # the daemon drains the last events and sees the exit
  kill -TERM "$POLL_PID" 2>/dev/null
  wait "$POLL_PID" 2>/dev/null
  POLL_PID=""
  snapshot "$post"
  {
    printf '===== row %s %s (%s) =====\n' "$id" "$R_KEY" "$(date -u +%H:%M:%S)"
    "$CLI" --socket "$SOCK" 2>&1 || true
    printf '\n'
  } >>"$OUT_DIR/compat-cuwarden.txt"
  echo "--- program output (exit $rc, $secs s; allocation lines left out)"
  grep -v '^alloc index=' "$log" | tail -n 40
  echo "---"
  local extra=()
  ((R_REACH)) && extra+=(--require-reach)
  report row --rows-file "$ROWS_FILE" --id "$id" --key "$R_KEY" --program "$R_PROG" --cap "$R_CAP" \
    --rc "$rc" --seconds "$secs" --timeout "$tmo" --log "$log" --pre "$pre" --poll "$poll" --post "$post" \
    --command "$cmdline" --parts "$R_PARTS" "${extra[@]}" ||
    skip_row "$id" "could not judge the row (report.py failed; program exit $rc)"
}

for id in "${SELECTED[@]}"; do run_row "$id"; done

# =========================================================================================
section "Final state"
"$CLI" --socket "$SOCK" 2>&1 | tail -n 40 || true
echo "--- cuwardend log (last 20 lines)"
tail -n 20 "$WORK/cuwardend.log" 2>/dev/null || true

NOT_RUN_TEXT=""
if ((${#NOT_RUN_HERE[@]})); then
  NOT_RUN_TEXT="rows ${NOT_RUN_HERE[*]} need 2 GPUs (this machine shows $NGPU); run ROWS=multi on a 2-GPU machine"
  NOT_RUN_TEXT+=" (with MERGE_JSON=<this run's compat.json> to get one matrix)."
fi
MERGE_ARGS=()
[[ -n $MERGE ]] && MERGE_ARGS=(--merge "$MERGE")
echo "Files in \$OUT: compat.md compat.json compat.log compat-cuwarden.txt"
section "Compatibility matrix"
report final --rows-file "$ROWS_FILE" --md "$OUT_DIR/compat.md" --json "$OUT_DIR/compat.json" \
  --meta "date=$DATE" --meta "device=${DEVICE_NAME:-?}" --meta "gpu_count=$NGPU" \
  --meta "gpus=$(tr '\n' ';' <<<"$GPU_LIST" | sed 's/;$//')" --meta "driver=${DRIVER:-?}" \
  --meta "cuda_driver=${CUDA_DRIVER:-?}" --meta "nvcc=${NVCC_VERSION:-absent}" \
  --meta "torch=$(version_of torch)" --meta "jax=$(version_of jax)" --meta "cupy=$(version_of cupy)" \
  --meta "build_dir=${BUILD_DIR:-build}" --meta "rows_selected=${ROWS:-all} -> ${SELECTED[*]:-none}" \
  --meta "runtime_s=$SECONDS" --not-run "$NOT_RUN_TEXT" "${MERGE_ARGS[@]}"

python3 -c "
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))['rows'] if r.get('status') == 'ran' and not r.get('merged_from')]
sys.exit(0 if rows and all(r.get('passed') for r in rows) else 1)" "$OUT_DIR/compat.json"
