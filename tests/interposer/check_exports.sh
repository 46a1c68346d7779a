#!/usr/bin/env bash
# Interposer test: libcuwarden.so exports exactly the hook table's names (plus dlsym and
# dlvsym under glibc's two version nodes, and the runtime hooks of cudart.hpp under the
# runtimes' nodes), nothing else: no leaked C++ or dependency symbol.
#   check_exports.sh LIBCUWARDEN HOOK_TABLE_HPP  (work_hooks.inc and cudart.hpp beside it are read too)
set -euo pipefail
lib=$1 table=$2
rows='^  X\([A-Za-z_0-9]+, [A-Za-z_0-9]+,'
runtime=$(grep -oE "$rows" "$(dirname "$table")/cudart.hpp" | sed -E 's/^  X\([A-Za-z_0-9]+, ([A-Za-z_0-9]+),/\1/' | sort)
[[ -n "$runtime" ]] || { echo "no runtime hooks read from cudart.hpp"; exit 1; }
want=$( (echo "$runtime"; cat "$table" "$(dirname "$table")/work_hooks.inc" | grep -oE '^  X\([A-Za-z_0-9]+, [A-Za-z_0-9]+,' | sed -E 's/^  X\([A-Za-z_0-9]+, ([A-Za-z_0-9]+),/\1/') | sort)
got=$(nm -D --defined-only "$lib" | awk '$2 == "T" { sub(/@.*/, "", $3); print $3 }' | sort -u | grep -vx -e dlsym -e dlvsym)
if [[ "$want" != "$got" ]]; then
  echo "exports differ from the hook table (< table, > library):"
  diff <(echo "$want") <(echo "$got") || true
  exit 1
fi
versions=$(nm -D --defined-only "$lib" | awk '$3 ~ /^dl(v)?sym@/ { print $3 }' | sort | tr '\n' ' ')
for v in 'dlsym@@GLIBC_2.34' 'dlvsym@@GLIBC_2.34'; do
  [[ " $versions " == *" $v "* ]] || { echo "missing $v (have: $versions)"; exit 1; }
done
# Each runtime hook exactly under both runtimes' nodes, hidden (name@node: a definition under
# our own node, or a default one, would bind where it must not: base/cudart.hpp).
for name in $runtime; do
  have=$(nm -D --defined-only "$lib" | awk -v n="$name" '$2 == "T" { split($3, a, "@"); if (a[1] == n) print $3 }' | sort | tr '\n' ' ')
  [[ "$have" == "$name@libcudart.so.12 $name@libcudart.so.13 " ]] || { echo "$name exported as: $have"; exit 1; }
done
others=$(nm -D --defined-only "$lib" | awk '$2 != "T" && $2 != "A" { print }')
if [[ -n "$others" ]]; then
  echo "unexpected non-function exports:"; echo "$others"; exit 1
fi
echo "exports match the hook table: $(echo "$want" | wc -l) hooks (runtime: $(echo $runtime) under libcudart.so.12 and .13), dlsym/dlvsym as $versions"
