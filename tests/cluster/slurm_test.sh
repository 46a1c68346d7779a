#!/usr/bin/env bash
# cuwarden test: the SPANK plugin (cluster/slurm) in a real Slurm on this machine. Starts
# munged, slurmctld and slurmd as root, without systemd, on a configuration of their own (own
# munge key and socket, ports, spool; proctrack/linuxproc, task/none, no accounting), and
# cuwardend on a run directory of its own; the tasks run on the simulated driver.
#   slurm_test.sh PLUGIN LIB PROBE DAEMON CLI
# Checks: `srun --gpu-mem-limit=64M` caps at the byte (and from sbatch), also a child that
# raises CUWARDEN_LIMIT (the plugin's root-owned ceiling file, removed at the job's end by its
# job epilog, scancel included); two tasks of one job share
# --gpu-mem-job-limit; `cuwarden` shows the job as slurm-<id>; at the job's end the daemon logs
# its peak per GPU and removes its job file; a cap past the site's maximum is refused by srun
# before the job starts, the maximum is the default of a job that asks for none, and a
# maximum lowered while a job waits holds that job at launch; a long LD_PRELOAD of the user's
# is kept; a job with gres/shards gets their memory as its job cap; the job's QOS sets its
# tasks' CUWARDEN_PRIORITY through qos_priority=; scancel of a running job
# leaves no ring behind; the TaskProlog alternative prints the same variables. Exit 77
# (skipped) when not root or Slurm is absent.
set -euo pipefail
PLUGIN=$1 LIB=$2 PROBE=$3 DAEMON=$4 CLI=$5

if [[ $(id -u) -ne 0 ]]; then echo "slurm_test: needs root (slurmd starts tasks as their user)"; exit 77; fi
for tool in munged slurmctld slurmd srun sinfo; do
  command -v "$tool" >/dev/null || { echo "slurm_test: $tool not installed (scripts/setup.sh)"; exit 77; }
done

