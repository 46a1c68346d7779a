#!/usr/bin/env bash
# cuwarden bench: how many instructions, and how many cache lines missed, the hooks add to
# one alloc+free pair when the driver's own work has evicted them from the caches, as it
# does on a GPU. Deterministic (valgrind's cache simulation), CPU only:
#
#   bench/cold_lines.sh BUILD_DIR [LIB] [--async]
#
# Runs BUILD_DIR/bin/cuw_callgrind_pairs on the simulated driver with FAKECUDA_THRASH_KB=4096
# (every driver call first writes 4 MiB and runs 32 KiB of code), LIB (default
# BUILD_DIR/lib/libcuwarden.so) preloaded with CUWARDEN_POOL=off and no cap, under callgrind
# with a 32 KiB L1i, a 48 KiB L1d and a 2 MiB last level; prints, per pair, the Ir of
# cuwarden's own code and its L1 instruction and data read misses (each a line that came
# from far away), in total and per function, and those of what it calls outside itself and
# the driver (libc; valgrind hides the vDSO, so a clock read there is libc's system call).
# --async: cuMemAllocAsync + cuMemFreeAsync.
# The stream-ordered pools' refresh (at most once a millisecond, which valgrind's slowness
# turns into every pair) is left out of the totals.
set -euo pipefail
[[ $# -ge 1 ]] || { echo "usage: bench/cold_lines.sh BUILD_DIR [LIB] [--async]" >&2; exit 1; }
BUILD=$(cd "$1" && pwd); shift
LIB=$BUILD/lib/libcuwarden.so
ASYNC=()
for a in "$@"; do
  if [[ $a == --async ]]; then ASYNC=(--async); else LIB=$(cd "$(dirname "$a")" && pwd)/$(basename "$a"); fi
done
command -v valgrind >/dev/null || { echo "cold_lines: valgrind is not installed" >&2; exit 77; }
PAIRS=300
W=$(mktemp -d "${TMPDIR:-/tmp}/cuwarden-cold.XXXXXX")
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/run"
(cd "$W" && env -i PATH=/usr/local/bin:/usr/bin:/bin LD_LIBRARY_PATH="$BUILD/fakecuda" CUWARDEN_FAKE_DEVICES=1 CUWARDEN_FAKE_MEMORY=16G \
   FAKECUDA_THRASH_KB=4096 LD_PRELOAD="$LIB" CUWARDEN_POOL=off CUWARDEN_RUN_DIR="$W/run" \
   valgrind --tool=callgrind --collect-atstart=no --cache-sim=yes --I1=32768,8,64 --D1=49152,12,64 \
   --LL=2097152,16,64 --callgrind-out-file="$W/cg.out" "$BUILD/bin/cuw_callgrind_pairs" "${ASYNC[@]}" \
   --pairs $PAIRS --warmup 100 --size 1048576 >/dev/null 2>"$W/err") || { cat "$W/err" >&2; exit 1; }
python3 - "$W/cg.out" "$PAIRS" <<'PY'
# Sums the self cost of every function of libcuwarden.so, inlined code included, from
# callgrind's raw output (object and function of each cost line; calls' inclusive costs skipped).
import collections, re, sys
path, n = sys.argv[1], int(sys.argv[2])
names = {"ob": {}, "fn": {}, "fl": {}, "fi": {}, "fe": {}, "cob": {}, "cfn": {}, "cfi": {}, "cfl": {}}
def resolve(kind, val):
    table = names["ob" if kind in ("ob", "cob") else "fn" if kind in ("fn", "cfn") else "fl"]
    m = re.match(r"\((\d+)\)\s*(.*)", val)
    if m:
        if m.group(2): table[m.group(1)] = m.group(2)
        return table.get(m.group(1), "?")
    return val
events = None; ob = fn = cob = None; agg = collections.defaultdict(lambda: None); skip_next = False
outside = None  # inclusive cost of calls from cuwarden's code into other objects but the driver
for line in open(path):
    line = line.rstrip("\n")
    if line.startswith("events:"): events = line.split()[1:]; continue
    m = re.match(r"(ob|fn|fl|fi|fe|cob|cfn|cfi|cfl)=(.*)", line)
    if m:
        k, v = m.groups(); r = resolve(k, v)
        if k == "ob": ob = r
        elif k == "fn": fn = r; cob = None
        elif k == "cob": cob = r
        continue
    if line.startswith("calls="): skip_next = True; continue
    if line and (line[0].isdigit() or line[0] in "+-*"):
        if skip_next:  # the inclusive cost of a call
            skip_next = False
            callee = cob or ob
            if ob and "libcuwarden" in ob and fn and "refresh" not in fn and callee and "libcuwarden" not in callee \
                    and "libcuda" not in callee:
                vals = [int(x) for x in line.split()[1:]]
                vals += [0] * (len(events) - len(vals))
                outside = vals if outside is None else [x + y for x, y in zip(outside, vals)]
            cob = None
            continue
        vals = [int(x) for x in line.split()[1:]]
        vals += [0] * (len(events) - len(vals))
        if ob and "libcuwarden" in ob and fn and "refresh" not in fn:
            a = agg[fn]; agg[fn] = vals if a is None else [x + y for x, y in zip(a, vals)]
idx = {e: i for i, e in enumerate(events)}
keys = [k for k in ("Ir", "I1mr", "D1mr", "D1mw") if k in idx]
tot = {k: sum(v[idx[k]] for v in agg.values()) / n for k in keys}
print("per pair: " + "  ".join("%s %.1f" % (k, tot[k]) for k in keys))
if outside:
    print("  %-44s " % "(called: libc, ld.so)" + "  ".join("%s %.1f" % (k, outside[idx[k]] / n) for k in keys))
for f, v in sorted(agg.items(), key=lambda kv: -kv[1][idx["Ir"]])[:8]:
    print("  %-44s " % re.sub(r"\(.*", "", f)[-44:] + "  ".join("%s %.1f" % (k, v[idx[k]] / n) for k in keys))
PY
