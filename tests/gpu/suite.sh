#!/usr/bin/env bash
# cuwarden GPU suite: the checks that stand behind a change to the interposer, in one run on a
# CUDA machine: the compatibility matrix under --pool off and under --pool cache
# (tests/gpu/compat.sh), the cache's reuse canary (tests/gpu/cache_reuse.sh), memory freed
# with its context (tests/gpu/ctx_gone.sh) and what a cap counts (tests/gpu/cap_scope.sh). Builds nothing: BUILD_DIR (default <repo>/build)
# holds what those scripts use (lib/libcuwarden.so, bin/cuwardend, bin/cuwarden and the probes).
#
#   BUILD_DIR=<dir> OUT=<dir> bash tests/gpu/suite.sh
#
# Environment: COMPAT_TIME_BUDGET_S (150: each matrix's budget, so that the whole suite fits
# in about 8 minutes on one GPU), ROWS (compat.sh's, default every row the GPUs allow),
# SUITE_COMMIT (the commit to name in suite.md where the copy has no .git).
# Writes into $OUT: suite.md (one line per part, with its summary) and suite.tar.gz (every
# part's own files: compat-off/, compat-cache/, cache-reuse/, ctx-gone/, cap-scope/). Exit status: 0 when
# every part passed, 1 otherwise.
set -u -o pipefail
START_CWD=$(pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
abs_path() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$START_CWD/$1" ;; esac; }
BUILD=$(abs_path "${BUILD_DIR:-$REPO/build}")
OUT_DIR=$(abs_path "${OUT:-./gpu-out}")
PARTS=$(mktemp -d "${TMPDIR:-/tmp}/cuwarden-suite.XXXXXX")
trap 'rm -rf "$PARTS"' EXIT
mkdir -p "$OUT_DIR"
export BUILD_DIR=$BUILD
budget=${COMPAT_TIME_BUDGET_S:-150}

fails=0
lines=()
summary_of() {  # summary_of NAME: the part's own count of what passed
  local d="$PARTS/$1"
  case $1 in
    compat-*) sed -n 's/^| summary | \(.*\) |$/\1/p' "$d/compat.md" 2>/dev/null | head -1 ;;
    cache-reuse) grep -m1 -E '^[0-9]+ cases under cuwarden' "$d/cache-reuse.md" 2>/dev/null ;;
    cap-scope) echo "$(grep -c '| pass |' "$d/cap-scope.md" 2>/dev/null)/$(grep -cE '\| (pass|FAIL[^|]*) \|$' "$d/cap-scope.md" 2>/dev/null) runs ok" ;;
    ctx-gone) [[ -s $d/ctx-gone.jsonl ]] &&
      echo "$(grep -c '"ok":true' "$d/ctx-gone.jsonl")/$(wc -l <"$d/ctx-gone.jsonl") cases ok" ;;
  esac
}
part() {  # part NAME COMMAND...
  local name=$1
  shift
  local start rc
  start=$(date +%s)
  echo "===== suite: $name"
  OUT="$PARTS/$name" "$@"
  rc=$?
  lines+=("| $name | $([[ $rc == 0 ]] && echo pass || echo FAIL) | $(summary_of "$name") | $(($(date +%s) - start)) s |")
  [[ $rc == 0 ]] || fails=$((fails + 1))
}

part compat-off env COMPAT_POOL=off TIME_BUDGET_S="$budget" bash "$REPO/tests/gpu/compat.sh"
part compat-cache env COMPAT_POOL=cache TIME_BUDGET_S="$budget" bash "$REPO/tests/gpu/compat.sh"
part cache-reuse bash "$REPO/tests/gpu/cache_reuse.sh"
part ctx-gone bash "$REPO/tests/gpu/ctx_gone.sh"
part cap-scope bash "$REPO/tests/gpu/cap_scope.sh"

{
  echo "# cuwarden GPU suite"
  echo
  echo "Commit ${SUITE_COMMIT:-$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)}, $(date -u '+%Y-%m-%d %H:%M UTC')," \
       "$(nvidia-smi --query-gpu=count,name,driver_version --format=csv,noheader 2>/dev/null | head -1)."
  echo
  echo "| part | result | summary | time |"
  echo "| --- | --- | --- | --- |"
  printf '%s\n' "${lines[@]}"
} >"$OUT_DIR/suite.md"
tar -C "$PARTS" -czf "$OUT_DIR/suite.tar.gz" .
cat "$OUT_DIR/suite.md"
exit $((fails > 0))