T=$(mktemp -d /tmp/cuw-slurm-XXXXXX)
PIDS=()
cleanup() {
  exec 3>&- 2>/dev/null || true
  if [[ -n ${SLURM_CONF:-} ]]; then
    scancel --quiet --full --signal=KILL 2>/dev/null || true
    for i in $(seq 30); do [[ -z $(squeue -h 2>/dev/null) ]] && break; sleep 0.1; done
    # Everything this test started after exporting SLURM_CONF carries it, steps and tasks
    # that would outlive slurmd included; nothing else does.
    for d in /proc/[0-9]*; do
      p=${d#/proc/}
      [[ $p == "$$" || $p == "$BASHPID" ]] && continue
      if grep -qzx "SLURM_CONF=$SLURM_CONF" "$d/environ" 2>/dev/null; then kill -9 "$p" 2>/dev/null || true; fi
    done
  fi
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  if [[ ${KEEP:-0} != 1 ]]; then rm -rf "$T"; fi
}
trap cleanup EXIT
fail() {
  echo "slurm_test: FAIL (after ${SECONDS}s): $*"
  for f in "$T"/*.log; do echo "---- $f"; tail -n 20 "$f"; done
  exit 1
}

mkdir -p "$T/run" "$T/spool/ctld" "$T/spool/d" "$T/munge"
chmod 755 "$T/munge"   # munged wants its socket directory reachable by all
dd if=/dev/urandom of="$T/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$T/munge/munge.key"
MUNGE_SOCK=$T/munge/munge.sock
munged -F --force --key-file="$T/munge/munge.key" --socket="$MUNGE_SOCK" --pid-file="$T/munge/munged.pid" \
  --log-file="$T/munged.log" --seed-file="$T/munge/seed" >"$T/munged.out.log" 2>&1 &
PIDS+=($!)

# Ports of our own, away from a site's 6817/6818 and below the kernel's range for ephemeral
# ports (which other tests' connections take at any moment), both free when chosen.
read -r EPHEMERAL_LOW _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || EPHEMERAL_LOW=32768
(( EPHEMERAL_LOW > 12000 )) || EPHEMERAL_LOW=32768
port_free() {
  python3 -c 'import socket,sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)' "$1"
}
for _ in $(seq 50); do
  PORT=$((10000 + RANDOM % (EPHEMERAL_LOW - 10002)))
  port_free "$PORT" && port_free $((PORT + 1)) && break
done
NODE=cuwtest
cat >"$T/plugstack.conf" <<EOC
required $PLUGIN lib=$LIB run_dir=$T/run max=1G shard_size=16M qos_priority=normal:-5,high:10
EOC
cat >"$T/slurm.conf" <<EOC
ClusterName=cuwtest
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
CredType=cred/munge
StateSaveLocation=$T/spool/ctld
SlurmdSpoolDir=$T/spool/d
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
PlugStackConfig=$T/plugstack.conf
GresTypes=gpu,shard
SlurmdParameters=config_overrides
NodeName=$NODE NodeAddr=127.0.0.1 NodeHostname=$(hostname -s) CPUs=2 Gres=gpu:1,shard:4 State=UNKNOWN
PartitionName=test Nodes=$NODE Default=YES MaxTime=5 State=UP OverSubscribe=FORCE:2
EOC
# One GPU cut into 4 shards; /dev/null stands in for its device file (slurmd wants a
# character device; task/none fences nothing).
cat >"$T/gres.conf" <<EOC
NodeName=$NODE Name=gpu File=/dev/null
NodeName=$NODE Name=shard Count=4 File=/dev/null
EOC
export SLURM_CONF=$T/slurm.conf
for i in $(seq 300); do [[ -S $MUNGE_SOCK ]] && break; sleep 0.1; done
[[ -S $MUNGE_SOCK ]] || fail "munged did not start"

slurmctld -D -i -f "$SLURM_CONF" >"$T/slurmctld.out.log" 2>&1 &
PIDS+=($!)
slurmd -D -N "$NODE" -f "$SLURM_CONF" >"$T/slurmd.out.log" 2>&1 &
PIDS+=($!)
# --exited-linger 0: the daemon forgets an exited process, and removes its files, at once.
"$DAEMON" --run-dir "$T/run" --no-nvml --drain-interval-ms 50 --scan-interval-ms 100 --exited-linger 0 \
  >"$T/cuwardend.log" 2>&1 &
PIDS+=($!)
for i in $(seq 100); do
  kill -0 "${PIDS[1]}" 2>/dev/null || fail "slurmctld exited"
  state=$(timeout 5 sinfo -h -N -o %t 2>/dev/null || true)
  [[ $state == idle ]] && break
  sleep 0.2
done
[[ ${state:-} == idle ]] || fail "the node did not come up (state '${state:-}')"

SRUN=(srun --quiet -N1 -t 1)
# 1. The cap at the byte: 64 MiB fits, one byte more is refused.
out=$("${SRUN[@]}" --gpu-mem-limit=64M "$PROBE" bytes $((64 << 20)) 2>&1) || fail "64 MiB under a 64M cap: $out"
[[ $out == ok ]] || fail "64 MiB under a 64M cap printed '$out'"
if out=$("${SRUN[@]}" --gpu-mem-limit=64M "$PROBE" bytes $(((64 << 20) + 1)) 2>&1); then
  fail "64 MiB + 1 byte under a 64M cap was not refused: $out"
fi
[[ $out == *refused* ]] || fail "64 MiB + 1 byte: expected a refusal, got '$out'"
echo "slurm_test: [${SECONDS}s] --gpu-mem-limit=64M holds at the byte"

# The plugin wrote the job's cap, as root, where the task cannot change it; a child process
# that raises CUWARDEN_LIMIT is held to it and told so.
out=$("${SRUN[@]}" --gpu-mem-limit=64M bash -c 'f=$1/run/ceilings/slurm-$SLURM_JOB_ID
  echo "job=$SLURM_JOB_ID"; stat -c "%U %a" "$(dirname "$f")" "$f"; cat "$f"
  CUWARDEN_LIMIT=1G "$0" bytes $(((64 << 20) + 1))' "$PROBE" "$T" 2>&1) &&
  fail "a child's CUWARDEN_LIMIT=1G raised the job's 64M: $out"
# srun forwards the task's stdout and stderr apart: each part is looked for on its own.
for want in "root 755" "root 644" "CUWARDEN_LIMIT=64M" "CUWARDEN_LIMIT='1G' is refused: this Slurm job's ceiling"; do
  [[ $out == *"$want"* ]] || fail "the job's ceiling file: expected '$want' (root's 64M, a raise refused), got '$out'"
done
echo "slurm_test: [${SECONDS}s] the job's ceiling file is root's and holds a child's raise"
# At the job's end its ceiling file goes (the plugin's job epilog, which slurmd runs once the
# job has ended, after srun has returned).
ceiling_job=$(sed -n 's/^job=//p' <<<"$out")
[[ -n $ceiling_job ]] || fail "the task did not print its job id: $out"
ceiling_gone() { [[ ! -e $T/run/ceilings/slurm-$1 ]]; }
for i in $(seq 300); do ceiling_gone "$ceiling_job" && break; sleep 0.1; done
ceiling_gone "$ceiling_job" || fail "the ceiling file of job $ceiling_job is left after its end: $(ls -l "$T/run/ceilings")"
echo "slurm_test: [${SECONDS}s] at the job's end its ceiling file is removed"

# The same from sbatch: the option reaches the batch script's processes.
# (Polled here: sbatch -W polls at intervals of up to 10 s.)
sbatch --quiet -t 1 -o "$T/sbatch.out" --gpu-mem-limit=64M \
  --wrap "$PROBE bytes $(((64 << 20) + 1)); echo rc=\$?" >/dev/null 2>&1 || fail "sbatch failed"
for i in $(seq 600); do grep -q "rc=" "$T/sbatch.out" 2>/dev/null && break; sleep 0.1; done
grep -q "rc=2" "$T/sbatch.out" || fail "sbatch --gpu-mem-limit=64M: expected a refusal, got '$(cat "$T/sbatch.out")'"
echo "slurm_test: [${SECONDS}s] sbatch --gpu-mem-limit=64M holds too"

# 2. Two tasks of one job share its cap, and cuwarden shows the job as slurm-<id>. Task 0
# holds 60 MiB until released; task 1 asks for 60 MiB once cuwarden shows task 0's: 120 MiB >
# the job's 100M. Files order the steps, not sleeps: a busy machine only makes it slower.
"${SRUN[@]}" -n2 -J cuwshare --gpu-mem-job-limit=100M bash -c '
  if [[ $SLURM_PROCID == 0 ]]; then
    until [[ -e $1/release ]]; do sleep 0.1; done | "$0" hold 60; echo "task0 $?"
  else
    until [[ -e $1/go ]]; do sleep 0.1; done; "$0" alloc 60; echo "task1 $?"; touch "$1/release"
  fi' "$PROBE" "$T" >"$T/job.out" 2>&1 &
JOB_PID=$!
job=""
for i in $(seq 300); do
  job=$(squeue -h -n cuwshare -o %i 2>/dev/null | head -n1)
  [[ -n $job ]] && break
  sleep 0.1
done
[[ -n $job ]] || fail "the two-task job did not start"
seen=""
for i in $(seq 300); do
  seen=$(CUWARDEN_RUN_DIR=$T/run "$CLI" --query-compute-apps=pid,job,used_memory --format=csv,noheader 2>&1 || true)
  [[ $seen == *"slurm-$job"*"60 MiB"* ]] && break
  sleep 0.1
done
touch "$T/go"
[[ $seen == *"slurm-$job"* ]] || { touch "$T/release"; fail "cuwarden did not show job slurm-$job: $seen"; }
echo "slurm_test: [${SECONDS}s] two tasks of job $job share --gpu-mem-job-limit=100M; cuwarden shows slurm-$job"
wait "$JOB_PID" || true
grep -q "task0 0" "$T/job.out" || fail "task 0 did not hold 60 MiB: $(cat "$T/job.out")"
grep -q "task1 2" "$T/job.out" || fail "task 1 was not refused past the job's cap: $(cat "$T/job.out")"
echo "slurm_test: [${SECONDS}s] two tasks of job $job share --gpu-mem-job-limit=100M; cuwarden shows slurm-$job"
# Its end: the daemon logs the job's peak per GPU (task 0's 60 MiB) and removes its job file.
for i in $(seq 300); do grep -q "slurm-$job ended" "$T/cuwardend.log" && break; sleep 0.1; done
grep -q "job root/slurm-$job ended (no member left): GPU-[0-9a-f-]* peak 60.00 MiB (62914560 bytes); cap 100.00 MiB" \
  "$T/cuwardend.log" || fail "no end-of-job line with the peak: $(grep "slurm-$job" "$T/cuwardend.log")"
! compgen -G "$T/run/jobs/*/job-*-slurm-$job.cwj" >/dev/null || fail "the job file of slurm-$job is left: $(ls -R "$T/run")"
echo "slurm_test: [${SECONDS}s] at its end: $(grep -o "job root/slurm-$job ended.*" "$T/cuwardend.log")"

# 3. The site's maximum (max=1G in plugstack.conf): srun refuses before the job starts.
if out=$("${SRUN[@]}" --gpu-mem-limit=2G true 2>&1); then fail "a cap past the site's maximum was accepted"; fi
[[ $out == *"more than this site's maximum"* ]] || fail "past the maximum: expected the plugin's message, got '$out'"
echo "slurm_test: [${SECONDS}s] a cap past the site's maximum is refused by srun"
out=$("${SRUN[@]}" printenv CUWARDEN_LIMIT 2>&1) || fail "srun printenv: $out"
[[ $out == 1073741824 ]] || fail "a job that asked for no cap got CUWARDEN_LIMIT='$out', not the site's maximum"
echo "slurm_test: [${SECONDS}s] the site's maximum is the cap of a job that asks for none"

# A user's own preloads stay after ours, however long (here past 4 KiB).
long=$(printf '/lib/x86_64-linux-gnu/libc.so.6:%.0s' $(seq 150))
out=$(LD_PRELOAD=${long%:} "${SRUN[@]}" printenv LD_PRELOAD 2>/dev/null) || fail "srun with a long LD_PRELOAD failed"
[[ $out == "$LIB:${long%:}" ]] || fail "LD_PRELOAD of ${#long} bytes came back as ${#out} bytes: ${out:0:200}"
echo "slurm_test: [${SECONDS}s] a ${#long}-byte LD_PRELOAD of the user's is kept behind ours"

# A maximum lowered while a job waits: the job runs, held to the new maximum.
held=$(sbatch --parsable -H -t 1 -o "$T/held.out" --gpu-mem-limit=1G --wrap 'echo "limit=$CUWARDEN_LIMIT"' 2>&1) ||
  fail "sbatch -H failed: $held"
sed -i 's/max=1G/max=512M/' "$T/plugstack.conf"
scontrol release "$held"
for i in $(seq 150); do grep -q "limit=" "$T/held.out" 2>/dev/null && break; sleep 0.1; done
grep -qx "limit=536870912" "$T/held.out" || fail "the held job after the maximum went down: '$(cat "$T/held.out" 2>&1)'"
sed -i 's/max=512M/max=1G/' "$T/plugstack.conf"
echo "slurm_test: [${SECONDS}s] a job queued under max=1G and started under max=512M runs capped at 512M"

# gres/shard: a job holding 2 of the GPU's 4 shards gets 2 * shard_size (16M) as its job cap,
# and a job cap asked above that is lowered to it.
out=$("${SRUN[@]}" --gres=shard:2 printenv SLURM_SHARDS_ON_NODE CUWARDEN_JOB_LIMIT 2>&1) || fail "srun --gres=shard:2: $out"
[[ $out == $'2\n33554432' ]] || fail "with 2 shards of 16M: '$out'"
out=$("${SRUN[@]}" --gres=shard:2 --gpu-mem-job-limit=100M printenv CUWARDEN_JOB_LIMIT 2>&1) || fail "$out"
[[ $out == 33554432 ]] || fail "a job cap above the shards' memory: '$out'"
out=$("${SRUN[@]}" --gres=shard:2 "$PROBE" bytes $(((32 << 20) + 1)) 2>&1) && fail "32 MiB + 1 under 2 shards: $out"
echo "slurm_test: [${SECONDS}s] 2 of 4 shards at shard_size=16M: the job's cap is 32 MiB"

# The job's QOS to its tasks' priority (qos_priority=normal:-5,high:10 in plugstack.conf): the
# table's, or the task's own when lower. This Slurm runs without accounting, so it gives a job
# no QOS; SLURM_JOB_QOS in the submitting environment reaches the task as Slurm's own would.
show='echo "${SLURM_JOB_QOS-none} ${CUWARDEN_PRIORITY-unset}"'
out=$("${SRUN[@]}" bash -c "$show" 2>&1) || fail "srun: $out"
[[ $out == "none unset" ]] || fail "a job with no QOS got '$out'"
out=$(SLURM_JOB_QOS=high "${SRUN[@]}" bash -c "$show" 2>&1) || fail "srun: $out"
[[ $out == "high 10" ]] || fail "QOS high: '$out'"
out=$(SLURM_JOB_QOS=normal "${SRUN[@]}" bash -c "$show" 2>&1) || fail "srun: $out"
[[ $out == "normal -5" ]] || fail "QOS normal: '$out'"
out=$(SLURM_JOB_QOS=high CUWARDEN_PRIORITY=3 "${SRUN[@]}" bash -c "$show" 2>&1) || fail "srun: $out"
[[ $out == "high 3" ]] || fail "QOS high, asking for 3: '$out'"
out=$(SLURM_JOB_QOS=normal CUWARDEN_PRIORITY=50 "${SRUN[@]}" bash -c "$show" 2>&1) || fail "srun: $out"
[[ $out == "normal -5" ]] || fail "QOS normal, asking for 50: '$out'"
out=$(SLURM_JOB_QOS=debug CUWARDEN_PRIORITY=7 "${SRUN[@]}" bash -c "$show" 2>&1) || fail "srun: $out"
[[ $out == "debug 7" ]] || fail "a QOS the table does not name: '$out'"
echo "slurm_test: [${SECONDS}s] qos_priority: QOS high runs at 10, normal at -5, a task may ask for less"

# 4. scancel of a running job: its process is killed, and its ring and live segment go with it.
# The task holds its memory until its stdin closes: a FIFO this script keeps open.
mkfifo "$T/hold.fifo"
"${SRUN[@]}" -J cuwcancel --gpu-mem-limit=64M "$PROBE" hold 16 <"$T/hold.fifo" >"$T/cancel.out" 2>&1 &
HOLD_PID=$!
exec 3>"$T/hold.fifo"
for i in $(seq 50); do compgen -G "$T/run/ring-*" >/dev/null && break; sleep 0.1; done
compgen -G "$T/run/ring-*" >/dev/null || fail "the job to cancel made no ring"
scancel -n cuwcancel
wait "$HOLD_PID" || true  # srun returns once the step has ended
exec 3>&-
left() { compgen -G "$T/run/ring-*" || compgen -G "$T/run/live-*"; }
for i in $(seq 50); do left >/dev/null || break; sleep 0.1; done
if left >/dev/null; then fail "files left after scancel: $(ls "$T/run")"; fi
echo "slurm_test: [${SECONDS}s] scancel leaves no ring in the run directory (left: $(ls "$T/run" | tr '\n' ' '))"
# Every job has ended by now, the cancelled one included: no ceiling file is left.
for i in $(seq 300); do [[ -z $(ls -A "$T/run/ceilings") ]] && break; sleep 0.1; done
[[ -z $(ls -A "$T/run/ceilings") ]] || fail "ceiling files left after their jobs: $(ls -l "$T/run/ceilings")"
echo "slurm_test: [${SECONDS}s] no ceiling file is left once every job has ended, scancel included"

# 5. The TaskProlog alternative, as slurmstepd runs it: the job's variables, the user's cap kept.
PROLOG=$(dirname "$0")/../../cluster/slurm/cuwarden-taskprolog.sh
out=$(env -i SLURM_JOB_ID=42 CUWARDEN_SLURM_LIB="$LIB" CUWARDEN_SLURM_DEFAULT=16G sh "$PROLOG")
want="export LD_PRELOAD=$LIB
export CUWARDEN_JOB=slurm-42
export CUWARDEN_LIMIT=16G"
[[ $out == "$want" ]] || fail "TaskProlog printed '$out'"
out=$(env -i SLURM_JOB_ID=42 CUWARDEN_SLURM_LIB="$LIB" CUWARDEN_SLURM_DEFAULT=16G CUWARDEN_LIMIT=8G sh "$PROLOG")
[[ $out != *CUWARDEN_LIMIT* ]] || fail "TaskProlog overrode the user's cap: '$out'"
echo "slurm_test: [${SECONDS}s] the TaskProlog prints the job's variables"
echo "slurm_test: PASS in ${SECONDS}s"
