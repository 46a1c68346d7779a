#!/usr/bin/env python3
"""Every folder's README names the files in it, and names no file that is gone.

  check_readme_lists.py REPO      check every README.md under the folders of ROOTS
                                  (ctest: scripts.readme_lists)
  check_readme_lists.py --self-test
                                  a README that names a missing file, or misses a present one,
                                  must fail (ctest: scripts.readme_lists_selftest)

The rules, for a README.md in folder F:

- Each entry of F (file or folder; not README.md itself, not a dot-name, not what git ignores)
  is named in the README: in backticks (`name`, `name/`, or a path to it such as
  `src/hooks/` or `bench/gpu.sh`), as a link target, or in a fenced code block. A bare stem in
  backticks (`util`) names every file of that stem (util.cpp and util.hpp); a path into a
  subfolder (`src/hooks/alloc.cpp`) names the subfolder.
- Each path the README names (one backticked word, or a link target, that holds a "/" or ends
  in a source or document extension; words with placeholders such as <x>, $X or * are prose)
  exists, relative to F, to a folder above F (up to the repository), or to
  common/include (the include path every part shares). A file a program writes is named with
  its place as a placeholder (`$OUT/report.md`, `<build>/bin/cuwardend`), so it reads as one.

Exit 0 when every README agrees with its folder, 1 with one line per mismatch otherwise.
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

# The folders whose READMEs describe source, tests and results: the products, their tests and
# benchmarks, and docs/ (its README is the index of its pages). The repository's own README.md
# is the user's guide and names no file list; packaging/ and scripts/ have no README.
ROOTS = ("interposer", "daemon", "cli", "common", "cluster", "bench", "tests", "docs")

# Folders skipped with the folders below them (none).
SKIP: tuple[str, ...] = ()

EXTENSIONS = ("cpp", "hpp", "h", "c", "cc", "inc", "py", "sh", "json", "jsonl", "md", "txt",
              "cmake", "map", "in", "toml", "yaml", "yml", "js", "html", "css", "supp", "png")
LOOKS_LIKE_PATH = re.compile(r"^[\w.+-]*(/[\w.+-]*)*$")
HAS_EXTENSION = re.compile(r"\.(%s)$" % "|".join(re.escape(e) for e in EXTENSIONS))
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def skipped(rel):
    return any(rel == s or rel.startswith(s + "/") for s in SKIP)


def ignored(repo, paths):
    """The paths (relative to repo) that git ignores; none when repo is not a git work tree."""
    if not paths:
        return set()
    try:
        out = subprocess.run(["git", "-C", str(repo), "check-ignore", "--stdin"], input="\n".join(paths),
                             capture_output=True, text=True, check=False)
    except OSError:
        return set()
    if out.returncode not in (0, 1):
        return set()
    return set(out.stdout.split())


def tokens(text):
    """(words naming things, single words checked for existence) of one README."""
    naming, checked = [], []
    for block in FENCE.findall(text):
        naming += block.split()
    prose = FENCE.sub("", text)
    for span in INLINE.findall(prose):
        words = span.split()
        naming += words
        if len(words) == 1:
            checked.append(words[0])
    for link in LINK.findall(prose):
        if re.match(r"[a-z]+://", link) or link.startswith(("mailto:", "#")):
            continue
        link = link.split("#")[0]
        naming.append(link)
        checked.append(link)
    return naming, checked


def clean(word):
    word = word.strip("'\",;:()")
    word = re.sub(r":\d+(-\d+)?$", "", word)  # file.cpp:71
    return word[2:] if word.startswith("./") else word


def candidates(repo, folder, word):
    """Where a relative path named in folder's README may point: folder, each folder above it
    up to repo, and common/include."""
    bases = [folder]
    p = folder
    while p != repo and repo in p.parents:
        p = p.parent
        bases.append(p)
    bases.append(repo / "common" / "include")
    return [(b / word) for b in bases]


def check_readme(repo, readme):
    folder = readme.parent
    rel_folder = folder.relative_to(repo).as_posix()
    text = readme.read_text(errors="replace")
    naming, checked = tokens(text)
    problems = []

    named = set()  # absolute paths the README names
    stems = set()
    for w in naming:
        w = clean(w)
        if not w or w.startswith(("/", "-")) or not LOOKS_LIKE_PATH.match(w):
            continue
        if "/" not in w and "." not in w:
            stems.add(w)
        for c in candidates(repo, folder, w.rstrip("/")):
            named.add(os.path.normpath(c))

    for w in checked:
        w = clean(w)
        if not w or w.startswith(("/", "-", "~", ".")) or not LOOKS_LIKE_PATH.match(w):
            continue
        if "/" not in w and not HAS_EXTENSION.search(w):
            continue
        if not any(c.exists() for c in candidates(repo, folder, w.rstrip("/"))):
            problems.append(f"{readme.relative_to(repo)}: names `{w}`, which is not there")

    entries = sorted(e for e in os.listdir(folder) if e != "README.md" and not e.startswith("."))
    rels = [f"{rel_folder}/{e}" + ("/" if (folder / e).is_dir() else "") for e in entries]
    gone = ignored(repo, rels)
    for e, r in zip(entries, rels):
        if r in gone or r.rstrip("/") in gone or e == "__pycache__":
            continue
        path = folder / e
        if os.path.normpath(path) in named:
            continue
        if path.is_dir() and any(n.startswith(os.path.normpath(path) + os.sep) for n in named):
            continue
        if path.is_file() and e.split(".")[0] in stems:
            continue
        what = f"folder `{e}/`" if path.is_dir() else f"file `{e}`"
        problems.append(f"{readme.relative_to(repo)}: does not name the {what}")
    return problems


def check(repo):
    repo = pathlib.Path(repo).resolve()
    problems, checked, skips = [], 0, []
    for root in ROOTS:
        top = repo / root
        if not top.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
            rel = pathlib.Path(dirpath).relative_to(repo).as_posix()
            if "README.md" not in filenames:
                continue
            if skipped(rel):
                skips.append(rel)
                continue
            checked += 1
            problems += check_readme(repo, pathlib.Path(dirpath) / "README.md")
    return problems, checked, skips


def self_test():
    failures = []

    def tree(files, readme):
        d = pathlib.Path(tempfile.mkdtemp(prefix="cuwt-readme-"))
        (d / "common" / "include" / "cuw").mkdir(parents=True)
        (d / "common" / "include" / "cuw" / "options.hpp").write_text("")
        f = d / "bench"
        f.mkdir()
        for name in files:
            (f / name).parent.mkdir(parents=True, exist_ok=True)
            (f / name).write_text("")
        (f / "README.md").write_text(readme)
        return d

    def expect(name, files, readme, want_fail, needle=""):
        d = tree(files, readme)
        try:
            problems, n, _ = check(d)
        finally:
            shutil.rmtree(d)
        if n != 1:
            failures.append(f"{name}: checked {n} READMEs, not 1")
        if bool(problems) != want_fail or (needle and not any(needle in p for p in problems)):
            failures.append(f"{name}: {'expected a failure' if want_fail else 'expected a pass'}, got {problems}")

    files = ["gpu.sh", "util.cpp", "util.hpp", "src/a.cpp", "results/x.md"]
    good = ("`gpu.sh` runs; `util` helps; `src/a.cpp`; [x](results/x.md); the options in "
            "`cuw/options.hpp` and `bench/gpu.sh`.\n")
    expect("a README naming each file passes", files, good, False)
    expect("a README naming a missing file fails", files, good + "Also `gone.py`.\n", True, "`gone.py`")
    expect("a README naming a missing path fails", files, good + "See `src/b.cpp`.\n", True, "`src/b.cpp`")
    expect("a README missing a present file fails", files + ["new.py"], good, True, "`new.py`")
    expect("a README missing a present folder fails", files + ["traces/t.txt"], good, True, "`traces/`")
    expect("a file named only in a code block passes", files + ["micro.sh"],
           good + "```\nbench/micro.sh build\n```\n", False)
    expect("placeholders are prose", files, good + "Writes `<date>-h200.md` into `$OUT/raw`.\n", False)
    for f in failures:
        print("FAIL:", f)
    print(f"self-test: {'failed' if failures else 'passed'}")
    return 1 if failures else 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    problems, n, skips = check(argv[1])
    for p in problems:
        print("FAIL:", p)
    print(f"{n} READMEs checked; skipped for now: {', '.join(skips) or 'none'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
