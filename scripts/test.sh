#!/usr/bin/env bash
# cuwarden: the whole test run, as CI does it (.ci/run). What runs where:
#   1. scripts/setup.sh: install the packages that are missing (apt) and check the CUDA toolkit.
#   2. scripts/build.sh: preset default (RelWithDebInfo, build/): everything, benchmarks and
#      the nvcc-built probes included.
#   3. ctest --preset default, three tests at a time: every test (unit, simulated driver,
#      interposer, daemon, CLI, workloads, storm and security, packaging, scripts and docs, the
#      callgrind guard).
# With --all, or when CI is set (CI=true), it then runs scripts/ci_extra.sh: the suite again
# under ASan + UBSan and the concurrency tests under TSan (each leaving out the tests labelled
# nosan, see tests/CMakeLists.txt), then each libFuzzer target for a few seconds. On 2 cores
# steps 2-3 take about 6 minutes, ci_extra.sh about 12 more.
# Exit status: the first failing step's. GPU checks are not here: they need a real GPU
# (tests/gpu/run.sh, tests/gpu/compat.sh, bench/gpu.sh).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

all=0
[[ ${1:-} == --all || ${CI:-} == true ]] && all=1

# CI's throwaway machine: the package test also installs, uses and removes the .deb.
if [[ ${CI:-} == true && $(id -u) == 0 ]] && ! dpkg-query -W cuwarden >/dev/null 2>&1; then
  export CUWARDEN_TEST_DPKG=1
fi

# CPU seconds (user + sys) of this shell's finished children, as scripts/ci_extra.sh prints them.
cpu_s() {
  local f
  read -r -a f <<<"$(sed 's/.*) //' /proc/$$/stat)"  # the fields after the command's name
  echo $(( (f[13] + f[14]) / $(getconf CLK_TCK) ))  # cutime, cstime
}

start=$(date +%s)
scripts/setup.sh
b=$(date +%s) c=$(cpu_s)
scripts/build.sh
echo "test.sh: build took $(( $(date +%s) - b )) s (CPU $(( $(cpu_s) - c )) s)"
b=$(date +%s) c=$(cpu_s)
ctest --preset default
echo "test.sh: ctest took $(( $(date +%s) - b )) s (CPU $(( $(cpu_s) - c )) s)"
echo "test.sh: setup, build and ctest took $(( $(date +%s) - start )) s"
if (( all )); then
  scripts/ci_extra.sh
  echo "test.sh: everything took $(( $(date +%s) - start )) s"
fi
