#!/usr/bin/env python3
"""Checks a pickle from `cuwarden snapshot --format pytorch` against what PyTorch's memory tools read.

  check_pytorch_snapshot.py FILE [EXPECT_JSON]   exit 0 when FILE passes, 1 with the reasons
  check_pytorch_snapshot.py --self-test          broken snapshots must fail, a good one pass

What is checked, and where PyTorch reads it (torch/cuda/_memory_viz.py, torch/utils/viz/
MemoryViz.js and process_alloc_data.js, torch/cuda/memory.py's _snapshot docstring):
  - every opcode is one MemoryViz.js's own unpickler knows (it throws on any other);
  - segments: device (an int: the viewer compares it with ===), address, total_size,
    allocated_size (trace's find_segment), active_size, requested_size, stream, segment_type,
    blocks; each block: address, size, requested_size, state, frames ({filename, line,
    name}); blocks tile their segment in address order (the viewer and `stats` walk them
    adding sizes; `stats` asserts that they add up to total_size); allocated_size, active_size
    and requested_size are the sums over the active blocks; no two segments of a device
    overlap;
  - device_traces: a list per device ordinal, at least up to every segment's device; each
    entry: action, size, stream, time_us, frames, and addr (device_free for 'oom');
    'free_requested' directly followed by its 'free_completed' (the viewer folds the pair);
    replayed backwards from the segments as the viewer's "Allocator State History" does,
    no block falls outside every segment and each 'segment_alloc' names a segment that no
    live block is in;
  - `stats`, `trace`, `segments` and `memory`'s own reads, done here without torch.
EXPECT_JSON (optional): {"segments": N, "devices": N, "actions": {"alloc": N, ...},
"frames": ["file:line:name", ...] (each in some frame list), "oom_device_free": [N, ...],
"settings": {key: value, ...}}.
"""
import io
import json
import pickle
import pickletools
import sys

# MemoryViz.js's unpickleData: the opcodes it handles (any other throws "UNKNOWN OPCODE").
VIEWER_OPCODES = {
    "APPENDS", "BINGET", "BININT", "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME",
    "LONG1", "LONG_BINGET", "MARK", "MEMOIZE", "PROTO", "SETITEMS", "SHORT_BINUNICODE", "STOP",
    "TUPLE2", "APPEND", "NEWFALSE", "BINPUT", "BINUNICODE", "EMPTY_TUPLE", "NEWTRUE", "NONE",
    "BINFLOAT", "TUPLE", "TUPLE1", "TUPLE3", "LONG_BINPUT", "LIST", "DICT", "SETITEM",
}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "oom", "snapshot"}
STATES = {"active_allocated", "active_pending_free", "inactive"}
PAGE_SIZE = 20 << 20  # _memory_viz.segsum's page


class Bad(Exception):
    pass


def need(cond, what):
    if not cond:
        raise Bad(what)


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def check_frames(frames, where):
    need(isinstance(frames, list), f"{where}: frames is not a list")
    for f in frames:
        need(isinstance(f, dict), f"{where}: a frame is not a dict")
        need(isinstance(f.get("filename"), str), f"{where}: frame without a str filename: {f}")
        need(isinstance(f.get("name"), str), f"{where}: frame without a str name: {f}")
        need(is_int(f.get("line")) and f["line"] >= 0, f"{where}: frame without an int line: {f}")


def check_opcodes(data):
    for op, _, _ in pickletools.genops(data):
        need(op.name in VIEWER_OPCODES, f"opcode {op.name} is not one MemoryViz.js reads")
        if op.name == "PROTO":
            pass
    need(data[:2] == b"\x80\x04", "not a protocol 4 pickle")


