#!/usr/bin/env python3
"""cuwarden GPU check: the figures of tests/gpu/tensors_keep.sh, from cuwarden's own view of each run.

    tensors_keep_report.py events RUN_JSON EVENTS_JSONL [SNAPSHOT_JSON]
        adds "cuwarden_memory" to RUN_JSON (a bench/train_gpt.py result): from the process's
        allocation events (`cuwarden events --pid PID --json`), its peak of live bytes as
        cuwarden counted them (the sum of requested sizes, and rounded to 512 B as PyTorch
        rounds) and what the pool held (the events' used_after: with a pool, the bytes it holds
        from the driver), the maximum from the start of step HELD_AFTER (5) on and over the
        whole run; checked against the counters of the exited process (SNAPSHOT_JSON:
        `cuwarden snapshot PID --format json`): every allocation and free has its event, and no
        event was dropped (exit 3 when not: the daemon may not have drained the ring yet).
    tensors_keep_report.py show OUT
        the memory_allocated comparison of tests/gpu/tensors_show.py's runs in OUT/runs/
        (show-cached*.out against show-tensors*.out): at each mark, cuwarden's bytes made through
        libc10_cuda less the cuBLAS/cuBLASLt workspaces, against memory_allocated().
    tensors_keep_report.py summary OUT
        OUT/summary.md and OUT/tensors-keep.json from OUT/runs/*.json.
    tensors_keep_report.py trace EVENTS_JSONL[.gz] OUT.trace.gz [SOURCE]
        the process's allocations and frees as an allocation trace of bench/traces/ (record.py
        gives the format), to replay the same requests on any machine: bench/keep_table.py
        --traces OUT.trace.gz, cuw_trace_replay.

Held over peak live uses the same process's two figures: under `cuwarden run --tensors` every
buffer, cuBLAS's workspaces too, goes through the pool, and cuwarden's live bytes count them;
PyTorch's max_memory_allocated (another process, its cache on) may not. Both are reported.
"""
import glob
import gzip
import json
import os
import statistics
import sys
from bisect import bisect_right

HELD_AFTER = 5  # the held: the maximum over the steps after 5 warm-up steps
TICK_NS = 4_000_000  # CLOCK_REALTIME_COARSE's tick at most (CUWARDEN_CLOCK=coarse stamps events)
MiB = 1 << 20


def round512(b):
    return (b + 511) // 512 * 512


def memory_from_events(events, run, snap=None):
    """The memory figures of one run from its events (dicts as `cuwarden events --json` prints
    them) and its train_gpt JSON (`pid`, `step_start_ns`); `snap`: the exited process's snapshot."""
    pid = run.get("pid")
    starts = run.get("step_start_ns") or []
    after_ns = starts[HELD_AFTER] if len(starts) > HELD_AFTER else None
    evs = sorted((e for e in events if pid is None or e.get("pid") == pid), key=lambda e: e.get("seq", 0))
    sizes = {}
    live = live512 = peak = peak512 = 0
    peak_ns = None
    held_all = held_after = held_at_start = 0
    counts = {}
    for e in evs:
        k = e.get("kind")
        counts[k] = counts.get(k, 0) + 1
        if k == "alloc":
            b = e["bytes"]
            sizes[e["address"]] = b
            live += b
            live512 += round512(b)
            if live > peak:
                peak, peak_ns = live, e.get("time_ns")
            peak512 = max(peak512, live512)
        elif k == "free":
            b = sizes.pop(e["address"], e["bytes"])
            live -= b
            live512 -= round512(b)
        if k in ("alloc", "free", "segment_alloc", "segment_free"):
            used = e.get("used_after", 0)
            held_all = max(held_all, used)
            # What the pool holds as step HELD_AFTER starts is the last event's used_after before
            # then: held from then on is that or more. The coarse clock is never ahead and at most
            # a tick behind, so an event stamped after the step's start happened after it, and
            # one stamped before it happened at most a tick after.
            if after_ns is not None:
                if e.get("time_ns", 0) >= after_ns:
                    held_after = max(held_after, used)
                else:
                    held_at_start = used
    held_after = max(held_after, held_at_start)
    # The reserved_bytes counter read before the first measured step and after the last (the
    # first run's held was the maximum of such reads after each step).
    reserved = [c.get("reserved_bytes") for c in (run.get("counters_before"), run.get("counters_after"))
                if c and c.get("reserved_bytes") is not None]
    res = {
        "events": len(evs), "alloc_events": counts.get("alloc", 0), "free_events": counts.get("free", 0),
        "segment_events": counts.get("segment_alloc", 0) + counts.get("segment_free", 0),
        "peak_live_bytes": peak, "peak_live_rounded_bytes": peak512,
        # the step the peak was first reached in (the coarse clock is up to a tick, 4 ms, behind)
        "peak_live_step": (bisect_right(starts, peak_ns + TICK_NS) - 1) if peak_ns is not None and starts else None,
        "held_bytes": held_after if after_ns is not None else None, "held_all_bytes": held_all,
        "held_over_peak_live": held_after / peak if peak and after_ns is not None else None,
        "held_over_peak_live_rounded": held_after / peak512 if peak512 and after_ns is not None else None,
        "held_after_step": HELD_AFTER,
        "reserved_counter_bytes": max(reserved) if reserved else None,
        "reserved_counter_over_peak_live": max(reserved) / peak if reserved and peak else None,
    }
    if snap is not None:
        devs = [d for d in snap.get("devices", []) if d.get("alloc_count")]
        allocs = sum(d.get("alloc_count", 0) for d in devs)
        frees = sum(d.get("free_count", 0) for d in devs)
        res.update({"counted_allocations": allocs, "counted_frees": frees,
                    "events_dropped": snap.get("events_dropped"),
                    "peak_counter_bytes": max((d.get("peak_bytes", 0) for d in devs), default=0)})
        # Complete: an event for every allocation and free the counters saw, none dropped.
        res["complete"] = (snap.get("events_dropped") == 0 and allocs == res["alloc_events"]
                           and frees == res["free_events"])
    return res


