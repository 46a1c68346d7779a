#!/usr/bin/env bash
# cuwarden: install what the build needs (Debian/Ubuntu packages and the CUDA toolkit check).
# Idempotent: apt-get runs only when a package is missing. Exit 1 when no usable CUDA
# toolkit (12 or newer, for its headers and libcudart) can be found or installed.
#
#   scripts/setup.sh          what the build and every test need; then the services some of
#                             those packages start (Prometheus, Slurm, munge) are disabled and
#                             stopped (scripts/quiet_services.sh): the tests run their own.
#   scripts/setup.sh --demo   only what scripts/demo.sh builds (no test tools, no services)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

demo=0
[[ ${1:-} == --demo ]] && demo=1

# What the build of the programs, the simulated driver and the web dashboard needs (the demo).
BUILD_PACKAGES=(
  build-essential cmake ninja-build
  libspdlog-dev libfmt-dev catch2 libcli11-dev nlohmann-json3-dev libtomlplusplus-dev
  libdw-dev pkgconf   # the daemon's symbolizer: elfutils' libdw, found through pkg-config
  libseccomp-dev   # the symbolization worker's system-call filter
  libncurses-dev   # `cuwarden top` (wide-character ncurses)
  python3
  nodejs   # the web dashboard: uPlot from npm (below)
)
# What the tests, benchmarks, fuzzers and the package add.
TEST_PACKAGES=(
  libcpp-httplib-dev libunwind-dev libbenchmark-dev valgrind
  python3-yaml   # tests/cluster: the Kubernetes manifests parsed and checked
  libslurm-dev slurmctld slurmd slurm-client munge   # cluster/slurm's SPANK plugin; cluster.slurm runs a local Slurm
  clang libclang-rt-14-dev   # libFuzzer targets (scripts/fuzz.sh, the `fuzz` preset)
  help2man lintian bash-completion   # man pages; scripts/package.sh and its test
  tmux   # `cuwarden top`'s test drives it in tmux
  prometheus   # promtool checks dashboards/prometheus and the Grafana queries (tests/dashboards)
  chromium   # the web dashboard's test drives a headless Chromium
  gdb   # tests/deadline.sh: the stacks of a test that hangs
)
PACKAGES=("${BUILD_PACKAGES[@]}")
((demo)) || PACKAGES+=("${TEST_PACKAGES[@]}")

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null; then SUDO=(sudo); fi
fi

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

APT_UPDATED=0
apt_install() {
  if [[ $APT_UPDATED -eq 0 ]]; then
    "${SUDO[@]}" apt-get update -q
    APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -q --no-install-recommends "$@"
}

missing=()
for p in "${PACKAGES[@]}"; do
  installed "$p" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "setup: installing ${missing[*]}"
  apt_install "${missing[@]}"
else
  echo "setup: all ${#PACKAGES[@]} packages already installed"
fi
((demo)) || "${SUDO[@]}" scripts/quiet_services.sh

# ---- npm packages: uPlot (staged beside the web dashboard), playwright-core (its test) -------
# package.json and package-lock.json at the root; `npm ci` again only when the lock changed.
if ! command -v npm >/dev/null; then
  echo "setup: installing npm"
  apt_install npm
fi
lock_sum=$(sha256sum package-lock.json | cut -d' ' -f1)
if [[ ! -d node_modules || $(cat node_modules/.cuwarden-lock.sha256 2>/dev/null) != "$lock_sum" ]]; then
  echo "setup: npm ci (package-lock.json)"
  npm ci --ignore-scripts --no-audit --no-fund
  echo "$lock_sum" >node_modules/.cuwarden-lock.sha256
else
  echo "setup: node_modules matches package-lock.json"
fi

# ---- CUDA toolkit: headers, libcudart_static.a, libcudart.so (no GPU needed to build) ------
find_nvcc() {
  if command -v nvcc >/dev/null; then command -v nvcc; return 0; fi
  local d
  for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-*; do
    [[ -n $d && -x $d/bin/nvcc ]] && { echo "$d/bin/nvcc"; return 0; }
  done
  return 1
}
cuda_major() { "$1" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p' | head -1; }

NVCC=$(find_nvcc || true)
if [[ -z $NVCC ]]; then
  echo "setup: no CUDA toolkit found (nvcc not on PATH, none under /usr/local/cuda*)"
  # Debian ships one as nvidia-cuda-toolkit in its non-free component, if that is enabled.
  "${SUDO[@]}" apt-get update -q >/dev/null 2>&1 || true
  APT_UPDATED=1
  candidate=$(apt-cache policy nvidia-cuda-toolkit 2>/dev/null | sed -n 's/^ *Candidate: *//p')
  if [[ -n $candidate && $candidate != "(none)" ]]; then
    echo "setup: trying the distribution's nvidia-cuda-toolkit $candidate"
    apt_install nvidia-cuda-toolkit || true
    NVCC=$(find_nvcc || true)
  else
    echo "setup: the package nvidia-cuda-toolkit is not available from the configured apt sources"
  fi
fi
if [[ -z $NVCC ]]; then
  cat >&2 <<'MSG'
setup: ERROR: cuwarden needs the CUDA toolkit (12.x or 13.x) to build: cuda.h, cuda_runtime_api.h,
       libcudart_static.a and libcudart.so. No GPU is needed to build or to run the tests.
       Install NVIDIA's CUDA toolkit (it lands in /usr/local/cuda), or on Debian enable the
       non-free component and `apt-get install nvidia-cuda-toolkit`, or put nvcc on PATH,
       then run this script again.
MSG
  exit 1
fi
major=$(cuda_major "$NVCC")
echo "setup: CUDA toolkit $("$NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') at $(dirname "$(dirname "$NVCC")")"
if [[ -z $major || $major -lt 12 ]]; then
  echo "setup: ERROR: CUDA ${major:-?} is too old; cuwarden needs CUDA 12 or newer" >&2
  exit 1
fi
echo "setup: ready"
