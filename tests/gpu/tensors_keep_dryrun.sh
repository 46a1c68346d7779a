#!/usr/bin/env bash
# Tries tests/gpu/tensors_keep.sh without a GPU or PyTorch: on cuwarden's simulated driver, with
# tests/gpu/train_stand_in.py and tests/gpu/show_stand_in.py in place of bench/train_gpt.py and
# tests/gpu/tensors_show.py, and three small libraries named as PyTorch's and cuBLAS's (built here
# with cc) so that the call-site classification meets frames of those names. Then checks what the
# report made of it:
#   - every configuration ran, each cuwarden run's events are complete (one per allocation and
#     free, none dropped), its peak of live bytes from the events is the stand-in's own count to
#     the byte, and what the pool held from step 5 on is at least that;
#   - at each mark, tensors_show.py's classes: the stand-in's workspaces (one through a workspace
#     function, one from the handle getter itself) as "workspace", cuBLAS's handles as "cublas",
#     the tensors as "tensor", whose rounded bytes equal the cached run's memory_allocated;
#   - with CUBLAS_WORKSPACE_CONFIG=:4096:4 the workspaces, and the difference they make, move by
#     exactly twice (32 - 16) MiB.
# The timings of the simulated driver mean nothing.
#
#   BUILD_DIR=build tests/gpu/tensors_keep_dryrun.sh [OUT]
set -euo pipefail
START_CWD=$(pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
abs() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$START_CWD/$1" ;; esac; }
BUILD=$(abs "${BUILD_DIR:-$REPO/build}")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cuw-keep-dry.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
OUT=$(abs "${1:-$WORK/out}")
[[ -e $BUILD/fakecuda/libcuda.so.1 ]] || { echo "no simulated driver in $BUILD/fakecuda"; exit 2; }

LIBS=$WORK/libs
mkdir -p "$LIBS"
CFLAGS=(-shared -fPIC -O0 -fno-omit-frame-pointer -fno-optimize-sibling-calls)
cat >"$WORK/c10.c" <<'EOF'
#include <stddef.h>
#include <stdint.h>
int cuMemAlloc_v2(uint64_t *p, size_t n);
int cuMemFree_v2(uint64_t p);
uint64_t c10_alloc(size_t n) { uint64_t p = 0; return cuMemAlloc_v2(&p, n) ? 0 : p; }
void c10_free(uint64_t p) { cuMemFree_v2(p); }
EOF
cat >"$WORK/cublas.c" <<'EOF'
#include <stddef.h>
#include <stdint.h>
int cuMemAlloc_v2(uint64_t *p, size_t n);
uint64_t cublasCreate_stub(size_t n) { uint64_t p = 0; return cuMemAlloc_v2(&p, n) ? 0 : p; }
EOF
cat >"$WORK/torch_cuda.c" <<'EOF'
#include <stddef.h>
#include <stdint.h>
uint64_t c10_alloc(size_t n);
uint64_t cublasCreate_stub(size_t n);
uint64_t getNewWorkspace(size_t n) { uint64_t p = c10_alloc(n); return p; }
uint64_t getCurrentCUDABlasHandle(size_t ws) {
  uint64_t h = cublasCreate_stub(132096);
  if (ws) c10_alloc(ws);
  return h;
}
EOF
cc "${CFLAGS[@]}" -o "$LIBS/libc10_cuda.so" "$WORK/c10.c"
cc "${CFLAGS[@]}" -o "$LIBS/libcublas.so.13" "$WORK/cublas.c"
cc "${CFLAGS[@]}" -o "$LIBS/libtorch_cuda.so" "$WORK/torch_cuda.c"

export LD_LIBRARY_PATH=$BUILD/fakecuda CUWARDEN_FAKE_DEVICES=1 CUWARDEN_FAKE_MEMORY=16G CUWARDEN_FAKE_DIR=$WORK/fake
mkdir -m 0700 "$CUWARDEN_FAKE_DIR"
export STAND_IN_LIBS=$LIBS
rc=0
TRAIN_PY=$REPO/tests/gpu/train_stand_in.py SHOW_PY=$REPO/tests/gpu/show_stand_in.py BUILD_DIR=$BUILD OUT=$OUT \
  ROUNDS=${ROUNDS:-2} STEPS=${STEPS:-6} WARMUP=${WARMUP:-6} bash "$REPO/tests/gpu/tensors_keep.sh" >/dev/null || rc=$?
echo "tensors_keep.sh exited $rc; its log: $OUT/run.log; OUT: $(cd "$OUT" && echo *)"
[[ -e $OUT/runs.tar.gz ]] && tar -C "$OUT" -xzf "$OUT/runs.tar.gz"  # the runs, archived

REPO_GPU=$REPO/tests/gpu python3 - "$OUT" <<'EOF'
import glob, gzip, json, os, sys
out = sys.argv[1]
res = json.load(open(f"{out}/tensors-keep.json"))
bad = []
def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        bad.append(what)
want = ["pytorch", "vmm_keep0", "vmm_keep1pct", "vmm_keep2pct", "vmm_keep5pct", "vmm_keep10pct", "vmm_keep256M", "vmm_cs16",
        "cache"]
check(list(res["configs"]) == want, f"configurations {list(res['configs'])}")
runs = [json.load(open(p)) for p in sorted(glob.glob(f"{out}/runs/r*-vmm_*.json") + glob.glob(f"{out}/runs/r*-cache.json"))]
check(len(runs) == 2 * (len(want) - 1), f"{len(runs)} cuwarden runs")
for r in runs:
    m = r.get("cuwarden_memory") or {}
    name = f"{r['config_name']} pid {r['pid']}"
    check(m.get("complete") is True, f"{name}: events complete ({m.get('alloc_events')} allocs, "
          f"{m.get('counted_allocations')} counted, {m.get('events_dropped')} dropped)")
    check(m.get("peak_live_bytes") == r["expected_peak_live_bytes"],
          f"{name}: peak live from events {m.get('peak_live_bytes')} == the stand-in's {r['expected_peak_live_bytes']}")
    check((m.get("held_bytes") or 0) >= m.get("peak_live_bytes", 1) and m.get("held_over_peak_live", 0) >= 1.0,
          f"{name}: held {m.get('held_bytes')} >= peak live, ratio {m.get('held_over_peak_live')}")
    c = r.get("pool_calls_per_step") or {}
    check("pool_driver_allocations" in c and c.get("alloc_count", 0) > 0,
          f"{name}: pool calls per step read ({c.get('alloc_count')} allocations, "
          f"{c.get('pool_driver_allocations')} driver allocations)")
for cfg in want[1:]:
    row = res["configs"][cfg]
    check(row.get("held_over_peak_live") is not None and row.get("ratio_of_medians") is not None
          and row.get("old_ratio_held_over_pytorch_max_allocated") is not None, f"{cfg}: summary row filled")
held = {c: res["configs"][c]["held_bytes"] for c in want[1:]}
print("held by keep:", held)
ma = res.get("memory_allocated") or {}
for tag in ("default", "small_ws"):
    v = ma.get(tag)
    check(v is not None, f"memory_allocated {tag} present")
    if not v:
        continue
    ws = 32 << 20 if tag == "default" else 16 << 20
    for r in v["marks"]:
        check(r["within_1_MiB"] and r["difference"] == 0, f"{tag} {r['mark']}: tensors {r['cuwarden_tensors']} == "
              f"memory_allocated {r['memory_allocated']}")
        want_ws = {"model": 0, "forward": ws}.get(r["mark"], 2 * ws)
        want_cb = {"model": 0, "forward": 132096}.get(r["mark"], 2 * 132096)
        check(r["workspace"] == want_ws and r["cublas_own"] == want_cb,
              f"{tag} {r['mark']}: workspaces {r['workspace']} == {want_ws}, cuBLAS's own {r['cublas_own']} == {want_cb}")
moves = ma.get("workspace_size_moves") or []
check(len(moves) == 5 and all(m["workspace_moved"] == m["difference_with_workspaces_moved"] ==
                              {"model": 0, "forward": 16 << 20}.get(m["mark"], 32 << 20) for m in moves),
      f"the smaller workspace moves the difference by the workspaces: {moves}")
check(os.path.exists(f"{out}/summary.md"), "summary.md written")
events = sorted(os.path.basename(p) for p in glob.glob(f"{out}/runs/*.events.jsonl*"))
check(events == ["r1-vmm_keep5pct.events.jsonl.gz"], f"one run's events kept: {events}")
top = sorted(os.listdir(out))
check(top == ["run.log", "runs", "runs.tar.gz", "summary.md", "tensors-keep.json", "tensors-step.trace.gz"],
      f"OUT holds {top}")
head = gzip.open(f"{out}/tensors-step.trace.gz", "rt").read(4096).splitlines()[2]
kept = json.load(open(f"{out}/runs/r1-vmm_keep5pct.json"))
check(head.endswith(f"peak live bytes: {kept['expected_peak_live_bytes']}"), f"the trace's header: {head}")
# Held from step 5 on, on events made up around its start: what the pool held as the step began
# counts (the stand-in's steps are shorter than the coarse clock's tick: its events can all be
# stamped before step 5's start).
sys.path.insert(0, os.environ["REPO_GPU"])
import tensors_keep_report as rep
ev = [{"seq": 1, "kind": "segment_alloc", "used_after": 100, "time_ns": 1, "address": 0, "bytes": 100},
      {"seq": 2, "kind": "alloc", "used_after": 100, "time_ns": 2, "address": 1, "bytes": 60},
      {"seq": 3, "kind": "segment_alloc", "used_after": 300, "time_ns": 12, "address": 0, "bytes": 200},
      {"seq": 4, "kind": "alloc", "used_after": 300, "time_ns": 13, "address": 2, "bytes": 150},
      {"seq": 5, "kind": "free", "used_after": 300, "time_ns": 14, "address": 2, "bytes": 150},
      {"seq": 6, "kind": "segment_free", "used_after": 120, "time_ns": 45, "address": 0, "bytes": 180},
      {"seq": 7, "kind": "alloc", "used_after": 120, "time_ns": 55, "address": 3, "bytes": 50}]
run = {"pid": None, "step_start_ns": [0, 10, 20, 30, 40, 50, 60]}
m = rep.memory_from_events(ev, run)
check((m["held_bytes"], m["held_all_bytes"], m["peak_live_bytes"]) == (120, 300, 210),
      f"held from step 5 120, over the run 300, peak live 210: {m['held_bytes']}, {m['held_all_bytes']}, "
      f"{m['peak_live_bytes']}")
m = rep.memory_from_events(ev[:5], run)
check(m["held_bytes"] == 300, f"no event after step 5's start: held as it began, 300: {m['held_bytes']}")
print("dry run:", "all checks passed" if not bad else f"{len(bad)} checks failed")
sys.exit(1 if bad else 0)
EOF
