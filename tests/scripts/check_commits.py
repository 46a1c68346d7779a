#!/usr/bin/env python3
"""Commit messages follow CONTRIBUTING.md from the commit that wrote the rule on: a subject of at
most 72 characters (one line: a first paragraph of several lines is a subject too long), and a
body that says why for every change of more than 20 lines (a rewrap or one doc sentence may go
with its subject alone). Merge commits need only the subject rule.

  check_commits.py REPO        check REPO's history since the rule (ctest: scripts.commit_messages)
  check_commits.py --self-test a long subject, a multi-line subject and a large change without a
                               body fail, a small change without one and a good commit pass, and
                               an allow-list entry that is not in the history fails
                               (ctest: scripts.commit_messages_selftest)

Exit 0 when every commit follows the rule, 1 with one line per problem, 77 (ctest: skipped) when
REPO has no git history back to the rule's commit (a shallow clone, an archive): that history is
where the check looks.
"""
import os
import subprocess
import sys
import tempfile

RULE_COMMIT = "0d18fcd7bf34e0a575de8d6207bd1912ceaeac17"  # "Write the project's rules in CONTRIBUTING.md"
MAX_SUBJECT = 72
BODY_OVER_LINES = 20

# Commits that landed before this check and break the rule; history is not rewritten, so the
# list stays, and an entry that is not in the history fails the check (a typo would hide nothing).
ALLOWED = {
    "6644fc8dd062": "subject of 73 characters",
    "791bffef73eb": "subject of 73 characters",
}

SKIP = 77


def git(repo, *args):
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout


def commits(repo, base):
    """(hash, parents, subject, body, changed lines) of each commit in base..HEAD."""
    out = git(repo, "log", "--format=%x1e%H%x1f%P%x1f%s%x1f%b%x1f", "--shortstat", f"{base}..HEAD")
    for rec in out.split("\x1e")[1:]:
        h, parents, subject, body, stat = rec.split("\x1f")
        changed = 0
        for part in stat.strip().split(","):
            words = part.split()
            if len(words) >= 2 and words[1].startswith(("insertion", "deletion")):
                changed += int(words[0])
        yield h, parents.split(), subject, body.strip(), changed


def check(repo, base=RULE_COMMIT, allowed=ALLOWED):
    problems, seen = [], set()
    for h, parents, subject, body, changed in commits(repo, base):
        short = h[:12]
        if short in allowed:
            seen.add(short)
            continue
        if len(subject) > MAX_SUBJECT:
            problems.append(f"{short} {subject[:40]}...: subject of {len(subject)} characters, over {MAX_SUBJECT} "
                            "(a blank line after the subject; the rest goes in the body)")
        if len(parents) < 2 and not body and changed > BODY_OVER_LINES:
            problems.append(f"{short} {subject[:40]}: {changed} lines changed and no body: say why, with the "
                            "measurements (CONTRIBUTING.md)")
    for short in sorted(set(allowed) - seen):
        problems.append(f"{short}: on the allow-list but not in the history since {base[:12]}: take it off "
                        "(tests/scripts/check_commits.py)")
    return problems


def self_test():
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                   GIT_COMMITTER_EMAIL="t@t")

        def run(*args):
            return subprocess.run(["git", "-C", d, *args], check=True, capture_output=True, text=True,
                                  env=env).stdout.strip()

        def commit(message, lines):
            with open(os.path.join(d, "f"), "a") as f:
                f.write("x\n" * lines)
            run("add", "f")
            run("commit", "-q", "-m", message)
            return run("rev-parse", "HEAD")[:12]

        run("init", "-q")
        base = commit("Base", 1)
        commit("Add a good change\n\nWhy, with figures.", 50)
        commit("Rewrap a comment", 3)
        failures = []
        if check(d, base, {}):
            failures.append(f"a clean history failed: {check(d, base, {})}")
        long = commit("S" * 73, 1)
        if not any(long in p and "73 characters" in p for p in check(d, base, {})):
            failures.append("a subject of 73 characters passed")
        if check(d, base, {long: "test"}):
            failures.append("an allowed commit failed")
        multi = commit("A subject that goes on\nonto a second line and further still, past the bar of seventy-two", 1)
        if not any(multi in p for p in check(d, base, {long: "test"})):
            failures.append("a subject of two lines passed")
        run("reset", "-q", "--hard", long)
        bare = commit("Change a lot", 30)
        if not any(bare in p and "no body" in p for p in check(d, base, {long: "test"})):
            failures.append("30 lines without a body passed")
        if not any("deadbeef0000" in p for p in check(d, base, {long: "test", bare: "test", "deadbeef0000": "x"})):
            failures.append("an allow-list entry outside the history passed")
    for f in failures:
        print(f"self-test: {f}")
    return 1 if failures else 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) != 2:
        print(__doc__)
        return 2
    repo = argv[1]
    try:
        git(repo, "cat-file", "-e", f"{RULE_COMMIT}^{{commit}}")
    except (OSError, subprocess.CalledProcessError):
        print(f"check_commits.py: {repo} has no git history back to {RULE_COMMIT[:12]} "
              "(not a clone, or a shallow one): nothing to check")
        return SKIP
    problems = check(repo)
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
