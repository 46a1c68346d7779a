#!/usr/bin/env python3
"""Offline checks of dashboards/prometheus and dashboards/grafana with promtool.

    check_dashboards.py prometheus REPO   # ctest dashboards.prometheus
    check_dashboards.py grafana REPO      # ctest dashboards.grafana

prometheus: `promtool check config` (which also checks the rule file it names), `promtool
check rules`, `promtool test rules`; every alert has a firing and a quiet case in the tests,
every recording rule an expression test; the scrape target is written once, so a copy for
another address is one substitution; the metric names and their labels are cuwardend's; and
deliberately broken copies of the rules fail those tests.

grafana: the dashboard's structure (ids, grid, data sources, targets, variables), the metric
names and labels it uses, and every panel's, annotation's and variable's PromQL, parsed by
`promtool check rules` after the template variables are replaced with concrete values;
deliberately broken copies of the dashboard must fail the same check.

promtool comes from PATH or $PROMTOOL (Debian's `prometheus` package; scripts/setup.sh
installs it). Without it the check fails: it never skips.
"""
import copy
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

# ---- metric names and labels ------------------------------------------------------------
# The per-device rows (per-process gauges, and counters kept per GPU, job and user) come from
# common/include/cuw/counters.hpp; the families below are the daemon's others (docs/dashboards.md).
PROCESS_LABELS = {"hostname", "gpu", "uuid", "pid", "process", "user", "cuwarden_job"}
COUNTER_LABELS = {"hostname", "gpu", "uuid", "user", "cuwarden_job"}
OTHER_FAMILIES = {
    "cuwarden_events_dropped_total": {"hostname", "user", "cuwarden_job"},
    "cuwarden_job_memory_used_bytes": {"hostname", "cuwarden_job", "user", "gpu", "uuid"},
    "cuwarden_job_memory_limit_bytes": {"hostname", "cuwarden_job", "user", "gpu", "uuid"},
    "cuwarden_device_memory_total_bytes": {"hostname", "gpu", "uuid", "name"},
    "cuwarden_device_memory_used_bytes": {"hostname", "gpu", "uuid", "name"},
    "cuwarden_device_driver_used_bytes": {"hostname", "gpu", "uuid", "name"},
    "cuwarden_processes": {"hostname"},
    "cuwarden_suspended_processes": {"hostname"},
    "cuwarden_suspended_host_bytes": {"hostname"},
    "cuwarden_suspended_overdue_processes": {"hostname"},
    "cuwarden_build_info": {"version"},
}
TARGET_LABELS = {"job", "instance"}  # added by the scrape
LABEL_NAMES = {"cuwarden_job"}  # a label that looks like a metric name


def families(repo):
    """{metric name: label names} for everything cuwardend exports."""
    text = (repo / "common/include/cuw/counters.hpp").read_text()
    text = text.replace("\\\n", " ")
    rows = re.findall(r'\b[XD]\(\s*\w+\s*,\s*"[^"]*"\s*,\s*"[^"]*"\s*,\s*"[^"]*"\s*,\s*"(\w+)"\s*,\s*(gauge|counter)\b',
                      text)
    if len(rows) < 10:
        raise SystemExit(f"FAIL: read only {len(rows)} counter rows from counters.hpp (its layout changed?)")
    out = {}
    for metric, kind in rows:
        out["cuwarden_" + metric] = PROCESS_LABELS if kind == "gauge" else COUNTER_LABELS
    out.update(OTHER_FAMILIES)
    return out


METRIC_RE = re.compile(r"(?<![\w:$])cuwarden_[a-z0-9_]+(?![\w:])")
SELECTOR_RE = re.compile(r"(?<![\w:$])(cuwarden_[a-z0-9_]+)\s*\{([^}]*)\}")
MATCHER_RE = re.compile(r"(\w+)\s*(=~|!~|!=|=)\s*\"")
COUNTER_FN_RE = re.compile(r"\b(rate|irate|increase|resets)\s*\(\s*(cuwarden_[a-z0-9_]+)")


