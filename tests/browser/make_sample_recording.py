#!/usr/bin/env python3
"""Write tests/browser/recording-sample/: a small, hand-made recording of cuwardend's HTTP API in
the format replay_server.py documents, for the dashboard's replay test.

    make_sample_recording.py OUT_DIR

One H200, two processes for 15 minutes of history and 8 s of recording:
  4101 python3 train.py (alice): capped at 16 GiB, cache pool; at +2 s it allocates 4 GiB
       (6 -> 10 GiB), after an alloc/free of 512 MiB at +1 s.
  4102 infer_server (bob, job "serve" capped at 6 GiB): capped at 4 GiB, holds 3 GiB; one
       refusal in the history (-300 s) and a live one at +4 s (2 GiB asked), then 512 MiB more
       at +6 s (3.5 GiB).
A snapshot of 4101 (200, with call sites); none of 4102 (the replay answers 403 for it).
The field sets follow daemon/src/views/state_json.cpp and snapshot_json.cpp; run again and
commit the result when they change.
"""
import json
import pathlib
import sys

GiB, MiB = 1 << 30, 1 << 20
T0 = 1764633600                 # recording start (unix s)
HIST0 = T0 - 900                # history begins
END = T0 + 8.5
HISTORY_AT = T0 + 8.3
GPU = {"index": 0, "uuid": "GPU-5f1c2a9e-6b7d-4e30-9a41-0c2b8d7e11aa", "name": "NVIDIA H200",
       "memory_total_bytes": 150754820096, "bus_id": "00000000:18:00.0"}
RUN = "/run/cuwarden"

# What each process holds over time: (from time, used, reserved) steps, and its counters'
# changes as events. Reserved >= used with the cache pool.
PROCS = {
    4101: {"user": "alice", "uid": 1000, "name": "python3", "cmdline": "python3 train.py --epochs 3",
           "job": "", "pool": "cache", "limit": 16 * GiB, "created": HIST0 - 5, "start_time": 8123456,
           "steps": [(HIST0, 2 * GiB, 2 * GiB), (T0 - 800, 4 * GiB, 5 * GiB), (T0 - 600, 7 * GiB, 8 * GiB),
                     (T0 - 590, 6 * GiB, 8 * GiB), (T0 + 2, 10 * GiB, 12 * GiB)],
           "ooms": []},
    4102: {"user": "bob", "uid": 1001, "name": "infer_server", "cmdline": "infer_server --port 8000 --model llama-8b",
           "job": "serve", "pool": "off", "limit": 4 * GiB, "created": T0 - 500, "start_time": 8155001,
           "steps": [(T0 - 500, 1 * GiB, 1 * GiB), (T0 - 420, 3 * GiB, 3 * GiB), (T0 + 6, 3 * GiB + 512 * MiB, 3 * GiB + 512 * MiB)],
           "ooms": [(T0 - 300, 2 * GiB), (T0 + 4, 2 * GiB)]},
}
JOB = {"name": "serve", "user": "bob", "uid": 1001, "limit": 6 * GiB, "pids": [4102]}

# Memory events during the recording: (time, pid, api, kind, bytes, used_after)
EVENTS = [
    (T0 + 1.0, 4101, "cuMemAlloc_v2", "alloc", 512 * MiB, 6 * GiB + 512 * MiB),
    (T0 + 1.2, 4101, "cuMemFree_v2", "free", 512 * MiB, 6 * GiB),
    (T0 + 2.0, 4101, "cuMemAlloc_v2", "alloc", 4 * GiB, 10 * GiB),
    (T0 + 4.0, 4102, "cuMemAlloc_v2", "refuse", 2 * GiB, 3 * GiB),
    (T0 + 6.0, 4102, "cuMemAlloc_v2", "alloc", 512 * MiB, 3 * GiB + 512 * MiB),
]
FIRST_SEQ = 1041


def at(steps, t):
    cur = None
    for s in steps:
        if s[0] <= t:
            cur = s
    return cur


