#!/usr/bin/env bash
# scripts/demo.sh on an existing build, as a new user reads it: the cap refuses the
# workload's last request; the job section says as many processes were refused as were,
# each refusal names the other member's use; it ends with how to keep exploring, and what
# it says there holds: its targets build the web page, which answers at /, and the workload
# it suggests lasts until stopped.
#
#   check_demo.sh REPO BUILD_DIR
set -euo pipefail
REPO=$1 BUILD=$2
fail() { echo "FAIL: $*" >&2; exit 1; }
out=$(env -u CUWARDEN_RUN_DIR SKIP_BUILD=1 BUILD_DIR="$BUILD" CUWARDEN_DEMO_SIMULATE=1 "$REPO/scripts/demo.sh" 2>&1) \
  || { echo "$out"; fail "demo.sh exited $?"; }
echo "$out" | sed 's/^/  | /'
[[ $out == *"The cap held."* ]] || fail "section 6: no refusal at the 2 GiB cap"
job=${out#*== 8. A job}
refused=$(grep -c '^    refused: ' <<<"$job" || true)
# Each member peaks at 1.6 GiB alone and holds 512 MiB of model state throughout: together
# they pass the job's 2 GiB, so at least one is refused.
case $refused in
  2) [[ $job == *"in both processes"* ]] || fail "two refusals, but the text does not say both" ;;
  1) [[ $job == *"the one whose allocation"* ]] || fail "one refusal, but the text does not say one" ;;
  *) fail "no job member was refused: the job's cap did not hold" ;;
esac
[[ $(grep -c 'others sharing it [0-9]' <<<"$job") == "$refused" ]] || fail "a job refusal does not name the other member's use"
[[ $out == *"== Keep exploring =="*"source scripts/env.sh"*"cuwardend --http 127.0.0.1:9477 2>cuwardend.log &"* ]] \
  || fail "no way to keep exploring at the end (the daemon with its web page, its log in a file)"
[[ $out == *"cuw_demo_workload --hold >workload.log 2>&1 &"* ]] || fail "the closing workload does not last until stopped"
[[ $out != *"Try also"* ]] || fail "suggests a command after the daemon has stopped"
echo "ok: demo ($refused job member(s) refused, text agrees)"

# What the closing lines tell the user to open, the demo builds: its own targets stage the
# web page (a demo run alone, without the full build, serves it).
targets=$("$REPO/scripts/demo.sh" --targets)
# shellcheck disable=SC2086
commands=$(ninja -C "$BUILD" -t commands $targets)
[[ $commands == *"share/cuwarden/web/index.html"* ]] \
  || fail "demo.sh's targets ($targets) do not build the web page its closing lines name"
echo "ok: the demo's targets build the web page"

# The closing lines, run: the page answers at /, and the workload holds until stopped.
T=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$T"; }
trap cleanup EXIT
"$BUILD/bin/cuwardend" --run-dir "$T/run" --socket "$T/d.sock" --no-nvml --http 127.0.0.1:0 2>"$T/cuwardend.log" &
pids+=($!)
port=""
for _ in $(seq 300); do
  port=$(sed -n 's/.*(port \([0-9]*\)).*/\1/p' "$T/cuwardend.log" | head -1)
  [[ -n $port ]] && break
  sleep 0.1
done
[[ -n $port ]] || { cat "$T/cuwardend.log"; fail "cuwardend --http did not say its port"; }
page=$(python3 -c 'import sys, urllib.request; r = urllib.request.urlopen(sys.argv[1], timeout=30); print(r.status); print(r.read().decode())' \
  "http://127.0.0.1:$port/") || fail "GET / failed"
[[ $(head -1 <<<"$page") == 200 && $page == *"<html"* ]] || fail "GET / did not answer the page: $(head -3 <<<"$page")"
echo "ok: the web page answers at /"
env CUWARDEN_RUN_DIR="$T/run" LD_LIBRARY_PATH="$BUILD/fakecuda" CUWARDEN_FAKE_DEVICES=1 CUWARDEN_FAKE_MEMORY=16G \
  "$BUILD/bin/cuwarden" run --limit 2G -- "$BUILD/bin/cuw_demo_workload" --sleep-ms 10 --hold >"$T/workload.log" 2>&1 &
pids+=($!)
for _ in $(seq 600); do
  grep -q '^holding its memory until stopped' "$T/workload.log" && break
  kill -0 "${pids[1]}" 2>/dev/null || break
  sleep 0.1
done
grep -q '^refused:' "$T/workload.log" || { cat "$T/workload.log"; fail "the workload was not refused at its cap"; }
grep -q '^holding its memory until stopped' "$T/workload.log" || { cat "$T/workload.log"; fail "the workload did not hold"; }
kill -0 "${pids[1]}" 2>/dev/null || fail "the workload ended before it was stopped"
echo "ok: the workload holds until stopped"
echo PASS
