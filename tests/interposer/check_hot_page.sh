#!/usr/bin/env bash
# Interposer test: the synchronous pair's hooks start in one 4 KiB page of code, as
# hooks/alloc.cpp lays them out (cuMemAlloc_v2 aligned to a page, cuMemFree_v2 emitted right after
# it): a hooked call runs with the caches and, after an unmapping, the TLB cold, and each
# page of code is one more translation to walk (bench/results/2026-11-30-h200-sync-pair.md).
# A reordering of hooks/alloc.cpp, or a compiler that emits functions in another order, fails here.
#   check_hot_page.sh LIBCUWARDEN
set -euo pipefail
lib=$1
addr() { nm -D --defined-only "$lib" | awk -v n="$1" '$2 == "T" { sub(/@.*/, "", $3); if ($3 == n) print $1 }'; }
alloc=$(addr cuMemAlloc_v2) free=$(addr cuMemFree_v2)
[[ -n $alloc && -n $free ]] || { echo "cuMemAlloc_v2 or cuMemFree_v2 not exported"; exit 1; }
a=$((16#$alloc)) f=$((16#$free))
if (( a % 4096 != 0 )); then printf 'cuMemAlloc_v2 at %#x: not at a page boundary\n' "$a"; exit 1; fi
if (( f <= a || f >= a + 4096 )); then
  printf 'cuMemFree_v2 at %#x: not in cuMemAlloc_v2'"'"'s page (%#x..%#x)\n' "$f" "$a" $((a + 4095)); exit 1
fi
# The free's hot path (its first ~1.2 KiB with GCC 12 -O2) must fit in the page too.
if (( a + 4096 - f < 1024 )); then printf 'cuMemFree_v2 at %#x leaves %d bytes of the page\n' "$f" $((a + 4096 - f)); exit 1; fi
printf 'cuMemAlloc_v2 at %#x, cuMemFree_v2 at %#x: one page\n' "$a" "$f"
