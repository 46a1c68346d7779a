#!/usr/bin/env python3
"""The CUWARDEN_* variables are declared once, in the options table (CUW_OPTIONS in
common/include/cuw/options.hpp). The README's table of variables is generated from it, and
`cuwarden run --help` lists every row; this fails when either drifts from the table.

    check_options.py REPO [--cli PATH]   check the README (and PATH run --help) (ctest scripts.options)
    check_options.py REPO --write        rewrite the README's table from the options table
"""
import pathlib
import re
import subprocess
import sys

HEADER = "common/include/cuw/options.hpp"
BEGIN = f"<!-- generated from {HEADER}: edit the table there, then run tests/scripts/check_options.py . --write -->"
END = "<!-- end of the generated table -->"
FIELDS = ("variable", "default", "values", "doc", "flag")


def macro_body(text):
    """The text of `#define CUW_OPTIONS(X)`, its line continuations joined."""
    m = re.search(r"^#define CUW_OPTIONS\(X\)(.*?[^\\])$", text, re.M | re.S)
    if not m:
        raise SystemExit(f"{HEADER}: no '#define CUW_OPTIONS(X)'")
    return m.group(1).replace("\\\n", " ")


def parse_rows(body):
    """X(IDENT, "lit", "lit", "lit", "lit") rows; adjacent literals are joined. The table
    allows no backslash or double quote inside a literal (options.hpp asserts it)."""
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
                raise SystemExit(f"{HEADER}: cannot read the row at '{body[start:start + 60]}...'")
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
                raise SystemExit(f"{HEADER}: unexpected '(' in the row at '{body[start:start + 60]}...'")
        if len(args) != len(FIELDS) or any(a is None for a in args):
            raise SystemExit(f"{HEADER}: a row needs {len(FIELDS)} fields ({', '.join(FIELDS)}): {args}")
        rows.append(dict(zip(FIELDS, args)))
    if not rows:
        raise SystemExit(f"{HEADER}: CUW_OPTIONS has no rows")
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


def readme_section(text):
    """(start, end) of the generated table in the README, END's line included."""
    b, e = text.find(BEGIN), text.find(END)
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


def main(argv):
    if len(argv) < 2:
        raise SystemExit(__doc__)
    repo = pathlib.Path(argv[1])
    rows = parse_rows(macro_body((repo / HEADER).read_text()))
    readme = repo / "README.md"
    text = readme.read_text()
    table = markdown_table(rows)
    where = readme_section(text)
    if "--write" in argv[2:]:
        if not where:
            raise SystemExit(f"README.md: no generated table to replace (put the lines\n{BEGIN}\n{END}\nwhere it goes)")
        readme.write_text(text[:where[0]] + table + text[where[1]:])
        print(f"README.md: table of {len(rows)} variables written")
        return 0
    problems = []
    if not where:
        problems.append(f"README.md has no generated table of variables (between '{BEGIN}' and '{END}')")
    elif text[where[0]:where[1]] != table:
        problems.append("README.md's table of variables is not what the options table makes: "
                        "run tests/scripts/check_options.py . --write")
    if "--cli" in argv[2:]:
        problems += check_help(argv[argv.index("--cli") + 1], rows)
    for p in problems:
        print("FAIL:", p)
    print(f"{len(rows)} options checked")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
