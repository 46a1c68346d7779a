"""compat.sh helper: judges one row from what the program printed and what cuwarden counted,
and writes the final matrix (compat.md, compat.json).

  report.py row   --rows-file F --id N --key K --program TEXT --cap SPEC --rc RC --seconds S
                  --timeout T --log LOG --pre PRE.json --poll POLL.json --post POST.json
                  --command TEXT [--parts N] [--require-reach]
  report.py skip  --rows-file F --id N --key K --program TEXT --cap SPEC --reason TEXT
  report.py final --rows-file F --md OUT.md --json OUT.json [--meta KEY=VALUE ...]
                  [--merge OTHER/compat.json ...] [--not-run TEXT]

"cap respected" of a row is
  yes  for every (process, device) of the row: cuwarden's peak <= cap, the program's own
       figures (bytes it holds, the framework's reserved/pool figure) <= cap, the driver's
       own per-process figure (NVML, when the daemon has it) <= cap + DRIVER_SLACK_MIB (context
       and modules are never allocation calls), and the program was refused before its target;
  no   any of those figures over the cap (something got past the count), or the program reached
       its target (4x the cap) without a refusal;
  ?    nothing over the cap, but no refusal seen (crash, hang, other error) or figures missing.
"""
import argparse
import json
import os
import re
import sys

MiB = 1 << 20
GiB = 1 << 30
DRIVER_SLACK = int(os.environ.get("DRIVER_SLACK_MIB", "2048")) * MiB
UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40,
         "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40,
         "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12}
SIGNALS = {4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}


def parse_size(text):
    """cuwarden's size syntax: bare bytes; K M G T and KiB..TiB = 1024; kB MB GB TB = 1000."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text or "")
    if not m:
        return None
    unit = m.group(2)
    if unit in ("kB", "KB", "MB", "GB", "TB"):
        mult = UNITS[unit.upper()]
    else:
        mult = UNITS.get(unit.upper())
    return None if mult is None else int(float(m.group(1)) * mult)


def cap_map(spec):
    """'4G' -> {None: 4 GiB}; '0=4G,1=2G' -> {0: 4 GiB, 1: 2 GiB}."""
    out = {}
    for item in (spec or "").split(","):
        if "=" in item:
            k, v = item.split("=", 1)
            out[int(k)] = parse_size(v)
        elif item.strip():
            out[None] = parse_size(item)
    return out


def cap_display(spec):
    """'4G' -> '4 GiB'; '0=4G,1=2G' -> 'gpu0 4 GiB, gpu1 2 GiB'."""
    caps = cap_map(spec)
    if not caps or any(v is None for v in caps.values()):
        return spec or "—"

    def one(b):
        return ("%d GiB" % (b // GiB)) if b % GiB == 0 else ("%d MiB" % (b // MiB) if b % MiB == 0 else "%d B" % b)
    return ", ".join(("gpu%d " % k if k is not None else "") + one(v) for k, v in sorted(caps.items(), key=lambda kv: -1 if kv[0] is None else kv[0]))


def cap_for(caps, device):
    return caps.get(device, caps.get(None))


def gib(b):
    return "—" if b is None else "%.2f GiB" % (b / GiB)


def fmt(b):
    return "—" if b is None else "%d (%s)" % (b, gib(b))


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except Exception:  # noqa: BLE001
        return None


def pids_in(state):
    return {p.get("pid") for p in (state or {}).get("processes", []) or []}


def devices_in(state):
    out = {}
    for p in (state or {}).get("processes", []) or []:
        for d in p.get("devices", []) or []:
            out[(p.get("pid"), d.get("ordinal"))] = dict(d, process_name=p.get("process_name"), state=p.get("state"))
    return out


def num(v):
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def hi(*vals):
    vals = [v for v in vals if num(v) is not None]
    return max(vals) if vals else None


def parse_parts(log_path):
    """The program's JSON lines, normalized to the part format (cuwq.py)."""
    parts, tail = [], []
    try:
        lines = open(log_path, errors="replace").read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        s = line.strip()
        if not s.startswith("{"):
            continue
        try:
            doc = json.loads(s)
        except ValueError:
            continue
        if not isinstance(doc, dict):
            continue
        if doc.get("compat") == 1:
            parts.append(doc)
        elif "allocated_bytes" in doc:  # the carried probes (cuw_alloc_probe, cuw_nvcc_probe_*)
            api = doc.get("api") or "runtime"
            err = doc.get("first_error")
            part = {"pid": doc.get("pid"), "device": 0, "api": api, "held_bytes": doc.get("allocated_bytes"),
                    "chunks": doc.get("chunks"), "framework_bytes": doc.get("allocated_bytes"),
                    "framework_figure": "bytes %s returned" % ("cuMemAlloc_v2" if api == "driver" else "cudaMalloc"),
                    "outcome": err if err else "no error (reached --max)", "oom": bool(doc.get("first_error_is_oom")),
                    "meminfo_total": doc.get("meminfo_total"), "checks": {},
                    "message": doc.get("unexpected_error") or ""}
            if "kernel_checked" in doc:
                part["checks"]["kernels wrote every buffer"] = doc.get("kernel_checked") is True
            parts.append(part)
    tail = [ln[:300] for ln in lines if not ln.startswith(("alloc index=", "{"))][-15:]
    return parts, tail


