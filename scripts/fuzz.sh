#!/usr/bin/env bash
# cuwarden: build the libFuzzer targets (CMake preset `fuzz`: clang, ASan + UBSan) and run
# each for SECONDS (default 10, the CI smoke run; pass more for a real campaign), FUZZ_JOBS
# (default: the number of CPUs) at a time.
#   scripts/fuzz.sh [SECONDS] [TARGET ...]
# Seeds: tests/fuzz/corpus/<target>/ (committed, read only). What the fuzzer finds is kept
# in build-fuzz/fuzz/corpus/<target>/; crashes in build-fuzz/fuzz/artifacts/<target>/.
# Exit status: 0 when every target ran its time without a crash, leak, timeout or OOM.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

secs=${1:-10}
shift || true
all_targets=(fuzz_ring fuzz_daemon_ring fuzz_server fuzz_http fuzz_recv_message fuzz_size fuzz_env fuzz_live fuzz_oom_store fuzz_job_file fuzz_policy fuzz_modules)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")

command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ not found (apt-get install clang libclang-rt-14-dev)" >&2; exit 1; }

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target "${targets[@]}" cuw_fuzz_seeds

out=build-fuzz/fuzz
# The daemon targets write ring files and a socket: a private tmpfs directory.
scratch=$(mktemp -d "${FUZZ_TMPDIR:-/dev/shm}/cuwfuzz.XXXXXX" 2>/dev/null || mktemp -d)
trap 'rm -rf "$scratch"' EXIT

max_len() {
  case "$1" in
    fuzz_ring|fuzz_daemon_ring) echo 40000 ;;   # header (16 KiB) + some slots
    fuzz_live) echo 20000 ;;                     # header (4 KiB) + a table and a log
    fuzz_oom_store) echo 20000 ;;                # a report with a few sites and events
    fuzz_job_file) echo 16384 ;;                 # flags + header + 64 members (the rest padded with 0)
    fuzz_policy) echo 4096 ;;                    # a policy file with a few sections
    fuzz_modules) echo 32768 ;;                  # a modules log, request or reply; a small ELF file
    fuzz_server|fuzz_recv_message|fuzz_http) echo 8192 ;;
    *) echo 512 ;;
  esac
}

run_one() {
  local t=$1 log="$out/logs/$1.log" rc=0
  TMPDIR="$scratch" ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1" \
    "$out/bin/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len="$(max_len "$t")" \
    -print_final_stats=1 -artifact_prefix="$out/artifacts/$t/" \
    "$out/corpus/$t" "tests/fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  echo "$rc" >"$out/logs/$t.rc"
}

jobs=${FUZZ_JOBS:-$(nproc)}
for t in "${targets[@]}"; do
  mkdir -p "$out/corpus/$t" "$out/artifacts/$t" "$out/logs"
  rm -f "$out/logs/$t.rc"
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  run_one "$t" &
done
wait

status=0
printf '%-20s %10s %8s %s\n' target executions corpus result
for t in "${targets[@]}"; do
  log="$out/logs/$t.log"
  rc=$(cat "$out/logs/$t.rc" 2>/dev/null || echo 1)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  corpus=$(ls "$out/corpus/$t" | wc -l)
  if [ "$rc" -eq 0 ]; then
    printf '%-20s %10s %8s ok\n' "$t" "${execs:-?}" "$corpus"
  else
    printf '%-20s %10s %8s FAILED (exit %d; log %s)\n' "$t" "${execs:-?}" "$corpus" "$rc" "$log"
    grep -E "ERROR|SUMMARY|runtime error|Test unit written" "$log" | head -20 >&2 || true
    status=1
  fi
done
exit $status