def check_promql_names(expr, fams, where):
    """Unknown metric names, labels a family does not carry, rate() of a gauge."""
    errs = []
    for name in METRIC_RE.findall(expr):
        if name not in fams and name not in LABEL_NAMES:
            errs.append(f"{where}: unknown metric {name}")
    for name, body in SELECTOR_RE.findall(expr):
        if name not in fams:
            continue
        for label, _ in MATCHER_RE.findall(body):
            if label not in fams[name] | TARGET_LABELS:
                errs.append(f"{where}: {name} has no label {label!r} (it has {', '.join(sorted(fams[name]))})")
    for fn, name in COUNTER_FN_RE.findall(expr):
        if not name.endswith("_total"):
            errs.append(f"{where}: {fn}() of {name}, which is not a counter")
    return errs


# ---- promtool ---------------------------------------------------------------------------
def promtool():
    path = os.environ.get("PROMTOOL") or shutil.which("promtool")
    if not path or not os.access(path, os.X_OK):
        print("FAIL: promtool not found (on PATH or in $PROMTOOL). Install Debian's `prometheus` "
              "package (scripts/setup.sh does); these checks do not skip without it.")
        sys.exit(1)
    return path


def run_promtool(args, cwd=None):
    p = subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    return p.returncode, (p.stdout + p.stderr).strip()


# ---- prometheus -------------------------------------------------------------------------
TARGET = "127.0.0.1:9477"

# Broken copies of the rules that the unit tests must catch: (what, old, new).
RULE_MUTANTS = [
    ("process near-cap threshold 0.9 -> 0.99", "cuwarden_process_memory_limit_bytes > 0.9",
     "cuwarden_process_memory_limit_bytes > 0.99"),
    ("process near-cap on used bytes, not in-use", "cuwarden_process_memory_in_use_bytes /",
     "cuwarden_process_memory_used_bytes /"),
    ("job near-cap threshold 0.9 -> 0.99", "cuwarden_job_memory_limit_bytes > 0.9",
     "cuwarden_job_memory_limit_bytes > 0.99"),
    ("out-of-memory alert without its new-series case",
     "(cuwarden_ooms_total > 0 unless cuwarden_ooms_total offset 5m)", "(cuwarden_ooms_total > 0 unless cuwarden_ooms_total)"),
    ("new-series cases without the 'scraped 5 minutes ago' condition", "(up offset 5m == 1)", "(up == 1)"),
    ("out-of-memory alert counting increases of 0", "(increase(cuwarden_ooms_total[5m]) > 0)",
     "increase(cuwarden_ooms_total[5m])"),
    ("driver failures over 1m, not 5m", "increase(cuwarden_driver_errors_total[5m])",
     "increase(cuwarden_driver_errors_total[1m])"),
    ("events dropped: old drops too", "increase(cuwarden_events_dropped_total[5m]) > 0",
     "cuwarden_events_dropped_total > 0"),
    ("no 'for: 1m'", "for: 1m", "for: 0s"),
    ("daemon down for every scrape job", 'up{job="cuwarden"} == 0', "up == 0"),
    ("job summed per job only, not per job and user", "sum by (cuwarden_job, user) (cuwarden_job_memory_used_bytes)",
     "sum by (cuwarden_job) (cuwarden_job_memory_used_bytes)"),
]


def strip_comments(yaml_text):
    return "\n".join(re.sub(r"(^|\s)#.*$", "", line) for line in yaml_text.splitlines())