def rc_outcome(rc, timeout):
    if rc == 124:
        return "hang (killed after %s s)" % timeout
    if rc == 137:
        return "hang (killed with SIGKILL after %s s)" % timeout
    if rc == 78:
        return "cuwarden configuration error (exit 78)"
    if rc > 128:
        return "crash (signal %d %s)" % (rc - 128, SIGNALS.get(rc - 128, ""))
    return "crash (exit %d, no result line)" % rc


def judge_part(part, caps, cw, require_reach):
    """Fills part["verdict"] ('yes'|'no'|'?') and part["why"]; returns the verdict."""
    dev = part.get("device")
    cap = cap_for(caps, dev)
    part["cap"] = cap
    why, bad, unknown = [], False, False
    peak, limit = cw.get("peak_bytes"), cw.get("limit_bytes")
    held, fw = num(part.get("held_bytes")), num(part.get("framework_bytes"))
    drv = cw.get("driver_used_bytes_max")
    if cap is None:
        return "?"
    if peak is None:
        unknown = True
        why.append("cuwarden's daemon never saw this process")
    elif peak > cap:
        bad = True
        why.append("cuwarden peak %s > cap" % gib(peak))
    if limit is not None and limit != cap:
        bad = True
        why.append("cuwarden's limit is %s, not the cap %s" % (fmt(limit), gib(cap)))
    for label, v in (("program holds", held), ("framework figure", fw)):
        if v is not None and v > cap:
            bad = True
            why.append("%s %s > cap" % (label, gib(v)))
    if drv is not None and drv > cap + DRIVER_SLACK:
        bad = True
        why.append("driver (NVML) figure %s > cap + %s" % (gib(drv), gib(DRIVER_SLACK)))
    # A program that died without its own figures still shows the cap held when cuwarden
    # refused it and the driver's own figure for it stayed within the cap (+ slack).
    vouched = (cw.get("ooms") or 0) > 0 and peak is not None and peak <= cap and drv is not None \
        and drv <= cap + DRIVER_SLACK
    if held is None and fw is None:
        if vouched:
            why.append("no figures from the program; cuwarden refused it and the driver's figure stayed within the cap")
        else:
            unknown = True
    if not part.get("oom"):
        if str(part.get("outcome", "")).startswith("no error"):
            bad = True
            why.append("never refused: reached its target")
        elif vouched:
            why.append("the program did not report the refusal itself")
        else:
            unknown = True
            why.append("no out-of-memory refusal seen")
    if require_reach and held is not None and held + 256 * MiB < cap:
        part.setdefault("checks", {})["allocated up to the cap (>= cap - one chunk)"] = False
    elif require_reach and held is not None:
        part.setdefault("checks", {})["allocated up to the cap (>= cap - one chunk)"] = True
    verdict = "no" if bad else ("?" if unknown else "yes")
    part["verdict"], part["why"] = verdict, why
    return verdict


