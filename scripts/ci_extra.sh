#!/usr/bin/env bash
# cuwarden: the reliability run CI adds to scripts/test.sh (issue 6), in order:
#   1. ASan + UBSan (presets asan, build-asan/): builds everything but bench/ and the nvcc-built
#      probes (no test runs them there), at -Og -g1 (CMakePresets.json says why), test programs
#      of several files as unity builds (CUWARDEN_UNITY_TESTS: the top-level CMakeLists.txt says
#      why); runs every test but those labelled nosan (packaging, scripts, source checks:
#      tests/CMakeLists.txt), ASAN_TEST_JOBS (default 4) at a time: under ASan the tests wait
#      more than they compute.
#   2. TSan (presets tsan, build-tsan/): builds only the targets of the tests it runs, the
#      concurrency tests: unit.*, interposer.cap, interposer.concurrency_nocap,
#      interposer.cache(_cap), the cache's adversarial churn / contexts / cap cases, ctx_gone,
#      daemon.* (the test preset's filter).
#   3. every libFuzzer target for FUZZ_SECONDS (default 5; the 30-minute runs are
#      bench/results/2026-12-06-fuzz-30-minutes.md) from its committed corpus
#      (preset fuzz, clang, build-fuzz/; scripts/fuzz.sh).
# The main build and ctest (build/) are scripts/test.sh's. Stops at the first failing step and
# says which. Prints each step's wall time and CPU time (user + sys of everything it ran).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

JOBS=${JOBS:-2}
# Extra ctest arguments for both sanitizer runs, e.g. CI_EXTRA_CTEST_ARGS='-E ^interposer\.'
read -r -a ctest_extra <<<"${CI_EXTRA_CTEST_ARGS:-}"
t0=$(date +%s)
# CPU seconds (user + sys) this shell's finished children have used: a step's CPU time, which
# unlike its wall time does not depend on what else runs on the machine.
cpu_s() {
  local f
  read -r -a f <<<"$(sed 's/.*) //' /proc/$$/stat)"  # the fields after the command's name
  echo $(( (f[13] + f[14]) / $(getconf CLK_TCK) ))  # cutime, cstime
}
step() {
  local name=$1
  shift
  local s c
  s=$(date +%s)
  c=$(cpu_s)
  echo "=== ci_extra: $name"
  if ! "$@"; then
    echo "=== ci_extra: $name FAILED after $(($(date +%s) - s)) s" >&2
    exit 1
  fi
  echo "=== ci_extra: $name ok in $(($(date +%s) - s)) s (CPU $(( $(cpu_s) - c )) s)"
}

step "asan: configure" cmake --preset asan
step "asan: build" cmake --build --preset asan -j "$JOBS"
step "asan: ctest" ctest --preset asan -j "${ASAN_TEST_JOBS:-4}" "${ctest_extra[@]}"
step "tsan: configure" cmake --preset tsan
step "tsan: build" cmake --build --preset tsan -j "$JOBS"
step "tsan: ctest" ctest --preset tsan -j "$JOBS" "${ctest_extra[@]}"
step "fuzz: ${FUZZ_SECONDS:-5} s per target" scripts/fuzz.sh "${FUZZ_SECONDS:-5}"
echo "=== ci_extra: all ok in $(($(date +%s) - t0)) s (CPU $(cpu_s) s)"
