#!/usr/bin/env bash
# browser.suspend_live: a suspended process on the web dashboard, in headless Chromium against
# a real `cuwardend --http`. The daemon and a program under the interposer share one simulated
# driver directory (tests/fakecuda: its checkpoint API works across processes there); the
# program (fakecuda_ckpt_victim) holds 64 MiB and `cuwarden suspend` moves them to the host.
# suspend_test.mjs says what the page must show, and resumes it on its cue.
#
#   run_suspend_live.sh REPO WEB_ROOT ARTEFACT_DIR CUWARDEND CUWARDEN_CLI LIBCUWARDEN VICTIM FAKECUDA_DIR
#
# Exit 77 (skip) when node, the npm packages or chromium are missing.
set -euo pipefail
REPO=$1 WEB=$2 ART=$3 DAEMON=$4 CLI=$5 LIB=$6 VICTIM=$7 FAKECUDA=$8
HERE=$REPO/tests/browser
CHROMIUM=${CUWARDEN_CHROMIUM:-/usr/bin/chromium}

command -v node >/dev/null || { echo "skip: node not found (scripts/setup.sh)"; exit 77; }
[[ -d $REPO/node_modules/playwright-core ]] || { echo "skip: no node_modules/playwright-core (run npm ci in $REPO)"; exit 77; }
[[ -x $CHROMIUM ]] || { echo "skip: $CHROMIUM not found (scripts/setup.sh installs chromium)"; exit 77; }
[[ -f $WEB/index.html && -f $WEB/uPlot.iife.min.js ]] || { echo "FAIL: $WEB is not a staged web root (build the cuwarden_web target)"; exit 1; }

# shellcheck source=tests/browser/live_daemon.sh
source "$HERE/live_daemon.sh" cuwt-browser-suspend
# The daemon drives the simulated driver's checkpoint API, and its simulated NVML reports the
# shared device: both find the program through this directory.
mkdir -m 01777 "$T/fake" "$T/state"
export LD_LIBRARY_PATH=$FAKECUDA CUWARDEN_FAKE_DIR=$T/fake CUWARDEN_FAKE_DEVICES=1 CUWARDEN_FAKE_MEMORY=16G
start_daemon "$DAEMON" "$WEB" --socket "$T/d.sock" --state-dir "$T/state"

# The program reads commands from a FIFO this script holds open (fd 3).
mkfifo "$T/v.in"
LD_PRELOAD="$LIB" "$VICTIM" <"$T/v.in" >"$T/v.out" 2>"$T/v.log" &
pids+=($!)
exec 3>"$T/v.in"
wait_for() {  # wait_for PATTERN
  for _ in $(seq 600); do grep -q "$1" "$T/v.out" 2>/dev/null && return 0; sleep 0.05; done
  fail "the program did not answer '$1' within 30 s"
}
wait_for '^ready '
pid=$(sed -n 's/^ready \([0-9]*\)$/\1/p' "$T/v.out")
echo "alloc $((64 << 20))" >&3
wait_for '^ptr 0x'

# The daemon sees what it holds, then it is suspended.
for _ in $(seq 300); do
  curl -fsS -m 10 "$BASE/api/v1/state" 2>/dev/null | python3 -c '
import json, sys
st = json.load(sys.stdin)
sys.exit(0 if any(p["pid"] == int(sys.argv[1]) and p["devices"] and p["devices"][0]["used_bytes"] == 64 << 20
                  for p in st["processes"]) else 1)' "$pid" && break
  sleep 0.1
done
"$CLI" suspend "$pid" --socket "$T/d.sock" >"$T/suspend.out" 2>&1 || fail "cuwarden suspend: $(cat "$T/suspend.out")"

rc=0
node "$HERE/suspend_test.mjs" --url "$BASE/" --artefacts "$ART" --pid "$pid" \
  --trigger "'$CLI' resume $pid --socket '$T/d.sock'" || rc=$?
(( rc == 0 )) || fail "suspend_test.mjs"
echo PASS