def check_prometheus(repo):
    d = repo / "dashboards/prometheus"
    config, rules, tests = d / "prometheus.yml", d / "cuwarden.rules.yml", d / "cuwarden.rules.test.yml"
    fails = []
    fams = families(repo)

    for args, what in ((["check", "config", "--lint-fatal", "--lint=all", str(config)], "check config"),
                       (["check", "rules", "--lint-fatal", "--lint=all", str(rules)], "check rules"),
                       (["test", "rules", str(tests)], "test rules")):
        rc, out = run_promtool(args, cwd=d)
        print(f"promtool {what}: rc {rc}")
        if rc != 0:
            fails.append(f"promtool {what} failed:\n{out}")

    conf = config.read_text()
    if strip_comments(conf).count(TARGET) != 1:
        fails.append(f"prometheus.yml: the target {TARGET} must be written once outside comments "
                     "(a test rewrites it for another address)")
    if not re.search(r"^\s*-\s*job_name:\s*['\"]?cuwarden['\"]?\s*$", conf, re.M):
        fails.append('prometheus.yml: no scrape job named "cuwarden" (the alerts select up{job="cuwarden"})')
    # A copy for another address is valid and scrapes that address.
    with tempfile.TemporaryDirectory() as tmp:
        t = pathlib.Path(tmp)
        shutil.copy(rules, t / rules.name)
        (t / config.name).write_text(conf.replace(TARGET, "10.1.2.3:19477"))
        rc, out = run_promtool(["check", "config", str(t / config.name)])
        if rc != 0 or TARGET in strip_comments((t / config.name).read_text()):
            fails.append(f"prometheus.yml with its target rewritten does not check:\n{out}")

    rules_text = strip_comments(rules.read_text())
    fails += check_promql_names(rules_text, fams, "cuwarden.rules.yml")
    alerts = re.findall(r"^\s*-\s*alert:\s*(\w+)", rules_text, re.M)
    records = re.findall(r"^\s*-\s*record:\s*(\S+)", rules_text, re.M)
    print(f"rules: {len(alerts)} alerts, {len(records)} recording rules")
    for a in ("CuwardenProcessNearCap", "CuwardenJobNearCap", "CuwardenOutOfMemory", "CuwardenEventsDropped"):
        if a not in alerts:
            fails.append(f"cuwarden.rules.yml: no alert {a}")

    # Every alert is tested firing and quiet; every recording rule has an expression test.
    tests_text = strip_comments(tests.read_text())
    firing, quiet = set(), set()
    for block in re.split(r"^\s*-\s*eval_time:", tests_text, flags=re.M)[1:]:
        m = re.search(r"^\s*alertname:\s*(\w+)", block, re.M)
        if not m:
            continue
        if re.search(r"^\s*exp_alerts:\s*\[\]\s*$", block, re.M):
            quiet.add(m.group(1))
        elif re.search(r"^\s*exp_alerts:\s*(\*\w+\s*)?$", block, re.M):
            firing.add(m.group(1))
    for a in alerts:
        if a not in firing:
            fails.append(f"cuwarden.rules.test.yml: alert {a} is never tested firing")
        if a not in quiet:
            fails.append(f"cuwarden.rules.test.yml: alert {a} is never tested quiet (exp_alerts: [])")
    tested_exprs = re.findall(r"^\s*-\s*expr:\s*(\S+)", tests_text, re.M)
    for r in records:
        if r not in tested_exprs:
            fails.append(f"cuwarden.rules.test.yml: recording rule {r} has no promql_expr_test")

    # The tests must fail on broken rules.
    with tempfile.TemporaryDirectory() as tmp:
        t = pathlib.Path(tmp)
        shutil.copy(tests, t / tests.name)
        original = rules.read_text()
        (t / rules.name).write_text(original + "\n  - name: broken\n    rules:\n      - record: x\n        expr: sum(\n")
        rc, _ = run_promtool(["check", "rules", str(t / rules.name)])
        if rc == 0:
            fails.append("self-test: promtool check rules accepted an unparsable expression")
        killed = 0
        for what, old, new in RULE_MUTANTS:
            if old not in original:
                fails.append(f"self-test: '{old}' is no longer in cuwarden.rules.yml; update RULE_MUTANTS ({what})")
                continue
            (t / rules.name).write_text(original.replace(old, new))
            rc, out = run_promtool(["test", "rules", str(t / tests.name)])
            if rc == 0:
                fails.append(f"self-test: the rule tests pass with a broken rule: {what}")
            elif "FAILED" not in out:
                fails.append(f"self-test: promtool test rules failed for another reason with '{what}':\n{out}")
            else:
                killed += 1
        print(f"self-test: {killed}/{len(RULE_MUTANTS)} broken copies of the rules fail the tests")
    return fails


