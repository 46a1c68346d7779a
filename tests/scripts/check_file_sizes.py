#!/usr/bin/env python3
"""No product source file is over 700 lines: a file that long holds several concepts, which
are easier to read, review and change as files of their own.

  check_file_sizes.py REPO        check REPO's product folders (ctest: scripts.file_sizes)
  check_file_sizes.py --self-test a file over the bar fails, one at it passes, and an entry
                                  of the allow-list that no longer needs to be there fails
                                  (ctest: scripts.file_sizes_selftest)

Product folders: interposer, daemon, cli, common, cluster. Source files: C and C++ (sources,
headers, .inc), Python and shell. Lines are counted as `wc -l` does.
Exit 0 when every file is within the bar, 1 with one line per problem otherwise.
"""
import os
import sys
import tempfile

MAX_LINES = 700
FOLDERS = ("interposer", "daemon", "cli", "common", "cluster")
SUFFIXES = (".c", ".cc", ".cpp", ".h", ".hpp", ".inc", ".py", ".sh")

# Files over the bar while someone splits them; each entry goes with its split (the check
# fails while an entry names a file that is gone or back within the bar, so the list only
# shrinks). Paths relative to the repository.
ALLOWED: set[str] = set()


def lines_of(path):
    with open(path, "rb") as f:
        return f.read().count(b"\n")


def check(repo, allowed=ALLOWED, folders=FOLDERS):
    problems = []
    seen = set()
    for folder in folders:
        top = os.path.join(repo, folder)
        for root, dirs, files in os.walk(top):
            dirs.sort()
            for name in sorted(files):
                if not name.endswith(SUFFIXES):
                    continue
                path = os.path.join(root, name)
                rel = os.path.relpath(path, repo)
                n = lines_of(path)
                if rel in allowed:
                    seen.add(rel)
                    if n <= MAX_LINES:
                        problems.append(f"{rel}: {n} lines, within {MAX_LINES}: take it off the allow-list "
                                        f"(tests/scripts/check_file_sizes.py)")
                elif n > MAX_LINES:
                    problems.append(f"{rel}: {n} lines, over {MAX_LINES}: split it along its concepts")
    for rel in sorted(set(allowed) - seen):
        problems.append(f"{rel}: on the allow-list but not found: take it off (tests/scripts/check_file_sizes.py)")
    return problems


def self_test():
    with tempfile.TemporaryDirectory() as d:
        def write(rel, lines):
            path = os.path.join(d, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write("x\n" * lines)

        write("cli/src/short.cpp", MAX_LINES)
        write("daemon/src/notes.md", MAX_LINES + 100)  # not a source file
        write("docs/long.cpp", MAX_LINES + 100)  # not a product folder
        found = check(d, allowed=set())
        if found:
            print("self-test: files within the bar were refused:", *found, sep="\n  ")
            return 1
        write("interposer/src/core/long.hpp", MAX_LINES + 1)
        found = check(d, allowed=set())
        if len(found) != 1 or "interposer/src/core/long.hpp: 701 lines" not in found[0]:
            print("self-test: a header of 701 lines was not the one problem found:", *found, sep="\n  ")
            return 1
        found = check(d, allowed={"interposer/src/core/long.hpp"})
        if found:
            print("self-test: an allowed file over the bar was refused:", *found, sep="\n  ")
            return 1
        found = check(d, allowed={"interposer/src/core/long.hpp", "cli/src/short.cpp"})
        if len(found) != 1 or "cli/src/short.cpp" not in found[0] or "allow-list" not in found[0]:
            print("self-test: an allowed file within the bar was not refused:", *found, sep="\n  ")
            return 1
        found = check(d, allowed={"interposer/src/core/long.hpp", "cli/src/gone.cpp"})
        if len(found) != 1 or "cli/src/gone.cpp" not in found[0]:
            print("self-test: an allowed file that is gone was not refused:", *found, sep="\n  ")
            return 1
    print(f"self-test: a file of {MAX_LINES + 1} lines fails, one of {MAX_LINES} passes; an allow-list entry "
          "within the bar or gone fails")
    return 0


def main():
    args = sys.argv[1:]
    if args == ["--self-test"]:
        return self_test()
    if len(args) != 1:
        print("usage: check_file_sizes.py REPO | --self-test")
        return 2
    problems = check(args[0])
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} problem(s): product source files are at most {MAX_LINES} lines")
        return 1
    print(f"every product source file is at most {MAX_LINES} lines ({len(ALLOWED)} allowed over it while split)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
