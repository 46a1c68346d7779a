#!/usr/bin/env bash
# cuwarden bench: what preloading libcuwarden.so costs a program that never uses CUDA
# (start-up of the library: constructor, symbol binding). Median wall time of N runs of
# each command, bare and preloaded, interleaved. Prints a markdown table.
#   bench/preload_cost.sh [BUILD_DIR] [N]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build}; n=${2:-200}
lib=$(cd "$build/lib" && pwd)/libcuwarden.so
[[ -f $lib ]] || { echo "missing $lib" >&2; exit 1; }
median_us() {  # median_us PRELOAD(0|1) COMMAND...: median wall microseconds of n runs
  local pre=$1; shift
  python3 - "$pre" "$n" "$lib" "$@" <<'PY'
import os, statistics, subprocess, sys, time
pre, n, lib, cmd = sys.argv[1] == "1", int(sys.argv[2]), sys.argv[3], sys.argv[4:]
env = dict(os.environ)
env.pop("LD_PRELOAD", None)
if pre:
    env.update(LD_PRELOAD=lib, CUWARDEN_LIMIT="1G", CUWARDEN_RUN_DIR="/nonexistent/cuwarden-bench")
times = []
for _ in range(n):
    t = time.perf_counter_ns()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    times.append((time.perf_counter_ns() - t) / 1000)
print(f"{statistics.median(times):.0f}")
PY
}
echo "| command | bare (median µs) | preloaded (median µs) | added (µs) |"
echo "| --- | --- | --- | --- |"
for cmd in "/bin/true" "/usr/bin/env python3 -c pass"; do
  # shellcheck disable=SC2086
  a=$(median_us 0 $cmd); b=$(median_us 1 $cmd); a2=$(median_us 0 $cmd); b2=$(median_us 1 $cmd)
  bare=$(( (a + a2) / 2 )); pre=$(( (b + b2) / 2 ))
  echo "| \`$cmd\` | $bare | $pre | $(( pre - bare )) |"
done
