#!/usr/bin/env bash
# cuwarden GPU check: every tensor through cuwarden's pool (PyTorch's cache off), against
# PyTorch's own caching allocator, on a GPT-style training step (bench/train_gpt.py: 6 layers,
# d 768, batch 8 x 512, bf16 autocast, AdamW; each step timed to completion).
#   1. interleaved rounds (ROUNDS, default 3) of the configurations
#        pytorch       PyTorch's caching allocator, no cuwarden
#        tensors       cuwarden run --tensors (PyTorch's cache off, the cache pool)
#        tensors_vmm   cuwarden run --tensors --pool vmm
#        tensors_cs16  cuwarden run --tensors --callsites 16 (Python frames too)
#      and once each: driver (PYTORCH_NO_CUDA_MEMORY_CACHING=1 without cuwarden);
#   2. where the time goes, one run per pooled configuration with the daemon up: cuwarden's
#      counters per measured step (driver calls of the pool, hits, waits), the pool's reserved
#      bytes after each step from the 6th on (held: their maximum), then 5 steps under
#      torch.profiler (GPU idle time between kernels, host time in each CUDA runtime call);
#      the same profile for pytorch;
#   3. what the mode shows (tests/gpu/tensors_show.py): cuwarden's live bytes made through
#      libc10_cuda against torch.cuda.memory_allocated() of the same steps with the cache on,
#      at 5 marks, and a tensor's own line where the cache would have reused a segment;
#   4. a CPU-bound configuration (batch 1 x 64): pytorch and tensors, ROUNDS rounds;
#   5. CUDA graph capture with PyTorch's cache off: a tensor allocated inside
#      torch.cuda.graph gets the driver's answer, with and without cuwarden; and
#      torch.compile(mode="reduce-overhead") (CUDA graphs) on a Linear layer, with and without.
# Writes OUT/summary.md, OUT/tensors.json (the fields tests/gpu/results/*tensors*.json keep),
# OUT/run.log and each run's JSON under OUT/runs/. Exit 0 when every run completed.
#
#   BUILD_DIR=build OUT=gpu-out ROUNDS=3 tests/gpu/tensors.sh
set -uo pipefail

START_CWD=$(pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
abs() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$START_CWD/$1" ;; esac; }
OUT=$(abs "${OUT:-./gpu-out}")
BUILD=$(abs "${BUILD_DIR:-$REPO/build}")
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-40}
WARMUP=${WARMUP:-10}
LIB=$BUILD/lib/libcuwarden.so
BIN=$BUILD/bin
[[ -x $BIN/cuwardend && -x $BIN/cuwarden && -f $LIB ]] || { echo "no cuwardend, cuwarden and libcuwarden.so in $BUILD"; exit 2; }
mkdir -p "$OUT/runs"
exec > >(tee "$OUT/run.log") 2>&1
unset LD_PRELOAD CUWARDEN_LIMIT CUWARDEN_POOL CUWARDEN_CALLSITES PYTORCH_NO_CUDA_MEMORY_CACHING PYTORCH_CUDA_ALLOC_CONF
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cuw-tensors.XXXXXX")
export CUWARDEN_RUN_DIR=$WORK/run
mkdir -p "$CUWARDEN_RUN_DIR"
daemon=""
trap '[[ -n $daemon ]] && kill "$daemon" 2>/dev/null; rm -rf "$WORK"' EXIT
TRAIN=(python3 "${TRAIN_PY:-$REPO/bench/train_gpt.py}" --layers 6)  # TRAIN_PY: a stand-in, to try this script
RUN=("$BIN/cuwarden" run --lib "$LIB" --tensors)  # the cache pool unless --pool says otherwise
failures=0

echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0)"
python3 -c 'import torch; print("# torch", torch.__version__, "cuda", torch.version.cuda)'