def cmd_row(a):
    caps = cap_map(a.cap)
    parts, tail = parse_parts(a.log)
    pre, post, poll = load_json(a.pre), load_json(a.post), load_json(a.poll) or {}
    pre_pids = pids_in(pre)
    post_devs = devices_in(post)
    poll_devs = {(d.get("pid"), d.get("ordinal")): d for d in (poll.get("devices") or {}).values()}
    new_keys = sorted({k for k in list(post_devs) + list(poll_devs) if k[0] not in pre_pids},
                      key=lambda k: (k[0] or 0, k[1] or 0))

    def counted(pid, ordinal, part=None):
        p, q = post_devs.get((pid, ordinal)) or {}, poll_devs.get((pid, ordinal)) or {}
        selfq = ((part or {}).get("cuwarden_at_oom") or {}).get(str(ordinal)) or {}
        return {
            "peak_bytes": hi(p.get("peak_bytes"), q.get("peak_bytes"), selfq.get("peak_bytes")),
            "limit_bytes": num(p.get("limit_bytes")) if num(p.get("limit_bytes")) is not None
            else (q.get("limit_bytes") if q.get("limit_bytes") is not None else selfq.get("limit_bytes")),
            "ooms": hi(p.get("ooms"), q.get("ooms"), selfq.get("ooms")),
            "used_at_oom": selfq.get("used_bytes"),
            "driver_used_bytes_max": hi(q.get("driver_used_bytes_max"), selfq.get("driver_used_bytes")),
            "alloc_count": hi(p.get("alloc_count"), q.get("alloc_count")),
            "state": p.get("state") or q.get("state"),
        }

    skipped = [p for p in parts if p.get("skipped")]
    row = {"id": a.id, "key": a.key, "program": a.program, "cap_spec": a.cap, "rc": a.rc,
           "seconds": a.seconds, "command": a.command, "log_tail": tail, "notes": [], "checks": {}}
    if skipped:
        row.update(status="not run", respected="—", outcome=skipped[0].get("outcome"), parts=[],
                   passed=None)
        row["notes"].append(skipped[0].get("message") or "")
        return finish_row(a, row)

    crash = None
    if a.rc != 0 and (a.rc in (124, 137, 78) or a.rc > 128 or not parts):
        crash = rc_outcome(a.rc, a.timeout)
    if not parts:  # nothing printed: what the daemon saw of the new processes stands in
        for pid, ordinal in new_keys:
            c = counted(pid, ordinal)
            if (c["alloc_count"] or 0) > 0 or (c["peak_bytes"] or 0) > 0:
                parts.append({"pid": pid, "device": ordinal, "held_bytes": None, "framework_bytes": None,
                              "framework_figure": None, "outcome": crash, "oom": False, "derived": True})
        if not parts:
            parts.append({"pid": None, "device": 0, "held_bytes": None, "framework_bytes": None,
                          "framework_figure": None, "outcome": crash, "oom": False, "derived": True})
    elif crash:
        for p in parts:
            p["outcome"] = "%s, then %s" % (p.get("outcome"), crash)

    parts.sort(key=lambda p: (p.get("device") if isinstance(p.get("device"), int) else 99, p.get("rank") or 0))
    verdicts = []
    part_keys = set()
    for p in parts:
        c = counted(p.get("pid"), p.get("device"), p)
        p["cuwarden"] = c
        part_keys.add((p.get("pid"), p.get("device")))
        verdicts.append(judge_part(p, caps, c, a.require_reach))
        for name, ok in (p.get("checks") or {}).items():
            label = name if len(parts) == 1 else "%s: %s" % (part_label(p), name)
            row["checks"][label] = bool(ok)
        total, cap = num(p.get("meminfo_total")), cap_for(caps, p.get("device"))
        if total is not None and cap is not None:
            row["checks"][("" if len(parts) == 1 else part_label(p) + ": ") + "meminfo total = cap"] = total == cap
    # Other processes that appeared during the row (children, helpers) are held to their caps too.
    others = []
    for k in new_keys:
        if k in part_keys or k[0] in {p.get("pid") for p in parts if p.get("derived")}:
            continue
        c = counted(*k)
        if (c["peak_bytes"] or 0) == 0 and (c["alloc_count"] or 0) == 0:
            continue
        cap = cap_for(caps, k[1])
        over = cap is not None and c["peak_bytes"] is not None and c["peak_bytes"] > cap
        others.append({"pid": k[0], "device": k[1], "peak_bytes": c["peak_bytes"], "limit_bytes": c["limit_bytes"],
                       "over_cap": over})
        if over:
            verdicts.append("no")
    if a.parts and len([p for p in parts if not p.get("derived")]) < a.parts:
        row["checks"]["%d result line(s), one per process and device" % a.parts] = False
    row["parts"], row["other_processes"] = parts, others
    row["respected"] = "no" if "no" in verdicts else ("?" if "?" in verdicts or not verdicts else "yes")
    row["status"] = "ran"
    row["outcome"] = "; ".join(dict.fromkeys(
        (part_label(p) + ": " if len(parts) > 1 else "") + str(p.get("outcome")) for p in parts))
    errors = [p for p in parts if str(p.get("outcome", "")).startswith(("error", "crash", "hang"))]
    row["passed"] = row["respected"] == "yes" and all(row["checks"].values()) and not errors
    return finish_row(a, row)


