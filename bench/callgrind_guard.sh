#!/usr/bin/env bash
# cuwarden CI guard: instructions the interposer adds to one cuMemAlloc_v2 + cuMemFree_v2
# pair, counted by valgrind's callgrind on the simulated driver (deterministic: the same
# build gives the same count on any machine, however busy), against the budgets kept in
# bench/callgrind_budget.json. Three pairs, one per backend, each with its own budget:
#   off    CUWARDEN_POOL=off: what the hooks add to the driver's pair (the cap check and the
#          record of every call): (Ir_with - Ir_bare) / N;
#   cache  CUWARDEN_POOL=cache: a warm pool's hit and its free (after the 200 warm-up pairs
#          the 1 MiB block is always in the pool, and the driver allocates nothing): the
#          whole pair as the program sees it, Ir_with / N (the driver's own pair does not
#          happen, so subtracting the bare run would measure the simulated driver instead);
#   vmm    CUWARDEN_POOL=vmm: the same over granules.
#
#   bench/callgrind_guard.sh BUILD_DIR            check (ctest: bench.callgrind_guard)
#   bench/callgrind_guard.sh BUILD_DIR --update   measure and rewrite the budgets
#                                                 (off + 5%, cache and vmm + 2%)
#
# Runs build/bin/cuw_callgrind_pairs under callgrind, collecting only around N pairs: bare,
# and once per backend with libcuwarden.so preloaded (CUWARDEN_LIMIT=3G, no daemon). Each
# preloaded run checks that cuMemGetInfo reports the cap, so a hook that silently did not
# load cannot pass. The cache and vmm runs also hold every call between libcuwarden's own
# functions on a hit and its free to a direct call (bench/hit_calls.py: no virtual call).
# Exit: 0 all within budget; 1 one over budget, an indirect call on a hit, or broken; 77
# skipped (no valgrind, sanitizer build, or a build type other than the budgets'), which ctest
# reports as skipped.
set -euo pipefail

SKIP=77
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUDGET_FILE=${CUWARDEN_GUARD_BUDGET:-$HERE/callgrind_budget.json}  # override: tests of the guard itself
PAIRS=2000
WARMUP=200
SIZE=1048576
LIMIT_BYTES=3221225472  # 3G
# The count is deterministic for one compiler and build type; the headroom only lets small,
# deliberate changes through without a new budget (a larger one says why in its commit).
HEADROOM_PCT=5       # the off pair
POOL_HEADROOM_PCT=2  # the cache and vmm pairs
POOLS=(off cache vmm)

