#!/usr/bin/env bash
# scripts/demo.sh on an existing build, as a new user reads it: the cap refuses the
# workload's last request; the job section says as many processes were refused as were,
# each refusal names the other member's use; it ends with how to keep exploring.
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
[[ $out == *"== Keep exploring =="*"source scripts/env.sh"*"cuwardend &"* ]] || fail "no way to keep exploring at the end"
[[ $out != *"Try also"* ]] || fail "suggests a command after the daemon has stopped"
echo "ok: demo ($refused job member(s) refused, text agrees)"
echo PASS