def read_jsonl(path):
    out = []
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                out.append(json.loads(line))
    return out


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def cmd_events(run_path, events_path, snap_path=None):
    run = load(run_path)
    if run is None:
        sys.exit(f"tensors_keep_report: no run JSON at {run_path}")
    snap = load(snap_path) if snap_path else None
    m = run["cuwarden_memory"] = memory_from_events(read_jsonl(events_path), run, snap)
    with open(run_path, "w") as f:
        json.dump(run, f)
    print(f"    held {fmt_bytes(m['held_bytes'])} B, own peak live {fmt_bytes(m['peak_live_bytes'])} B: "
          f"{fmt_ratio(m['held_over_peak_live'], 4)}; {m['events']} events, complete {m.get('complete')}")
    # Events still to come: fewer than the counters, none dropped (dropped ones never come).
    pending = m.get("events_dropped") == 0 and (m["alloc_events"] < m.get("counted_allocations", 0)
                                                 or m["free_events"] < m.get("counted_frees", 0))
    return 3 if pending else 0


def write_trace(events, path, source):
    """`events` (one process's) as a trace: 'a ID BYTES' per allocation, 'f ID' per free, in the
    order the interposer wrote them; ids dense from 0. Returns (events written, peak live bytes)."""
    ids, sizes, lines = {}, {}, []
    live = peak = 0
    for e in sorted(events, key=lambda e: e.get("seq", 0)):
        if e.get("kind") == "alloc":
            i = len(sizes)
            ids[e["address"]] = i
            sizes[i] = e["bytes"]
            live += e["bytes"]
            peak = max(peak, live)
            lines.append(f"a {i} {e['bytes']}\n")
        elif e.get("kind") == "free" and e["address"] in ids:
            i = ids.pop(e["address"])
            live -= sizes[i]
            lines.append(f"f {i}\n")
    with gzip.open(path, "wt") as f:
        f.write("# cuwarden allocation trace v1\n")
        f.write(f"# source: {source}\n")
        f.write(f"# events: {len(lines)}, allocations: {len(sizes)}, peak live bytes: {peak}\n")
        f.writelines(lines)
    return len(lines), peak


def show_rows(cached, tens):
    """Per mark: memory_allocated (cached run) against cuwarden's bytes through libc10_cuda less
    the workspaces (tensors run), rounded to 512 B; and the requested bytes the same way."""
    rows = []
    for c, t in zip(cached["marks"], tens["marks"]):
        cl = t.get("classes")
        if cl is None:  # a tensors_show.py without the classes: nothing to take apart
            continue
        tensors = cl["tensor"]["rounded"]
        row = {"mark": c["mark"], "memory_allocated": c["memory_allocated"],
               "requested_bytes": c.get("requested_bytes"),
               "cuwarden_libc10_cuda": tensors + cl["workspace"]["rounded"],
               "workspace": cl["workspace"]["rounded"], "workspace_count": cl["workspace"]["count"],
               "cublas_own": cl["cublas"]["requested"], "other": cl["other"]["requested"],
               "cuwarden_tensors": tensors, "difference": tensors - c["memory_allocated"],
               "difference_with_workspaces": tensors + cl["workspace"]["rounded"] - c["memory_allocated"]}
        if c.get("requested_bytes") is not None:
            row["requested_difference"] = cl["tensor"]["requested"] - c["requested_bytes"]
        row["within_1_MiB"] = abs(row["difference"]) <= MiB
        rows.append(row)
    return rows


