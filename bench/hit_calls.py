#!/usr/bin/env python3
"""The calls a run of cuw_callgrind_pairs made from libcuwarden's code, and whether any of them
between libcuwarden's own functions was indirect (a virtual call, a function pointer, a
std::function or call_ref): with a warm pool, the pairs are hits and frees, which make none
(backends/start.hpp: with_backend calls the pool's class). An indirect call into another
object (the driver's entry points, which are resolved at run time) is allowed and listed.

    hit_calls.py CALLGRIND_OUT LIBCUWARDEN
    hit_calls.py --self-test      a virtual call and a function pointer inside a library fail

CALLGRIND_OUT must have been written with --dump-instr=yes --compress-strings=no
--compress-pos=no (bench/callgrind_guard.sh does), so that each call names the address of
its call instruction; the instruction is read from `objdump -d` of LIBCUWARDEN.
Exit: 0 no indirect call inside libcuwarden; 1 one or more (each printed); 2 unusable input.
"""
import argparse
import functools
import os
import re
import subprocess
import sys
import tempfile


@functools.lru_cache(maxsize=None)
def real(path):
    """`path` with its links resolved, as valgrind names an object."""
    return os.path.realpath(path) if path.startswith('/') else path


def call_sites(path, lib):
    """(site address, callee object, callee function, calls) for each call made from `lib`."""
    lib = real(lib)
    sites = []
    ob = fn = cob = cfn = None
    pending = None  # a calls= line waits for its call site's position
    with open(path) as f:
        for line in f:
            if pending is not None:
                if line.startswith('0x') and real(ob) == lib:
                    sites.append((int(line.split()[0], 16), pending[0], pending[1], pending[2]))
                pending = None
                cob = cfn = None
                continue
            if line.startswith('ob='):
                ob = line[3:].strip()
            elif line.startswith('fn='):
                fn = line[3:].strip()
            elif line.startswith('cob='):
                cob = line[4:].strip()
            elif line.startswith('cfn='):
                cfn = line[4:].strip()
            elif line.startswith('calls='):
                pending = (real(cob or ob), cfn, int(line[6:].split()[0]))
            elif line.startswith('positions:') and 'instr' not in line:
                sys.exit(f'hit_calls: {path} has no instruction addresses (--dump-instr=yes)')
    return sites


def disassembly(lib):
    """address -> (function, instruction) of every instruction in `lib`."""
    out = subprocess.run(['objdump', '-d', '--no-show-raw-insn', '-C', lib], capture_output=True, text=True,
                         check=True).stdout
    table, fn = {}, '?'
    for line in out.splitlines():
        m = re.match(r'^[0-9a-f]+ <(.*)>:$', line)
        if m:
            fn = m.group(1)
            continue
        m = re.match(r'^\s+([0-9a-f]+):\s+(.*)$', line)
        if m:
            table[int(m.group(1), 16)] = (fn, m.group(2).strip())
    return table


def check(callgrind_out, lib):
    """Prints every call from `lib`; returns 1 if one between its own functions is indirect."""
    sites = call_sites(callgrind_out, lib)
    if not sites:
        sys.exit(f'hit_calls: no call from {lib} in {callgrind_out}')
    code = disassembly(lib)
    bad = 0
    for addr, cob, cfn, n in sorted(sites):
        fn, ins = code.get(addr, ('?', '?'))
        indirect = bool(re.match(r'(call|jmp)\w*\s+\*', ins))
        inside = cob == real(lib)
        verdict = 'INDIRECT, inside libcuwarden' if indirect and inside else 'indirect, into ' + cob.rsplit('/', 1)[-1] \
            if indirect else 'direct'
        bad += indirect and inside
        print(f'{n:8d} calls {addr:#8x} {ins:<28.28} {verdict:<36} {fn[:60]} -> {cfn[:60]}')
    if bad:
        print(f'hit_calls: FAILED: {bad} indirect call site(s) between libcuwarden\'s own functions')
        return 1
    print('hit_calls: OK: every call between libcuwarden\'s own functions is direct')
    return 0


SELF_TEST_SRC = r"""
struct Base { virtual int f(int) = 0; };
__attribute__((noinline)) static int target(int x) { return x + 1; }
extern "C" int via_direct(int x) { return target(x) * 2; }
extern "C" int via_vtable(Base* b, int x) { return b->f(x) * 3; }
extern "C" int via_pointer(int (*fp)(int), int x) { return fp(x) * 5; }
"""


def self_test():
    """A small library with a direct call, a virtual call and a call through a pointer, and
    callgrind files naming those call sites: the direct call, and a pointer's call into
    another object, pass; the virtual call, or the pointer's call landing in the library,
    fail."""
    with tempfile.TemporaryDirectory() as d:
        src, lib = os.path.join(d, 'calls.cpp'), os.path.join(d, 'libcalls.so')
        open(src, 'w').write(SELF_TEST_SRC)
        subprocess.run([os.environ.get('CXX', 'c++'), '-O2', '-fPIC', '-shared', '-o', lib, src], check=True)
        site = {}
        for addr, (fn, ins) in disassembly(lib).items():
            if fn in ('via_direct', 'via_vtable', 'via_pointer') and re.match(r'(call|jmp)\w*\s', ins):
                site.setdefault(fn, addr)
        if set(site) != {'via_direct', 'via_vtable', 'via_pointer'}:
            print('self-test: call sites not found:', site)
            return 1

        def run(calls):
            out = os.path.join(d, 'callgrind.out')
            with open(out, 'w') as f:
                f.write(f'positions: instr line\nevents: Ir\nob={lib}\n')
                for fn, cob, cfn in calls:
                    f.write(f'fn={fn}\ncob={cob}\ncfn={cfn}\ncalls=7 0x0\n{site[fn]:#x} 0 70\n')
            return check(out, lib)

        other = '/usr/lib/libelsewhere.so'
        cases = [([('via_direct', lib, 'target'), ('via_pointer', other, 'driver_entry')], 0),
                 ([('via_direct', lib, 'target'), ('via_vtable', lib, 'Derived::f')], 1),
                 ([('via_pointer', lib, 'target')], 1)]
        for calls, want in cases:
            if run(calls) != want:
                print(f'self-test: {calls} should give {want}')
                return 1
    print('self-test: OK')
    return 0


def main():
    if sys.argv[1:] == ['--self-test']:
        return self_test()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('callgrind_out')
    ap.add_argument('lib')
    a = ap.parse_args()
    return check(a.callgrind_out, a.lib)


if __name__ == '__main__':
    sys.exit(main())
