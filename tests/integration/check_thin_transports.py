#!/usr/bin/env python3
"""The daemon's transports only frame, authenticate and dispatch: none takes a snapshot or
picks its view (the command's handler in daemon/src/commands/ does).

  check_thin_transports.py SRC_DIR PROTOCOL_HPP              check SRC_DIR/transports
                                                             (ctest: daemon.transports_thin)
  check_thin_transports.py --self-test SRC_DIR PROTOCOL_HPP  a transport that breaks a rule
                                                             must fail, a thin one pass
                                                             (ctest: daemon.transports_thin_selftest)

SRC_DIR is daemon/src, PROTOCOL_HPP common/include/cuw/protocol.hpp. A file of
SRC_DIR/transports breaks the rules when it
  - includes the snapshot model (model/snapshot.hpp, model/snapshots.hpp) or any view
    (views/...);
  - calls a function that takes or names a snapshot (take_snapshot, symbolize) or one that
    the snapshot views declare (views/snapshot_views.hpp: snapshot_text, snapshot_json, ...);
  - names a snapshot format: a string literal that is one of protocol.hpp's
    kSnapshotFormats ("text", "json", ...), or kSnapshotFormats / is_snapshot_format.
Comments are not read. Exit 0 when every file keeps them, 1 with one line per break.
"""
import os
import re
import shutil
import sys
import tempfile

SNAPSHOT_MODEL = ("model/snapshot.hpp", "model/snapshots.hpp")
TAKERS = ("take_snapshot", "symbolize")
INCLUDE = re.compile(r'^\s*#\s*include\s+[<"]([^">]+)[">]', re.M)
LITERAL = re.compile(r'"((?:[^"\\\n]|\\.)*)"')


def formats(protocol_hpp):
    text = open(protocol_hpp).read()
    m = re.search(r"kSnapshotFormats\[\]\s*=\s*\{([^}]*)\}", text)
    if not m:
        raise SystemExit(f"{protocol_hpp}: no kSnapshotFormats")
    return set(re.findall(r'"([^"]+)"', m.group(1)))


def view_functions(src):
    """The functions views/snapshot_views.hpp declares."""
    text = strip_comments(open(os.path.join(src, "views", "snapshot_views.hpp")).read())
    return set(re.findall(r"^[A-Za-z][\w:<>, ]*[\s*&]+(\w+)\s*\(", text, re.M))


def strip_comments(text):
    """`text` without // and /* */ comments; string literals kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"' and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif c == "'" and i + 2 < n:
            j = text.find("'", i + 1 if text[i + 1] != "\\" else i + 2)
            out.append(text[i:j + 1] if j > 0 else c)
            i = j + 1 if j > 0 else i + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def check(src, protocol_hpp):
    fmts = formats(protocol_hpp)
    calls = view_functions(src) | set(TAKERS)
    names = re.compile(r"\b(" + "|".join(sorted(calls)) + r")\s*\(")
    problems = []
    tdir = os.path.join(src, "transports")
    for f in sorted(os.listdir(tdir)):
        if not f.endswith((".hpp", ".cpp", ".h", ".inc")):
            continue
        rel = f"transports/{f}"
        text = strip_comments(open(os.path.join(tdir, f), errors="replace").read())
        for inc in INCLUDE.findall(text):
            if inc in SNAPSHOT_MODEL:
                problems.append(f"{rel}: #include \"{inc}\": the snapshot model is the handlers' (commands/)")
            elif inc.startswith("views/"):
                problems.append(f"{rel}: #include \"{inc}\": a view is picked by the command's handler (commands/)")
        body = INCLUDE.sub("", text)
        for m in names.finditer(body):
            problems.append(f"{rel}: calls {m.group(1)}(): taking a snapshot or rendering it is the handler's")
        for lit in LITERAL.findall(body):
            if lit in fmts:
                problems.append(f"{rel}: \"{lit}\": picks a snapshot format (the handler does)")
        for word in ("kSnapshotFormats", "is_snapshot_format"):
            if re.search(r"\b" + word + r"\b", body):
                problems.append(f"{rel}: {word}: picks a snapshot format (the handler does)")
    return problems


def self_test(src, protocol_hpp):
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "views"))
        os.makedirs(os.path.join(d, "transports"))
        shutil.copy(os.path.join(src, "views", "snapshot_views.hpp"), os.path.join(d, "views"))
        fmts = sorted(formats(protocol_hpp))
        views = sorted(view_functions(src))
        if len(fmts) < 2 or len(views) < 2:
            print(f"self-test: found {len(fmts)} formats and {len(views)} view functions: the sources changed shape")
            return 1
        thin = ('// a transport: calls snapshot_text() in a comment, says "json" in one too\n'
                '#include "commands/table.hpp"\n#include "model/peer.hpp"\n'
                'const char* kType = "application/json";  /* take_snapshot( */\n'
                'int f() { return dispatch("/api/v1/state"); }\n')
        path = os.path.join(d, "transports", "t.cpp")
        open(path, "w").write(thin)
        found = check(d, protocol_hpp)
        if found:
            print("self-test: a thin transport was refused:", *found, sep="\n  ")
            return 1
        cases = [('#include "model/snapshots.hpp"\n', "the snapshot model"),
                 ('#include "model/snapshot.hpp"\n', "the snapshot model"),
                 ('#include "views/state_json.hpp"\n', "a view"),
                 ("auto t = take_snapshot(id, h, nullptr);\n", "take_snapshot"),
                 ("symbolize (t, opts);\n", "symbolize"),
                 ('const char* f = "pytorch";\n', "format"),
                 ("bool ok = proto::is_snapshot_format(f);\n", "format")]
        cases += [(f"auto s = {v}(snap);\n", v) for v in views]
        cases += [(f'if (format == "{f}") return;\n', "format") for f in fmts]
        for text, what in cases:
            open(path, "w").write(thin + text)
            found = check(d, protocol_hpp)
            if len(found) != 1 or what not in found[0]:
                print(f"self-test: {text.strip()!r} was not the one problem found ({what}):", *found, sep="\n  ")
                return 1
    print(f"self-test: {len(cases)} transports that take, render or pick a snapshot are refused "
          f"({len(views)} view functions, {len(fmts)} formats); a thin one passes")
    return 0


def main():
    args = sys.argv[1:]
    if len(args) == 3 and args[0] == "--self-test":
        return self_test(args[1], args[2])
    if len(args) != 2:
        print(__doc__.strip().splitlines()[2])
        return 2
    problems = check(args[0], args[1])
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} place(s) where a transport takes, renders or picks a snapshot "
              "(daemon/src/transports/README.md)")
        return 1
    n = len([f for f in os.listdir(os.path.join(args[0], "transports")) if f.endswith((".hpp", ".cpp"))])
    print(f"{n} transport files: none takes a snapshot or picks its view")
    return 0


if __name__ == "__main__":
    sys.exit(main())
