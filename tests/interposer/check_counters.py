#!/usr/bin/env python3
"""Only the ledger and the tracker write a device counter, in the interposer.

  check_counters.py SRC_DIR COUNTERS_HPP   check SRC_DIR (ctest: interposer.counters on
                                           interposer/src and common's cuw/counters.hpp)
  check_counters.py --self-test            a tree where a backend writes a counter must fail

The counters are the stored rows of CUW_DEVICE_COUNTERS (X(field, ...) in cuw/counters.hpp),
the fields of ring::DeviceSlot. A write is a member access to one of them (`.field` or
`->field`) that is stored, exchanged or read-modified-written (`.store(`, `.fetch_add(`,
`.fetch_sub(`, `.exchange(`, `.compare_exchange_*(`), or passed first to counter_add /
counter_sub. Allowed in core/ledger.hpp (allocations, frees, a pool's memory) and the
tracker's own files (the caps: used, peak, refusals, context bytes): ALLOWED below. A line
in another file that writes a member of that name which is not a device counter says so with
a NOT_A_COUNTER entry (file, field, why).
Exit 0 when no other file writes a counter, 1 with one line per write otherwise.
"""
import os
import re
import sys
import tempfile

ALLOWED = {"core/ledger.hpp", "core/tracker.hpp", "core/tracker.cpp", "core/cap_scope.cpp"}
# (file, field): why that member is not a ring::DeviceSlot counter.
NOT_A_COUNTER = {
    ("core/live_segment.cpp", "used"): "a live table's filled bytes (live.hpp), not a device's",
}
ROW = re.compile(r"^\s*X\((\w+),", re.M)


def counter_fields(counters_hpp):
    fields = ROW.findall(open(counters_hpp).read())
    if not fields:
        raise SystemExit(f"{counters_hpp}: no X(field, ...) rows")
    return fields


def writes(text, fields):
    names = "|".join(fields)
    member = rf"(?:\.|->)\s*({names})\b"
    store = re.compile(member + r"\s*\.\s*(?:store|fetch_add|fetch_sub|fetch_or|fetch_and|exchange|compare_exchange_\w+)\s*\(")
    helper = re.compile(r"\bcounter_(?:add|sub)\s*\(\s*[^,;]*?" + member + r"\s*,")
    for n, line in enumerate(text.split("\n"), 1):
        for rx in (store, helper):
            for m in rx.finditer(line):
                yield n, m.group(1)


def check(src, fields):
    problems = []
    for root, _, files in os.walk(src):
        for f in sorted(files):
            if not f.endswith((".hpp", ".cpp", ".inc", ".h")):
                continue
            path = os.path.join(root, f)
            rel = os.path.relpath(path, src).replace(os.sep, "/")
            if rel in ALLOWED:
                continue
            for n, field in writes(open(path, errors="replace").read(), fields):
                if (rel, field) in NOT_A_COUNTER:
                    continue
                problems.append(f"{rel}:{n}: writes the device counter `{field}`: only the ledger "
                                f"(core/ledger.hpp) and the tracker write counters")
    return problems


def self_test():
    fields = ["used", "reserved", "cached", "pool_hits"]
    with tempfile.TemporaryDirectory() as d:
        def write(rel, text):
            os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
            open(os.path.join(d, rel), "w").write(text)
        write("core/ledger.hpp", "void hit() { counter_add(d_.pool_hits, 1); d_.cached.store(0); }\n")
        write("core/tracker.cpp", "void charge() { d.used.store(used + bytes); }\n")
        write("backends/pool.cpp", "void f() { ledger_.hit(p); x.cached_bytes.store(1); slot_.cached.load(); }\n")
        if check(d, fields):
            print("self-test: a clean tree was refused:", *check(d, fields), sep="\n  ")
            return 1
        cases = [
            "void f() { core::counter_sub(slot_.cached, b->size); }\n",
            "void f() { core::counter_add(t.header().devices[0].reserved, 1); }\n",
            "void f() { slot_->pool_hits.fetch_add(1, std::memory_order_relaxed); }\n",
            "void f() { d.used.store(0, std::memory_order_relaxed); }\n",
        ]
        for case in cases:
            write("backends/pool.cpp", case)
            found = check(d, fields)
            if len(found) != 1 or "backends/pool.cpp:1" not in found[0]:
                print(f"self-test: a backend's counter write was not the one problem found: {case.strip()}",
                      *found, sep="\n  ")
                return 1
    print("self-test: a backend writing a counter (counter_add/counter_sub, store, fetch_add) is refused; "
          "the ledger and the tracker may, reads and other members pass")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 1
    problems = check(argv[1], counter_fields(argv[2]))
    for p in problems:
        print(p)
    if not problems:
        print(f"check_counters: no file of {argv[1]} outside {', '.join(sorted(ALLOWED))} writes a device counter")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
