#!/usr/bin/env python3
"""Includes point down the layers only, in the interposer and in the daemon.

  check_layers.py SRC_DIR [--entry FILE]...   check SRC_DIR (ctest: interposer.layers
                                              on interposer/src, daemon.layers on daemon/src)
  check_layers.py --self-test                 a tree with an include that points up must fail
  check_layers.py --self-test SRC_DIR [--entry FILE]...
                                              SRC_DIR's own rules (its READMEs) must refuse
                                              every upward include (ctest: daemon.layers_selftest)

Each layer is a folder of SRC_DIR with a README.md whose line "May include: a b c" names the
layers its files may include (itself among them); no two layers may include each other. Every
quoted include of a file under a layer must start with one of those folder names, or be
common's "cuw/..."; an include by a bare file name is refused too (it hides which layer it
reaches). A file at the top of SRC_DIR is refused unless named by --entry: the program's entry
point (the daemon's main.cpp), which wires the layers together and may include any of them.
Exit 0 when all agree, 1 with one line per offending include otherwise.
"""
import os
import re
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# An angle include reaches the layers too (src/ is on the include path): checked when it
# names a layer folder.
ANGLE = re.compile(r'^\s*#\s*include\s+<([^>]+)>', re.M)


def layers(src):
    out = {}
    for name in sorted(os.listdir(src)):
        readme = os.path.join(src, name, "README.md")
        if not os.path.isfile(readme):
            continue
        m = re.search(r"^May include:\s*(.+)$", open(readme).read(), re.M)
        if not m:
            raise SystemExit(f"{readme}: no 'May include:' line")
        out[name] = set(m.group(1).split())
    return out


def check(src, entries=()):
    allowed = layers(src)
    if not allowed:
        return [f"{src}: no layer folders (a README.md with 'May include:')"]
    problems = []
    for a in sorted(allowed):
        for b in sorted(allowed[a]):
            if b != a and b in allowed and a in allowed[b]:
                if a < b:
                    problems.append(f"{a}/README.md and {b}/README.md: each may include the other (a cycle, not layers)")
    for root, _, files in os.walk(src):
        rel_root = os.path.relpath(root, src)
        layer = rel_root.split(os.sep)[0]
        for f in sorted(files):
            if not f.endswith((".hpp", ".cpp", ".inc", ".h")):
                continue
            path = os.path.join(root, f)
            rel = os.path.relpath(path, src)
            if rel_root == "." and f in entries:
                may = set(allowed)
            elif layer not in allowed:
                problems.append(f"{rel}: outside every layer folder ({', '.join(sorted(allowed))})")
                continue
            else:
                may = allowed[layer]
            text = open(path, errors="replace").read()
            includes = INCLUDE.findall(text) + [i for i in ANGLE.findall(text) if i.split("/")[0] in allowed]
            for inc in includes:
                top = inc.split("/")[0]
                if top == "cuw":
                    continue
                if "/" not in inc:
                    problems.append(f"{rel}: #include \"{inc}\": name the layer folder (e.g. \"{layer}/{inc}\")")
                elif top not in allowed:
                    problems.append(f"{rel}: #include \"{inc}\": '{top}' is not a layer")
                elif top not in may:
                    problems.append(f"{rel}: #include \"{inc}\": {layer}/ may include {' '.join(sorted(may))}, "
                                    f"not {top}/ (a layer above)")
    return problems


