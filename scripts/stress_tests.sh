#!/usr/bin/env bash
# cuwarden: the test suite on a loaded machine. Runs ctest once without load (to learn which
# tests run and which skip there), then N times beside a CPU load of twice the cores (busy
# loops this script starts, and stops on any exit), and lists every test that failed in any
# run, and every test that skipped under load but ran without it (a failure too: a test that
# gives up when the machine is busy hides what it tests).
#
#   scripts/stress_tests.sh [--build-dir DIR] [--no-baseline] N [CTEST ARGS...]
#
# CTEST ARGS go to every ctest run (e.g. -R '^storm\.' or -L storm for a subset, -j2);
# without -j the suite runs two tests at a time, as `ctest --preset default` does.
# --no-baseline skips the unloaded run (then no skip can be compared). Each run's JUnit file
# and log are kept in DIR/stress/. Exit status: 0 when no test failed or skipped under load
# only, 1 otherwise, 2 for bad arguments.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=build
baseline=1
runs=""
ctest_args=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --build-dir) build=$2; shift 2 ;;
    --no-baseline) baseline=0; shift ;;
    *)
      if [[ -z $runs ]]; then runs=$1; else ctest_args+=("$1"); fi
      shift ;;
  esac
done
if ! [[ $runs =~ ^[1-9][0-9]*$ ]]; then
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
[[ " ${ctest_args[*]} " == *" -j"* || " ${ctest_args[*]} " == *" --parallel"* ]] || ctest_args+=(-j2)
[[ -f $build/CTestTestfile.cmake ]] || { echo "stress_tests.sh: no test tree in $build (build first)" >&2; exit 2; }

out=$(cd "$build" && pwd)/stress
rm -rf "$out"
mkdir -p "$out"
cores=$(nproc)
load_pids=()

stop_load() {
  local pid
  for pid in "${load_pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${load_pids[@]}"; do wait "$pid" 2>/dev/null; done
  load_pids=()
}
start_load() {
  local i
  for ((i = 0; i < 2 * cores; i++)); do
    (while :; do :; done) &
    load_pids+=($!)
  done
}
trap stop_load EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

run_ctest() {  # run_ctest NAME: one ctest run, its JUnit file and log under $out
  local name=$1 start=$SECONDS
  ctest --test-dir "$build" --output-on-failure --output-junit "$out/$name.xml" "${ctest_args[@]}" \
    >"$out/$name.log" 2>&1
  echo "stress_tests.sh: $name: $(grep -E 'tests passed|No tests were found' "$out/$name.log" | tail -1) ($((SECONDS - start)) s)"
}

if ((baseline)); then
  run_ctest unloaded
fi
echo "stress_tests.sh: load: $((2 * cores)) busy loops on $cores cores"
start_load
for ((r = 1; r <= runs; r++)); do
  run_ctest "loaded-$r"
done
stop_load

python3 - "$out" "$runs" "$baseline" <<'EOF'
import glob, os, sys
import xml.etree.ElementTree as ET

out, runs, baseline = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"

def results(path):
    """{test: (status, seconds)}: status is passed, failed or skipped."""
    r = {}
    if not os.path.exists(path):
        return r
    for tc in ET.parse(path).getroot().iter("testcase"):
        status = "passed"
        if tc.find("failure") is not None or tc.find("error") is not None or tc.get("status") == "fail":
            status = "failed"
        elif tc.find("skipped") is not None or tc.get("status") in ("disabled", "notrun"):
            status = "skipped"
        r[tc.get("name")] = (status, float(tc.get("time") or 0))
    return r

unloaded = results(os.path.join(out, "unloaded.xml")) if baseline else {}
loaded = [results(os.path.join(out, f"loaded-{i}.xml")) for i in range(1, runs + 1)]
bad = 0
failed = {}
for i, res in enumerate(loaded, 1):
    if not res:
        print(f"run {i}: no results (ctest did not run)")
        bad += 1
    for name, (status, _) in res.items():
        if status == "failed":
            failed.setdefault(name, []).append(i)
if baseline:
    for name, (status, _) in unloaded.items():
        if status == "failed":
            failed.setdefault(name, []).append("unloaded")
skipped = {}
for name, (status, _) in unloaded.items():
    if status == "passed":
        under = [i for i, res in enumerate(loaded, 1) if res.get(name, ("", 0))[0] == "skipped"]
        if under:
            skipped[name] = under
for name in sorted(failed):
    print(f"FAILED  {name}: in run(s) {', '.join(map(str, failed[name]))}")
for name in sorted(skipped):
    print(f"SKIPPED {name}: under load in run(s) {', '.join(map(str, skipped[name]))}, ran unloaded")
bad += len(failed) + len(skipped)
times = [(t, name, i) for i, res in enumerate(loaded, 1) for name, (_, t) in res.items()]
tests = len(set().union(*[set(r) for r in loaded])) if loaded else 0
slowest = max(times) if times else (0, "-", 0)
print(f"stress_tests.sh: {runs} loaded run(s) of {tests} test(s)" + (" after one unloaded run" if baseline else "") +
      f"; slowest under load: {slowest[1]} ({slowest[0]:.1f} s, run {slowest[2]}); "
      + ("no failure" if not bad else f"{len(failed)} test(s) failed, {len(skipped)} skipped under load only"))
sys.exit(1 if bad else 0)
EOF
