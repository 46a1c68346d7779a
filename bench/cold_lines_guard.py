#!/usr/bin/env python3
"""cuwarden CI guard: what the hooks cost one alloc+free pair when the driver's work has evicted
them from the caches, as on a GPU: instructions, L1 instruction lines missed and L1 data lines
missed (read and write), per pair, measured by bench/cold_lines.sh (valgrind's cache
simulation: deterministic for one build), for cuMemAlloc_v2 + cuMemFree_v2 and for
cuMemAllocAsync + cuMemFreeAsync, against the budgets in bench/cold_lines_budget.json.

  bench/cold_lines_guard.py BUILD_DIR            check (ctest: bench.cold_lines_guard)
  bench/cold_lines_guard.py BUILD_DIR --update   measure and rewrite the budgets (+2%; at
                                                 least 1 instruction line and 3 data lines more)

Exit: 0 all within budget; 1 one over budget or broken; 77 skipped (no valgrind, a sanitizer
build, or a build type other than the budgets'), which ctest reports as skipped.
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
BUDGET_FILE = os.environ.get("CUWARDEN_COLD_BUDGET", os.path.join(HERE, "cold_lines_budget.json"))
HEADROOM_PCT = 2
MODES = {"sync": [], "async": ["--async"]}
FIELDS = ("ir", "l1i_lines", "l1d_lines")


def say(msg):
    print(f"cold_lines_guard: {msg}", flush=True)


def measure(build, args):
    """{ir, l1i_lines, l1d_lines} per pair from cold_lines.sh's first line."""
    out = subprocess.run(["bash", os.path.join(HERE, "cold_lines.sh"), build, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"cold_lines.sh {' '.join(args)} exited {out.returncode}: {out.stderr.strip()[-400:]}")
    m = re.search(r"per pair: Ir ([\d.]+)\s+I1mr ([\d.]+)\s+D1mr ([\d.]+)\s+D1mw ([\d.]+)", out.stdout)
    if not m:
        raise RuntimeError(f"no 'per pair' line in cold_lines.sh's output: {out.stdout[:400]}")
    ir, i1, d1r, d1w = (float(g) for g in m.groups())
    return {"ir": ir, "l1i_lines": i1, "l1d_lines": d1r + d1w}


# Lines more than +2% allows: an instruction line count is the same in every run of a build,
# but which data lines miss depends on where the stack lands, which the length of the build's
# path and of the arguments moves (19-20 lines on the synchronous pair, 21.3-21.7 on the
# stream-ordered one, between checkouts).
MIN_EXTRA_LINES = {"ir": 0, "l1i_lines": 1, "l1d_lines": 3}


def budget_of(field, value):
    return math.ceil(max(value * (1 + HEADROOM_PCT / 100), value + MIN_EXTRA_LINES[field]))


def main(argv):
    if len(argv) not in (2, 3) or (len(argv) == 3 and argv[2] != "--update"):
        print(__doc__)
        return 2
    build, update = os.path.abspath(argv[1]), len(argv) == 3
    if not shutil.which("valgrind"):
        say("SKIPPED: valgrind is not installed (apt-get install valgrind; scripts/setup.sh does)")
        return SKIP
    if os.environ.get("CUWARDEN_SANITIZE"):
        say(f"SKIPPED: sanitizer build ({os.environ['CUWARDEN_SANITIZE']}); cache lines mean nothing there")
        return SKIP
    try:
        with open(BUDGET_FILE) as f:
            budget = json.load(f)
    except (OSError, ValueError) as e:
        if not update:
            say(f"FAILED: cannot read {BUDGET_FILE} ({e}): create it with --update")
            return 1
        budget = {}
    build_type = os.environ.get("CUWARDEN_BUILD_TYPE", "")
    if not update and build_type and build_type != budget.get("build_type"):
        say(f"SKIPPED: this is a {build_type} build; the budget was measured on a {budget.get('build_type')} build")
        return SKIP
    try:
        got = {mode: measure(build, args) for mode, args in MODES.items()}
    except RuntimeError as e:
        say(f"FAILED: {e}")
        return 1
    for mode, g in got.items():
        say(f"{mode} pair: Ir {g['ir']:.1f}, L1i lines {g['l1i_lines']:.1f}, L1d lines {g['l1d_lines']:.1f}")
    if update:
        for mode, g in got.items():
            for field in FIELDS:
                budget[f"cold_{mode}_{field}"] = budget_of(field, g[field])
                budget[f"cold_{mode}_{field}_measured"] = round(g[field], 1)
        valgrind = subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout.strip()
        budget.update({"headroom_percent": HEADROOM_PCT, "build_type": build_type or "RelWithDebInfo",
                       "valgrind": valgrind, "date": subprocess.run(["date", "-u", "+%Y-%m-%d"], capture_output=True,
                                                                     text=True).stdout.strip()})
        with open(BUDGET_FILE, "w") as f:
            json.dump(budget, f, indent=2)
            f.write("\n")
        say(f"budgets written to {BUDGET_FILE}")
        return 0
    over = []
    for mode, g in got.items():
        for field in FIELDS:
            key = f"cold_{mode}_{field}"
            if key not in budget:
                over.append(f"{key}: no budget in {BUDGET_FILE} (run with --update)")
            elif g[field] > budget[key]:
                over.append(f"{mode} pair: {field} {g[field]:.1f} over its budget {budget[key]} "
                            f"(measured {budget.get(key + '_measured')}): keep the hooks' lines together, or "
                            "raise the budget with --update and say why in the commit")
    for o in over:
        say(f"FAILED: {o}")
    if not over:
        say("within budget")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
