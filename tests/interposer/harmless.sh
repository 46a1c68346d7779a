#!/usr/bin/env bash
# Interposer test: preloaded into programs that never touch CUDA, the library changes
# nothing: they run, exit as usual, and no run directory or ring appears. Includes
# `import torch` when a PyTorch (CPU-only builds too) is importable; skipped otherwise.
#   harmless.sh LIBCUWARDEN
set -euo pipefail
lib=$1
dir=$(mktemp -d "${TMPDIR:-/tmp}/cuw-harmless.XXXXXX")
trap 'rm -rf "$dir"' EXIT
run_dir="$dir/run"   # must never be created
under() { env LD_PRELOAD="$lib" CUWARDEN_RUN_DIR="$run_dir" CUWARDEN_LIMIT=1G timeout 120 "$@"; }
fail=0
check() {  # check NAME COMMAND...
  local name=$1; shift
  if out=$(under "$@" 2>&1); then echo "ok   $name"; else echo "FAIL $name (exit $?): $out"; fail=1; fi
}
check "sh -c true" /bin/sh -c true
check "ls" ls /
check "python3 -c pass" python3 -c pass
for py in /usr/bin/python3 python3; do
  if "$py" -c "import torch" >/dev/null 2>&1; then
    check "$py: import torch (cuda available: $("$py" -c 'import torch; print(torch.cuda.is_available())'))" \
      "$py" -c "import torch; torch.zeros(3).sum().item()"
    break
  fi
done
if [[ -e $run_dir ]]; then echo "FAIL: the run directory was created: $(ls -la "$run_dir")"; fail=1; fi
exit $fail
