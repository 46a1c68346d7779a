#!/usr/bin/env python3
"""cuwarden: report of bench/cache_gpu.sh (CUWARDEN_POOL=cache).

    cache_report.py RAW_DIR OUT_PREFIX

Reads RAW_DIR/{env.txt, pairs-MODE-N.json, e2e-MODE-N.json, cupy-MODE-N.json}, writes
OUT_PREFIX.md and OUT_PREFIX.json, prints the markdown. Medians over every repetition of
every run. Exit 1 when a part is missing or checksums differ between modes.
"""
import glob
import json
import os
import statistics
import sys

SIZES = [(4 << 10, "4 KiB"), (1 << 20, "1 MiB"), (64 << 20, "64 MiB"), (1 << 30, "1 GiB")]
MODES = ["bare", "off", "cache"]


def load(raw, prefix):
    out = {}
    for path in sorted(glob.glob(os.path.join(raw, prefix + "-*.json"))):
        mode = os.path.basename(path)[len(prefix) + 1:].rsplit("-", 1)[0]
        with open(path) as f:
            try:
                out.setdefault(mode, []).append(json.loads(f.read()))
            except ValueError:
                pass
    return out


def fmt_ns(v):
    if v is None:
        return "-"
    return f"{v / 1000:.2f} us" if v >= 10000 else f"{v:.0f} ns"