def check_segments(snap):
    segs = snap["segments"]
    need(isinstance(segs, list), "segments is not a list")
    by_device = {}
    for i, seg in enumerate(segs):
        w = f"segment {i}"
        need(isinstance(seg, dict), f"{w}: not a dict")
        for k in ("device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream"):
            need(is_int(seg.get(k)), f"{w}: {k} missing or not an int: {seg.get(k)!r}")
        need(seg["total_size"] > 0, f"{w}: total_size {seg['total_size']}")
        need(seg.get("segment_type") in ("large", "small"), f"{w}: segment_type {seg.get('segment_type')!r}")
        check_frames(seg.get("frames", []), w)
        blocks = seg.get("blocks")
        need(isinstance(blocks, list) and blocks, f"{w}: no blocks")
        addr = seg["address"]
        allocated = active = requested = 0
        for j, b in enumerate(blocks):
            wb = f"{w} block {j}"
            for k in ("address", "size", "requested_size"):
                need(is_int(b.get(k)), f"{wb}: {k} missing or not an int")
            need(b.get("state") in STATES, f"{wb}: state {b.get('state')!r}")
            check_frames(b.get("frames"), wb)
            need(b["address"] == addr, f"{wb}: at {b['address']:#x}, the tiling is at {addr:#x}")
            need(b["size"] > 0, f"{wb}: size {b['size']}")
            if b["state"] != "inactive":
                need(0 <= b["requested_size"] <= b["size"], f"{wb}: requested_size {b['requested_size']} > size {b['size']}")
                active += b["size"]
                requested += b["requested_size"]
                if b["state"] == "active_allocated":
                    allocated += b["size"]
            addr += b["size"]
        need(addr == seg["address"] + seg["total_size"],
             f"{w}: blocks add up to {addr - seg['address']}, total_size is {seg['total_size']}")
        need(seg["allocated_size"] == allocated, f"{w}: allocated_size {seg['allocated_size']} != {allocated}")
        need(seg["active_size"] == active, f"{w}: active_size {seg['active_size']} != {active}")
        need(seg["requested_size"] == requested, f"{w}: requested_size {seg['requested_size']} != {requested}")
        by_device.setdefault(seg["device"], []).append((seg["address"], seg["total_size"]))
    for d, ranges in by_device.items():
        ranges.sort()
        for (a, n), (b, _) in zip(ranges, ranges[1:]):
            need(a + n <= b, f"device {d}: segments at {a:#x} and {b:#x} overlap")


def replay_backwards(snap, device, trace):
    """MemoryViz.js's simulate_memory, walked over every entry: it must never need a
    segment that is not there."""
    segs = {}
    blocks = {}
    for seg in snap["segments"]:
        if seg["device"] != device:
            continue
        segs[seg["address"]] = seg["total_size"]
        for b in seg["blocks"]:
            if b["state"] in ("active_allocated", "active_pending_free"):
                blocks[b["address"]] = b["size"]

    def containing(addr):
        return any(s <= addr < s + n for s, n in segs.items())

    for i in range(len(trace) - 1, -1, -1):
        e = trace[i]
        a = e["action"]
        w = f"device {device} entry {i} ({a})"
        if a == "free_completed":
            blocks[e["addr"]] = e["size"]
        elif a == "alloc":
            blocks.pop(e["addr"], None)
        elif a == "segment_free":
            segs[e["addr"]] = e["size"]
        elif a == "segment_alloc":
            need(e["addr"] in segs, f"{w}: names no segment of the state before it")
            n = segs.pop(e["addr"])
            inside = [b for b in blocks if e["addr"] <= b < e["addr"] + n]
            need(not inside, f"{w}: live blocks lie in it: {[hex(b) for b in inside]}")
        for b in blocks:
            need(containing(b), f"{w}: block {b:#x} lies in no segment")


