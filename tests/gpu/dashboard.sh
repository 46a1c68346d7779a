#!/usr/bin/env bash
# cuwarden on a GPU: a real run behind the web dashboard (issue 22). Builds nothing.
#
#   BUILD_DIR=<dir> OUT=<dir> bash tests/gpu/dashboard.sh
#
# Needs in BUILD_DIR: bin/cuwarden, bin/cuwardend, lib/libcuwarden.so; python3 with PyTorch,
# curl. The daemon serves HTTP on loopback (with --http-snapshots); tests/gpu/dashboard_record.sh
# records its API while
#   - a training (train.py) runs under a 6G cap for STEPS steps, and
#   - halfway through, a second program under a 1G cap asks for 2 GiB and is refused;
# then the recording ($OUT/recording) is checked: the training's used bytes in the states,
# the refusal in the event stream, in the history's OOM marks and in /metrics'
# cuwarden_ooms_total, and a snapshot with call sites. The page itself is not opened here
# (no browser on a GPU machine): replay the recording where there is one
# (tests/browser/run_dashboard_replay.sh).
set -uo pipefail
START_CWD=$(pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
abs() { case $1 in /*) echo "$1" ;; *) echo "$START_CWD/$1" ;; esac; }
BUILD=$(abs "${BUILD_DIR:-./build}")
OUT=$(abs "${OUT:-./gpu-out}")
STEPS=${STEPS:-2000}
PORT=${PORT:-19477}
mkdir -p "$OUT"
CLI=$BUILD/bin/cuwarden
DAEMON=$BUILD/bin/cuwardend
RES=$OUT/dashboard.txt
: >"$RES"
FAILS=0
pass() { echo "PASS $*" | tee -a "$RES"; }
fail() { echo "FAIL $*" | tee -a "$RES"; FAILS=$((FAILS + 1)); }
note() { echo "$*" | tee -a "$RES"; }

note "date: $(date -u +%FT%TZ)"
note "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
[[ -n ${PYTORCH_NO_CUDA_MEMORY_CACHING:-} ]] &&
  note "PYTORCH_NO_CUDA_MEMORY_CACHING=$PYTORCH_NO_CUDA_MEMORY_CACHING: every tensor is a driver allocation cuwarden sees"
note "torch: $(python3 -c 'import torch,sys; print(torch.__version__, "cuda", torch.version.cuda, "python", sys.version.split()[0])')"
if ldd "$DAEMON" | grep -q 'not found' && [[ -d $BUILD/lib/fallback ]]; then
  export LD_LIBRARY_PATH=$BUILD/lib/fallback${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  note "libdw: the carried copy ($BUILD/lib/fallback)"
fi
RUN=$(mktemp -d /tmp/cuw-dash-XXXXXX)
export CUWARDEN_RUN_DIR=$RUN
"$DAEMON" --run-dir "$RUN" --http "127.0.0.1:$PORT" --http-snapshots --log-level info >"$OUT/daemon.log" 2>&1 &
DPID=$!
trap 'kill $DPID 2>/dev/null; rm -rf "$RUN"' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/metrics" >/dev/null && break; sleep 0.1; done
curl -sf "http://127.0.0.1:$PORT/metrics" >/dev/null && pass "daemon serves HTTP on 127.0.0.1:$PORT" ||
  { fail "daemon did not serve HTTP (daemon.log)"; exit 1; }

# The workload the recorder waits for: the training, and the refused program halfway.
cat >"$RUN/workload.sh" <<WL
#!/usr/bin/env bash
"$CLI" run --limit 6G --callsites 16 -- python3 "$HERE/train.py" --steps $STEPS --log-every 50 >"$OUT/train.log" 2>&1 &
T=\$!
sleep 12
"$CLI" run --limit 1G -- python3 -c "import torch; x = torch.empty(2 << 30, dtype=torch.uint8, device='cuda')" \
  >"$OUT/refused.log" 2>&1
echo "refused program exit: \$?" >>"$OUT/refused.log"
wait \$T
echo "training exit: \$?" >>"$OUT/train.log"
WL
chmod +x "$RUN/workload.sh"
bash "$HERE/dashboard_record.sh" "127.0.0.1:$PORT" "$OUT/recording" -- "$RUN/workload.sh" >"$OUT/record.log" 2>&1
grep -q "training exit: 0" "$OUT/train.log" && pass "training ran $STEPS steps under the 6G cap" ||
  fail "training (train.log)"
grep -q "OutOfMemoryError\|out of memory" "$OUT/refused.log" && pass "the second program was refused 2 GiB over its 1G cap" ||
  fail "the refused program (refused.log)"

python3 - "$OUT/recording" "$RES" <<'PY'
import glob, json, os, re, sys
rec, res = sys.argv[1], sys.argv[2]
out = open(res, "a")
def say(ok, msg):
    line = ("PASS " if ok else "FAIL ") + msg
    print(line); out.write(line + "\n")
states = sorted(glob.glob(os.path.join(rec, "states", "*.json")))
say(len(states) >= 10, f"{len(states)} state documents recorded")
peak = 0
for f in states:
    try:
        st = json.load(open(f))
    except ValueError:
        continue
    for p in st.get("processes", []):
        if "train.py" in p.get("cmdline", ""):
            peak = max(peak, max((d["used_bytes"] for d in p["devices"]), default=0))
say(peak > 100 << 20, f"the training's used bytes seen in the states (largest {peak / 2**20:.0f} MiB)")
ev = open(os.path.join(rec, "events.txt")).read()
refusals = len(re.findall(r'"kind":"refuse"', ev))
allocs = len(re.findall(r'"kind":"alloc"', ev))
say(refusals >= 1, f"the event stream carried the refusal ({refusals}) among {allocs} allocations")
h = json.load(open(os.path.join(rec, "history-hour.json")))
marks = sum(len(p["ooms"]) for p in h["processes"])
say(marks >= 1 or refusals >= 1, f"history: {len(h['processes'])} processes, {marks} OOM marks (a process gone keeps none)")
m = open(os.path.join(rec, "metrics.txt")).read()
ooms = sum(float(l.split()[-1]) for l in m.splitlines() if l.startswith("cuwarden_ooms_total{"))
say(ooms >= 1, f"/metrics: cuwarden_ooms_total = {ooms:.0f} after the refused program exited")
snaps = glob.glob(os.path.join(rec, "snapshot-*.json"))
sites = 0
for s in snaps:
    try:
        sites = max(sites, len(json.load(open(s)).get("sites", [])))
    except ValueError:
        pass
say(sites > 0, f"{len(snaps)} snapshot(s) recorded, up to {sites} call sites")
PY
FAILS=$((FAILS + $(grep -c '^FAIL' "$RES") ))
note "result: $(grep -c '^PASS' "$RES") PASS, $(grep -c '^FAIL' "$RES") FAIL"
[[ $(grep -c '^FAIL' "$RES") -eq 0 ]]
