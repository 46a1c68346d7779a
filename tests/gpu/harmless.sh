#!/usr/bin/env bash
# cuwarden GPU check: the library is harmless in nvidia-smi (no file, same output shape and
# time), and NVML in a capped CUDA process reports the same cap and free memory as
# cuMemGetInfo (pynvml, both nvmlMemory versions). Builds nothing: BUILD_DIR (default build).
#   BUILD_DIR=build bash tests/gpu/harmless.sh
set -u
LIB=$(cd "${BUILD_DIR:-build}/lib" && pwd)/libcuwarden.so
RD=$(mktemp -d)/run
echo "== nvidia-smi bare vs preloaded (5 runs each, ms)"
for mode in bare pre; do
  for i in 1 2 3 4 5; do
    s=$(date +%s%N)
    if [ $mode = pre ]; then CUWARDEN_RUN_DIR=$RD LD_PRELOAD=$LIB CUWARDEN_LIMIT=4G nvidia-smi >/tmp/smi-$mode.txt 2>&1; else nvidia-smi >/tmp/smi-$mode.txt 2>&1; fi
    echo "$mode $(( ($(date +%s%N)-s)/1000000 ))"
  done
done | sort | awk '{a[$1]=a[$1]" "$2} END {for (k in a) print k":"a[k]}'
echo "nvidia-smi exit under preload: $(CUWARDEN_RUN_DIR=$RD LD_PRELOAD=$LIB CUWARDEN_LIMIT=4G nvidia-smi >/dev/null 2>&1; echo $?)"
echo "run dir created by nvidia-smi under preload: $([ -e $RD ] && echo yes || echo no)"
diff <(grep -c MiB /tmp/smi-bare.txt) <(grep -c MiB /tmp/smi-pre.txt) >/dev/null && echo "same table shape: yes"
echo "== real NVML in a capped CUDA process (pynvml), next to cuMemGetInfo"
RD2=$(mktemp -d)
CUWARDEN_RUN_DIR=$RD2 LD_PRELOAD=$LIB CUWARDEN_LIMIT=4G python3 - <<'PY'
import torch, pynvml
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
free, total = torch.cuda.mem_get_info()
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
m = pynvml.nvmlDeviceGetMemoryInfo(h)
print("cuMemGetInfo free/total:", free, total)
print("NVML total/free/used:   ", m.total, m.free, m.used)
print("NVML agrees with cuMemGetInfo:", m.total == total and m.free == free)
try:
    m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    print("NVML v2 total/free/used/reserved:", m2.total, m2.free, m2.used, m2.reserved, "agrees:", m2.total == total and m2.free == free)
except Exception as e:
    print("NVML v2 not available through pynvml:", e)
PY
