#!/usr/bin/env bash
# cuwarden: the whole test run, as CI does it: install what is missing, build, run ctest
# (unit, simulated-driver, daemon, storm and security tests, and the callgrind guard).
# With --all, or when CI is set (CI=true), it then runs scripts/ci_extra.sh: the whole suite
# again under ASan + UBSan, the concurrency tests under TSan, and each libFuzzer target for
# a few seconds (about 20 minutes more on 2 cores).
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

start=$(date +%s)
scripts/setup.sh
scripts/build.sh
ctest --preset default
echo "test.sh: build and ctest took $(( $(date +%s) - start )) s"
if (( all )); then
  scripts/ci_extra.sh
  echo "test.sh: everything took $(( $(date +%s) - start )) s"
fi