def part_label(p):
    if p.get("rank") is not None:
        return "rank%s gpu%s" % (p.get("rank"), p.get("device"))
    return "gpu%s" % p.get("device")


def finish_row(a, row):
    with open(a.rows_file, "a") as f:
        f.write(json.dumps(row, default=str) + "\n")
    print("ROW %-3s %-22s cap respected: %-3s  pass: %-5s  outcome: %s" %
          (row["id"], row["key"], row["respected"], row.get("passed"), str(row.get("outcome"))[:160]))
    for p in row.get("parts", []):
        c = p.get("cuwarden") or {}
        print("    %-12s cuwarden peak %s, limit %s, refusals %s, driver max %s | program holds %s, %s = %s | %s%s" % (
            part_label(p), fmt(c.get("peak_bytes")), fmt(c.get("limit_bytes")),
            "—" if c.get("ooms") is None else c.get("ooms"), gib(c.get("driver_used_bytes_max")),
            fmt(num(p.get("held_bytes"))), p.get("framework_figure") or "framework figure",
            fmt(num(p.get("framework_bytes"))), p.get("verdict"), (" (" + "; ".join(p.get("why")) + ")") if p.get("why") else ""))
    for name, ok in row.get("checks", {}).items():
        print("    %s %s" % ("ok  " if ok else "FAIL", name))
    return 0


def cmd_skip(a):
    row = {"id": a.id, "key": a.key, "program": a.program, "cap_spec": a.cap, "status": "not run",
           "respected": "—", "outcome": "not run: " + a.reason, "parts": [], "notes": [], "checks": {},
           "passed": None}
    return finish_row(a, row)


# ---------------------------------------------------------------------------------------------
def cell(text, limit=400):
    text = " ".join(str(text).split())
    if len(text) > limit:
        text = text[:limit - 1] + "…"
    return text.replace("|", "\\|")


