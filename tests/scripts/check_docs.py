#!/usr/bin/env python3
"""The README is a user's guide: at most 15 KB, with the sections a new user looks for; every
relative link in it and in docs/ names a file that exists (and a heading, for #anchors).

    check_docs.py REPO
"""
import pathlib
import re
import sys

repo = pathlib.Path(sys.argv[1])
readme = repo / "README.md"
failures = []
size = readme.stat().st_size
if size > 15 * 1024:
    failures.append(f"README.md is {size} bytes (at most {15 * 1024})")
text = readme.read_text()
for heading in ("## Install", "## On a fresh machine", "## Try it without installing", "## Use",
                "## What is intercepted", "## Limits of the design", "## Not in this build yet"):
    if not re.search(rf"^{re.escape(heading)}\b", text, re.M):
        failures.append(f"README.md has no '{heading}' section")


def slug(title):
    s = re.sub(r"[^\w\- ]", "", title.strip().lower())
    return s.replace(" ", "-")


def anchors(path):
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", path.read_text(), re.M)}


checked = 0
for md in [readme, *sorted((repo / "docs").glob("*.md"))]:
    for m in re.finditer(r"\]\(([^)\s]+)\)", md.read_text()):
        link = m.group(1)
        if re.match(r"[a-z]+://", link) or link.startswith("mailto:"):
            continue
        path, _, anchor = link.partition("#")
        target = (md.parent / path).resolve() if path else md
        checked += 1
        if not target.exists():
            failures.append(f"{md.relative_to(repo)}: broken link {link}")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            failures.append(f"{md.relative_to(repo)}: no heading for #{anchor} in {path or md.name}")
for f in failures:
    print("FAIL:", f)
print(f"README.md {size} bytes; {checked} links checked")
sys.exit(1 if failures else 0)
