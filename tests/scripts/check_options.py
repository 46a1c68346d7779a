#!/usr/bin/env python3
"""The CUWARDEN_* variables are declared once, in the options table (CUW_OPTIONS in
common/include/cuw/options.hpp). The README's table of variables is generated from it, and
`cuwarden run --help` lists every row; this fails when either drifts from the table. The
per-tensor mode's framework switches (CUW_TENSOR_SWITCHES in common/include/cuw/tensors.hpp)
are held to the same rule: docs/tensors.md's table and `cuwarden run --help`. The shell
completion (packaging/completion/cuwarden) offers a flag's values as the table lists them.

    check_options.py REPO [--cli PATH]   check the README, docs/tensors.md, the completion (and PATH run --help)
                                         (ctest scripts.options)
    check_options.py REPO --write        rewrite both tables from their headers
    check_options.py REPO --self-test    a value added to the table that the completion lacks fails
                                         (ctest scripts.options_selftest)
"""
import pathlib
import re
import subprocess
import sys

HEADER = "common/include/cuw/options.hpp"
TENSORS_HEADER = "common/include/cuw/tensors.hpp"
TENSORS_DOC = "docs/tensors.md"


def begin_marker(header):
    return f"<!-- generated from {header}: edit the table there, then run tests/scripts/check_options.py . --write -->"


BEGIN = begin_marker(HEADER)
END = "<!-- end of the generated table -->"
FIELDS = ("variable", "default", "values", "doc", "flag")
TENSOR_FIELDS = ("framework", "variable", "value", "effect")


def macro_body(text, name="CUW_OPTIONS", header=HEADER):
    """The text of `#define NAME(X)`, its line continuations joined and /* comments */ dropped."""
    m = re.search(rf"^#define {name}\(X\)(.*?[^\\])$", text, re.M | re.S)
    if not m:
        raise SystemExit(f"{header}: no '#define {name}(X)'")
    return re.sub(r"/\*.*?\*/", " ", m.group(1).replace("\\\n", " "), flags=re.S)


def parse_rows(body, fields=FIELDS, header=HEADER):
    """X(IDENT or "lit", ...) rows; adjacent literals are joined. The tables allow no
    backslash or double quote inside a literal (their headers assert it)."""
    rows = []
    pos = 0
    token = re.compile(r'\s*(?:(?P<ident>[A-Za-z_]\w*)|(?P<str>"[^"\\]*")|(?P<punct>[(),]))')
    while True:
        start = body.find("X(", pos)
        if start < 0:
            break
        pos = start + 2
        args, current = [], None
        while True:
            m = token.match(body, pos)
            if not m:
                raise SystemExit(f"{header}: cannot read the row at '{body[start:start + 60]}...'")
            pos = m.end()
            if m.group("ident"):
                current = m.group("ident")
            elif m.group("str"):
                current = (current or "") + m.group("str")[1:-1]
            elif m.group("punct") == ",":
                args.append(current)
                current = None
            elif m.group("punct") == ")":
                args.append(current)
                break
            else:
                raise SystemExit(f"{header}: unexpected '(' in the row at '{body[start:start + 60]}...'")
        if len(args) != len(fields) or any(a is None for a in args):
            raise SystemExit(f"{header}: a row needs {len(fields)} fields ({', '.join(fields)}): {args}")
        rows.append(dict(zip(fields, args)))
    if not rows:
        raise SystemExit(f"{header}: the table has no rows")
    return rows


def plain(markdown):
    return markdown.replace("`", "")


def markdown_table(rows):
    lines = [BEGIN, "| variable (`cuwarden run` flag) | values | default | meaning |", "| --- | --- | --- | --- |"]
    for r in rows:
        var = f"`{r['variable']}`" + (f" (`{r['flag']}`)" if r["flag"] else "")
        default = f"`{r['default']}`" if r["default"] else "unset"
        lines.append(f"| {var} | {r['values']} | {default} | {r['doc']} |")
    lines.append(END)
    return "\n".join(lines) + "\n"


def tensors_table(rows):
    lines = [begin_marker(TENSORS_HEADER), "| framework | variable | `--tensors` sets | what the framework then does |",
             "| --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['framework']} | `{r['variable']}` | `{r['value']}` | {r['effect']} |")
    lines.append(END)
    return "\n".join(lines) + "\n"


def section(text, begin):
    """(start, end) of the generated table that opens with `begin`, END's line included."""
    b = text.find(begin)
    e = text.find(END, b) if b >= 0 else -1
    if b < 0 or e < b:
        return None
    return b, e + len(END) + 1