def cmd_show(out):
    res = {}
    # the default workspace first, then the variants
    for cached_path in sorted(glob.glob(f"{out}/runs/show-cached*.out"), key=lambda p: (not p.endswith("-cached.out"), p)):
        tag = os.path.basename(cached_path)[len("show-cached"):-len(".out")]
        cached, tens = load(cached_path), load(f"{out}/runs/show-tensors{tag}.out")
        if not cached or not tens:
            continue
        rows = show_rows(cached, tens)
        details = {t_mark["mark"]: t_mark.get("sites") for t_mark in tens["marks"]}
        res[tag.lstrip("-") or "default"] = {
            "cublas_workspace_config": tens.get("cublas_workspace_config"), "marks": rows,
            "within_1_MiB": bool(rows) and all(r["within_1_MiB"] for r in rows),
            "sites": details, "tensor_line": {k: tens.get(k) for k in (
                "lines", "names_tensor_line", "names_segment_line", "small_sites")}}
    # A second measure that needs no frames: the difference moves with the workspace's size.
    if "default" in res and "small_ws" in res:
        moved = []
        for a, b in zip(res["default"]["marks"], res["small_ws"]["marks"]):
            moved.append({"mark": a["mark"], "difference_with_workspaces_moved":
                          a["difference_with_workspaces"] - b["difference_with_workspaces"],
                          "workspace_moved": a["workspace"] - b["workspace"]})
        res["workspace_size_moves"] = moved
    return res


def med(v):
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else None


