#!/usr/bin/env python3
"""Python frames read without the GIL (interposer/src/core/callsites/pyframes.cpp), through the test
build libcuwarden_pyframes_test.so (tests/interposer/pyframes_api.cpp), preloaded as the
interposer is in a real run.

    test_pyframes.py LIB      (ctest interposer.pyframes)

Every capture is compared with the stack Python itself reports at the same place
(sys._getframe(): file, co_qualname or co_name, f_lineno), and a few lines also with marker
comments found in this file's source. Calls go through ctypes.CDLL, which releases the GIL
around them (PyTorch's case: an allocation hook runs without it), and through ctypes.PyDLL,
which keeps it. Prints one line per check and a closing 'N passed, 0 failed'; exits 1 on the
first failure.
"""
import asyncio
import atexit
import ctypes
import dis
import gc
import json
import os
import sys
import threading

LIB = sys.argv[1]
cdll = ctypes.CDLL(LIB)   # releases the GIL during each call
pydll = ctypes.PyDLL(LIB)  # keeps it
for _lib in (cdll, pydll):
    _lib.cuw_test_pyframes_max.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
    _lib.cuw_test_pyframes_raw.argtypes = [ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                                           ctypes.c_int]
    _lib.cuw_test_pyframes_code.argtypes = [ctypes.c_uint32, ctypes.c_char_p, ctypes.c_int]
    _lib.cuw_test_pyframes_count.restype = ctypes.c_uint32
    _lib.cuw_test_pyframes_bench.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    _lib.cuw_test_pyframes_bench.restype = ctypes.c_double
    _lib.cuw_test_pyframes_bench_cold.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    _lib.cuw_test_pyframes_bench_cold.restype = ctypes.c_double
    _lib.cuw_test_pyframes_line.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int)
cdll.cuw_test_pyframes_call.argtypes = [CALLBACK]

BUFSIZE = 1 << 16
MAX_TEXT = 255  # bytes of a copied name (pyframes.hpp)
PASSED = [0]


class Failure(Exception):
    pass


def fail(what, detail=""):
    raise Failure(f"{what}: {detail}")


def _utf8(s):
    """What the reader writes for one string: UTF-8, a lone surrogate as '?'."""
    return "".join("?" if 0xD800 <= ord(c) <= 0xDFFF else c for c in s)


def keep_head(s):
    s = _utf8(s)
    out, n = [], 0
    for c in s:
        k = len(c.encode())
        if n + k > MAX_TEXT:
            break
        out.append(c)
        n += k
    return "".join(out)


def keep_tail(s):
    s = _utf8(s)
    out, n = [], 0
    for c in reversed(s):
        k = len(c.encode())
        if n + k > MAX_TEXT:
            break
        out.append(c)
        n += k
    out.reverse()
    if len(out) == len(s):
        return s
    while n + 3 > MAX_TEXT:
        n -= len(out.pop(0).encode())
    return "..." + "".join(out)


def name_of(code):
    return getattr(code, "co_qualname", code.co_name)


def expected(frame, limit=256):
    """Python's own view of the stack from `frame` outwards, as the reader reports it."""
    out = []
    while frame is not None and len(out) < limit:
        code = frame.f_code
        out.append((keep_tail(code.co_filename), keep_head(name_of(code)), frame.f_lineno or 0))
        frame = frame.f_back
    return out


def parse(buf, n, what):
    if n < 0:
        fail(what, f"the library answered {n}")
    lines = buf.value.decode("utf-8").split("\n")[:-1]
    if len(lines) != n:
        fail(what, f"{n} frames but {len(lines)} lines")
    out = []
    for line in lines:
        file, function, number = line.rsplit(":", 2)
        out.append((file, function, int(number)))
    return out


def capture(lib=None, max_frames=256):
    """(captured, expected): the reader's frames and Python's, taken on one line (so that this
    frame's f_lineno, read while expected() runs, is the line the capture was made from)."""
    lib = lib or cdll
    buf = ctypes.create_string_buffer(BUFSIZE)
    n = lib.cuw_test_pyframes_max(buf, BUFSIZE, max_frames); want = expected(sys._getframe(), max_frames)  # noqa: E702
    return parse(buf, n, "capture"), want