def check_help(cli, rows):
    """`cuwarden run --help` names every row: its variable, values, default and doc line, and
    each flag says which variable it sets."""
    out = subprocess.run([cli, "run", "--help"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return [f"{cli} run --help exited {out.returncode}: {out.stderr.strip()}"]
    lines = out.stdout.splitlines()
    problems = []
    for r in rows:
        head = f"  {r['variable']}" + (f" ({r['flag']})" if r["flag"] else "") + f": {plain(r['values'])}"
        if r["default"]:
            head += f"; default {r['default']}"
        if head not in lines:
            problems.append(f"run --help has no line '{head.strip()}'")
        elif lines.index(head) + 1 >= len(lines) or lines[lines.index(head) + 1].strip() != plain(r["doc"]):
            problems.append(f"run --help: {r['variable']} is not followed by its doc line '{plain(r['doc'])}'")
        if r["flag"]:
            flag_lines = [l for l in lines if re.match(rf"\s+{re.escape(r['flag'])}\b", l)]
            if not any(f"sets {r['variable']})" in l and plain(r["doc"]) in l for l in flag_lines):
                problems.append(f"run --help: {r['flag']} does not show its doc line and 'sets {r['variable']}'")
    return problems


def check_tensors_help(cli, switches):
    """`cuwarden run --help` names --tensors and lists every framework switch as
    `  VARIABLE=VALUE for FRAMEWORK: effect`."""
    out = subprocess.run([cli, "run", "--help"], capture_output=True, text=True, check=False)
    lines = out.stdout.splitlines()
    problems = []
    if "--tensors" not in out.stdout:
        problems.append("run --help does not name --tensors")
    for r in switches:
        line = f"  {r['variable']}={r['value']} for {r['framework']}: {plain(r['effect'])}"
        if line not in lines:
            problems.append(f"run --help has no line '{line.strip()}'")
    return problems


COMPLETION = "packaging/completion/cuwarden"


def literals(values):
    """The `literal` values of a row's values field, in order."""
    return re.findall(r"`([^`]*)`", values)


def check_completion(text, rows):
    """Each table flag the completion offers a list of words for (`--flag) COMPREPLY=($(compgen
    -W 'a b c' ...`) offers its row's `literal` values, all of them and no other."""
    by_flag = {r["flag"]: r for r in rows if r["flag"]}
    problems = []
    for m in re.finditer(r"^\s*((?:--[\w-]+\s*\|\s*)*--[\w-]+)\)\s*COMPREPLY=\(\$\(compgen -W '([^']*)'", text, re.M):
        for flag in re.split(r"\s*\|\s*", m.group(1)):
            row = by_flag.get(flag)
            if row and m.group(2).split() != literals(row["values"]):
                problems.append(f"{COMPLETION} offers '{m.group(2)}' for {flag}, the options table "
                                f"'{' '.join(literals(row['values']))}' ({row['variable']})")
    return problems


def self_test(repo):
    """The real completion passes; with a value added to CUWARDEN_POOL's row, it fails."""
    rows = parse_rows(macro_body((repo / HEADER).read_text()))
    text = (repo / COMPLETION).read_text()
    if check_completion(text, rows):
        print("FAIL: the completion does not pass as it is:", check_completion(text, rows))
        return 1
    pool = next(r for r in rows if r["variable"] == "CUWARDEN_POOL")
    pool["values"] += ", `exact`"
    problems = check_completion(text, rows)
    if not any("--pool" in p for p in problems):
        print("FAIL: a CUWARDEN_POOL value missing from the completion was not found")
        return 1
    print("ok: a value the completion lacks fails:", problems[0])
    return 0


def main(argv):
    if len(argv) < 2:
        raise SystemExit(__doc__)
    repo = pathlib.Path(argv[1])
    if "--self-test" in argv[2:]:
        return self_test(repo)
    rows = parse_rows(macro_body((repo / HEADER).read_text()))
    switches = parse_rows(macro_body((repo / TENSORS_HEADER).read_text(), "CUW_TENSOR_SWITCHES", TENSORS_HEADER),
                          TENSOR_FIELDS, TENSORS_HEADER)
    # (file, what its table holds, the table's first line, the table, where it comes from)
    targets = [("README.md", f"table of {len(rows)} variables", BEGIN, markdown_table(rows), "the options table"),
               (TENSORS_DOC, f"table of {len(switches)} framework switches", begin_marker(TENSORS_HEADER),
                tensors_table(switches), TENSORS_HEADER)]
    problems = []
    for name, what, begin, table, source in targets:
        path = repo / name
        text = path.read_text()
        where = section(text, begin)
        if "--write" in argv[2:]:
            if not where:
                raise SystemExit(f"{name}: no generated table to replace (put the lines\n{begin}\n{END}\nwhere it goes)")
            path.write_text(text[:where[0]] + table + text[where[1]:])
            print(f"{name}: {what} written")
        elif not where:
            problems.append(f"{name} has no generated {what} (between '{begin}' and '{END}')")
        elif text[where[0]:where[1]] != table:
            problems.append(f"{name}'s {what} is not what {source} makes: run tests/scripts/check_options.py . --write")
    if "--write" in argv[2:]:
        return 0
    problems += check_completion((repo / COMPLETION).read_text(), rows)
    if "--cli" in argv[2:]:
        cli = argv[argv.index("--cli") + 1]
        problems += check_help(cli, rows) + check_tensors_help(cli, switches)
    for p in problems:
        print("FAIL:", p)
    print(f"{len(rows)} options and {len(switches)} framework switches checked")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