def device_doc(pid, p, t):
    step = at(p["steps"], t)
    used, reserved = (step[1], step[2]) if step else (0, 0)
    peak = max(s[1] for s in p["steps"] if s[0] <= t) if step else 0
    ooms = sum(1 for o in p["ooms"] if o[0] <= t)
    allocs = sum(1 for e in EVENTS if e[1] == pid and e[3] == "alloc" and e[0] <= t)
    frees = sum(1 for e in EVENTS if e[1] == pid and e[3] == "free" and e[0] <= t)
    cached = reserved - used if p["pool"] == "cache" else 0
    live = used // (256 * MiB)
    context = 500 * MiB
    return {
        "ordinal": 0, "uuid": GPU["uuid"], "name": GPU["name"], "memory_total_bytes": GPU["memory_total_bytes"],
        "used_bytes": used, "peak_bytes": peak, "limit_bytes": p["limit"], "reserved_bytes": reserved,
        "allocations": live, "alloc_count": 120 + live + allocs, "free_count": 120 + frees, "ooms": ooms,
        "driver_errors": 0, "host_bytes": 0, "cached_bytes": cached, "in_use_bytes": used - cached,
        "pool_hits": 340 if p["pool"] == "cache" else 0, "pool_waits": 0, "context_bytes": 0,
        "pool_free_bytes": cached, "pool_largest_free_bytes": cached,
        "driver_used_bytes": reserved + context, "outside_cap_bytes": reserved + context - used, "gpu_index": 0,
    }


def state_doc(t, seq):
    procs = []
    gpu_used = gpu_reserved = 0
    for pid, p in PROCS.items():
        dev = device_doc(pid, p, t)
        gpu_used += dev["used_bytes"]
        gpu_reserved += dev["reserved_bytes"]
        procs.append({
            "pid": pid, "user": p["user"], "uid": p["uid"], "process_name": p["name"], "cmdline": p["cmdline"],
            "job": p["job"], "pool": p["pool"], "cap_scope": "allocations", "state": "running",
            "start_time": p["start_time"], "created_ns": p["created"] * 10**9, "exited_ns": None,
            "events_written": 260 + seq, "events_dropped": 0, "events_received": 260 + seq, "events_lost": 0,
            "events_readable": True, "consumer_heartbeat_ns": int(t * 1e9),
            "ring": f"{RUN}/ring-{pid}-{p['start_time']}.cwr", "devices": [dev]})
    driver_used = sum(d["driver_used_bytes"] for p in procs for d in p["devices"]) + 1 * GiB
    b = PROCS[4102]
    bdev = device_doc(4102, b, t)
    job = {
        "name": JOB["name"], "user": JOB["user"], "uid": JOB["uid"], "file": f"{RUN}/job-{JOB['uid']}-{JOB['name']}.cwj",
        "limit_bytes": JOB["limit"], "caps_requested": [{"bytes": JOB["limit"], "members": 1}], "caps_disagree": False,
        "refusals": 0,
        "gpus": [{"job_gpu": 0, "uuid": GPU["uuid"], "gpu_index": 0, "memory_total_bytes": GPU["memory_total_bytes"],
                  "used_bytes": bdev["used_bytes"], "limit_bytes": JOB["limit"]}],
        "members": [{"pid": 4102, "slot": 0, "process_name": b["name"], "limit_bytes": JOB["limit"],
                     "requested_bytes": JOB["limit"], "used_bytes": bdev["used_bytes"],
                     "charged": [{"uuid": GPU["uuid"], "bytes": bdev["used_bytes"]}],
                     "joined_ns": b["created"] * 10**9, "refusals": 0}]}
    return {
        "version": "0.1.0", "hostname": "gpu-node-7", "time_ns": int(t * 1e9), "run_dir": RUN, "nvml": True,
        "events_seq": FIRST_SEQ - 1 + sum(1 for e in EVENTS if e[0] <= t),
        "gpus": [{"index": 0, "uuid": GPU["uuid"], "name": GPU["name"], "memory_total_bytes": GPU["memory_total_bytes"],
                  "used_bytes": gpu_used, "reserved_bytes": gpu_reserved, "limit_bytes": None, "processes": 2,
                  "capped_processes": 2, "bus_id": GPU["bus_id"], "driver_used_bytes": driver_used}],
        "processes": procs, "jobs": [job], "problems": [], "policy": None, "limit_changes": [],
    }