def main():
    raw, prefix = sys.argv[1], sys.argv[2]
    env = {}
    if os.path.exists(os.path.join(raw, "env.txt")):
        for line in open(os.path.join(raw, "env.txt")):
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                env[k] = v
    ok = True
    pairs = load(raw, "pairs")
    # medians[(mode, api, bytes)] = ns per pair
    samples = {}
    run_medians = {}  # (mode, api, bytes) -> the median of each run
    for mode, runs in pairs.items():
        for run in runs:
            for r in run.get("results", []):
                if r.get("op") != "alloc_free":
                    continue
                samples.setdefault((mode, r["api"], r["bytes"]), []).extend(r["ns"])
                if r["ns"]:
                    run_medians.setdefault((mode, r["api"], r["bytes"]), []).append(statistics.median(r["ns"]))
    med = {k: statistics.median(v) for k, v in samples.items() if v}
    if not med:
        ok = False
    rows = []
    for size, label in SIZES:
        native_async = med.get(("bare", "async", size))
        for api in ("driver", "runtime", "async"):
            n, o, c = (med.get((m, api, size)) for m in MODES)
            row = {"size": size, "label": label, "api": api, "native_ns": n, "off_ns": o, "cache_ns": c}
            row["off_added_ns"] = (o - n) if (o is not None and n is not None) else None
            if api == "driver" and c is not None:
                row["target"] = "cache <= 150 ns"
                row["met"] = c <= 150
            elif api == "runtime" and c is not None and native_async is not None:
                row["target"] = f"cache <= {native_async / 2:.0f} ns (half of cudaMallocAsync)"
                row["met"] = c <= native_async / 2
            else:
                row["target"], row["met"] = "", None
            # "off adds at most 100 ns" can only be judged where the native pair is steady to
            # better than that from run to run; a 60 us cudaMalloc pair moves by microseconds.
            natives = run_medians.get(("bare", api, size), [])
            row["native_spread_ns"] = (max(natives) - min(natives)) if len(natives) > 1 else None
            if row["off_added_ns"] is not None:
                if row["native_spread_ns"] is not None and row["native_spread_ns"] > 100:
                    row["off_met"] = None
                else:
                    row["off_met"] = row["off_added_ns"] <= 100
            rows.append(row)

    def e2e_part(name):
        nonlocal ok
        runs = load(raw, name)
        if not runs:
            return None
        part = {"modes": {}}
        sums = set()
        for mode, rs in runs.items():
            us = [r["us_per_step"] for r in rs if "us_per_step" in r]
            al = [r["alloc_us_per_step"] for r in rs if "alloc_us_per_step" in r]
            fr = [r["free_us_per_step"] for r in rs if "free_us_per_step" in r]
            part["modes"][mode] = {"us_per_step": statistics.median(us) if us else None,
                                   "alloc_us_per_step": statistics.median(al) if al else None,
                                   "free_us_per_step": statistics.median(fr) if fr else None,
                                   "checksums": sorted({r.get("checksum") for r in rs}),
                                   "kernel": rs[0].get("kernel")}
            sums.update(r.get("checksum") for r in rs)
        part["identical"] = len(sums) == 1
        b = part["modes"].get("bare", {}).get("us_per_step")
        c = part["modes"].get("cache", {}).get("us_per_step")
        part["speedup"] = (b / c) if (b and c) else None
        f = part["modes"].get("floor", {}).get("us_per_step")
        part["floor_speedup"] = (b / f) if (b and f) else None
        part["floor_share"] = (f / c) if (f and c) else None
        if not part["identical"]:
            ok = False
        return part

    # hookcost: per (api, bytes) the median over runs of each run's median added ns.
    hook = {}
    for mode, runs in load(raw, "hookcost").items():
        for run in runs:
            for r in run.get("results", []):
                hook.setdefault((mode, r["api"], r["bytes"]), []).append(r)
    hookcost = []
    for (mode, api, size), rs in sorted(hook.items()):
        added = sorted(x["added_ns"] for x in rs)
        hookcost.append({"mode": mode, "api": api, "bytes": size, "runs": len(rs),
                         "added_ns": statistics.median(added), "added_ns_runs": added,
                         "hooked_ns": statistics.median(x["hooked_ns"] for x in rs),
                         "driver_ns": statistics.median(x["driver_ns"] for x in rs),
                         "q1_ns": statistics.median(x["added_q1_ns"] for x in rs),
                         "q3_ns": statistics.median(x["added_q3_ns"] for x in rs),
                         # standard error of one run's median, from its interquartile range
                         "se_ns": statistics.median(0.93 * (x["added_q3_ns"] - x["added_q1_ns"]) / max(x["rounds"], 1) ** 0.5
                                                    for x in rs)})

    e2e = e2e_part("e2e")
    e2e_check10 = e2e_part("e2e_check10")
    e2e_upload = e2e_part("e2e_upload")
    cupy = e2e_part("cupy")
    cupy_check10 = e2e_part("cupy_check10")
    if e2e is None:
        ok = False

    title = f"# CUWARDEN_POOL=cache on {env.get('gpu', env.get('tag', '?'))} ({env.get('date', '?')})"
    md = [title, "",
          f"Driver {env.get('driver', '-')}, CUDA driver API {env.get('cuda_driver', '-')}, CuPy {env.get('cupy', '-')}, "
          f"commit {env.get('commit', '?')}, CPU {env.get('cpu', '?')}. Produced by `bench/cache_gpu.sh`"
          + (" on the simulated driver (not GPU numbers)." if env.get("fake") == "1" else "."),
          "", "## Alloc+free pair, median", "",
          "| size | API | native | cuwarden off | off adds | off adds <= 100 ns | cuwarden cache | cache target | met |",
          "| --- | --- | ---: | ---: | ---: | --- | ---: | --- | --- |"]
    names = {"driver": "cuMemAlloc+cuMemFree", "runtime": "cudaMalloc+cudaFree",
             "async": "cudaMallocAsync+cudaFreeAsync"}
    for r in rows:
        met = "" if r["met"] is None else ("yes" if r["met"] else "**no**")
        if "off_met" not in r:
            off = "-"
        elif r["off_met"] is None:
            off = f"not resolvable (native moves {fmt_ns(r['native_spread_ns'])} between runs)"
        else:
            off = "yes" if r["off_met"] else "**no**"
        added = r["off_added_ns"]
        md.append(f"| {r['label']} | {names[r['api']]} | {fmt_ns(r['native_ns'])} | {fmt_ns(r['off_ns'])} | "
                  f"{(fmt_ns(added) if added >= 0 else '-' + fmt_ns(-added)) if added is not None else '-'} | {off} | "
                  f"{fmt_ns(r['cache_ns'])} | {r['target']} | {met} |")
    md += ["", "cudaMallocAsync rows are the driver's own stream-ordered pool in every column (cuwarden "
           "passes it through); they are the reference the runtime target is measured against.", ""]
    if hookcost:
        md += ["## What `off` adds, measured inside one process (`cuw_bench_gpu hookcost`)", "",
               "The same driver-API pair through cuwarden's hooks and through libcuda's own entry points, in "
               "alternating batches (8 pairs for cuMemAlloc, 64 for cuMemAllocAsync) of 400 rounds; the median of "
               "the per-batch differences, then the median over runs. `bare` runs the same program without "
               "cuwarden: both paths are then the driver's, and its figure is the method's own noise.", "",
               "± is two standard errors of a run's median (0.93 x interquartile range / sqrt(rounds), per run, "
               "then the median over runs); the verdict holds only when the whole interval is on one side of 100 ns.", "",
               "| mode | pair | size | hooked | driver's own | added (median of runs) | each run | <= 100 ns |",
               "| --- | --- | --- | ---: | ---: | ---: | --- | --- |"]
        pname = {"driver": "cuMemAlloc+cuMemFree", "async": "cuMemAllocAsync+cuMemFreeAsync"}
        for h in hookcost:
            label = dict(SIZES).get(h["bytes"], str(h["bytes"]))
            err = 2 * h["se_ns"]
            if h["mode"] != "off":
                verdict = ""
            elif h["added_ns"] + err <= 100:
                verdict = "yes"
            elif h["added_ns"] - err > 100:
                verdict = "**no**"
            else:
                verdict = "undecided (the interval holds 100 ns)"
            md.append(f"| {h['mode']} | {pname.get(h['api'], h['api'])} | {label} | {fmt_ns(h['hooked_ns'])} | "
                      f"{fmt_ns(h['driver_ns'])} | {h['added_ns']:.0f} ± {err:.0f} ns | "
                      f"{', '.join(f'{a:.0f}' for a in h['added_ns_runs'])} | {verdict} |")
        md.append("")
    for name, part, what in (("e2e", e2e, "C++ loop: 4 x cudaMalloc, device fill, kernel, 16 KiB read back, "
                                           "4 x cudaFree per step"),
                             ("e2e_check10", e2e_check10, "the same loop reading its 16 KiB back every 10th step "
                                                          "only (`--check-every 10`)"),
                             ("e2e_upload", e2e_upload, "the same loop with its 4 MiB input copied from pageable "
                                                        "host memory every step (`--upload`)"),
                             ("cupy", cupy, "CuPy with its memory pool disabled"),
                             ("cupy_check10", cupy_check10, "CuPy with its memory pool disabled, results read "
                                                            "back every 10th step")):
        md.append(f"## End to end: {what}")
        md.append("")
        if part is None:
            md += ["not measured (see the log)", ""]
            continue
        md += ["| mode | us per step | in cudaMalloc (us/step) | in cudaFree (us/step) | checksum |",
               "| --- | ---: | ---: | ---: | --- |"]
        for mode in MODES + ["floor"]:
            m = part["modes"].get(mode)
            if m:
                a = m.get("alloc_us_per_step")
                f = m.get("free_us_per_step")
                md.append(f"| {mode} | {m['us_per_step']:.1f} | {'-' if a is None else f'{a:.2f}'} | "
                          f"{'-' if f is None else f'{f:.2f}'} | {', '.join(str(s) for s in m['checksums'])} |")
        sp = f"{part['speedup']:.1f}x" if part["speedup"] else "-"
        md += ["", f"Speedup with `CUWARDEN_POOL=cache`: **{sp}** (target 5x); results identical across modes: "
               f"**{'yes' if part['identical'] else 'NO'}**."]
        if part.get("floor_speedup"):
            md.append(f"The floor (no allocation in the loop) is {part['floor_speedup']:.1f}x bare: the most any "
                      f"allocator could give this program; cache reaches {part['floor_share']:.0%} of it.")
        md.append("")

    with open(prefix + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    with open(prefix + ".json", "w") as f:
        json.dump({"env": env, "pairs": rows, "hookcost": hookcost, "e2e": e2e, "e2e_check10": e2e_check10, "e2e_upload": e2e_upload,
                   "cupy": cupy, "cupy_check10": cupy_check10}, f, indent=1)
    print("\n".join(md))
    print(f"\nwritten: {prefix}.md, {prefix}.json")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