# ---- grafana ----------------------------------------------------------------------------
BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__interval_ms": "15000", "__range": "1h",
            "__range_s": "3600", "__range_ms": "3600000", "__from": "1764633600000", "__to": "1764637200000"}
VAR_RE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\[\[(\w+)(?::[^\]]*)?\]\]|\$(\w+)")


def var_refs(text):
    return [a or b or c for a, b, c in VAR_RE.findall(text)]


def walk_panels(panels):
    for p in panels:
        yield p
        yield from walk_panels(p.get("panels", []))


def substitute(text, variables):
    def value(m):
        name = m.group(1) or m.group(2) or m.group(3)
        if name in BUILTINS:
            return BUILTINS[name]
        v = variables[name]
        if v.get("type") == "datasource":
            return "prometheus-uid"
        # A multi-value variable is written as Grafana writes it for Prometheus: a regex.
        return "(value-1|value-2)" if v.get("multi") or v.get("includeAll") else "value-1"
    return VAR_RE.sub(value, text)


def promql_of_variable(query):
    """The PromQL inside a Prometheus variable query, or None (label_names(), label_values(label))."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", query, re.S)
    if m:
        return m.group(1)
    m = re.fullmatch(r"\s*query_result\((.*)\)\s*", query, re.S)
    if m:
        return m.group(1)
    return None


def grafana_failures(doc, fams, tmpdir, verbose=False):
    """Everything wrong with one dashboard document; [] when it is good."""
    fails = []
    for key in ("uid", "title", "panels", "templating", "annotations"):
        if key not in doc:
            fails.append(f"no '{key}'")
    if not isinstance(doc.get("schemaVersion"), int) or doc["schemaVersion"] < 36:
        fails.append(f"schemaVersion {doc.get('schemaVersion')!r}: expected 36 or later")
    if fails:
        return fails

    variables = {}
    order = []
    for v in doc["templating"].get("list", []):
        name = v.get("name")
        if not name or name in variables:
            fails.append(f"variable {name!r}: missing or duplicate name")
            continue
        variables[name] = v
        order.append(name)
    ds_vars = [n for n, v in variables.items() if v.get("type") == "datasource" and v.get("query") == "prometheus"]
    if not ds_vars:
        fails.append("no data source variable of type prometheus")
    for want in ("hostname", "gpu", "cuwarden_job", "user"):
        if want not in variables:
            fails.append(f"no variable {want}")

    def ds_ok(ds, where):
        if not isinstance(ds, dict) or ds.get("type") != "prometheus":
            fails.append(f"{where}: data source {ds!r} is not a Prometheus one")
            return
        refs = var_refs(ds.get("uid", ""))
        if not refs or any(r not in ds_vars for r in refs):
            fails.append(f"{where}: data source uid {ds.get('uid')!r} is not the data source variable")

    multi = {n for n, v in variables.items() if v.get("multi") or v.get("includeAll")}
    exprs = []  # (where, expr)

    def refs_ok(text, where, defined):
        for r in var_refs(text):
            if r not in BUILTINS and r not in defined:
                fails.append(f"{where}: ${r} is not a variable of the dashboard")

    def equality_with_multi(expr, where):
        for label, op, rest in re.findall(r"(\w+)\s*(=|!=)\s*\"([^\"]*)\"", expr):
            for r in var_refs(rest):
                if r in multi:
                    fails.append(f"{where}: {label}{op}\"...${r}...\": a multi-value variable needs =~ or !~")

    for i, name in enumerate(order):
        v = variables[name]
        where = f"variable {name}"
        if v.get("type") == "query":
            ds_ok(v.get("datasource"), where)
            q = v.get("query")
            q = q.get("query", "") if isinstance(q, dict) else (q or "")
            refs_ok(q, where, set(order[:i]))  # a variable can use only those before it
            inner = promql_of_variable(q)
            if inner is None:
                fails.append(f"{where}: query {q!r} is not label_values(SELECTOR, LABEL) or query_result(...)")
            else:
                exprs.append((where, inner))
            if v.get("includeAll") and v.get("allValue") != ".*":
                fails.append(f"{where}: allValue must be '.*' (All must match series without the label, "
                             "e.g. processes with no cuwarden job)")

    ids = set()
    cells = []
    for p in walk_panels(doc["panels"]):
        pid = p.get("id")
        where = f"panel {pid} ({p.get('title', '?')})"
        if not isinstance(pid, int):
            fails.append(f"{where}: id is not an integer")
        elif pid in ids:
            fails.append(f"{where}: duplicate id")
        ids.add(pid)
        if not p.get("type"):
            fails.append(f"{where}: no type")
        g = p.get("gridPos", {})
        if not all(isinstance(g.get(k), int) for k in "xywh") or g["x"] < 0 or g["w"] < 1 or g["x"] + g["w"] > 24:
            fails.append(f"{where}: bad gridPos {g}")
        else:
            for other, og in cells:
                if g["x"] < og["x"] + og["w"] and og["x"] < g["x"] + g["w"] and \
                   g["y"] < og["y"] + og["h"] and og["y"] < g["y"] + g["h"]:
                    fails.append(f"{where}: overlaps {other}")
            cells.append((where, g))
        refs_ok(p.get("title", ""), where, variables)
        if p.get("type") == "row":
            continue
        ds_ok(p.get("datasource"), where)
        targets = p.get("targets")
        if not targets:
            fails.append(f"{where}: no targets")
            continue
        refids = set()
        for t in targets:
            tw = f"{where} target {t.get('refId')}"
            if not t.get("refId") or t["refId"] in refids:
                fails.append(f"{tw}: missing or duplicate refId")
            refids.add(t.get("refId"))
            if "datasource" in t:
                ds_ok(t["datasource"], tw)
            expr = t.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                fails.append(f"{tw}: no expr")
                continue
            refs_ok(expr + t.get("legendFormat", ""), tw, variables)
            exprs.append((tw, expr))

    annotations = [a for a in doc["annotations"].get("list", []) if not a.get("builtIn")]
    if not annotations:
        fails.append("no annotation query (out-of-memory refusals)")
    for a in annotations:
        where = f"annotation {a.get('name')!r}"
        ds_ok(a.get("datasource"), where)
        expr = a.get("expr") or a.get("target", {}).get("expr")
        if not expr:
            fails.append(f"{where}: no expr")
            continue
        refs_ok(expr, where, variables)
        exprs.append((where, expr))
    if not any("cuwarden_ooms_total" in a.get("expr", "") for a in annotations):
        fails.append("no annotation on cuwarden_ooms_total")

    if fails:  # names must resolve before anything is substituted
        return fails
    rules = []
    for where, expr in exprs:
        equality_with_multi(expr, where)
        concrete = substitute(expr, variables)
        fails += check_promql_names(concrete, fams, where)
        rules.append({"record": f"grafana_check_{len(rules)}", "expr": concrete})
        if verbose:
            print(f"  {where}: {concrete}")
    # One recording rule per expression; JSON is YAML, so promtool reads it as a rule file.
    path = pathlib.Path(tmpdir) / "grafana_exprs.rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "grafana", "rules": rules}]}, indent=1))
    rc, out = run_promtool(["check", "rules", str(path)])
    if rc != 0:
        names = {f"grafana_check_{i}": w for i, (w, _) in enumerate(exprs)}
        out = re.sub(r"grafana_check_\d+", lambda m: f"{m.group(0)} = {names.get(m.group(0))}", out)
        fails.append(f"promtool check rules on the dashboard's {len(rules)} expressions:\n{out}")
    elif verbose:
        print(f"promtool parsed the dashboard's {len(rules)} expressions")
    return fails


def first_target(doc):
    return next(t for p in walk_panels(doc["panels"]) for t in p.get("targets", []))


def grafana_mutants(doc):
    """(what, expected failure text, broken copy)."""
    out = []

    def mutant(what, expect, change):
        d = copy.deepcopy(doc)
        change(d)
        out.append((what, expect, d))

    def oom_annotation(d):
        return next(a for a in d["annotations"]["list"] if "cuwarden_ooms_total" in a.get("expr", ""))

    mutant("an unbalanced parenthesis in a panel", "promtool",
           lambda d: first_target(d).update(expr=first_target(d)["expr"] + ")"))
    mutant("a panel's range selector without its duration", "promtool",
           lambda d: [t.update(expr=t["expr"].replace("[$__rate_interval]", "[]"))
                      for p in walk_panels(d["panels"]) for t in p.get("targets", [])])
    mutant("a broken annotation expression", "promtool",
           lambda d: oom_annotation(d).update(expr=oom_annotation(d)["expr"].replace("> 0", "> > 0")))
    mutant("a misspelt metric", "unknown metric",
           lambda d: first_target(d).update(expr=first_target(d)["expr"].replace("cuwarden_", "cuwarden_x", 1)))
    mutant("a label the metric does not carry", "has no label",
           lambda d: first_target(d).update(expr='cuwarden_processes{gpu=~"$gpu"}'))
    mutant("rate() of a gauge", "not a counter",
           lambda d: first_target(d).update(expr="rate(cuwarden_process_memory_used_bytes[$__rate_interval])"))
    mutant("an undefined variable", "not a variable",
           lambda d: first_target(d).update(expr='cuwarden_processes{hostname=~"$nosuchnode"}'))
    mutant("a multi-value variable with =", "needs =~",
           lambda d: first_target(d).update(expr='cuwarden_processes{hostname="$hostname"}'))
    mutant("a duplicate panel id", "duplicate id",
           lambda d: d["panels"][2].update(id=d["panels"][1]["id"]))
    mutant("a panel without a data source", "data source",
           lambda d: d["panels"][1].pop("datasource"))
    mutant("a panel without an expression", "no expr",
           lambda d: first_target(d).pop("expr"))
    mutant("a variable used before it is defined", "not a variable",
           lambda d: d["templating"]["list"].reverse())
    mutant("overlapping panels", "overlaps",
           lambda d: d["panels"][2]["gridPos"].update(x=d["panels"][1]["gridPos"]["x"],
                                                      y=d["panels"][1]["gridPos"]["y"]))
    return out


def check_grafana(repo):
    path = repo / "dashboards/grafana/cuwarden.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return [f"{path}: {e}"]
    fams = families(repo)
    promtool()
    with tempfile.TemporaryDirectory() as tmp:
        fails = grafana_failures(doc, fams, tmp, verbose=True)
        if fails:
            return fails
        print(f"{path.name}: {sum(1 for _ in walk_panels(doc['panels']))} panels, good")
        killed = 0
        mutants = grafana_mutants(doc)
        for what, expect, broken in mutants:
            got = grafana_failures(broken, fams, tmp)
            if not got:
                fails.append(f"self-test: the check accepts a dashboard with {what}")
            elif not any(expect in f for f in got):
                fails.append(f"self-test: {what} failed for another reason than '{expect}': {got}")
            else:
                killed += 1
        print(f"self-test: {killed}/{len(mutants)} broken copies of the dashboard fail the check")
    return fails


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("prometheus", "grafana"):
        sys.exit(__doc__)
    repo = pathlib.Path(sys.argv[2]).resolve()
    promtool()
    fails = check_prometheus(repo) if sys.argv[1] == "prometheus" else check_grafana(repo)
    for f in fails:
        print("FAIL:", f)
    print("FAILED" if fails else "OK")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