def check_traces(snap):
    traces = snap.get("device_traces")
    need(isinstance(traces, list), "device_traces is not a list")
    for seg in snap["segments"]:
        need(seg["device"] < len(traces), f"segment of device {seg['device']} without a device_traces entry")
    for d, trace in enumerate(traces):
        need(isinstance(trace, list), f"device_traces[{d}] is not a list")
        for i, e in enumerate(trace):
            w = f"device {d} entry {i}"
            need(isinstance(e, dict), f"{w}: not a dict")
            need(e.get("action") in ACTIONS, f"{w}: action {e.get('action')!r}")
            for k in ("size", "stream", "time_us"):
                need(is_int(e.get(k)), f"{w}: {k} missing or not an int")
            if e["action"] == "oom":
                need(is_int(e.get("device_free")), f"{w}: oom without device_free")
            else:
                need(is_int(e.get("addr")), f"{w}: addr missing or not an int")
            check_frames(e.get("frames"), w)
            if e["action"] == "free_requested":
                need(i + 1 < len(trace) and trace[i + 1]["action"] == "free_completed"
                     and trace[i + 1].get("addr") == e["addr"], f"{w}: free_requested not followed by its free_completed")
            if e["action"] == "free_completed":
                need(i > 0 and trace[i - 1]["action"] == "free_requested", f"{w}: free_completed alone")
        replay_backwards(snap, d, trace)


def run_tools(snap):
    """The reads of _memory_viz's stats (segsum), trace, segments and memory."""
    total_reserved = total_allocated = free_external = free_internal = 0
    for seg in snap["segments"]:
        total_reserved += seg["total_size"]
        seg_alloc = seg_ext = seg_int = 0
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                real = b["requested_size"] if "frames" in b else b.get("requested_size", b["size"])
                seg_alloc += real
                seg_int += b["size"] - real
            else:
                seg_ext += b["size"]
        need(seg_alloc + seg_ext + seg_int == seg["total_size"], "stats: a segment's sums disagree")
        total_allocated += seg_alloc
        free_external += seg_ext
        free_internal += seg_int
        _ = (seg["total_size"] - 1) // PAGE_SIZE + 1, seg["stream"]
    need(free_internal + free_external + total_allocated == total_reserved, "stats: totals disagree")
    out = io.StringIO()
    for seg in snap["segments"]:  # segments / memory flamegraph lines
        for b in seg["blocks"]:
            names = ";".join(f"{f['filename'].split('/')[-1]}:{f['line']}:{f['name']}" for f in reversed(b["frames"]))
            out.write(f"stream_{seg['stream']};seg_{seg['address']};{b['state']};{names or '<non-python>'} "
                      f"{b['requested_size']}\n")
    for d in snap["device_traces"]:  # trace
        for e in d:
            if e["action"] == "oom":
                _ = e["size"], e["device_free"]
            else:
                _ = e["addr"], e["size"]
        for seg in snap["segments"]:
            _ = seg["address"], seg["allocated_size"]
    return out.getvalue()


def check_expectations(snap, expect):
    if "segments" in expect:
        need(len(snap["segments"]) == expect["segments"], f"{len(snap['segments'])} segments, expected {expect['segments']}")
    if "devices" in expect:
        need(len(snap["device_traces"]) == expect["devices"],
             f"{len(snap['device_traces'])} device traces, expected {expect['devices']}")
    if "actions" in expect:
        counts = {}
        for d in snap["device_traces"]:
            for e in d:
                counts[e["action"]] = counts.get(e["action"], 0) + 1
        for a, n in expect["actions"].items():
            need(counts.get(a, 0) == n, f"{counts.get(a, 0)} '{a}' entries, expected {n} (all: {counts})")
    frames = set()
    lists = [b["frames"] for s in snap["segments"] for b in s["blocks"]]
    lists += [e["frames"] for d in snap["device_traces"] for e in d]
    for fl in lists:
        for f in fl:
            frames.add(f"{f['filename']}:{f['line']}:{f['name']}")
    for f in expect.get("frames", []):
        need(f in frames, f"no frame {f}")
    if "oom_device_free" in expect:
        got = [e["device_free"] for d in snap["device_traces"] for e in d if e["action"] == "oom"]
        need(got == expect["oom_device_free"], f"oom device_free {got}, expected {expect['oom_device_free']}")
    for k, v in expect.get("settings", {}).items():
        need(snap.get("allocator_settings", {}).get(k) == v,
             f"allocator_settings[{k!r}] = {snap.get('allocator_settings', {}).get(k)!r}, expected {v!r}")