# run NAME CONFIG [train_gpt args...]: one process of CONFIG, its JSON in OUT/runs/NAME.json.
run() {
  local name=$1 config=$2
  shift 2
  local pre=()
  case $config in
    pytorch) ;;
    driver) pre=(env PYTORCH_NO_CUDA_MEMORY_CACHING=1) ;;
    tensors) pre=("${RUN[@]}" --) ;;
    tensors_vmm) pre=("${RUN[@]}" --pool vmm --) ;;
    tensors_cs16) pre=("${RUN[@]}" --callsites 16 --) ;;  # Python frames too (CUWARDEN_PYFRAMES=1)
    *) echo "unknown configuration $config"; return 2 ;;
  esac
  local t0 rc
  t0=$(date -u +%FT%TZ)
  "${pre[@]}" "${TRAIN[@]}" --json "$OUT/runs/$name.json" "$@" >"$OUT/runs/$name.log" 2>&1
  rc=$?
  if ((rc != 0)); then
    echo "FAIL: $name ($config) exited $rc"; tail -n 5 "$OUT/runs/$name.log"; failures=$((failures + 1))
    return
  fi
  python3 - "$OUT/runs/$name.json" "$config" "$t0" <<'EOF'
import json, sys
p, config, t0 = sys.argv[1:]
r = json.load(open(p))
r["config_name"], r["timestamp"] = config, t0
json.dump(r, open(p, "w"))
print(f"{t0} {config:13s} median {r['median_ms']:.2f} ms/step  loss {r['first_loss']:.4f} -> {r['last_loss']:.4f}")
EOF
}

echo "== 1. interleaved rounds: batch 8 x 512, $WARMUP warm-up + $STEPS measured steps"
for r in $(seq "$ROUNDS"); do
  for c in pytorch tensors tensors_vmm tensors_cs16; do
    run "r$r-$c" "$c" --steps "$STEPS" --warmup "$WARMUP"
  done
done
run "r1-driver" driver --steps 20 --warmup 5

echo "== 2. where the time goes (the daemon up)"
"$BIN/cuwardend" --run-dir "$CUWARDEN_RUN_DIR" --no-nvml >"$OUT/cuwardend.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do [[ -S $CUWARDEN_RUN_DIR/daemon/cuwardend.sock ]] && break; sleep 0.1; done
for c in tensors tensors_vmm; do
  run "calls-$c" "$c" --steps 20 --warmup "$WARMUP" --cuwarden-cli "$BIN/cuwarden" --held-after 5 --profile-steps 5
done
run "calls-pytorch" pytorch --steps 20 --warmup "$WARMUP" --profile-steps 5

echo "== 3. what the per-tensor mode shows (tests/gpu/tensors_show.py)"
python3 "$REPO/tests/gpu/tensors_show.py" cached "$OUT/runs/show-cached.out" >/dev/null 2>"$OUT/runs/show-cached.err" ||
  { echo "FAIL: tensors_show.py cached"; tail -n 5 "$OUT/runs/show-cached.err"; failures=$((failures + 1)); }
CUWARDEN_CLI="$BIN/cuwarden" "${RUN[@]}" --callsites 16 -- python3 "$REPO/tests/gpu/tensors_show.py" tensors \
  "$OUT/runs/show-tensors.out" >/dev/null 2>"$OUT/runs/show-tensors.err" ||
  { echo "FAIL: tensors_show.py tensors"; tail -n 5 "$OUT/runs/show-tensors.err"; failures=$((failures + 1)); }
kill "$daemon" 2>/dev/null
wait "$daemon" 2>/dev/null
daemon=""

echo "== 4. CPU-bound: batch 1 x 64"
for r in $(seq "$ROUNDS"); do
  for c in pytorch tensors; do
    run "cpu-r$r-$c" "$c" --batch 1 --seq 64 --steps 60 --warmup 10
  done
done

echo "== 5. graph capture with PyTorch's cache off"
cat >"$WORK/capture.py" <<'EOF'
import json, torch
x = torch.ones(1 << 20, device="cuda")
torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(g):
        y = x * 2  # a new tensor: an allocation during the capture
    g.replay()
    torch.cuda.synchronize()
    print(json.dumps({"captured": True, "y0": float(y[0])}))
