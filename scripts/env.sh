# cuwarden: use a build of this checkout without installing it. Source it (bash or zsh):
#
#   source scripts/env.sh
#
# Puts the build's bin/ first on PATH (cuwarden, cuwardend, and cuw_demo_workload, a
# training-like program to try them on). On a machine without a GPU it also points CUDA
# programs at cuwarden's simulated driver (one 16 GiB GPU), as the demo and the tests do.
#   CUWARDEN_BUILD_DIR=DIR   another build (default: build/ of this checkout)
#   CUWARDEN_SIMULATE=1|0    the simulated driver even with a GPU | never (default: when no GPU)
# Then, in two shells:  cuwardend     and     cuwarden run --limit 2G -- cuw_demo_workload ; cuwarden

_cuw_repo=$(cd "$(dirname "${BASH_SOURCE[0]:-${(%):-%x}}")/.." && pwd)
_cuw_build=${CUWARDEN_BUILD_DIR:-$_cuw_repo/build}
case $_cuw_build in /*) ;; *) _cuw_build=$PWD/$_cuw_build ;; esac

if [ ! -x "$_cuw_build/bin/cuwarden" ] || [ ! -e "$_cuw_build/lib/libcuwarden.so" ]; then
  echo "cuwarden: no build in $_cuw_build (scripts/build.sh makes one)" >&2
  unset _cuw_repo _cuw_build
  return 1 2>/dev/null || exit 1
fi
case ":$PATH:" in *":$_cuw_build/bin:"*) ;; *) export PATH="$_cuw_build/bin:$PATH" ;; esac

_cuw_sim=${CUWARDEN_SIMULATE:-}
if [ -z "$_cuw_sim" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    _cuw_sim=0
  else
    _cuw_sim=1
  fi
fi
if [ "$_cuw_sim" = 1 ]; then
  if [ ! -e "$_cuw_build/fakecuda/libcuda.so.1" ]; then
    echo "cuwarden: no simulated driver in $_cuw_build/fakecuda (it is built with the tests)" >&2
  else
    case ":${LD_LIBRARY_PATH:-}:" in
      *":$_cuw_build/fakecuda:"*) ;;
      *) export LD_LIBRARY_PATH="$_cuw_build/fakecuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
    esac
    export CUWARDEN_FAKE_DEVICES=${CUWARDEN_FAKE_DEVICES:-1} CUWARDEN_FAKE_MEMORY=${CUWARDEN_FAKE_MEMORY:-16G}
    # One simulated GPU for every process of this user, as a real one is shared: its used
    # memory (the simulated NVML) and `cuwarden suspend` work across processes.
    export CUWARDEN_FAKE_DIR=${CUWARDEN_FAKE_DIR:-${TMPDIR:-/tmp}/cuwarden-sim-$(id -u)}
    mkdir -p -m 0700 "$CUWARDEN_FAKE_DIR"
    echo "cuwarden: $_cuw_build/bin on PATH; CUDA programs in this shell use the simulated driver (${CUWARDEN_FAKE_DEVICES} GPU, ${CUWARDEN_FAKE_MEMORY})"
  fi
else
  echo "cuwarden: $_cuw_build/bin on PATH (real GPU driver)"
fi
# A run directory of this user's (the daemon's socket in its daemon/): the shared one and
# /run/cuwarden are root's to make, and a daemon started here must not need root.
if [ -z "${CUWARDEN_RUN_DIR:-}" ]; then
  export CUWARDEN_RUN_DIR="${TMPDIR:-/tmp}/cuwarden-$(id -u)"
  echo "cuwarden: run directory $CUWARDEN_RUN_DIR (CUWARDEN_RUN_DIR), yours alone"
fi
unset _cuw_repo _cuw_build _cuw_sim
