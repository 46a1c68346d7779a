#!/usr/bin/env bash
# cuwarden GPU test: what a cap counts. Under a 4 GiB cap, a CUDA-runtime program allocates
# 64 MiB chunks until refused and holds them while nvidia-smi reads its figure:
#   - CUWARDEN_CAP_SCOPE=allocations (the default): 4 GiB of allocations; the driver's figure
#     is above the cap by the context and modules, and the table's Outside column shows it;
#   - CUWARDEN_CAP_SCOPE=process: the driver's figure stays within the cap.
# With PyTorch (when it imports), the same with a matmul first (cuBLAS loads its modules).
# One call on a CUDA machine with 8 GiB free on device 0.
#
#   BUILD_DIR=<dir> OUT=<dir> bash tests/gpu/cap_scope.sh
#
# Writes $OUT/cap-scope.md (and each run's log). Exit 0 when every check holds.
set -u -o pipefail
START_CWD=$(pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
abs_path() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$START_CWD/$1" ;; esac; }
BUILD=$(abs_path "${BUILD_DIR:-$REPO/build}")
OUT_DIR=$(abs_path "${OUT:-./gpu-out}")
mkdir -p "$OUT_DIR"
CLI="$BUILD/bin/cuwarden"
LIB="$BUILD/lib/libcuwarden.so"
PROBE="$BUILD/bin/cuw_alloc_probe"
for f in "$CLI" "$BUILD/bin/cuwardend" "$LIB" "$PROBE"; do [[ -e $f ]] || { echo "cap_scope.sh: $f is missing"; exit 1; }; done
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cuwarden-capscope.XXXXXX")
unset LD_PRELOAD CUWARDEN_LIMIT CUWARDEN_POOL CUWARDEN_JOB CUWARDEN_JOB_LIMIT CUWARDEN_CAP_SCOPE
export CUWARDEN_RUN_DIR="$WORK/run"
mkdir -p "$CUWARDEN_RUN_DIR"
"$BUILD/bin/cuwardend" --run-dir "$CUWARDEN_RUN_DIR" >"$OUT_DIR/cuwardend.log" 2>&1 &
DAEMON=$!
trap 'kill $DAEMON 2>/dev/null; wait $DAEMON 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 50); do [[ -S $CUWARDEN_RUN_DIR/daemon/cuwardend.sock ]] && break; sleep 0.1; done

CAP_MIB=4096
fail=0
md="$OUT_DIR/cap-scope.md"
{
  echo "# What a cap counts (tests/gpu/cap_scope.sh)"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)," \
       "cap ${CAP_MIB} MiB (\`cuwarden run --limit 4G --cap-scope S\`). nvidia-smi's figure read while the program holds what it got."
  echo
  echo "| program | scope | the program's own count (MiB) | cuwarden's Used (MiB) | nvidia-smi (MiB) | context counted (MiB) | Outside (MiB) | check |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
} >"$md"

smi_of() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', *' -v p="$1" '$1==p{print $2}'; }
field_of() {  # field_of PID FIELD: cuwarden's query, MiB without unit
  "$CLI" --query-compute-apps="pid,$2" --format=csv,noheader,nounits 2>/dev/null | awk -F', *' -v p="$1" '$1==p{print $2}'
}

run_case() {  # run_case NAME SCOPE LOG COMMAND...: starts it, waits for "holding", measures
  local name=$1 scope=$2 log=$3
  shift 3
  "$CLI" run --limit 4G --cap-scope "$scope" -- "$@" >"$log" 2>&1 &
  local pid=$! ok=0
  for _ in $(seq 600); do
    grep -q '^holding' "$log" && { ok=1; break; }
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  sleep 1.5  # the daemon's next NVML poll
  local smi alloc counted outside verdict
  smi=$(smi_of $pid)
  alloc=$(sed -n 's/^allocated_mib=//p' "$log" | tail -1)
  [[ -n $alloc ]] || alloc=$(grep -o 'allocated=[0-9]*' "$log" | tail -1 | cut -d= -f2)
  [[ $alloc =~ ^[0-9]+$ && $alloc -gt 100000 ]] && alloc=$((alloc >> 20))
  counted=$(field_of $pid context_memory)
  used=$(field_of $pid used_memory)
  outside=$(field_of $pid outside_cap_memory)
  "$CLI" >"$log.table" 2>&1 || true
  wait $pid
  if [[ $ok != 1 || -z $smi ]]; then
    verdict="FAIL (no hold / no nvidia-smi row)"
  elif [[ $scope == allocations ]]; then
    # The cap filled with allocations (within a chunk and a library's workspace of it), the
    # context on top.
    (( used >= CAP_MIB - 128 && used <= CAP_MIB && smi > CAP_MIB )) && verdict=pass || verdict="FAIL"
  else
    # Filled to the cap (within a chunk), the context inside it, the driver's figure too.
    (( used >= CAP_MIB - 128 && used <= CAP_MIB && smi <= CAP_MIB + ${SLACK_MIB:-0} && counted > 0 )) \
      && verdict=pass || verdict="FAIL"
  fi
  [[ $verdict == pass ]] || fail=1
  echo "| $name | $scope | $alloc | ${used:--} | $smi | ${counted:--} | ${outside:--} | $verdict |" >>"$md"
  echo "$name $scope: allocated $alloc MiB, used $used, nvidia-smi $smi MiB, counted $counted, outside $outside: $verdict"
}

for scope in allocations process; do
  run_case "cuw_alloc_probe (static cudart)" $scope "$OUT_DIR/probe-$scope.log" \
    "$PROBE" --chunk 64M --max 100G --hold-ms 4000
done

if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  cat >"$WORK/torch_fill.py" <<'PY'
import time, torch
a = torch.randn(1024, 1024, device="cuda")
(a @ a).sum().item()  # cuBLAS: its modules and workspace
held = []
try:
    while True:
        held.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
except torch.cuda.OutOfMemoryError:
    pass
print(f"allocated_mib={torch.cuda.memory_reserved() >> 20}", flush=True)
print("holding", flush=True)
time.sleep(4)
PY
  for scope in allocations process; do
    run_case "PyTorch $(python3 -c 'import torch; print(torch.__version__)') (matmul, then 64 MiB tensors)" $scope \
      "$OUT_DIR/torch-$scope.log" python3 "$WORK/torch_fill.py"
  done
fi
{
  echo
  echo "Tables as \`cuwarden\` showed them during the hold:"
  for t in "$OUT_DIR"/*.log.table; do
    echo
    echo "\`$(basename "$t" .log.table)\`:"
    echo
    echo '```'
    cat "$t"
    echo '```'
  done
} >>"$md"
exit $fail