def row_cells(r):
    parts = r.get("parts") or []
    multi = len(parts) > 1

    def per_part(fn):
        vals = [("%s: " % part_label(p) if multi else "") + fn(p) for p in parts]
        return "; ".join(vals) if vals else "—"

    counted = per_part(lambda p: fmt((p.get("cuwarden") or {}).get("peak_bytes")))
    framework = per_part(lambda p: ("%s = %s" % (p.get("framework_figure"), fmt(num(p.get("framework_bytes")))))
                         if p.get("framework_figure") else "—")
    notes = []
    if r.get("merged_from"):
        notes.append("from the run of %s" % r["merged_from"])
    for p in parts:
        c = p.get("cuwarden") or {}
        pre = part_label(p) + ": " if multi else ""
        bits = []
        if num(p.get("held_bytes")) is not None:
            bits.append("holds %s%s" % (gib(p["held_bytes"]),
                                        " in %s chunks" % p["chunks"] if p.get("chunks") is not None else ""))
        if c.get("used_at_oom") is not None:
            bits.append("cuwarden used at the refusal %s" % gib(c["used_at_oom"]))
        if c.get("ooms") is not None:
            bits.append("refusals by cuwarden %s" % c["ooms"])
            if c["ooms"] == 0 and p.get("oom"):
                bits.append("the refusal came from the program's own limit, not from cuwarden")
        if c.get("driver_used_bytes_max") is not None:
            bits.append("driver (NVML) max %s" % gib(c["driver_used_bytes_max"]))
        if p.get("why"):
            bits.append("; ".join(p["why"]))
        if p.get("message"):
            bits.append("“%s”" % cell(p["message"], 160))
        if bits:
            notes.append(pre + ", ".join(bits))
    for o in r.get("other_processes") or []:
        notes.append("also pid %s gpu%s: peak %s%s" % (o["pid"], o["device"], gib(o["peak_bytes"]),
                                                      " OVER CAP" if o.get("over_cap") else ""))
    for name, ok in (r.get("checks") or {}).items():
        notes.append(("✓ " if ok else "✗ ") + name)
    notes += [n for n in r.get("notes") or [] if n]
    if r.get("status") == "ran":
        notes.append("exit %s, %s s" % (r.get("rc"), r.get("seconds")))
    cap = cap_display(r.get("cap_spec"))
    return ["%s. %s" % (r["id"], r["program"]), cap, r.get("respected", "?"), counted, framework,
            r.get("outcome") or "—", "; ".join(notes)]


HEADER = ["program", "cap", "cap respected", "counted by cuwarden (peak)", "framework's own figure",
          "outcome past the cap", "notes"]


def matrix_lines(rows):
    out = ["| " + " | ".join(HEADER) + " |", "| " + " | ".join("---" for _ in HEADER) + " |"]
    for r in rows:
        cells = row_cells(r)
        out.append("| " + " | ".join(cell(c, 160 if i < 6 else 1200) for i, c in enumerate(cells)) + " |")
    return out