except Exception as e:  # the driver's answer, as PyTorch reports it
    print(json.dumps({"captured": False, "error": str(e).splitlines()[0][:200]}))
EOF
cat >"$WORK/compile.py" <<'EOF'
import json, torch
m = torch.nn.Linear(256, 256).cuda()
f = torch.compile(m, mode="reduce-overhead")  # CUDA graphs, captured on a later call
x = torch.randn(64, 256, device="cuda")
try:
    for _ in range(4):
        y = f(x)
    torch.cuda.synchronize()
    print(json.dumps({"compiled": True, "matches_eager": bool(torch.allclose(y, m(x), atol=1e-3))}))
except Exception as e:
    print(json.dumps({"compiled": False, "error": str(e).splitlines()[0][:200]}))
EOF
for c in driver tensors tensors_vmm; do
  case $c in
    driver) pre=(env PYTORCH_NO_CUDA_MEMORY_CACHING=1) ;;
    tensors) pre=("${RUN[@]}" --) ;;
    tensors_vmm) pre=("${RUN[@]}" --pool vmm --) ;;
  esac
  out=$("${pre[@]}" python3 "$WORK/capture.py" 2>"$OUT/runs/capture-$c.err" | tail -n 1)
  echo "capture $c: $out"
  echo "$out" >"$OUT/runs/capture-$c.txt"
  [[ $c == tensors_vmm ]] && continue  # torch.compile: the driver's answer and cuwarden's cache pool
  out=$(timeout 90 "${pre[@]}" python3 "$WORK/compile.py" 2>"$OUT/runs/compile-$c.err" | tail -n 1)
  echo "torch.compile reduce-overhead $c: $out"
  echo "$out" >"$OUT/runs/compile-$c.txt"
done

python3 - "$OUT" <<'EOF'
import glob, json, os, statistics, sys
out = sys.argv[1]
runs = {os.path.basename(p)[:-5]: json.load(open(p)) for p in glob.glob(f"{out}/runs/*.json")}
def med(prefix, config):
    v = [r["median_ms"] for n, r in runs.items() if n.startswith(prefix) and r.get("config_name") == config]
    return (statistics.median(v), min(v), max(v)) if v else (None, None, None)
rounds = [{"name": n, "config": r["config_name"], "timestamp": r["timestamp"], "median_ms": r["median_ms"]}
          for n, r in sorted(runs.items(), key=lambda kv: kv[1].get("timestamp", "")) if n.startswith("r")]
pt = med("r", "pytorch")[0]
res = {"device": next(iter(runs.values()))["device"] if runs else None,
       "torch": next(iter(runs.values()))["torch"] if runs else None,
       "model": "bench/train_gpt.py --layers 6 (d 768, 12 heads, seq 512, batch 8, bf16 autocast)",
       "rounds": rounds}
for c in ("tensors", "tensors_vmm", "tensors_cs16", "driver"):
    m = med("r", c)[0]
    res[f"{c}_ratio"] = m / pt if m and pt else None
res["ratio"] = res.pop("tensors_ratio")
res["callsites16_ratio"] = res.pop("tensors_cs16_ratio")
peak_live = runs.get("calls-pytorch", {}).get("max_memory_allocated")
for c in ("tensors", "tensors_vmm"):
    r = runs.get(f"calls-{c}", {})
    res[f"{c}_calls_per_step"] = r.get("pool_calls_per_step")
    res[f"{c}_profile"] = r.get("profile")
    if c == "tensors":
        res["held_bytes"] = r.get("held_bytes")
    else:
        res["vmm_held_bytes"] = r.get("held_bytes")
res["pytorch_profile"] = runs.get("calls-pytorch", {}).get("profile")
res["peak_live_bytes"] = peak_live
res["peak_live_note"] = "PyTorch's max_memory_allocated of the same run with its cache on (requests rounded to 512 B)"
res["held_over_peak_live"] = res["held_bytes"] / peak_live if res.get("held_bytes") and peak_live else None
res["vmm_held_over_peak_live"] = res["vmm_held_bytes"] / peak_live if res.get("vmm_held_bytes") and peak_live else None
p = runs.get("calls-pytorch", {})
res["pytorch_reserved_over_allocated"] = (p["max_memory_reserved"] / p["max_memory_allocated"]
                                          if p.get("max_memory_allocated") else None)
