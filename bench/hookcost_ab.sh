#!/usr/bin/env bash
# cuwarden bench: what several builds of libcuwarden.so add to a driver-API alloc+free pair,
# on one GPU, interleaved so that they share the machine's state (a shared host moves by tens
# of ns between minutes). Each round runs `cuw_bench_gpu hookcost` once bare (the method's
# noise) and once under each library, in a shuffled order; hookcost itself compares the
# hooked pair with libcuda's own entry points inside one process.
#
#   BENCH=<build>/bin/cuw_bench_gpu OUT=<dir> bash bench/hookcost_ab.sh NAME=LIB [NAME=LIB ...]
#
# Every library runs with CUWARDEN_POOL=off; a NAME containing "+cap" adds CUWARDEN_LIMIT=100G
# (the capped path), "+fine" CUWARDEN_CLOCK=fine (event times from the CPU counter).
# ROUNDS (4), SIZES (4K,1M), HOOKCOST_ROUNDS (300).
# Writes OUT/<name>-<round>.json, OUT/bare-<round>.json, OUT/env.txt; prints, per library,
# API and size, the added ns of every round (in round order).
set -u
[[ $# -ge 1 ]] || { echo "usage: bench/hookcost_ab.sh NAME=LIB [NAME=LIB ...]" >&2; exit 1; }
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH=${BENCH:-$REPO/build/bin/cuw_bench_gpu}
OUT=${OUT:-./bench-out/hookcost-ab}
mkdir -p "$OUT"
declare -A LIB
for a in "$@"; do LIB[${a%%=*}]=${a#*=}; done
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)";
  cat /sys/devices/system/clocksource/clocksource0/current_clocksource; } > "$OUT/env.txt" 2>&1
unset LD_PRELOAD CUWARDEN_LIMIT CUWARDEN_POOL CUWARDEN_JOB
export CUWARDEN_RUN_DIR=${CUWARDEN_RUN_DIR:-$(mktemp -d)}
args=(hookcost --rounds "${HOOKCOST_ROUNDS:-300}" --sizes "${SIZES:-4K,1M}")
for r in $(seq "${ROUNDS:-4}"); do
  timeout 120 "$BENCH" "${args[@]}" > "$OUT/bare-$r.json" 2>>"$OUT/err.txt" || echo "bare $r failed"
  for name in $(printf '%s\n' "${!LIB[@]}" | shuf); do
    mode=(CUWARDEN_POOL=off)
    [[ $name == *+cap* ]] && mode+=(CUWARDEN_LIMIT=100G)
    [[ $name == *+fine* ]] && mode+=(CUWARDEN_CLOCK=fine)
    timeout 120 env LD_PRELOAD="${LIB[$name]}" "${mode[@]}" "$BENCH" "${args[@]}" > "$OUT/$name-$r.json" 2>>"$OUT/err.txt" \
      || echo "$name $r failed"
  done
done
cat "$OUT/env.txt"
python3 - "$OUT" <<'PY'
import collections, glob, json, os, sys
res = collections.defaultdict(list)
for f in sorted(glob.glob(os.path.join(sys.argv[1], '*-[0-9]*.json')), key=lambda p: int(p.rsplit('-', 1)[1][:-5])):
    name = os.path.basename(f).rsplit('-', 1)[0]
    try:
        j = json.loads(open(f).read().strip().splitlines()[-1])
    except Exception as e:  # a failed run: reported above
        continue
    for x in j['results']:
        res[(name, x['api'], x['bytes'])].append(round(x['added_ns']))
for k in sorted(res):
    v = sorted(res[k])
    print('%-12s %-6s %10d B  added ns per round %s  median %d' % (k[0], k[1], k[2], res[k], v[len(v) // 2]))
PY