def self_test():
    with tempfile.TemporaryDirectory() as d:
        def write(rel, text):
            os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
            open(os.path.join(d, rel), "w").write(text)
        write("base/README.md", "# base\n\nMay include: base\n")
        write("core/README.md", "# core\n\nMay include: base core\n")
        write("base/a.hpp", '#include "base/b.hpp"\n#include "cuw/ring.hpp"\n')
        write("base/b.hpp", "")
        write("core/c.cpp", '#include "base/a.hpp"\n#include "core/c.hpp"\n')
        write("core/c.hpp", "")
        if check(d):
            print("self-test: a clean tree was refused:", *check(d), sep="\n  ")
            return 1
        write("base/up.hpp", '#include "core/c.hpp"\n')
        found = check(d)
        if len(found) != 1 or "base/up.hpp" not in found[0]:
            print("self-test: an include pointing up was not the one problem found:", *found, sep="\n  ")
            return 1
        write("base/up.hpp", '#include <core/c.hpp>\n#include <vector>\n')
        found = check(d)
        if len(found) != 1 or "base/up.hpp" not in found[0]:
            print("self-test: an angle include pointing up was not the one problem found:", *found, sep="\n  ")
            return 1
        write("base/up.hpp", '#include "c.hpp"\n')
        found = check(d)
        if len(found) != 1 or "name the layer folder" not in found[0]:
            print("self-test: a bare include was not refused:", *found, sep="\n  ")
            return 1
        os.remove(os.path.join(d, "base/up.hpp"))
        write("base/README.md", "# base\n\nMay include: base core\n")
        found = check(d)
        if len(found) != 1 or "a cycle" not in found[0]:
            print("self-test: two layers that may include each other were not refused:", *found, sep="\n  ")
            return 1
    print("self-test: an include pointing up (quoted or angle), a bare one and two layers including each other are "
          "refused; a clean tree passes")
    return 0


def self_test_tree(src, entries):
    """SRC_DIR's READMEs, copied into an empty tree: every include a layer's rule allows
    passes, every other one (an include pointing up) is refused, and so is a file at the top
    that is not an entry point."""
    allowed = layers(src)
    if len(allowed) < 2:
        print(f"self-test: {src} has {len(allowed)} layer(s): nothing to point up to")
        return 1
    with tempfile.TemporaryDirectory() as d:
        def write(rel, text):
            os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
            open(os.path.join(d, rel), "w").write(text)
        for name in allowed:
            write(f"{name}/README.md", open(os.path.join(src, name, "README.md")).read())
            write(f"{name}/leaf.hpp", '#include "cuw/ring.hpp"\n')
        for name, may in allowed.items():
            write(f"{name}/down.cpp", "".join(f'#include "{m}/leaf.hpp"\n' for m in sorted(may) if m in allowed))
        for e in entries:
            write(e, "".join(f'#include "{m}/leaf.hpp"\n' for m in sorted(allowed)))
        found = check(d, entries)
        if found:
            print(f"self-test: {src}'s rules refuse includes they allow:", *found, sep="\n  ")
            return 1
        ups = 0
        for name, may in sorted(allowed.items()):
            for other in sorted(set(allowed) - may):
                write(f"{name}/up.hpp", f'#include "{other}/leaf.hpp"\n')
                found = check(d, entries)
                if len(found) != 1 or f"{name}/up.hpp" not in found[0]:
                    print(f"self-test: {name}/ including {other}/ was not the one problem found:", *found, sep="\n  ")
                    return 1
                os.remove(os.path.join(d, name, "up.hpp"))
                ups += 1
        if ups == 0:
            print(f"self-test: {src}'s rules let every layer include every other: no order")
            return 1
        write("stray.cpp", f'#include "{sorted(allowed)[0]}/leaf.hpp"\n')
        found = check(d, entries)
        if len(found) != 1 or "stray.cpp" not in found[0]:
            print("self-test: a file at the top that is no entry point was not refused:", *found, sep="\n  ")
            return 1
    print(f"self-test: {src}'s {len(allowed)} layers refuse all {ups} upward includes and a stray top file; "
          "the includes they allow pass")
    return 0


def main():
    args = sys.argv[1:]
    entries = []
    while "--entry" in args:
        i = args.index("--entry")
        if i + 1 >= len(args):
            print(__doc__.strip().splitlines()[2])
            return 2
        entries.append(args[i + 1])
        del args[i:i + 2]
    if args == ["--self-test"]:
        return self_test()
    if len(args) == 2 and args[0] == "--self-test":
        return self_test_tree(args[1], entries)
    if len(args) != 1:
        print(__doc__.strip().splitlines()[2])
        return 2
    problems = check(args[0], entries)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} include(s) against the layers (each folder's README.md says what it may include)")
        return 1
    n = len(layers(args[0]))
    print(f"every include points down: {n} layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
