#!/usr/bin/env bash
# browser.dashboard_live: the web dashboard in headless Chromium against a real
# `cuwardend --http --http-snapshots`, with two programs on the simulated driver (tests/fakecuda)
# under the interposer: A capped at 1 GiB (call sites on) holds 256 MiB, B capped at 256 MiB
# holds 128 MiB. The test's trigger makes A allocate 256 MiB more and B ask for 200 MiB, which
# its cap refuses; the page must show both without reloading.
#
#   run_dashboard_live.sh REPO WEB_ROOT ARTEFACT_DIR CUWARDEND LIBCUWARDEN ALLOC_LOOP FAKECUDA_DIR
#
# Exit 77 (skip) when node, the npm packages or chromium are missing.
set -euo pipefail
REPO=$1 WEB=$2 ART=$3 DAEMON=$4 LIB=$5 ALLOC=$6 FAKECUDA=$7
HERE=$REPO/tests/browser
CHROMIUM=${CUWARDEN_CHROMIUM:-/usr/bin/chromium}

command -v node >/dev/null || { echo "skip: node not found (scripts/setup.sh)"; exit 77; }
[[ -d $REPO/node_modules/playwright-core ]] || { echo "skip: no node_modules/playwright-core (run npm ci in $REPO)"; exit 77; }
[[ -x $CHROMIUM ]] || { echo "skip: $CHROMIUM not found (scripts/setup.sh installs chromium)"; exit 77; }
[[ -f $WEB/index.html && -f $WEB/uPlot.iife.min.js ]] || { echo "FAIL: $WEB is not a staged web root (build the cuwarden_web target)"; exit 1; }

# shellcheck source=tests/browser/live_daemon.sh
source "$HERE/live_daemon.sh" cuwt-browser-live
start_daemon "$DAEMON" "$WEB"

# The programs read commands from FIFOs this script holds open (fd 3: A, fd 4: B).
mkfifo "$T/a.in" "$T/b.in"
start() {  # start NAME LIMIT [ENV...]
  local name=$1 limit=$2
  shift 2
  env LD_LIBRARY_PATH="$FAKECUDA" CUWARDEN_FAKE_DEVICES=1 CUWARDEN_FAKE_MEMORY=16G LD_PRELOAD="$LIB" \
    CUWARDEN_LIMIT="$limit" "$@" "$ALLOC" <"$T/$name.in" >"$T/$name.out" 2>&1 &
  pids+=($!)
}
answers() { grep -c "$2" "$T/$1.out" 2>/dev/null || true; }
wait_for() {  # wait_for NAME PATTERN COUNT
  for _ in $(seq 600); do (( $(answers "$1" "$2") >= $3 )) && return 0; sleep 0.05; done
  fail "$1 did not answer '$2' ($3) within 30 s"
}
start a 1G CUWARDEN_CALLSITES=8
exec 3>"$T/a.in"
start b 256M
exec 4>"$T/b.in"
wait_for a '^ready' 1
wait_for b '^ready' 1
echo "alloc 256" >&3
echo "alloc 128" >&4
wait_for a '^ok' 1
wait_for b '^ok' 1

# Both seen by the daemon with what they hold before the page opens.
for _ in $(seq 300); do
  curl -fsS -m 10 "$BASE/api/v1/state" 2>/dev/null | python3 -c '
import json, sys
st = json.load(sys.stdin)
used = sorted(d["used_bytes"] for p in st["processes"] for d in p["devices"])
sys.exit(0 if used == [128 << 20, 256 << 20] else 1)' && break
  sleep 0.1
done

trigger="echo 'alloc 256' >'$T/a.in'; echo 'alloc 200' >'$T/b.in'"
rc=0
node "$HERE/dashboard_test.mjs" --url "$BASE/" --artefacts "$ART" --trigger "$trigger" --expect-ooms || rc=$?
[[ $(answers a '^ok') == 2 && $(answers b '^refused') == 1 ]] || { echo "the trigger's allocations: A $(answers a '^ok') ok, B $(answers b '^refused') refused"; rc=1; }
(( rc == 0 )) || fail "dashboard_test.mjs"
echo PASS
