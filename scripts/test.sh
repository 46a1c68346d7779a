#!/usr/bin/env bash
# cuwarden: the whole test run, as CI does it: install what is missing, build, run ctest.
# Exit status: ctest's (or the first failing step's). GPU checks are not here:
# they need a real GPU (tests/gpu/run.sh).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh
scripts/build.sh
ctest --preset default