usage() { echo "usage: bench/callgrind_guard.sh BUILD_DIR [--update]" >&2; exit 1; }
[[ $# -ge 1 ]] || usage
BUILD=$(cd "$1" && pwd) || usage
UPDATE=0
[[ ${2:-} == --update ]] && UPDATE=1
[[ $# -le 2 ]] || usage

say() { echo "callgrind_guard: $*"; }

if ! command -v valgrind >/dev/null; then
  say "SKIPPED: valgrind is not installed (apt-get install valgrind; scripts/setup.sh does)"
  exit $SKIP
fi
if [[ -n ${CUWARDEN_SANITIZE:-} ]]; then
  say "SKIPPED: sanitizer build (${CUWARDEN_SANITIZE}); instruction counts mean nothing there"
  exit $SKIP
fi

PROG="$BUILD/bin/cuw_callgrind_pairs"
LIB="$BUILD/lib/libcuwarden.so"
FAKE="$BUILD/fakecuda"
for f in "$PROG" "$LIB" "$FAKE/libcuda.so.1"; do
  if [[ ! -e $f ]]; then
    say "FAILED: $f is missing (build the cuw_callgrind_pairs, cuwarden and fakecuda targets)"
    exit 1
  fi
done

json_field() {  # json_field FILE KEY: a number or a "string" value of a flat JSON object
  sed -n "s/.*\"$2\"[[:space:]]*:[[:space:]]*\"\{0,1\}\([^\",}]*\)\"\{0,1\}.*/\1/p" "$1" | head -1
}

# The budget key of each pair (the off pair's keeps its first name, which reports read).
budget_key() { if [[ $1 == off ]]; then echo hook_pair_instructions; else echo "${1}_pair_instructions"; fi; }
declare -A BUDGET=()
BUDGET_TYPE=""
if [[ -f $BUDGET_FILE ]]; then
  for pool in "${POOLS[@]}"; do BUDGET[$pool]=$(json_field "$BUDGET_FILE" "$(budget_key "$pool")"); done
  BUDGET_TYPE=$(json_field "$BUDGET_FILE" build_type)
fi
BUILD_TYPE=${CUWARDEN_BUILD_TYPE:-$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null || true)}
if [[ $UPDATE -eq 0 && -n $BUDGET_TYPE && -n $BUILD_TYPE && $BUILD_TYPE != "$BUDGET_TYPE" ]]; then
  say "SKIPPED: this is a $BUILD_TYPE build; the budget was measured on a $BUDGET_TYPE build"
  exit $SKIP
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/cuwarden-callgrind.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/run"

# A clean, fixed environment: nothing from the caller's CUWARDEN_* / LD_PRELOAD.
CLEAN=(env -u LD_PRELOAD -u FAKECUDA_TRACE -u CUDA_VISIBLE_DEVICES)
while IFS= read -r v; do CLEAN+=(-u "$v"); done < <(compgen -e | grep '^CUWARDEN_' || true)
CLEAN+=(LD_LIBRARY_PATH="$FAKE" CUWARDEN_FAKE_DEVICES=1 CUWARDEN_FAKE_MEMORY=16G)

measure() {  # measure NAME [VAR=VALUE...] -- PROGRAM-ARGS...: prints the collected Ir
  local name=$1; shift
  local vars=()
  while [[ $1 != -- ]]; do vars+=("$1"); shift; done
  shift
  local out="$WORK/$name.callgrind"
  if ! (cd "$WORK" && "${CLEAN[@]}" "${vars[@]}" valgrind --tool=callgrind --collect-atstart=no \
        --dump-instr=yes --compress-strings=no --compress-pos=no \
        --callgrind-out-file="$out" --log-file="$WORK/$name.valgrind.log" \
        "$PROG" --pairs "$PAIRS" --warmup "$WARMUP" --size "$SIZE" "$@" >"$WORK/$name.stdout" 2>"$WORK/$name.stderr"); then
    say "FAILED: the $name run failed:" >&2
    cat "$WORK/$name.stderr" "$WORK/$name.stdout" >&2
    tail -5 "$WORK/$name.valgrind.log" >&2 || true
    return 1
  fi
  local ir
  ir=$(sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$out" | head -1)
  if [[ -z $ir ]]; then
    say "FAILED: no instruction total in $out" >&2
    return 1
  fi
  echo "$ir"
}

start=$(date +%s)
IR_BARE=$(measure bare -- --expect-bare) || exit 1
say "driver alone: $IR_BARE instructions for $PAIRS pairs ($(( IR_BARE / PAIRS ))/pair)"
declare -A PER_PAIR=()
INDIRECT=0
for pool in "${POOLS[@]}"; do
  # CUWARDEN_CLOCK=syscall: the CPU-counter clock re-anchors by elapsed time, which valgrind
  # stretches; clock_gettime keeps the count independent of how fast the machine runs.
  ir=$(measure "$pool" LD_PRELOAD="$LIB" CUWARDEN_LIMIT=3G CUWARDEN_POOL="$pool" CUWARDEN_CLOCK=syscall \
       CUWARDEN_RUN_DIR="$WORK/run" -- --expect-limit "$LIMIT_BYTES") || exit 1
  if [[ $pool == off ]]; then
    PER_PAIR[$pool]=$(( (ir - IR_BARE + PAIRS / 2) / PAIRS ))
    say "pool=off: $ir instructions with cuwarden ($(( ir / PAIRS ))/pair): ${PER_PAIR[$pool]} per pair added to the driver's"
  else
    PER_PAIR[$pool]=$(( (ir + PAIRS / 2) / PAIRS ))
    say "pool=$pool: $ir instructions with cuwarden: ${PER_PAIR[$pool]} per pair (a warm pool's hit and free)"
    # A hit and its free call the pool's class directly: no virtual call, no function pointer
    # between libcuwarden's own functions (bench/hit_calls.py; calls into the driver are its own).
    if ! python3 "$HERE/hit_calls.py" "$WORK/$pool.callgrind" "$LIB" >"$WORK/$pool.calls"; then
      cat "$WORK/$pool.calls"
      say "FAILED: pool=$pool: an indirect call between libcuwarden's functions on a hit or its free (above)"
      INDIRECT=1
    else
      say "pool=$pool: $(tail -1 "$WORK/$pool.calls" | sed 's/^hit_calls: //')"
    fi
  fi
done
say "per pair: off ${PER_PAIR[off]} (added), cache ${PER_PAIR[cache]}, vmm ${PER_PAIR[vmm]} ($(( $(date +%s) - start )) s)"

if [[ $UPDATE -eq 1 ]]; then
  declare -A NEW=()
  for pool in "${POOLS[@]}"; do
    pct=$POOL_HEADROOM_PCT
    [[ $pool == off ]] && pct=$HEADROOM_PCT
    NEW[$pool]=$(( (PER_PAIR[$pool] * (100 + pct) + 99) / 100 ))
  done
  CXX_ID=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null || true)
  CXX_VER=$(${CXX_ID:-c++} -dumpfullversion 2>/dev/null || echo unknown)
  cat >"$BUDGET_FILE" <<JSON
{
  "hook_pair_instructions": ${NEW[off]},
  "measured": ${PER_PAIR[off]},
  "headroom_percent": $HEADROOM_PCT,
  "cache_pair_instructions": ${NEW[cache]},
  "cache_measured": ${PER_PAIR[cache]},
  "vmm_pair_instructions": ${NEW[vmm]},
  "vmm_measured": ${PER_PAIR[vmm]},
  "pool_headroom_percent": $POOL_HEADROOM_PCT,
  "pairs": $PAIRS,
  "warmup": $WARMUP,
  "size": $SIZE,
  "build_type": "${BUILD_TYPE:-RelWithDebInfo}",
  "compiler": "$(basename "${CXX_ID:-c++}") $CXX_VER",
  "valgrind": "$(valgrind --version)",
  "date": "$(date -u +%Y-%m-%d)"
}
JSON
  say "budgets written to $BUDGET_FILE: off ${NEW[off]}, cache ${NEW[cache]}, vmm ${NEW[vmm]}"
  exit 0
fi

status=$INDIRECT
over=0
for pool in "${POOLS[@]}"; do
  budget=${BUDGET[$pool]}
  if [[ -z $budget ]]; then
    say "FAILED: no $(budget_key "$pool") in $BUDGET_FILE (create it with: bench/callgrind_guard.sh BUILD_DIR --update)"
    status=1
    continue
  fi
  if (( PER_PAIR[$pool] <= budget )); then
    say "OK: pool=$pool ${PER_PAIR[$pool]} <= budget $budget instructions per pair"
    continue
  fi
  status=1
  over=1
  say "FAILED: pool=$pool: ${PER_PAIR[$pool]} instructions per alloc+free pair; the budget is" \
      "$budget ($(( (PER_PAIR[$pool] - budget) * 100 / budget ))% over)."
  if command -v callgrind_annotate >/dev/null; then
    say "Where they go: instructions per pair, with minus bare, by function (exclusive):"
    for r in bare "$pool"; do
      callgrind_annotate --inclusive=no --auto=no --threshold=100 "$WORK/$r.callgrind" 2>/dev/null |
        sed -n '/file:function/,$p' |
        sed -n 's/^ *\([0-9,]*\) *( *[0-9.]*%) *\(.*\)$/\1\t\2/p' >"$WORK/$r.annotate" || true
    done
    awk -F '\t' -v pairs="$PAIRS" '
      { n = $1; gsub(",", "", n); key = substr($2, 1, 160) }
      FNR == NR { bare[key] = n; next }
      { d = (n - bare[key]) / pairs; if (d >= 1 || d <= -1) printf "%10.1f  %s\n", d, key }
    ' "$WORK/bare.annotate" "$WORK/$pool.annotate" | sort -rn | head -15 || true
  fi
done
if (( over != 0 )); then
  say "If the cost is intended, say why in the commit and raise the budgets:" \
      "bench/callgrind_guard.sh BUILD_DIR --update"
fi
exit $status
