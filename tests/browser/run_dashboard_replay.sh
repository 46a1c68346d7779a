#!/usr/bin/env bash
# browser.dashboard_replay: the web dashboard in headless Chromium against replay_server.py
# replaying a recording of the daemon's API (default: the hand-made recording-sample/).
#
#   run_dashboard_replay.sh REPO WEB_ROOT ARTEFACT_DIR [RECORDING]
#
# Exit 77 (skip) when node, the npm packages or chromium are missing.
set -euo pipefail
REPO=$1 WEB=$2 ART=$3 REC=${4:-$1/tests/browser/recording-sample}
HERE=$REPO/tests/browser
CHROMIUM=${CUWARDEN_CHROMIUM:-/usr/bin/chromium}

command -v node >/dev/null || { echo "skip: node not found (scripts/setup.sh)"; exit 77; }
[[ -d $REPO/node_modules/playwright-core ]] || { echo "skip: no node_modules/playwright-core (run npm ci in $REPO)"; exit 77; }
[[ -x $CHROMIUM ]] || { echo "skip: $CHROMIUM not found (scripts/setup.sh installs chromium)"; exit 77; }
[[ -f $WEB/index.html && -f $WEB/uPlot.iife.min.js ]] || { echo "FAIL: $WEB is not a staged web root (build the cuwarden_web target)"; exit 1; }

T=$(mktemp -d "${TMPDIR:-/tmp}/cuwt-browser.XXXXXX")
server=""
cleanup() {
  if [[ -n $server ]]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  rm -rf "$T"
}
trap cleanup EXIT
python3 "$HERE/replay_server.py" --web-root "$WEB" --recording "$REC" --port-file "$T/port" >"$T/server.log" 2>&1 &
server=$!
for _ in $(seq 600); do
  [[ -s $T/port ]] && break
  kill -0 "$server" 2>/dev/null || { cat "$T/server.log"; echo "FAIL: replay_server.py exited"; exit 1; }
  sleep 0.05
done
[[ -s $T/port ]] || { cat "$T/server.log"; echo "FAIL: replay_server.py did not listen within 30 s"; exit 1; }
# The sample's stream advances by itself: no trigger; it holds a live refusal (--expect-ooms).
rc=0
# REPLAY_TIMEOUT: seconds each step may wait (default 12); a recording whose refusal comes
# later than 12 s after its first allocation needs more.
node "$HERE/dashboard_test.mjs" --url "http://127.0.0.1:$(cat "$T/port")/" --artefacts "$ART" --expect-ooms \
  --timeout "${REPLAY_TIMEOUT:-12}" || rc=$?
[[ $rc == 0 ]] || cat "$T/server.log"
exit $rc