def check(what, got_want):
    got, want = got_want
    if got != want:
        lines = [f"  got  {g}\n  want {w}" for g, w in zip(got + [None] * len(want), want + [None] * len(got))
                 if g != w]
        fail(what, f"{len(got)} frames captured, {len(want)} expected; differences:\n" + "\n".join(lines[:8]))
    PASSED[0] += 1
    print(f"ok {what} ({len(got)} frames)")
    return got


def ok(what, cond, detail=""):
    if not cond:
        fail(what, detail)
    PASSED[0] += 1
    print(f"ok {what}")


def marker_line(tag):
    """The line of this file holding '# MARK:tag' (found in the source, not asked of Python)."""
    with open(__file__, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.rstrip().endswith(f"# MARK:{tag}"):
                return number
    raise SystemExit(f"no marker {tag}")


# ---- the shapes of stacks a program has --------------------------------------------------

def level3(lib):
    return capture(lib)  # MARK:level3


def level2(lib):
    return level3(lib)  # MARK:level2


def level1(lib):
    return level2(lib)


class Outer:
    class Inner:
        def method(self, lib):
            return capture(lib)

    @staticmethod
    def static(lib):
        return capture(lib)

    @property
    def prop(self):
        return capture()


def gen(lib):
    yield capture(lib)


async def coro(lib):
    return capture(lib)


async def coro_outer(lib):
    await asyncio.sleep(0)
    return await coro(lib)


def recurse(depth, lib, max_frames):
    if depth == 0:
        return capture(lib, max_frames)
    return recurse(depth - 1, lib, max_frames)


def run_in_thread(fn, *args):
    box = {}

    def body():
        try:
            box["result"] = fn(*args)
        except BaseException as e:  # reported by the main thread
            box["error"] = e

    t = threading.Thread(target=body, name="pyframes-worker")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


def test_shapes():
    for lib, how in ((cdll, "GIL released"), (pydll, "GIL held")):
        got = check(f"nested functions, {how}", level1(lib))
        ok(f"lines from the source, {how}",
           got[1][1:] == ("level3", marker_line("level3")) and got[2][1:] == ("level2", marker_line("level2")),
           f"{got[1:3]}")
        ok(f"innermost frame is the capturing function, {how}",
           got[0][0] == __file__ and got[0][1] == "capture", f"{got[0]}")
        check(f"second thread, {how}", run_in_thread(level1, lib))
        check(f"nested class method, {how}", Outer.Inner().method(lib))
        check(f"static method, {how}", Outer.static(lib))
        check(f"lambda, {how}", (lambda: capture(lib))())
        check(f"generator, {how}", next(gen(lib)))
        check(f"generator expression, {how}", next(capture(lib) for _ in range(1)))
        check(f"comprehension, {how}", [capture(lib) for _ in range(1)][0])
        try:
            coro(lib).send(None)
            fail("coroutine", "did not finish")
        except StopIteration as stop:
            check(f"coroutine, {how}", stop.value)
        check(f"coroutine under asyncio, {how}", asyncio.run(coro_outer(lib)))
    check("property", Outer().prop)


def test_callback():
    """Python -> C -> Python: the frames across the C call (3.11 entry frames, 3.12 shims)."""
    box = {}

    def callback():
        box["result"] = capture()
        return 7

    cb = CALLBACK(callback)
    ok("callback ran", cdll.cuw_test_pyframes_call(cb) == 7)
    check("callback through C", box["result"])


def test_bounds():
    got, want = recurse(200, cdll, 16)
    ok("max frames: a deep stack stops at max", len(got) == 16, f"{len(got)}")
    check("max frames: the innermost 16", (got, want))
    got, want = recurse(3, cdll, 1)
    check("max frames: 1", (got, want))
    got, want = recurse(300, cdll, 256)
    check("max frames: 256 of a deeper stack", (got, want))
    ok("a thread without Python state captures nothing", cdll.cuw_test_pyframes_foreign_thread() == 0)


def test_names():
    src = ("def größe(capture):\n    return capture()\n"
           "def 函数(capture):\n    return größe(capture)\n"
           "def 𐌰𐌱(capture):\n    return 函数(capture)\n")
    g = {}
    exec(compile(src, "/tmp/ünï/файл_😀.py", "exec"), g)
    got = check("latin-1, UCS-2 and UCS-4 names and file", g["𐌰𐌱"](capture))
    ok("non-ASCII names as UTF-8", [f for _, f, _ in got[1:4]] == ["größe", "函数", "𐌰𐌱"], f"{got[1:4]}")
    g = {}
    exec(compile("def f(capture):\n    return capture()\n", "/tmp/bad_\udcff_name.py", "exec"), g)
    got = check("a lone surrogate becomes '?'", g["f"](capture))
    ok("surrogate file name", got[1][0] == "/tmp/bad_?_name.py", got[1][0])
    long_name = "f" * 400
    long_file = "/" + "d" * 300 + "/ü" * 20 + "/long.py"
    g = {}
    exec(compile(f"def {long_name}(capture):\n    return capture()\n", long_file, "exec"), g)
    got = check("long names are cut", g[long_name](capture))
    ok("a long function keeps its start", got[1][1] == "f" * MAX_TEXT, f"{len(got[1][1])}")
    ok("a long file keeps its end", got[1][0].startswith("...") and got[1][0].endswith("/ü/long.py")
       and len(got[1][0].encode()) <= MAX_TEXT, got[1][0])


def test_reused_addresses():
    """Code objects freed and made again, often at the same addresses (pymalloc): each
    capture must name the function that is running, not the one that was there before."""
    seen = {}
    reused = 0
    for i in range(400):
        g = {}
        exec(f"def fn_{i}(capture):\n    return capture()\n", g)
        fn = g[f"fn_{i}"]
        address = id(fn.__code__)
        reused += address in seen
        seen[address] = i
        got, want = fn(capture)
        if got != want:
            fail("reused code addresses", f"iteration {i}: got {got[1]}, want {want[1]}")
        del fn, g
        gc.collect(0)  # the function and its globals hold each other (a young cycle): free them now
    ok(f"reused code addresses ({reused} of 400 codes at an address seen before)", reused > 0,
       "no address was reused: the check did not happen")


def test_ids():
    codes = (ctypes.c_uint32 * 64)()
    lines = (ctypes.c_uint32 * 64)()
    results = []
    for _ in range(2):
        n = cdll.cuw_test_pyframes_raw(codes, lines, 64)
        results.append((list(codes[:n]), list(lines[:n])))
    a, b = results
    ok("same place, same ids", a[0] == b[0] and a[1][1:] == b[1][1:], f"{a} {b}")
    buf = ctypes.create_string_buffer(1024)
    ok("code(id)", cdll.cuw_test_pyframes_code(a[0][0], buf, 1024) == 0)
    here = sys._getframe().f_code
    file, function, first = buf.value.decode().rsplit(":", 2)
    ok("code(id) is the function capturing", (file, function, int(first))
       == (__file__, name_of(here), here.co_firstlineno), buf.value.decode())
    ok("code(0) and code(count()) are unknown", cdll.cuw_test_pyframes_code(0, buf, 1024) == -1
       and cdll.cuw_test_pyframes_code(cdll.cuw_test_pyframes_count(), buf, 1024) == -1)


def test_threads():
    """Many threads capture at once, some through codes nobody has seen yet."""
    errors = []
    start = threading.Barrier(8)

    def worker(t):
        try:
            start.wait()
            for i in range(60):
                if i % 3 == 0:
                    g = {}
                    exec(f"def t{t}_{i}(capture):\n    return capture()\n", g)
                    got, want = g[f"t{t}_{i}"](capture)
                else:
                    got, want = level1(cdll)
                if got != want:
                    errors.append((t, i, got[:2], want[:2]))
        except BaseException as e:
            errors.append((t, repr(e)))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok("8 threads capturing at once", not errors, f"{errors[:3]}")
    count = cdll.cuw_test_pyframes_count()
    ok("count() grows with new codes", count > 160, f"{count}")


def test_decoder():
    """The line-table decoder against code.co_lines() for every instruction of many codes."""
    import inspect
    import tarfile
    fmt = 310 if sys.version_info < (3, 11) else 311
    codes = []

    def collect(code):
        codes.append(code)
        for c in code.co_consts:
            if hasattr(c, "co_code"):
                collect(c)

    for mod in (json.decoder, json.encoder, asyncio.base_events, inspect, tarfile, dis, sys.modules[__name__]):
        with open(mod.__file__, encoding="utf-8") as f:
            collect(compile(f.read(), mod.__file__, "exec"))
    checked = 0
    for code in codes:
        table = code.co_linetable
        for start, end, line in code.co_lines():
            for addr in range(start, end, 2):
                got = cdll.cuw_test_pyframes_line(table, len(table), code.co_firstlineno, addr, fmt)
                if got != (-1 if line is None else line):
                    fail("line table", f"{code.co_name} in {code.co_filename}: offset {addr}: {got}, want {line}")
                checked += 1
    ok(f"line tables of {len(codes)} codes, {checked} instructions", checked > 10000)
    ok("a negative offset is the first line",
       cdll.cuw_test_pyframes_line(codes[0].co_linetable, len(codes[0].co_linetable), 42, -2, fmt) == 42)
    ok("an offset past the table has no line",
       cdll.cuw_test_pyframes_line(b"", 0, 42, 0, fmt) == -1
       and cdll.cuw_test_pyframes_line(b"\xff" * 3, 3, 42, 10 ** 6, fmt) == -1)


def bench_at(lib):
    if len(expected(sys._getframe())) < 16:  # one more frame of this function until 16 in all
        return bench_at(lib)
    frames = ctypes.c_int(0)
    first = lib.cuw_test_pyframes_bench(1, 1, 16, ctypes.byref(frames))
    warm = lib.cuw_test_pyframes_bench(5, 20000, 16, ctypes.byref(frames))
    cold = lib.cuw_test_pyframes_bench_cold(15, 16, ctypes.byref(frames))
    return frames.value, first, warm, cold


def test_cost():
    frames, first, warm, cold = bench_at(cdll)
    ok("cost measured on 16 frames", frames == 16, f"{frames}")
    print(f"cost: capture of 16 Python frames: {warm:.0f} ns (best of 5 rounds of 20000, GIL released; "
          f"{first:.0f} ns for the first capture at that stack, which added its codes; "
          f"{cold:.0f} ns with cold caches, the median of 15 after writing 64 MiB)")
    ok("cost of 16 frames under 3 us", warm < 3000, f"{warm:.0f} ns")
    print(json.dumps({"pyframes_capture16_ns": round(warm), "pyframes_capture16_cold_ns": round(cold),
                      "python": sys.version.split()[0]}))


# ---- finalization ------------------------------------------------------------------------

def at_exit():
    """atexit runs before finalization: frames are read; they must be right or absent."""
    got, want = capture()
    if got and got != want:
        print(f"FAIL atexit: {got} != {want}", flush=True)
        os._exit(1)
    print(f"ok capture in an atexit handler ({len(got)} frames)", flush=True)


class CaptureWhenCollected:
    """Collected while the interpreter finalizes: the reader must answer 0 frames (or
    valid ones) and not crash."""

    def __del__(self):
        try:
            buf = ctypes.create_string_buffer(BUFSIZE)
            n = cdll.cuw_test_pyframes(buf, BUFSIZE)
            sys.stderr.write(f"capture during finalization: {n} frames\n")
        except Exception as e:  # modules may be half torn down: only a crash would fail
            sys.stderr.write(f"capture during finalization: not called ({e!r})\n")


def main():
    if not cdll.cuw_test_pyframes_available():
        print(f"FAIL: the reader does not support Python {sys.version.split()[0]}")
        return 1
    tests = [test_shapes, test_callback, test_bounds, test_names, test_reused_addresses, test_ids, test_threads,
             test_decoder, test_cost]
    try:
        for t in tests:
            t()
    except Failure as e:
        print(f"FAIL {e}")
        print(f"{PASSED[0]} passed, 1 failed")
        return 1
    atexit.register(at_exit)
    global _collected_at_exit
    _collected_at_exit = CaptureWhenCollected()
    print(f"{PASSED[0]} passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