def check_bytes(data, expect=None):
    check_opcodes(data)
    snap = pickle.loads(data)
    need(isinstance(snap, dict), "the pickle is not a dict")
    need("segments" in snap and "device_traces" in snap, "no segments or device_traces")
    check_segments(snap)
    check_traces(snap)
    run_tools(snap)
    if expect:
        check_expectations(snap, expect)


def self_test():
    good = {"segments": [{"device": 0, "address": 4096, "total_size": 3000, "allocated_size": 1000,
                          "active_size": 1000, "requested_size": 900, "stream": 0, "segment_type": "small",
                          "frames": [],
                          "blocks": [{"address": 4096, "size": 1000, "requested_size": 900, "state": "active_allocated",
                                      "frames": [{"filename": "a.py", "line": 3, "name": "f"}]},
                                     {"address": 5096, "size": 2000, "requested_size": 0, "state": "inactive",
                                      "frames": []}]}],
            "device_traces": [[{"action": "alloc", "addr": 4096, "size": 900, "stream": 0, "time_us": 1, "frames": []}]]}
    check_bytes(pickle.dumps(good, protocol=4))
    import copy
    breakers = {
        "a gap in the tiling": lambda s: s["segments"][0]["blocks"][1].__setitem__("address", 5100),
        "sizes not adding up": lambda s: s["segments"][0].__setitem__("total_size", 3001),
        "allocated_size off": lambda s: s["segments"][0].__setitem__("allocated_size", 900),
        "a str device": lambda s: s["segments"][0].__setitem__("device", "0"),
        "a segment without a trace": lambda s: s.__setitem__("device_traces", []),
        "an unpaired free_requested": lambda s: s["device_traces"][0].append(
            {"action": "free_requested", "addr": 4096, "size": 900, "stream": 0, "time_us": 2, "frames": []}),
        "a free outside every segment": lambda s: s["device_traces"][0].extend([
            {"action": "free_requested", "addr": 1, "size": 9, "stream": 0, "time_us": 2, "frames": []},
            {"action": "free_completed", "addr": 1, "size": 9, "stream": 0, "time_us": 2, "frames": []}]),
        "a segment_alloc under a live block": lambda s: s["device_traces"][0].insert(
            0, {"action": "segment_alloc", "addr": 4096, "size": 3000, "stream": 0, "time_us": 0, "frames": []}) or
            s["device_traces"][0].pop(),
        "an oom without device_free": lambda s: s["device_traces"][0].append(
            {"action": "oom", "size": 9, "stream": 0, "time_us": 2, "frames": []}),
        "a frame without a line": lambda s: s["segments"][0]["blocks"][0]["frames"][0].pop("line"),
    }
    failed = []
    for what, breaker in breakers.items():
        bad = copy.deepcopy(good)
        breaker(bad)
        try:
            check_bytes(pickle.dumps(bad, protocol=4))
            failed.append(what)
        except Bad:
            pass
    try:  # an opcode the viewer does not know (protocol 5's BYTEARRAY8 via a bytearray)
        check_bytes(pickle.dumps({"segments": [], "device_traces": [], "x": bytearray(b"1")}, protocol=5))
        failed.append("an unknown opcode")
    except Bad:
        pass
    if failed:
        print("self-test: passed although broken: " + ", ".join(failed))
        return 1
    print("self-test: ok")
    return 0


def main(argv):
    if len(argv) >= 2 and argv[1] == "--self-test":
        return self_test()
    if len(argv) not in (2, 3):
        print(__doc__)
        return 2
    with open(argv[1], "rb") as f:
        data = f.read()
    expect = json.loads(argv[2]) if len(argv) == 3 else None
    try:
        check_bytes(data, expect)
    except Bad as e:
        print(f"{argv[1]}: {e}")
        return 1
    print(f"{argv[1]}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