def history(rng):
    """What the daemon keeps: a point per scan (each second) when a value changed; for `day`,
    one a minute with the minute's largest used and reserved bytes."""
    step = 1 if rng == "hour" else 60
    end = int(HISTORY_AT)
    times = list(range(HIST0 - HIST0 % step, end + 1, step))

    def series(fn, keys):
        out = {"t": [], **{k: [] for k in keys}}
        last = None
        for t in times:
            vals = fn(t)
            if vals is None or vals == last:
                continue
            out["t"].append(t)
            for k in keys:
                out[k].append(vals[k])
            last = vals
        return out

    def proc_vals(pid, p, t):
        if t < p["steps"][0][0]:
            return None
        if step == 1:
            d = device_doc(pid, p, t)
        else:  # the minute's largest used and reserved, the peak and cap at its end
            ds = [device_doc(pid, p, s) for s in range(t, min(t + 60, end + 1))]
            d = dict(ds[-1], used_bytes=max(x["used_bytes"] for x in ds), reserved_bytes=max(x["reserved_bytes"] for x in ds))
        return {k: d[k] for k in ("used_bytes", "reserved_bytes", "peak_bytes", "limit_bytes")}

    procs = []
    for pid, p in PROCS.items():
        dev = {"ordinal": 0, "uuid": GPU["uuid"], "gpu_index": 0,
               **series(lambda t: proc_vals(pid, p, t), ["used_bytes", "reserved_bytes", "peak_bytes", "limit_bytes"])}
        procs.append({"pid": pid, "start_time": p["start_time"], "process_name": p["name"], "user": p["user"],
                      "job": p["job"], "state": "running", "devices": [dev],
                      "ooms": [{"time_ns": int(t * 1e9), "ordinal": 0, "bytes": b, "kind": "refuse"}
                               for t, b in p["ooms"] if t <= HISTORY_AT]})

    def total(t):
        vs = [proc_vals(pid, p, t) for pid, p in PROCS.items()]
        used = sum(v["used_bytes"] for v in vs if v)
        return {"used_bytes": used, "driver_used_bytes": used + 2 * GiB}

    b = PROCS[4102]
    job_gpu = series(lambda t: None if t < b["steps"][0][0] else
                     {"used_bytes": proc_vals(4102, b, t)["used_bytes"], "limit_bytes": JOB["limit"]},
                     ["used_bytes", "limit_bytes"])
    return {
        "range": rng, "interval_s": step, "time_ns": int(HISTORY_AT * 1e9), "processes": procs,
        "jobs": [{"name": JOB["name"], "user": JOB["user"], "gpus": [{"uuid": GPU["uuid"], "gpu_index": 0, **job_gpu}]}],
        "gpus": [{"index": 0, "uuid": GPU["uuid"], "name": GPU["name"], "memory_total_bytes": GPU["memory_total_bytes"],
                  **series(total, ["used_bytes", "driver_used_bytes"])}],
    }


def snapshot_4101(t):
    p = PROCS[4101]
    dev = device_doc(4101, p, t)
    dev.pop("gpu_index")
    dev.pop("driver_used_bytes")
    dev.pop("outside_cap_bytes")

    def py(fn, file, line, cls="user"):
        return {"python": True, "function": fn, "file": file, "line": line, "module": "", "offset": 0, "pc": 0,
                "class": cls, "text": f"{fn} ({file}:{line})"}

    def native(fn, module, offset, cls):
        return {"python": False, "function": fn, "file": "", "line": 0, "module": module, "offset": offset,
                "pc": 0x7f3a10000000 + offset, "class": cls, "text": f"{fn} ({module.rsplit('/', 1)[-1]}+{offset:#x})"}

    def site(i, live, count, frames, head, folded=""):
        # As the daemon labels them (cuw/frames.hpp): the heads differ, so no frame is added to
        # tell them apart; frames are native first, then Python, which is also their calling
        # order here (no interpreter frame).
        return {"id": i, "live_bytes": live, "live_allocations": count, "label": frames[head]["text"],
                "label_head": frames[head]["text"], "label_folded": folded, "label_via": [], "head_frame": head,
                "calling_order": list(range(len(frames))), "frames": frames}

    torch = "/usr/lib/python3/dist-packages/torch"
    sites = [
        {"id": 0, "live_bytes": 0, "live_allocations": 0, "label": "(no call site)", "label_head": "(no call site)",
         "label_folded": "", "label_via": [], "head_frame": -1, "calling_order": [], "frames": []},
        site(1, 4 * GiB, 16, [native("c10::cuda::CUDACachingAllocator::malloc", torch + "/lib/libc10_cuda.so", 0x3a2f0,
                                     "framework"),
                              py("forward", "/home/alice/model.py", 88), py("train_step", "/home/alice/train.py", 42)],
             1, "1 frame in libc10_cuda.so"),
        site(2, 4 * GiB, 8, [py("step", torch + "/optim/adam.py", 213, "framework"),
                             py("train_step", "/home/alice/train.py", 47)], 1, "1 frame in torch"),
        site(3, 2 * GiB, 16, [py("<module>", "/home/alice/train.py", 12)], 0),
    ]
    return {"pid": 4101, "process_name": p["name"], "comm": p["name"], "cmdline": p["cmdline"], "user": p["user"],
            "job": "", "pool": p["pool"], "time_ns": int(t * 1e9), "exited": False, "exact": True, "events_dropped": 0,
            "callsite_frames": 16, "devices": [dict(dev, live_bytes=10 * GiB, live_allocations=40)],
            "host": {"bytes": 0, "allocations": 0}, "allocations": [], "segments": [], "sites": sites,
            "segments_note": "The process runs PyTorch's caching allocator: a call site here is where a segment it "
                             "sub-allocates was made, not where the tensors now in it were "
                             "(torch.cuda.memory._snapshot() shows its tensors).", "trace": []}


