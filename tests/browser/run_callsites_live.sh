#!/usr/bin/env bash
# browser.callsites_live: the call-site table and the flame graph in headless Chromium against
# a real `cuwardend --http --http-snapshots`, with two programs on the simulated driver
# (tests/fakecuda) under the interposer, call sites on:
#   - cuwt_snapshot_app (tests/integration/snapshot_app.cpp) after `chain`: three sites that
#     share a dozen innermost frames (a 12-deep helper chain), from load_weights at two lines
#     and from make_buffers, beside big_buffer and small_buffers;
#   - a Python script whose one function allocates, called from two lines of the script.
# callsites_test.mjs says what the page must show.
#
#   run_callsites_live.sh REPO WEB_ROOT ARTEFACT_DIR CUWARDEND LIBCUWARDEN SNAPSHOT_APP FAKECUDA_DIR
#
# Exit 77 (skip) when node, the npm packages, chromium or python3 are missing.
set -euo pipefail
REPO=$1 WEB=$2 ART=$3 DAEMON=$4 LIB=$5 APP=$6 FAKECUDA=$7
HERE=$REPO/tests/browser
CHROMIUM=${CUWARDEN_CHROMIUM:-/usr/bin/chromium}

command -v node >/dev/null || { echo "skip: node not found (scripts/setup.sh)"; exit 77; }
command -v python3 >/dev/null || { echo "skip: python3 not found"; exit 77; }
[[ -d $REPO/node_modules/playwright-core ]] || { echo "skip: no node_modules/playwright-core (run npm ci in $REPO)"; exit 77; }
[[ -x $CHROMIUM ]] || { echo "skip: $CHROMIUM not found (scripts/setup.sh installs chromium)"; exit 77; }
for f in index.html app.js d3.min.js d3-flamegraph.min.js; do
  [[ -f $WEB/$f ]] || { echo "FAIL: $WEB has no $f (build the cuwarden_web target)"; exit 1; }
done

# shellcheck source=tests/browser/live_daemon.sh
source "$HERE/live_daemon.sh" cuwt-browser-sites
start_daemon "$DAEMON" "$WEB"

run_env=(env LD_LIBRARY_PATH="$FAKECUDA" CUWARDEN_FAKE_DEVICES=1 CUWARDEN_FAKE_MEMORY=16G LD_PRELOAD="$LIB"
         CUWARDEN_CALLSITES=24)
wait_for() {  # wait_for FILE PATTERN
  for _ in $(seq 600); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  fail "$(basename "$1") did not print '$2' within 30 s"
}

# The native program: reads commands from a FIFO this script holds open (fd 3).
mkfifo "$T/app.in" "$T/py.in"
"${run_env[@]}" "$APP" <"$T/app.in" >"$T/app.out" 2>"$T/app.log" &
pids+=($!)
app_pid=$!
exec 3>"$T/app.in"
echo chain >&3
wait_for "$T/app.out" '^chained'

# The Python program: alloc() allocates (line 9), called from lines 10 and 11.
cat >"$T/py_sites.py" <<'PY'
import ctypes, sys
cuda = ctypes.CDLL('libcuda.so.1')
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
a, b = ctypes.c_uint64(), ctypes.c_uint64()
def alloc(n, p):
    return cuda.cuMemAlloc_v2(ctypes.byref(p), n)
assert alloc(3 << 20, a) == 0
assert alloc(5 << 20, b) == 0
print('ready', flush=True)
sys.stdin.read()
PY
"${run_env[@]}" python3 "$T/py_sites.py" <"$T/py.in" >"$T/py.out" 2>"$T/py.log" &
pids+=($!)
py_pid=$!
exec 4>"$T/py.in"
wait_for "$T/py.out" '^ready'

lines=$(sed -n 's/^line \([a-z_0-9]*\) \([0-9]*\)$/"\1": \2/p' "$T/app.out" | paste -sd, -)
rc=0
node "$HERE/callsites_test.mjs" --url "$BASE/" --artefacts "$ART" \
  --chain-pid "$app_pid" --chain-lines "{$lines}" --py-pid "$py_pid" --py-file py_sites.py --py-lines 9,10,11 || rc=$?
(( rc == 0 )) || fail "callsites_test.mjs"
echo PASS
