#!/usr/bin/env python3
"""bench/vmm_gpu.sh's report: the raw runs of the trace replays into a results pair.

    vmm_report.py RAW_DIR OUT_PREFIX     writes OUT_PREFIX.md and OUT_PREFIX.json, prints the .md

RAW_DIR holds env.txt, NAME--cap.txt, and per run NAME--ROW--TAG.json (one JSON object from
cuw_trace_replay or replay_torch.py; TAG is `held` or `time-N`) or NAME--ROW--TAG.err (why not).
"""
import json
import pathlib
import statistics
import sys

ROWS = [  # (row id in the file names, label in the table)
    ("cudaMalloc", "cudaMalloc"),
    ("cudaMallocAsync", "cudaMallocAsync"),
    ("cache", "cache"),
    ("cache-cap", "cache, cap 1.05x"),
    ("vmm", "vmm"),
    ("vmm-cap", "vmm, cap 1.05x"),
    ("torch", "torch"),
    ("torch-expandable", "torch expandable"),
]
TRACE_ORDER = ["gpt2-train", "gpt2-generate", "cupy-grow"]


def keep_order(row):
    """vmm-keep-<K> rows by K: shares (`5pct`) before sizes (`256M`), each by its number."""
    k = row[len("vmm-keep-"):]
    digits = "".join(c for c in k if c.isdigit() or c == ".") or "0"
    return (0 if k.endswith("pct") or k == "0" else 1, float(digits))


def gib(n):
    return f"{n / 2**30:.2f}"


def main():
    raw, prefix = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    env = {}
    for line in (raw / "env.txt").read_text().splitlines():
        k, _, v = line.partition("=")
        env[k] = v
    names = sorted({p.name.split("--")[0] for p in raw.glob("*--*")},
                   key=lambda n: (TRACE_ORDER.index(n) if n in TRACE_ORDER else len(TRACE_ORDER), n))
    doc = {"env": env, "traces": {}}
    md = [f"Command: `{env.get('command', 'bash bench/vmm_gpu.sh')}`", ""]
    if env.get("fake") == "1":
        md.append(f"Simulated driver (fakecuda), commit {env.get('commit')}, {env.get('date')}; held = the simulated "
                  "driver's bytes in use; times are the simulated driver's, not a GPU's.")
    else:
        md.append(f"{env.get('gpu', '?')} ({env.get('gpu_memory', '?')}), driver {env.get('driver', '?')} "
                  f"(CUDA {env.get('cuda_driver', '?')}), PyTorch {env.get('torch', '?')}, commit {env.get('commit')}, "
                  f"{env.get('date')}, CPU {env.get('cpu', '?')}.")
    md += ["",
           "held / peak live: the most the process held on the device during the replay (held pass: NVML's used "
           "bytes after every allocation less the figure before the replay; torch rows: "
           "`torch.cuda.max_memory_reserved()`), over the trace's peak of live requested bytes. "
           f"Seconds: the replay loop, median of {env.get('rounds', '?')} time passes [min, max]; torch rows "
           "include Python's own cost per event.", ""]
    ok = True
    for name in names:
        cap_file = raw / f"{name}--cap.txt"
        cap = int(cap_file.read_text()) if cap_file.exists() else None
        trace = {"cap_bytes": cap, "rows": []}
        header = None
        lines = ["| row | held / peak live | held GiB | refusals | median s | spread [min, max] | note |",
                 "| --- | ---: | ---: | ---: | ---: | --- | --- |"]
        keeps = sorted({p.name.split("--")[1] for p in raw.glob(f"{name}--vmm-keep-*")}, key=keep_order)
        for row, label in ROWS + [(k, "vmm, keep " + k[len("vmm-keep-"):].replace("pct", "%")) for k in keeps]:
            held_file, held_err = raw / f"{name}--{row}--held.json", raw / f"{name}--{row}--held.err"
            times = []
            errors = []
            for p in sorted(raw.glob(f"{name}--{row}--time-*.json")):
                times.append(json.loads(p.read_text()))
            for p in sorted(raw.glob(f"{name}--{row}--time-*.err")):
                errors.append(p.read_text().strip())
            held = json.loads(held_file.read_text()) if held_file.exists() else None
            if held_err.exists():
                errors.insert(0, held_err.read_text().strip())
            if held is None and not times and not errors:
                continue
            ref = held or (times[0] if times else None)
            if ref and header is None:
                header = ref
            secs = [t["seconds"] for t in times if t.get("seconds") is not None]
            entry = {"row": label, "held": held, "time_passes": times, "errors": errors}
            note = []
            if held:
                entry["held_over_live"] = held.get("held_over_live")
                entry["held_peak_bytes"] = held.get("held_peak_bytes")
                entry["held_source"] = held.get("held_source")
                if held.get("held_nvml_peak_bytes") is not None and held.get("peak_live_bytes"):
                    note.append(f"NVML {held['held_nvml_peak_bytes'] / held['peak_live_bytes']:.3f}x")
                if held.get("driver_calls"):
                    note.append("calls: " + ", ".join(f"{k} {v}" for k, v in held["driver_calls"].items() if v))
            refusals = [held["refusals"]] if held else []
            refusals += [t["refusals"] for t in times]
            entry["refusals"] = refusals
            if secs:
                entry["median_s"] = statistics.median(secs)
                entry["min_s"], entry["max_s"] = min(secs), max(secs)
            if held and held.get("first_refusal"):
                fr = held["first_refusal"]
                note.append(f"first refusal: event {fr['event']}, {gib(fr['bytes'])} GiB, {fr['error']}")
            if errors:
                note.append(errors[0][:200].replace("|", "/"))
                if not errors[0].startswith(("configuration error", "skipped")):
                    ok = False
            trace["rows"].append(entry)
            # The held pass's count, then the time passes' range where it differs.
            t_ref = [t["refusals"] for t in times]
            ref_text = str(held["refusals"]) if held else ""
            if t_ref and (not held or set(t_ref) != {held["refusals"]}):
                span = f"{min(t_ref)}" if min(t_ref) == max(t_ref) else f"{min(t_ref)}-{max(t_ref)}"
                ref_text = f"{ref_text} (time {span})".strip()
            lines.append("| {} | {} | {} | {} | {} | {} | {} |".format(
                label,
                f"{held['held_over_live']:.3f}" if held and held.get("held_over_live") is not None else "",
                gib(held["held_peak_bytes"]) if held and held.get("held_peak_bytes") is not None else "",
                ref_text,
                f"{entry['median_s']:.4f}" if secs else "",
                f"[{entry['min_s']:.4f}, {entry['max_s']:.4f}]" if secs else "",
                "; ".join(note)))
        if header:
            trace.update(events=header["events"], allocations=header["allocations"],
                         peak_live_bytes=header["peak_live_bytes"])
            md.append(f"### {name}: {header['events']} events, {header['allocations']} allocations, peak live "
                      f"{gib(header['peak_live_bytes'])} GiB" + (f", cap {gib(cap)} GiB ({cap} bytes)" if cap else ""))
        else:
            md.append(f"### {name}")
        md += ["", *lines, ""]
        doc["traces"][name] = trace
    prefix.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    prefix.with_suffix(".md").write_text("\n".join(md))
    print("\n".join(md))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
