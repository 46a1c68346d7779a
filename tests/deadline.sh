#!/bin/bash
# cuwarden tests: the launcher of every ctest test (tests/deadline.cmake sets it). It runs
# the test and, if the test is still running 15 s before ctest's TIMEOUT would kill it
# without a word, prints `thread apply all bt` (gdb) for the test and every process it
# started, then kills them all: a hang leaves its stacks in the test's output.
#
#   deadline.sh [--timeout=SECONDS] COMMAND [ARG...]
#
# The timeout is the test's ctest TIMEOUT: --timeout= (catch_discover_tests' tests), else
# CUW_TEST_TIMEOUT (add_test's tests), else ctest's default of 1500 s. The deadline is 15 s
# under it (half of it for timeouts under 30 s); CUW_TEST_DEADLINE=SECONDS overrides it (the
# self-test). Exit status: the test's, or 124 after a deadline.
#
# Cheap on purpose: one bash and one sleeping watchdog per test, a few milliseconds. The test
# runs in its own process group (job control), so processes it started are found by group as
# well as by parent, even after their parent exits.
#
# gdb attaches with ptrace: as root (CI, this project's machines) always; as another user
# where Yama's ptrace_scope is 1 (Ubuntu's default) it may not, since gdb is not the test's
# ancestor: the dump then says "ptrace: Operation not permitted" and the kernel's wait
# channel of each process is all there is (kernel.yama.ptrace_scope=0 allows it).
set -m

timeout=${CUW_TEST_TIMEOUT:-1500}
if [[ $1 == --timeout=* ]]; then
  timeout=${1#--timeout=}
  shift
fi
if [[ -n $CUW_TEST_DEADLINE ]]; then
  deadline=$CUW_TEST_DEADLINE
elif ((timeout >= 30)); then
  deadline=$((timeout - 15))
else
  deadline=$((timeout / 2))
fi
# Seconds the stack dump may take in all before the tree is killed (ctest's own kill
# comes 15 s after the deadline).
dump_budget=${CUW_TEST_DUMP_SECONDS:-12}

# The pids of process group $1 and of every descendant of $1, the test first.
tree_of() {
  local root=$1 pid stat rest ppid pgrp
  local -A parent=() group=()
  for stat in /proc/[0-9]*/stat; do
    pid=${stat#/proc/}
    pid=${pid%/stat}
    read -r rest 2>/dev/null <"$stat" || continue
    rest=${rest##*) }  # after the command name, which may hold spaces and parentheses
    read -r _ ppid pgrp _ <<<"$rest"
    parent[$pid]=$ppid
    group[$pid]=$pgrp
  done
  local -a out=("$root")
  local -A seen=([$root]=1)
  local changed=1
  while ((changed)); do
    changed=0
    for pid in "${!parent[@]}"; do
      [[ -n ${seen[$pid]} ]] && continue
      if [[ -n ${seen[${parent[$pid]}]} || ${group[$pid]} == "$root" ]]; then
        seen[$pid]=1
        out+=("$pid")
        changed=1
      fi
    done
  done
  for pid in "${out[@]}"; do
    [[ -d /proc/$pid ]] && echo "$pid"
  done
}

on_deadline() {
  local root=$1 started=$SECONDS pid i=0
  local -a pids
  mapfile -t pids < <(tree_of "$root")
  {
    echo
    echo "deadline.sh: the test ran past its deadline (${deadline} s; ctest TIMEOUT ${timeout} s):"
    echo "deadline.sh: stacks of its ${#pids[@]} process(es), then killing them all"
    for pid in "${pids[@]}"; do
      echo "deadline.sh:   pid $pid ($(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-200))"
    done
  } >&2
  local dir
  dir=$(mktemp -d) || dir=/tmp
  # Four gdbs at a time, each one bounded by what is left of the budget.
  for pid in "${pids[@]}"; do
    local left=$((dump_budget - (SECONDS - started)))
    ((left < 1)) && break
    timeout -k 1 "$left" gdb -batch -nx -iex 'set debuginfod enabled off' -p "$pid" \
      -ex 'set pagination off' -ex 'thread apply all bt' >"$dir/$pid" 2>&1 </dev/null &
    if ((++i % 4 == 0)); then wait; fi
  done
  wait
  for pid in "${pids[@]}"; do
    echo "===== deadline.sh: pid $pid: $(cat "/proc/$pid/comm" 2>/dev/null) ====="
    if [[ -s $dir/$pid ]]; then
      grep -v '^\[New LWP\|^\[Thread debugging\|^Using host libthread_db' "$dir/$pid"
      grep -q 'ptrace: Operation not permitted' "$dir/$pid" &&
        echo "(kernel wait channel: $(cat "/proc/$pid/wchan" 2>/dev/null))"
    else
      echo "(no stacks: the budget of ${dump_budget} s ran out; kernel wait channel:" \
        "$(cat "/proc/$pid/wchan" 2>/dev/null))"
    fi
  done >&2
  [[ $dir != /tmp ]] && rm -rf "$dir"
  kill -KILL -- "-$root" 2>/dev/null
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  echo "deadline.sh: killed the test's processes" >&2
}

"$@" &
test_pid=$!
# ctest or a user interrupting us stops the test too.
trap 'kill -TERM -- "-$test_pid" 2>/dev/null; exit 130' INT
trap 'kill -TERM -- "-$test_pid" 2>/dev/null; exit 143' TERM HUP

# The watchdog: its own process group (job control), so that killing the group takes its
# sleep too, and no sleeping process keeps ctest's pipe open after the test ends.
(
  trap - INT TERM HUP
  sleep "$deadline" >/dev/null 2>&1 </dev/null
  [[ -d /proc/$test_pid ]] && on_deadline "$test_pid"
) &
watchdog=$!

wait "$test_pid"
rc=$?
if ((SECONDS < deadline)); then
  # The watchdog is still asleep: the test ended on its own.
  kill -KILL -- "-$watchdog" 2>/dev/null
  wait "$watchdog" 2>/dev/null
  exit "$rc"
fi
wait "$watchdog" 2>/dev/null
((rc == 137)) && exit 124  # killed by the watchdog
exit "$rc"