cpu_pt, cpu_t = med("cpu-", "pytorch")[0], med("cpu-", "tensors")[0]
res["cpu_bound"] = {"pytorch_ms": cpu_pt, "tensors_ms": cpu_t, "ratio": cpu_t / cpu_pt if cpu_pt and cpu_t else None}
def first_json(p):
    try:
        return json.loads(open(p).read().strip() or "null")
    except (OSError, ValueError):
        return None
res["capture"] = {c: first_json(f"{out}/runs/capture-{c}.txt") for c in ("driver", "tensors", "tensors_vmm")}
res["compile_reduce_overhead"] = {c: first_json(f"{out}/runs/compile-{c}.txt") for c in ("driver", "tensors")}
def load(p):
    try:
        return json.load(open(p))
    except (OSError, ValueError):
        return None
cached, tens = load(f"{out}/runs/show-cached.out"), load(f"{out}/runs/show-tensors.out")
if cached and tens:
    pairs = [{"mark": c["mark"], "memory_allocated": c["memory_allocated"], "cuwarden_libc10_cuda_bytes": t["libc10_cuda_bytes"],
              "difference": t["libc10_cuda_bytes"] - c["memory_allocated"], "not_pytorchs_bytes": t["other_bytes"],
              "not_pytorchs_sites": t["other_sites"]} for c, t in zip(cached["marks"], tens["marks"])]
    res["memory_allocated"] = {"marks": pairs, "within_1_MiB": all(abs(p["difference"]) <= 1 << 20 for p in pairs)}
    res["tensor_line"] = {"lines": tens["lines"], "names_tensor_line": tens["names_tensor_line"],
                          "names_segment_line": tens["names_segment_line"], "small_sites": tens["small_sites"]}
json.dump(res, open(f"{out}/tensors.json", "w"), indent=1)
L = [f"# Every tensor through cuwarden: {res['device']}, torch {res['torch']}", "",
     "| configuration | median ms/step (min-max over rounds) | vs pytorch |", "| --- | --- | --- |"]
for c in ("pytorch", "tensors", "tensors_vmm", "tensors_cs16", "driver"):
    m, lo, hi = med("r", c)
    if m:
        L.append(f"| {c} | {m:.2f} ({lo:.2f}-{hi:.2f}) | {m / pt:.3f} |")
L += ["", f"held {res.get('held_bytes')} B (vmm {res.get('vmm_held_bytes')}), peak live {peak_live} B: "
      f"held/peak live {res['held_over_peak_live']}, vmm {res['vmm_held_over_peak_live']}; "
      f"PyTorch's max reserved / max allocated {res['pytorch_reserved_over_allocated']}", "",
      f"CPU-bound (batch 1 x 64): {res['cpu_bound']}", "", f"capture: {res['capture']}", "", f"torch.compile(mode='reduce-overhead'): {res['compile_reduce_overhead']}", "",
      f"memory_allocated against cuwarden's libc10_cuda bytes: {json.dumps(res.get('memory_allocated'))}", "",
      f"the tensor's own line: {json.dumps(res.get('tensor_line'))}", ""]
for c in ("tensors", "tensors_vmm"):
    L += [f"## {c}: per measured step", "", "```", json.dumps(res[f"{c}_calls_per_step"], indent=1),
          json.dumps(res[f"{c}_profile"], indent=1), "```", ""]
L += ["## pytorch profile", "", "```", json.dumps(res["pytorch_profile"], indent=1), "```"]
open(f"{out}/summary.md", "w").write("\n".join(L) + "\n")
print("\n".join(L))
EOF
echo "tensors.sh: $failures failed runs"
exit $((failures > 0))
