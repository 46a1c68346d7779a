#!/usr/bin/env python3
"""cuwarden tests: every ctest test starts with tests/deadline.sh (tests/deadline.cmake), and
the launcher knows the test's own timeout, so that its deadline falls 15 s before ctest's.

    check_launcher.py CTEST BUILD_DIR LAUNCHER DEFAULT_TIMEOUT
"""
import json
import subprocess
import sys


def main() -> int:
    ctest, build, launcher, default = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    out = subprocess.run([ctest, "--test-dir", build, "--show-only=json-v1"], check=True,
                         capture_output=True, text=True).stdout
    tests = json.loads(out)["tests"]
    bad = []
    for t in tests:
        cmd = t.get("command") or []
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        if not cmd or cmd[0] != launcher:
            bad.append(f"{t['name']}: starts with {cmd[:1]}, not the launcher")
            continue
        timeout = float(props.get("TIMEOUT", default))
        told = None
        if len(cmd) > 1 and cmd[1].startswith("--timeout="):
            told = float(cmd[1].split("=", 1)[1])
        else:
            for kv in props.get("ENVIRONMENT", []):
                if kv.startswith("CUW_TEST_TIMEOUT="):
                    told = float(kv.split("=", 1)[1])
        if told != timeout:
            bad.append(f"{t['name']}: the launcher is told a timeout of {told}, ctest's is {timeout}")
    for b in bad:
        print("FAILED:", b)
    print(f"{len(tests)} tests, {len(tests) - len(bad)} run through {launcher} with their own timeout")
    return 1 if bad or len(tests) < 2 else 0


if __name__ == "__main__":
    sys.exit(main())
