#!/usr/bin/env python3
"""`python -m torch.cuda._memory_viz ARGS...`, on a machine without a network.

memory_viz's `segments` and `memory` pipe their stacks through Brendan Gregg's flamegraph.pl,
which torch downloads the first time. Where the download cannot happen, a stand-in is
written where torch wants the script: it reads every line torch gives it and writes an SVG
that says how many stacks it got. What is checked is torch's reading of the snapshot.
"""
import os
import runpy
import sys
import urllib.request

STANDIN = """#!/usr/bin/env python3
import sys
n = sum(1 for _ in sys.stdin)
print('<svg xmlns="http://www.w3.org/2000/svg"><text>%d stacks</text></svg>' % n)
"""

real = urllib.request.urlretrieve


def retrieve(url, filename=None, *args, **kwargs):
    try:
        return real(url, filename, *args, **kwargs)
    except Exception:
        if not filename or not url.endswith("flamegraph.pl"):
            raise
        os.makedirs(os.path.dirname(filename) or ".", exist_ok=True)
        with open(filename, "w") as f:
            f.write(STANDIN)
        os.chmod(filename, 0o755)
        print(f"memory_viz.py: no network: a stand-in flamegraph.pl at {filename}", file=sys.stderr)
        return filename, None


urllib.request.urlretrieve = retrieve
sys.argv = ["_memory_viz"] + sys.argv[1:]
runpy.run_module("torch.cuda._memory_viz", run_name="__main__")