def summarize(out):
    runs = {os.path.basename(p)[:-5]: load(p) for p in glob.glob(f"{out}/runs/*.json")}
    runs = {n: r for n, r in runs.items() if r and "median_ms" in r}
    rounds = [{"name": n, "config": r.get("config_name"), "keep": r.get("keep"), "timestamp": r.get("timestamp"),
               "median_ms": r["median_ms"]}
              for n, r in sorted(runs.items(), key=lambda kv: (kv[1].get("seq", 0), kv[1].get("timestamp", "")))
              if n.startswith("r")]
    configs = []
    for r in rounds:
        if r["config"] not in configs:
            configs.append(r["config"])
    by_round = {}
    for n, r in runs.items():
        if n.startswith("r") and "-" in n:
            by_round.setdefault(n.split("-", 1)[0], {})[r.get("config_name")] = r
    pt_runs = [r for r in runs.values() if r.get("config_name") == "pytorch" and r.get("max_memory_allocated")]
    pt_alloc = med([r["max_memory_allocated"] for r in pt_runs])
    pt_reserved = med([r["max_memory_reserved"] for r in pt_runs])
    pt_requested = med([r.get("max_memory_requested") for r in pt_runs])
    table = {}
    for c in configs:
        rs = [r for r in runs.values() if r.get("config_name") == c and r.get("median_ms") is not None]
        ms = [r["median_ms"] for r in rs]
        per_round = [rr[c]["median_ms"] / rr["pytorch"]["median_ms"]
                     for _, rr in sorted(by_round.items(), key=lambda kv: int(kv[0][1:]) if kv[0][1:].isdigit() else 0)
                     if c in rr and "pytorch" in rr and rr["pytorch"].get("median_ms")]
        mem = [r["cuwarden_memory"] for r in rs if r.get("cuwarden_memory")]
        calls = [r["pool_calls_per_step"] for r in rs if r.get("pool_calls_per_step")]
        row = {"keep": rs[0].get("keep") if rs else None, "runs": len(rs), "median_ms": med(ms),
               "min_ms": min(ms) if ms else None, "max_ms": max(ms) if ms else None,
               "ratio_per_round": per_round, "ratio_median_of_rounds": med(per_round)}
        if mem:
            for k in ("peak_live_bytes", "peak_live_rounded_bytes", "held_bytes", "held_all_bytes",
                      "held_over_peak_live", "held_over_peak_live_rounded", "peak_live_step",
                      "reserved_counter_bytes", "reserved_counter_over_peak_live"):
                row[k] = med([m.get(k) for m in mem])
            row["held_over_peak_live_range"] = [min(m["held_over_peak_live"] for m in mem if m.get("held_over_peak_live")),
                                                max(m["held_over_peak_live"] for m in mem if m.get("held_over_peak_live"))] \
                if any(m.get("held_over_peak_live") for m in mem) else None
            row["events_complete"] = all(m.get("complete") for m in mem)
            row["old_ratio_held_over_pytorch_max_allocated"] = row["held_bytes"] / pt_alloc \
                if row.get("held_bytes") and pt_alloc else None
        if calls:
            for k in ("pool_driver_allocations", "pool_driver_frees", "pool_waits", "pool_hits", "alloc_count"):
                row[f"{k}_per_step"] = med([cs.get(k) for cs in calls])
        table[c] = row
    pt = table.get("pytorch", {}).get("median_ms")
    for c, row in table.items():
        row["ratio_of_medians"] = row["median_ms"] / pt if pt and row.get("median_ms") else None
    first = next(iter(runs.values()), {})
    default = table.get("vmm_keep5pct", {})
    res = {
        "device": first.get("device"), "torch": first.get("torch"),
        "model": "bench/train_gpt.py --layers 6 (d 768, 12 heads, seq 512, batch 8, bf16 autocast)",
        "rounds": rounds, "configs": table,
        "pytorch": {"max_memory_allocated": pt_alloc, "max_memory_reserved": pt_reserved,
                    "max_memory_requested": pt_requested,
                    "reserved_over_allocated": pt_reserved / pt_alloc if pt_alloc else None,
                    "reserved_over_requested": pt_reserved / pt_requested if pt_requested else None},
        # the fields, for the per-tensor mode's default (vmm, keep 5%)
        "ratio": default.get("ratio_of_medians"), "held_bytes": default.get("held_bytes"),
        "peak_live_bytes": default.get("peak_live_bytes"), "held_over_peak_live": default.get("held_over_peak_live"),
        "callsites16_ratio": table.get("vmm_cs16", {}).get("ratio_of_medians"),
        "peak_live_note": "own peak live: the peak of the sum of requested sizes of the process's allocations, "
                          "from its events; held: the pool's bytes from the driver (the events' used_after), their "
                          f"maximum from step {HELD_AFTER} on",
    }
    show = cmd_show(out)
    if show:
        res["memory_allocated"] = show
    return res


def fmt_ratio(v, digits=3):
    return f"{v:.{digits}f}" if isinstance(v, (int, float)) else "-"


def fmt_bytes(v):
    return f"{v:,}" if isinstance(v, int) else (f"{int(v):,}" if isinstance(v, float) else "-")


