#!/usr/bin/env python3
"""cuwarden bench: what the hooks add to one alloc+free pair, from `cuw_bench_gpu hookraw` files.

    python3 bench/hookraw_report.py FILE [FILE ...]

Each file holds one process's pairs: "path position alloc_ns free_ns", path 0 the hooked entry
points, 1 and 2 libcuda's own (the same function twice). Pairs come in blocks of one path and
every group of three consecutive blocks holds each path once, in a random order. Per group:
added = mean(path 0) - mean(path 1), control = mean(path 2) - mean(path 1), per pair; a
group's three blocks share the machine's state of that moment, so slow drift cancels. Prints,
per file and for all files together, the 10%-trimmed mean and the median of both over the
groups, with a 95% bootstrap interval (2000 resamples, seed 1) of the trimmed mean: per file
the groups are resampled; for all files together the files (processes) first, then the groups
within each, since what the hooks add moves more between processes than within one; and the
same for the alloc and the free halves. The control's figure is the method's own error: the
added figure means something only where the control's interval is narrow and holds zero.
"""
import random
import sys


def load(path):
    """(groups, header fields, rows)."""
    groups, rows, head = [], [], {}
    for line in open(path):
        if line.startswith("#"):
            head.update(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
            continue
        v = line.split()
        if len(v) < 4:
            continue
        rows.append((int(v[0]), int(v[1]), float(v[2]), float(v[3])))  # older files have 2 more columns
    # Blocks: runs of one path starting at position 0.
    blocks = []
    for r in rows:
        if r[1] == 0:
            blocks.append((r[0], []))
        blocks[-1][1].append(r)
    for i in range(0, len(blocks) - 2, 3):
        g = {}
        for path, rs in blocks[i:i + 3]:
            n = len(rs)
            g[path] = (sum(x[2] for x in rs) / n, sum(x[3] for x in rs) / n)
        if len(g) == 3:
            groups.append(g)
    return groups, head, rows


def trimmed(v, cut=0.1):
    v = sorted(v)
    k = int(len(v) * cut)
    v = v[k:len(v) - k] if len(v) > 2 * k else v
    return sum(v) / len(v)


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def interval(per_process, reps=2000):
    """95% bootstrap interval of the trimmed mean of values grouped by process: each
    resample draws processes with replacement, then values within each drawn process (a
    process's own state moves what the hooks cost more than its rounds do, so resampling
    groups alone would make a pooled interval too narrow)."""
    rng = random.Random(1)
    k = len(per_process)
    est = []
    for _ in range(reps):
        sample = []
        for _ in range(k):
            v = per_process[rng.randrange(k)]
            n = len(v)
            sample.extend(v[rng.randrange(n)] for _ in range(n))
        est.append(trimmed(sample))
    est.sort()
    return est[int(0.025 * reps)], est[int(0.975 * reps)]


def figures(processes):
    """processes: one list of groups per process (file)."""
    out = {}
    for name, pick in (("pair", lambda t: t[0] + t[1]), ("alloc", lambda t: t[0]), ("free", lambda t: t[1])):
        added = [[pick(g[0]) - pick(g[1]) for g in gs] for gs in processes]
        control = [[pick(g[2]) - pick(g[1]) for g in gs] for gs in processes]
        own = [pick(g[1]) for gs in processes for g in gs]
        flat_added = [x for v in added for x in v]
        flat_control = [x for v in control for x in v]
        out[name] = dict(own=median(own), added=trimmed(flat_added), added_med=median(flat_added),
                         added_ci=interval(added), control=trimmed(flat_control), control_med=median(flat_control),
                         control_ci=interval(control))
    return out


def show(label, processes):
    f = figures(processes)
    groups = [g for gs in processes for g in gs]
    print("%s: %d groups" % (label, len(groups)))
    for name in ("pair", "alloc", "free"):
        x = f[name]
        print("  %-5s own %9.0f ns | added %6.0f ns [%6.0f, %6.0f] median %6.0f | control %6.0f ns [%6.0f, %6.0f] median %6.0f"
              % (name, x["own"], x["added"], x["added_ci"][0], x["added_ci"][1], x["added_med"], x["control"],
                 x["control_ci"][0], x["control_ci"][1], x["control_med"]))
    return f


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: bench/hookraw_report.py FILE [FILE ...]")
    every = []
    for path in sys.argv[1:]:
        g, head, rows = load(path)
        if not g:
            sys.exit("hookraw_report: %s: no complete group of three blocks" % path)
        show(path, [g])
        every.append(g)
    if len(sys.argv) > 2:
        show("all %d files (intervals: processes, then groups, resampled)" % (len(sys.argv) - 1), every)


if __name__ == "__main__":
    main()
