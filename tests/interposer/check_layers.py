#!/usr/bin/env python3
"""Interposer test: includes point down the layers only.

  check_layers.py SRC_DIR          check interposer/src (ctest: interposer.layers)
  check_layers.py --self-test      a tree with an include that points up must fail

Each layer is a folder of SRC_DIR with a README.md whose line "May include: a b c" names the
layers its files may include (itself among them). Every quoted include of a file under a
layer must start with one of those folder names, or be common's "cuw/..."; an include by a
bare file name is refused too (it hides which layer it reaches). Exit 0 when all agree, 1 with
one line per offending include otherwise.
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


def check(src):
    allowed = layers(src)
    if not allowed:
        return [f"{src}: no layer folders (a README.md with 'May include:')"]
    problems = []
    for root, _, files in os.walk(src):
        rel_root = os.path.relpath(root, src)
        layer = rel_root.split(os.sep)[0]
        for f in sorted(files):
            if not f.endswith((".hpp", ".cpp", ".inc", ".h")):
                continue
            path = os.path.join(root, f)
            rel = os.path.relpath(path, src)
            if layer not in allowed:
                problems.append(f"{rel}: outside every layer folder ({', '.join(sorted(allowed))})")
                continue
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
                elif top not in allowed[layer]:
                    problems.append(f"{rel}: #include \"{inc}\": {layer}/ may include {' '.join(sorted(allowed[layer]))}, "
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
    print("self-test: an include pointing up (quoted or angle), and a bare one, are refused; a clean tree passes")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2])
        return 2
    problems = check(sys.argv[1])
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} include(s) against the layers (each folder's README.md says what it may include)")
        return 1
    n = len(layers(sys.argv[1]))
    print(f"every include points down: {n} layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
