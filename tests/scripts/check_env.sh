#!/usr/bin/env bash
# The README's "try it without a GPU": in a clean shell, `source scripts/env.sh`, then the
# commands as typed: cuwardend in the background, a capped program, cuwarden. Also: a
# missing build is reported and the sourcing shell goes on.
#
#   check_env.sh REPO BUILD_DIR
set -euo pipefail
REPO=$1 BUILD=$2
T=$(mktemp -d "${TMPDIR:-/tmp}/cuwt-env.XXXXXX")
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# A clean shell, but a sanitizer build's settings kept (its runtime's own checks need them).
keep=()
for v in ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS TSAN_OPTIONS; do [[ -n ${!v:-} ]] && keep+=("$v=${!v}"); done
out=$(env -i "${keep[@]}" HOME="$T" PATH=/usr/bin:/bin CUWARDEN_BUILD_DIR="$BUILD" CUWARDEN_SIMULATE=1 CUWARDEN_RUN_DIR="$T/run" \
      bash --norc --noprofile -c '
  set -u
  command -v cuwarden >/dev/null && { echo "cuwarden on PATH before sourcing"; exit 1; }
  source "$1/scripts/env.sh" || exit 1
  cuwardend >"$HOME/d.log" 2>&1 &
  d=$!
  for _ in $(seq 600); do [ -S "$CUWARDEN_RUN_DIR/daemon/cuwardend.sock" ] && break; sleep 0.05; done
  cuwarden run --limit 1G -- cuw_demo_workload --steps 3 --expect-refusal; rc=$?
  echo "workload exit $rc"
  cuwarden
  kill $d; wait $d
' _ "$REPO" 2>&1) || fail "the shell failed: $out"
echo "$out" | sed 's/^/  | /'
[[ $out == *"simulated driver"* ]] || fail "env.sh did not say it uses the simulated driver"
[[ $out == *"cudaMemGetInfo: total 1.0 GiB"* ]] || fail "the program did not see the 1 GiB cap"
[[ $out == *"refused: "*"cap reached"* ]] || fail "no refusal at the cap"
[[ $out == *"workload exit 0"* ]] || fail "cuw_demo_workload --expect-refusal did not exit 0"
echo "$out" | grep -Eq '\| +0 +[0-9]+ .* cuw_demo_workload .* 1024MiB +1 +exited' \
  || fail "cuwarden did not list the capped process (cap 1024MiB, 1 OOM, exited)"
echo "ok: source scripts/env.sh, cuwardend, cuwarden run, cuwarden"

out=$(env -i "${keep[@]}" PATH=/usr/bin:/bin CUWARDEN_BUILD_DIR="$T/nothing" bash --norc -c \
      'source "$1/scripts/env.sh"; echo "status $?"; command -v cuwarden || echo "not on PATH"' _ "$REPO" 2>&1)
[[ $out == *"no build in $T/nothing"*"status 1"*"not on PATH"* ]] || fail "a missing build: $out"
echo "ok: a missing build is reported, the shell goes on"
echo PASS
