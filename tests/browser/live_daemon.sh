# shellcheck shell=bash
# Sourced by the browser tests that run a real daemon (run_dashboard_live.sh,
# run_callsites_live.sh): a private directory $T, the programs' pids in pids[] (killed at
# exit; fds 3 and 4 closed first: programs reading commands from them exit), fail(), and
# start_daemon, which starts cuwardend with HTTP and snapshots on a free port and sets $BASE.
#   source live_daemon.sh PREFIX   (then: start_daemon DAEMON WEB_ROOT [DAEMON ARGS...])
T=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
pids=()
cleanup() {
  exec 3>&- 4>&-   # EOF: the programs exit
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$T"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$T"/*.log "$T"/*.out; do [[ -e $f ]] && { echo "--- $f"; tail -20 "$f"; }; done; exit 1; }

start_daemon() {  # start_daemon DAEMON WEB_ROOT [DAEMON ARGS...]
  unset LD_PRELOAD CUWARDEN_LIMIT CUWARDEN_POOL CUWARDEN_JOB CUWARDEN_JOB_LIMIT CUWARDEN_CALLSITES
  export CUWARDEN_RUN_DIR=$T/run
  mkdir -p "$CUWARDEN_RUN_DIR"
  "$1" --run-dir "$CUWARDEN_RUN_DIR" --http 127.0.0.1:0 --http-snapshots --web-root "$2" "${@:3}" >"$T/cuwardend.log" 2>&1 &
  pids+=($!)
  local port=""
  for _ in $(seq 600); do
    port=$(sed -n 's/.*serving HTTP on .* (port \([0-9]*\)).*/\1/p' "$T/cuwardend.log" | head -1)
    [[ -n $port ]] && break
    kill -0 "${pids[0]}" 2>/dev/null || fail "cuwardend exited"
    sleep 0.05
  done
  [[ -n $port ]] || fail "cuwardend did not say its HTTP port within 30 s"
  # shellcheck disable=SC2034  # for the sourcing script
  BASE=http://127.0.0.1:$port
}
