"""compat.sh helper: while a row runs, polls `cuwarden --json` and keeps, per (pid, ordinal),
the highest used / peak / driver (NVML) figures seen, in OUTFILE (rewritten atomically).
The driver's own figure disappears when a process exits, so it can only be caught live.

  poll.py CUWARDEN_CLI OUTFILE [INTERVAL_S]      (runs until SIGTERM / SIGINT)
"""
import json
import os
import signal
import subprocess
import sys
import time

stop = False


def on_signal(signum, frame):  # noqa: ARG001
    global stop
    stop = True


def num(v):
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def hi(a, b):
    return b if a is None else (a if b is None else max(a, b))


def main():
    cli, out = sys.argv[1], sys.argv[2]
    interval = float(sys.argv[3]) if len(sys.argv) > 3 else 0.5
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    agg, polls, failures = {}, 0, 0
    while True:
        try:
            text = subprocess.run([cli, "--json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  universal_newlines=True, timeout=10, env=env).stdout
            state = json.loads(text)
            polls += 1
        except Exception:  # noqa: BLE001
            state = None
            failures += 1
        for p in (state or {}).get("processes", []) or []:
            for d in p.get("devices", []) or []:
                key = "%s:%s" % (p.get("pid"), d.get("ordinal"))
                a = agg.setdefault(key, {"pid": p.get("pid"), "ordinal": d.get("ordinal")})
                a["process_name"] = p.get("process_name")
                a["cmdline"] = (p.get("cmdline") or "")[:300]
                a["state"] = p.get("state")
                a["limit_bytes"] = num(d.get("limit_bytes"))
                a["used_bytes_max"] = hi(a.get("used_bytes_max"), num(d.get("used_bytes")))
                a["peak_bytes"] = hi(a.get("peak_bytes"), num(d.get("peak_bytes")))
                a["ooms"] = hi(a.get("ooms"), num(d.get("ooms")))
                a["alloc_count"] = hi(a.get("alloc_count"), num(d.get("alloc_count")))
                a["driver_used_bytes_max"] = hi(a.get("driver_used_bytes_max"), num(d.get("driver_used_bytes")))
        tmp = out + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"polls": polls, "failures": failures, "devices": agg}, f)
        os.replace(tmp, out)
        if stop:
            return 0
        deadline = time.monotonic() + interval
        while not stop and time.monotonic() < deadline:
            time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