def metrics(t):
    st = state_doc(t, 0)
    lines = []
    for name, help_ in (("cuwarden_process_memory_used_bytes", "Bytes counted against the cap right now"),
                        ("cuwarden_process_memory_limit_bytes", "The process's cap on the device")):
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
        key = "used_bytes" if "used" in name else "limit_bytes"
        for p in st["processes"]:
            d = p["devices"][0]
            lines.append(f'{name}{{gpu="0",uuid="{GPU["uuid"]}",pid="{p["pid"]}",process="{p["process_name"]}",'
                         f'cuwarden_job="{p["job"]}",user="{p["user"]}",hostname="gpu-node-7"}} {d[key]}')
    lines += ["# HELP cuwarden_device_memory_total_bytes Physical memory of the device",
              "# TYPE cuwarden_device_memory_total_bytes gauge",
              f'cuwarden_device_memory_total_bytes{{gpu="0",uuid="{GPU["uuid"]}",hostname="gpu-node-7"}} {GPU["memory_total_bytes"]}']
    return "\n".join(lines) + "\n"


def main():
    out = pathlib.Path(sys.argv[1])
    (out / "states").mkdir(parents=True, exist_ok=True)
    for f in (out / "states").glob("*.json"):
        f.unlink()
    dump = lambda obj: json.dumps(obj, separators=(",", ":")) + "\n"
    tsv, sse = [], []
    # The stream's state messages come 10 ms after each scan; the recorder's polls 50 ms after.
    stream = [(T0 + k + 0.01, "state", None) for k in range(9)]
    stream += [(e[0] + 0.002, "memory", (FIRST_SEQ + i, e)) for i, e in enumerate(EVENTS)]
    stream.append((T0 + 7.5, "comment", None))
    for t, kind, ev in sorted(stream, key=lambda x: x[0]):
        if kind == "state":
            sse += [f"{t:.6f}\tevent: state", f"{t:.6f}\tdata: {dump(state_doc(t - 0.01, int(t - T0))).strip()}", f"{t:.6f}\t"]
        elif kind == "comment":
            sse += [f"{t:.6f}\t: keep-alive", f"{t:.6f}\t"]
        else:
            seq, (et, pid, api, k, nbytes, used_after) = ev
            data = {"seq": seq, "pid": pid, "time_ns": int(et * 1e9), "api": api, "kind": k, "device": 0,
                    "bytes": nbytes, "address": 0 if k == "refuse" else 0x7f2a00000000 + seq * 0x20000000,
                    "used_after": used_after, "tid": pid, "result": 2 if k == "refuse" else 0, "aux": 0}
            sse += [f"{t:.6f}\tid: {seq}", f"{t:.6f}\tevent: memory", f"{t:.6f}\tdata: {dump(data).strip()}", f"{t:.6f}\t"]
    for k in range(9):
        t = T0 + k + 0.05
        name = f"states/{k:06d}.json"
        (out / name).write_text(dump(state_doc(t - 0.05, k)))
        tsv.append(f"{t:.6f}\t{name}\t200")
    (out / "states.tsv").write_text("\n".join(tsv) + "\n")
    (out / "events.txt").write_text("\n".join(sse) + "\n")
    (out / "history-hour.json").write_text(dump(history("hour")))
    (out / "history-day.json").write_text(dump(history("day")))
    (out / "metrics.txt").write_text(metrics(HISTORY_AT))
    (out / "snapshot-4101.json").write_text(dump(snapshot_4101(T0 + 5)))
    (out / "snapshot-4101.status").write_text("200\n")
    meta = {"format": "cuwarden-api-recording", "version": 1, "address": "127.0.0.1:9477",
            "started": float(T0), "ended": END, "history_time": HISTORY_AT,
            "note": "hand-made by tests/browser/make_sample_recording.py: one H200, two processes, "
                    "one capped (4101), one refused (4102)"}
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


if __name__ == "__main__":
    main()
