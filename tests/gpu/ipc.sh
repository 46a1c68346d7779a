#!/usr/bin/env bash
# cuwarden GPU test: IPC of device memory between processes under each backend. One call on a
# CUDA machine (PyTorch and numba-cuda installed for their parts).
#
#   BUILD_DIR=<dir> OUT=<dir> [PARTS="share torch numba"] bash tests/gpu/ipc.sh
#
# share: tests/interposer/ipc_share.cpp built against the machine's libcuda: parent to child
#        and child to parent, blocks of 5000 bytes (packed under the cache), 3 MiB + 1000 bytes
#        (sharing a granule with its neighbour under vmm; not run under the cache), 8 MiB and 1 GiB,
#        bare and under --pool off, cache and vmm; and an importer without cuwarden, which
#        must fail for a pooled block's handle.
# torch: tests/gpu/ipc/torch_share.py (torch.multiprocessing, both ways, through PyTorch's
#        caching allocator: its segments are whole blocks under the cache, mapped ones under
#        vmm), bare and under each backend. (Without the caching allocator,
#        PYTORCH_NO_CUDA_MEMORY_CACHING=1, sharing hangs bare on PyTorch 2.11: not a case.)
# numba: numba-cuda's own driver tests (numba.cuda.tests.cudadrv) and IPC tests
#        (numba.cuda.tests.cudapy.test_ipc), bare and under each backend, compared test by
#        test. Their tests import `filecheck`; where it is missing a stub module lets them
#        import (the tests that use it fail alike in every mode).
# Writes $OUT/ipc.md and $OUT/ipc.log (and numba-MODE.log). Exit 0 when every case passed
# and numba's results are the same in every mode.
set -u -o pipefail
START_CWD=$(pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
abs_path() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$START_CWD/$1" ;; esac; }
BUILD=$(abs_path "${BUILD_DIR:-$REPO/build}")
OUT_DIR=$(abs_path "${OUT:-./gpu-out}")
mkdir -p "$OUT_DIR"
LIB="$BUILD/lib/libcuwarden.so"
[[ -e $LIB ]] || { echo "ipc.sh: $LIB is missing"; exit 1; }
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
PYTHON=${PYTHON:-python3}
PARTS=${PARTS:-share torch numba}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cuwarden-ipc.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
exec > >(tee "$OUT_DIR/ipc.log") 2>&1
unset LD_PRELOAD CUWARDEN_LIMIT CUWARDEN_POOL CUWARDEN_JOB CUWARDEN_JOB_LIMIT
export CUWARDEN_RUN_DIR="$WORK/run"
MD="$OUT_DIR/ipc.md"
fail=0
echo "# IPC of device memory between processes (tests/gpu/ipc.sh)" >"$MD"

# under MODE CMD...: run CMD bare or under cuwarden with --pool MODE.
under() {
  local mode=$1; shift
  local t=${LIMIT_S:-300}
  if [[ $mode == bare ]]; then timeout "$t" "$@"; else timeout "$t" env LD_PRELOAD="$LIB" CUWARDEN_POOL="$mode" "$@"; fi
}

if [[ " $PARTS " == *" share "* ]]; then
  g++ -O2 -std=c++17 -I"$CUDA_HOME/include" -o "$WORK/ipc_share" "$REPO/tests/interposer/ipc_share.cpp" \
    -L"$CUDA_HOME/lib64/stubs" -lcuda || exit 1
  { echo; echo "## Both ways, raw driver API (ipc_share)"; echo
    echo "| mode | 5000 B | 3 MiB + 1000 B | 8 MiB | 1 GiB | importer without cuwarden |"
    echo "| --- | --- | --- | --- | --- | --- |"; } >>"$MD"
  for mode in bare off cache vmm; do
    row="| $mode |"
    for bytes in 5000 3146728 8388608 1073741824; do
      # 3 MiB + 1000 B: under vmm the second of two such blocks starts inside a granule the
      # first one shares. Not under the cache: a whole 4 MiB driver allocation goes with the
      # driver's handle, and the importer's range query answers with all of it.
      if [[ $mode == cache && $bytes == 3146728 ]]; then row+=" (not a case) |"; continue; fi
      # Handles of ours are also checked to open nothing once their block is freed.
      ours=0
      [[ $mode == vmm || ($mode == cache && $bytes == 5000) ]] && ours=1
      if CUWT_FREED_FAILS=$ours under "$mode" "$WORK/ipc_share" both "$bytes" >"$WORK/out" 2>&1; then
        row+=" ok |"
      else
        row+=" **fail** |"; fail=1
      fi
      sed "s/^/  [$mode $bytes] /" "$WORK/out" | grep -v "opens only in processes" | head -20
    done
    if [[ $mode == cache || $mode == vmm ]]; then
      if under "$mode" "$WORK/ipc_share" plain 5000 fail >"$WORK/out" 2>&1; then
        row+=" fails as it should: $(grep -o 'open: [0-9]*' "$WORK/out") |"
      else
        row+=" **opened** |"; fail=1
      fi
      sed "s/^/  [$mode plain] /" "$WORK/out"
    else
      row+=" (the driver's own handle) |"
    fi
    echo "$row" >>"$MD"
    echo "$row"
  done
fi

if [[ " $PARTS " == *" torch "* ]]; then
  { echo; echo "## torch.multiprocessing, both ways (torch_share.py, 4 KiB and 64 MiB tensors)"; echo
    echo "| mode | result |"; echo "| --- | --- |"; } >>"$MD"
  for mode in bare off cache vmm; do
    line=$(under "$mode" "$PYTHON" "$REPO/tests/gpu/ipc/torch_share.py" 2>"$WORK/err" | grep '^{' | tail -1)
    if [[ $line == *'"ok": true'* ]]; then echo "| $mode | ok |" >>"$MD"; else echo "| $mode | **fail** |" >>"$MD"; fail=1; fi
    echo "  [$mode] ${line:-no result: $(tail -3 "$WORK/err" | tr '\n' ' ')}"
  done
fi

if [[ " $PARTS " == *" numba "* ]]; then
  # A stub `filecheck` where it is not installed: any name of it is a class that refuses use.
  if ! "$PYTHON" -c "import filecheck" 2>/dev/null; then
    mkdir -p "$WORK/stub/filecheck"
    cat >"$WORK/stub/filecheck/__init__.py" <<'PY'
import importlib.abc, importlib.machinery, sys, types
class _Stub:
    def __init__(self, *a, **k):
        raise RuntimeError("filecheck is a stub here")
def __getattr__(name):
    return _Stub
class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        return importlib.machinery.ModuleSpec(name, self) if name.startswith("filecheck.") else None
    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__getattr__ = lambda n: _Stub
        return m
    def exec_module(self, module):
        pass
sys.meta_path.insert(0, _Finder())
PY
    export PYTHONPATH="$WORK/stub${PYTHONPATH:+:$PYTHONPATH}"
  fi
  for mode in bare off cache vmm; do
    LIMIT_S=${NUMBA_LIMIT_S:-300} under "$mode" "$PYTHON" -m numba.runtests -v numba.cuda.tests.cudadrv numba.cuda.tests.cudapy.test_ipc \
      >"$OUT_DIR/numba-$mode.log" 2>&1
    echo "numba $mode: exit $?, $(grep -c ' \.\.\. ' "$OUT_DIR/numba-$mode.log") results"
  done
  "$PYTHON" - "$OUT_DIR" >>"$MD" <<'PY' || fail=1
import re, sys
out = sys.argv[1]
modes = ["bare", "off", "cache", "vmm"]
pat = re.compile(r"^(test\w*) \(([\w.]+)\)\S*\s*(?:\n.*?)?\.\.\. (ok|FAIL|ERROR|skipped|expected failure|unexpected success)", re.M)
res = {}
for m in modes:
    # cuwarden's own log lines (stderr) may fall between a test's name and its result.
    text = re.sub(r"cuwarden: [^\n]*\n", "", open(f"{out}/numba-{m}.log", errors="replace").read())
    res[m] = {f"{cls}.{name}": st for name, cls, st in pat.findall(text)}
tests = sorted(set().union(*res.values()))
print("\n## numba-cuda's own tests (numba.cuda.tests.cudadrv, numba.cuda.tests.cudapy.test_ipc)\n")
print("| mode | tests | ok | failed or error | skipped |")
print("| --- | ---: | ---: | ---: | ---: |")
for m in modes:
    v = list(res[m].values())
    print(f"| {m} | {len(v)} | {v.count('ok')} | {v.count('FAIL') + v.count('ERROR')} | {v.count('skipped')} |")
ipc = [t for t in tests if "test_ipc" in t]
print(f"\nIPC tests ({len(ipc)}): " + "; ".join(f"{t.split('.')[-1]}: " + "/".join(res[m].get(t, "-") for m in modes) for t in ipc))
diff = [t for t in tests if len({res[m].get(t, "missing") for m in modes}) > 1]
print(f"\nTests whose result differs between modes: {len(diff)}")
for t in diff:
    print(f"- {t}: " + ", ".join(f"{m} {res[m].get(t, 'missing')}" for m in modes))
sys.exit(1 if diff or not tests else 0)
PY
fi
echo
cat "$MD"
exit $fail
