#!/bin/bash
# cuwarden tests: tests/deadline.sh, the launcher of every test. A test that hangs
# (hang_app: two threads, a child, an orphaned grandchild) leaves the stacks of all four
# blocked functions, is killed with everything it started, and ends with 124; a test that
# ends on its own keeps its output and exit status.
#   check_deadline.sh LAUNCHER HANG_APP
set -u
launcher=$1 app=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() {  # check DESCRIPTION COMMAND...
  if "${@:2}"; then echo "ok: $1"; else echo "FAILED: $1"; fail=1; fi
}

CUW_TEST_DEADLINE=1 "$launcher" "$app" "$tmp/pids" >"$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
check "a hung test ends with 124 (got $rc)" test "$rc" = 124
check "its own output is kept" grep -q '^hanging$' "$tmp/out"
for fn in cuwt_hang_in_main cuwt_hang_in_thread cuwt_hang_in_child cuwt_hang_orphan; do
  check "the stacks show $fn" grep -q " in $fn " "$tmp/out"
done
check "every thread of the test is shown" grep -q '^Thread 2 ' "$tmp/out"
# Gone: no process left, or only a zombie waiting for a parent that does not reap.
for pid in $(cat "$tmp/pids"); do
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)
  check "pid $pid was killed (state '${state:-gone}')" test "${state:-Z}" = Z
done

"$launcher" --timeout=60 sh -c 'echo to-stdout; echo to-stderr >&2; exit 7' >"$tmp/o" 2>"$tmp/e"
rc=$?
check "a test's exit status passes through (7, got $rc)" test "$rc" = 7
check "its stdout passes through" grep -qx to-stdout "$tmp/o"
check "its stderr passes through" grep -qx to-stderr "$tmp/e"
# A test that starts a process that outlives it: the launcher returns at once all the same
# (no watchdog or leftover holds ctest's pipe; ctest would wait for the pipe to close).
start=$SECONDS
out=$("$launcher" true | cat)
check "the launcher returns at once when the test ends (took $((SECONDS - start)) s)" test $((SECONDS - start)) -lt 30
exit $fail