def cmd_final(a):
    rows = []
    try:
        for line in open(a.rows_file):
            if line.strip():
                rows.append(json.loads(line))
    except OSError:
        pass
    meta = {}
    for kv in a.meta or []:
        k, _, v = kv.partition("=")
        meta[k] = v
    here = {r["id"] for r in rows if r.get("status") == "ran"}
    merged = []
    for path in a.merge or []:
        other = load_json(path) or {}
        om = other.get("meta", {})
        origin = "%s on %s (%s GPU(s))" % (om.get("date", "?"), om.get("device", "?"), om.get("gpu_count", "?"))
        for r in other.get("rows", []):
            if r.get("status") == "ran" and r["id"] not in here:
                rows = [x for x in rows if x["id"] != r["id"]]
                r.setdefault("merged_from", origin)  # keep the run it really came from
                rows.append(r)
                here.add(r["id"])
        merged.append("%s: %s" % (os.path.basename(path), origin))
    rows.sort(key=lambda r: int(r["id"]) if str(r["id"]).isdigit() else 999)
    ran = [r for r in rows if r.get("status") == "ran"]
    summary = "%d rows run: cap respected yes %d, no %d, ? %d; rows passing every check %d" % (
        len(ran), sum(r["respected"] == "yes" for r in ran), sum(r["respected"] == "no" for r in ran),
        sum(r["respected"] == "?" for r in ran), sum(bool(r.get("passed")) for r in ran))
    meta["summary"] = summary
    if merged:
        meta["merged"] = "; ".join(merged)
    with open(a.json, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1, default=str)

    table = matrix_lines(rows)
    md = ["# cuwarden compatibility matrix", "", "| | |", "| --- | --- |"]
    for k in ("date", "device", "gpus", "driver", "cuda_driver", "nvcc", "torch", "jax", "cupy", "build_dir",
              "rows_selected", "runtime_s", "merged", "summary"):
        if meta.get(k):
            md.append("| %s | %s |" % (k.replace("_", " "), cell(meta[k], 600)))
    md += ["", "## Matrix", ""] + table + [""]
    if a.not_run:
        md += ["Not run here: " + a.not_run, ""]
    md += ["## How to read it", "",
           "- Every program asks for more than its cap (up to 16 GiB, 8 GiB of managed memory) in "
           "256 MiB steps, under `cuwarden run --limit CAP` (LD_PRELOAD of libcuwarden.so), with a "
           "private cuwardend running. Each row had 120 s at most.",
           "- *cap respected*: **yes** when, for every process and device of the row, the peak that cuwarden "
           "counted is at most the cap, the program's own figures (bytes it holds; the framework's "
           "reserved or pool figure) are at most the cap, the driver's per-process figure (NVML) is at most "
           "the cap + %d MiB (context and modules are not allocation calls), and the program was refused "
           "before reaching its target; **no** when any figure is over the cap or the program reached its "
           "target; **?** when nothing was over the cap but no refusal was seen (crash, hang, error) or "
           "figures are missing." % (DRIVER_SLACK // MiB),
           "- Programs under `$WORK/bin` are compiled at run time from `tests/gpu/compat/`: `cuw_dlopen_probe` and "
           "`cuw_linked_probe` from `driver_probe.c` (gcc; `-ldl`, or `-DCUW_LINKED -lcuda`), `cuw_cuda_rows` from "
           "`cuda_rows.cu` (nvcc, static cudart). The Python rows are `tests/gpu/compat/*_row.py`.",
           "- *counted by cuwarden (peak)*: `peak_bytes` of the process in `cuwarden --json` (exact counter "
           "in the process's ring), in bytes.",
           "- *outcome past the cap*: the error the program got when it asked past the cap, in its own "
           "vocabulary; crash and hang are reported as such.",
           "- Notes: bytes held at the refusal, cuwarden's `used_bytes` read by the program itself at that "
           "moment, refusals counted by cuwarden, the driver's figure, and row-specific checks (✓/✗).",
           ""]
    cmds = [(r["id"], r.get("command")) for r in rows if r.get("command") and not r.get("merged_from")]
    if cmds:
        md += ["## Commands", "", "```"] + ["# %s\n%s" % (i, c) for i, c in cmds] + ["```", ""]
    with open(a.md, "w") as f:
        f.write("\n".join(md))
    print("\n".join(table))
    print()
    if a.not_run:
        print("Not run here: " + a.not_run)
    print(summary)
    return 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("row", "skip"):
        s = sub.add_parser(name)
        s.add_argument("--rows-file", required=True)
        s.add_argument("--id", required=True)
        s.add_argument("--key", required=True)
        s.add_argument("--program", required=True)
        s.add_argument("--cap", default="")
        if name == "skip":
            s.add_argument("--reason", required=True)
        else:
            s.add_argument("--rc", type=int, default=0)
            s.add_argument("--seconds", default="?")
            s.add_argument("--timeout", default="120")
            s.add_argument("--log", required=True)
            s.add_argument("--pre", default="")
            s.add_argument("--poll", default="")
            s.add_argument("--post", default="")
            s.add_argument("--command", default="")
            s.add_argument("--parts", type=int, default=0)
            s.add_argument("--require-reach", action="store_true")
    s = sub.add_parser("final")
    s.add_argument("--rows-file", required=True)
    s.add_argument("--md", required=True)
    s.add_argument("--json", required=True)
    s.add_argument("--meta", action="append")
    s.add_argument("--merge", action="append")
    s.add_argument("--not-run", default="")
    a = ap.parse_args()
    try:
        return {"row": cmd_row, "skip": cmd_skip, "final": cmd_final}[a.cmd](a)
    except Exception:  # noqa: BLE001 - never stop the script; say what broke
        import traceback
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