def render(res):
    L = [f"# Every tensor through cuwarden's vmm pool: keep, call sites, held over peak live ({res['device']}, "
         f"torch {res['torch']})", "",
         "## Speed and memory per configuration (interleaved rounds; medians over rounds)", "",
         "| config | keep | ms/step (min-max) | vs pytorch (per round) | held B | own peak live B | held / own peak live "
         "| old: held / PyTorch max_memory_allocated | driver calls per step: take / give back | waits per step "
         "| events complete |",
         "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- | --- | --- |"]
    for c, r in res["configs"].items():
        pr = " / ".join(f"{x:.3f}" for x in r.get("ratio_per_round", []))
        ms = f"{r['median_ms']:.2f} ({r['min_ms']:.2f}-{r['max_ms']:.2f})" if r.get("median_ms") else "-"
        calls = (f"{fmt_ratio(r.get('pool_driver_allocations_per_step'), 2)} / "
                 f"{fmt_ratio(r.get('pool_driver_frees_per_step'), 2)}") if "pool_driver_allocations_per_step" in r else "-"
        L.append(f"| {c} | {r.get('keep') or '-'} | {ms} | {fmt_ratio(r.get('ratio_of_medians'))} ({pr}) | "
                 f"{fmt_bytes(r.get('held_bytes'))} | {fmt_bytes(r.get('peak_live_bytes'))} | "
                 f"{fmt_ratio(r.get('held_over_peak_live'))} | "
                 f"{fmt_ratio(r.get('old_ratio_held_over_pytorch_max_allocated'))} | {calls} | "
                 f"{fmt_ratio(r.get('pool_waits_per_step'), 2)} | {r.get('events_complete', '-')} |")
    L += ["", "## Memory per configuration: cuwarden's own figures of the same process (medians over rounds)", "",
          "| config | own peak live B (requested) | rounded to 512 | in step | held B (events, from step "
          f"{HELD_AFTER}) | reserved counter B | held / peak live | held / peak rounded | reserved / peak live |",
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for c, r in res["configs"].items():
        if "peak_live_bytes" not in r:
            continue
        L.append(f"| {c} | {fmt_bytes(r.get('peak_live_bytes'))} | {fmt_bytes(r.get('peak_live_rounded_bytes'))} | "
                 f"{fmt_bytes(r.get('peak_live_step'))} | {fmt_bytes(r.get('held_bytes'))} | "
                 f"{fmt_bytes(r.get('reserved_counter_bytes'))} | {fmt_ratio(r.get('held_over_peak_live'), 4)} | "
                 f"{fmt_ratio(r.get('held_over_peak_live_rounded'), 4)} | "
                 f"{fmt_ratio(r.get('reserved_counter_over_peak_live'), 4)} |")
    p = res["pytorch"]
    L += ["", f"PyTorch's own (cache on): max_memory_allocated {fmt_bytes(p['max_memory_allocated'])} B, "
          f"max_memory_reserved {fmt_bytes(p['max_memory_reserved'])} B, peak requested "
          f"{fmt_bytes(p['max_memory_requested'])} B: reserved / allocated {fmt_ratio(p['reserved_over_allocated'])}, "
          f"reserved / requested {fmt_ratio(p['reserved_over_requested'])}", "",
          f"The first two tables: {res['peak_live_note']}; driver calls per measured step: pool_driver_allocations "
          "(vmm: cuMemCreate and cuMemMap) / pool_driver_frees (cuMemUnmap and cuMemRelease).", ""]
    ma = res.get("memory_allocated") or {}
    for tag, v in ma.items():
        if tag == "workspace_size_moves":
            continue
        L += [f"## memory_allocated against cuwarden's live bytes ({tag}: CUBLAS_WORKSPACE_CONFIG="
              f"{v.get('cublas_workspace_config')})", "",
              "| mark | memory_allocated | cuwarden via libc10_cuda | workspaces (count) | cuBLAS's own | "
              "tensors (libc10_cuda - workspaces) | difference | within 1 MiB | requested: cuwarden - PyTorch |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
        for r in v["marks"]:
            L.append(f"| {r['mark']} | {r['memory_allocated']:,} | {r['cuwarden_libc10_cuda']:,} | "
                     f"{r['workspace']:,} ({r['workspace_count']}) | {r['cublas_own']:,} | {r['cuwarden_tensors']:,} | "
                     f"{r['difference']:+,} | {r['within_1_MiB']} | {fmt_bytes(r.get('requested_difference'))} |")
        L += ["", "Sites that are not tensors, per mark (their first 8 frames; every frame in the JSON):", ""]
        for mark, sites in (v.get("sites") or {}).items():
            for label, d in (sites or {}).items():
                if d["class"] == "tensor":
                    continue
                L.append(f"- {mark}: {label}: {d['bytes']:,} B in {d['count']}; " + " < ".join(d["frames"][:8]))
        L.append("")
    if ma.get("workspace_size_moves"):
        L += ["Smaller workspaces (CUBLAS_WORKSPACE_CONFIG=:4096:4 against the default): how far the difference "
              "with workspaces counted moves, and the workspaces:", "", "```",
              json.dumps(ma["workspace_size_moves"], indent=1), "```", ""]
    return "\n".join(L) + "\n"


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "events":
        sys.exit(cmd_events(*sys.argv[2:5]))
    elif len(sys.argv) in (4, 5) and sys.argv[1] == "trace":
        source = sys.argv[4] if len(sys.argv) == 5 else f"cuwarden events of {os.path.basename(sys.argv[2])}"
        n, peak = write_trace(read_jsonl(sys.argv[2]), sys.argv[3], source)
        print(f"{sys.argv[3]}: {n} events, peak live {peak} bytes")
    elif len(sys.argv) == 3 and sys.argv[1] == "show":
        print(json.dumps(cmd_show(sys.argv[2]), indent=1))
    elif len(sys.argv) == 3 and sys.argv[1] == "summary":
        out = sys.argv[2]
        res = summarize(out)
        with open(f"{out}/tensors-keep.json", "w") as f:
            json.dump(res, f, indent=1)
        text = render(res)
        with open(f"{out}/summary.md", "w") as f:
            f.write(text)
        print(text)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
