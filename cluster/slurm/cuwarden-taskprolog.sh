#!/bin/sh
# cuwarden for Slurm sites that load no SPANK plugin: a TaskProlog (slurm.conf:
# TaskProlog=/path/cuwarden-taskprolog.sh). Slurm runs it as the job's user before each task
# and adds the variables of the `export NAME=value` lines it prints to the task.
#
# Each task gets the library preloaded and the job name slurm-<jobid>, so that the tasks of a
# job share CUWARDEN_JOB_LIMIT. Users give caps through the environment srun passes on
# (CUWARDEN_LIMIT=8G srun ...); the site's default below applies when they give none. A
# TaskProlog cannot refuse a cap: maxima belong in cuwardend's policy (max_limit,
# max_job_limit in /etc/cuwarden/cuwarden.toml).
#
# Site settings: edit here, or set them in slurm.conf's TaskProlog environment.
CUWARDEN_SLURM_LIB=${CUWARDEN_SLURM_LIB:-/usr/lib/x86_64-linux-gnu/cuwarden/libcuwarden.so}
CUWARDEN_SLURM_DEFAULT=${CUWARDEN_SLURM_DEFAULT:-}          # e.g. 16G; empty: no cap unless asked
CUWARDEN_SLURM_JOB_DEFAULT=${CUWARDEN_SLURM_JOB_DEFAULT:-}  # e.g. 64G
CUWARDEN_SLURM_SHARD_SIZE=${CUWARDEN_SLURM_SHARD_SIZE:-}    # GPU memory of one gres/shard, e.g. 10G

[ -n "${SLURM_JOB_ID:-}" ] || exit 0
case ":${LD_PRELOAD:-}:" in
  *":$CUWARDEN_SLURM_LIB:"*) ;;
  *) echo "export LD_PRELOAD=$CUWARDEN_SLURM_LIB${LD_PRELOAD:+:$LD_PRELOAD}" ;;
esac
echo "export CUWARDEN_JOB=slurm-$SLURM_JOB_ID"
if [ -z "${CUWARDEN_LIMIT:-}" ] && [ -n "$CUWARDEN_SLURM_DEFAULT" ]; then
  echo "export CUWARDEN_LIMIT=$CUWARDEN_SLURM_DEFAULT"
fi
# A job holding gres/shards gets their memory as its job cap (per GPU), when it gave none.
shards=${SLURM_SHARDS_ON_NODE:-}
case $shards in *[!0-9]*) shards= ;; esac  # a count, or nothing (never an expression)
if [ -z "${CUWARDEN_JOB_LIMIT:-}" ] && [ -n "$CUWARDEN_SLURM_SHARD_SIZE" ] && [ -n "$shards" ]; then
  n=${CUWARDEN_SLURM_SHARD_SIZE%[KMGT]}
  case $CUWARDEN_SLURM_SHARD_SIZE in
    *K) n=$((n << 10)) ;; *M) n=$((n << 20)) ;; *G) n=$((n << 30)) ;; *T) n=$((n << 40)) ;;
  esac
  echo "export CUWARDEN_JOB_LIMIT=$((shards * n))"
elif [ -z "${CUWARDEN_JOB_LIMIT:-}" ] && [ -n "$CUWARDEN_SLURM_JOB_DEFAULT" ]; then
  echo "export CUWARDEN_JOB_LIMIT=$CUWARDEN_SLURM_JOB_DEFAULT"
fi
exit 0
