#!/usr/bin/env bash
# cuwarden: configure and build with the default preset (Ninja, RelWithDebInfo, into build/).
# Extra arguments go to `cmake --build` (e.g. --target cuwarden, -j 2).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# FindCUDAToolkit looks on PATH first; a toolkit in /usr/local/cuda need not be on it.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

cmake --preset default
cmake --build --preset default "$@"
