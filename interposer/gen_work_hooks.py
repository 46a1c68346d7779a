#!/usr/bin/env python3
"""Generate interposer/src/base/work_hooks.inc: a hook-table row for every libcuda entry point
that queues work on the GPU (kernel launches, copies, memsets, graph launches, stream memory
operations, host functions and stream callbacks (which may write memory the CPU can reach),
prefetches ...).

CUWARDEN_POOL=cache hands a freed block straight out again only while it can prove that no
work was queued since its last completed event, or that all work since went to the legacy
stream (stream order); these hooks are how it learns that work was queued, and on which
stream (CUW_WORK_STREAM_<name>: the expression of the hook's parameters naming it). A submitting entry point missing here would let a block be reused under a running
kernel, so the list is derived from the driver's own export list, not written by hand:

  gen_work_hooks.py CUDA_INCLUDE_DIR DRIVER_EXPORTS_TXT > interposer/src/base/work_hooks.inc

DRIVER_EXPORTS_TXT lists libcuda.so.1's exported functions, one per line
(tests/fakecuda/driver_exports.txt, from `nm -D` of the CUDA 13.0 driver). Every export
whose name matches SUBMITS is either given a row (prototype from cuda.h, version from
cudaTypedefs.h) or listed in SKIPPED with the reason; the script fails on anything else, so
a new toolkit's new submitting entry point cannot slip through unnoticed. At run time a
submitting name that is not hooked (an older ABI variant, or a newer entry point) turns the
fast reuse off for the process (see backends/pool/pool.hpp and base/work_epoch.hpp).
"""
import re
import sys

# Name prefixes of the entry points that queue GPU work. The table below gets a row for each
# export that starts with one; the library also gets the list itself (CUW_WORK_PREFIXES), to
# recognize such a name the driver hands out that has no row (base/work_epoch.cpp).
SUBMIT_PREFIXES = [
    "cuLaunch", "cuMemcpy", "cuMemset", "cuGraphLaunch", "cuStreamWaitValue", "cuStreamWriteValue",
    "cuStreamBatchMemOp", "cuMemPrefetch", "cuMemDiscard", "cuMemBatchDecompress", "cuSignalExternalSemaphores",
    "cuWaitExternalSemaphores", "cuMemMapArrayAsync", "cuStreamAddCallback",
]
SUBMITS = re.compile("^(" + "|".join(re.escape(p) for p in SUBMIT_PREFIXES) + ")")

# Exports that match SUBMITS but get no row, and why.
SKIPPED_REASONS = {
    "legacy 32-bit ABI (CUdeviceptr_v1 / v1 descriptors, CUDA < 3.2): unusable by 64-bit programs":
        lambda n, proto: proto is not None and re.search(r"\b(CUdeviceptr_v1|CUDA_MEMCPY2D_v1|CUDA_MEMCPY3D_v1|"
                                                          r"CUDA_ARRAY_DESCRIPTOR_v1|CUDA_ARRAY3D_DESCRIPTOR_v1)\b|"
                                                          r"unsigned int ByteCount|unsigned int N\b", proto),
}


def strip_comments(s):
    s = re.sub(r"/\*.*?\*/", " ", s, flags=re.S)
    return re.sub(r"//[^\n]*", " ", s)


def main():
    inc, exports_path = sys.argv[1], sys.argv[2]
    raw = open(f"{inc}/cuda.h").read()
    # The internal section at the end declares every ABI variant under its exported name.
    cut = raw.rfind("#if defined(__CUDA_API_VERSION_INTERNAL)\n")
    cuda_h, internal = strip_comments(raw[:cut]), strip_comments(raw[cut:])
    typedefs = strip_comments(open(f"{inc}/cudaTypedefs.h").read())
    exports = [l.strip() for l in open(exports_path) if l.strip()]

    # name -> real name: "#define cuMemcpyHtoD __CUDA_API_PTDS(cuMemcpyHtoD_v2)"
    macro = {}
    for m in re.finditer(r"#define\s+(cu\w+)\s+(?:__CUDA_API_PT(DS|SZ)\((cu\w+)\)|(cu\w+))\s*\n", cuda_h):
        macro[m.group(1)] = (m.group(3) or m.group(4), m.group(2))
    # Prototypes: "CUresult CUDAAPI name(params);" (the internal section names every variant).
    protos = {}
    proto_re = r"CUresult\s+CUDAAPI\s+(cu\w+)\s*\(([^;]*?)\)\s*;"
    for m in re.finditer(proto_re, cuda_h):
        name, params = m.group(1), " ".join(m.group(2).split())
        real, pt = macro.get(name, (name, None))
        protos.setdefault(real, params)
        if pt:
            protos.setdefault(real + ("_ptds" if pt == "DS" else "_ptsz"), params)
    for m in re.finditer(proto_re, internal):  # exact exported names, older ABIs included
        protos.setdefault(m.group(1), " ".join(m.group(2).split()))
    # Versions: PFN_<base>_v<version>[_ptds|_ptsz]
    versions = {}
    for m in re.finditer(r"PFN_(cu\w+?)_v(\d+)(_ptds|_ptsz)?\)", typedefs):
        versions.setdefault((m.group(1), m.group(3) or ""), set()).add(int(m.group(2)))

    rows, skipped, failed, streams = [], [], [], []
    for n in exports:
        if not SUBMITS.match(n):
            continue
        proto = protos.get(n)
        reason = next((r for r, f in SKIPPED_REASONS.items() if f(n, proto)), None)
        if reason:
            skipped.append((n, reason))
            continue
        if proto is None:
            failed.append(f"{n}: no prototype in cuda.h")
            continue
        flavor = "_ptds" if n.endswith("_ptds") else "_ptsz" if n.endswith("_ptsz") else ""
        stem = n[: -len(flavor)] if flavor else n
        k = 1
        vm = re.match(r"^(cu\w+?)_v(\d+)$", stem)
        base = stem
        if vm:
            base, k = vm.group(1), int(vm.group(2))
        plain = sorted(versions.get((base, ""), []))
        mine = sorted(versions.get((base, flavor), []))
        if not mine:
            failed.append(f"{n}: no PFN_{base}_v*{flavor} in cudaTypedefs.h")
            continue
        # Plain variants: the k-th ABI version. Per-thread ones exist for the newest plain
        # versions only: align from the end.
        idx = k - 1 - (len(plain) - len(mine)) if flavor else k - 1
        if idx < 0 or idx >= len(mine):
            failed.append(f"{n}: cannot place _v{k} among versions {mine}")
            continue
        args = []
        for p in split_params(proto):
            if p == "void":
                continue
            am = re.search(r"(\w+)\s*(\[\s*\])?$", p)
            if not am:
                failed.append(f"{n}: cannot parse parameter '{p}'")
                break
            args.append(am.group(1))
        params = "(" + proto + ")" if proto != "void" else "()"
        streams.append(f"#define CUW_WORK_STREAM_{n} {stream_of(n, proto)}")
        rows.append(f'  X(CUresult, {n}, {params}, ({", ".join(args)}), "{base}", {mine[idx]}, '
                    f'{1 if flavor else 0}, 0)')
    if failed:
        sys.stderr.write("gen_work_hooks.py: cannot classify:\n  " + "\n  ".join(failed) + "\n")
        sys.exit(1)
    out = [
        "// GENERATED by interposer/gen_work_hooks.py from cuda.h, cudaTypedefs.h and the CUDA 13.0",
        "// driver's export list: every entry point that queues GPU work. Do not edit; rerun it.",
        "// Rows have the hook table's shape (hook_table.hpp); each hook calls the driver, then",
        "// notes that work was queued (CUWARDEN_POOL=cache).",
        "//",
        "// Not hooked (a program asking for them turns the cache's fast reuse off):",
    ]
    for n, r in skipped:
        out.append(f"//   {n}: {r}")
    # cuda.h maps some older names to their newest variant (#define cuStreamWaitValue32
    # cuStreamWaitValue32_v2): the older exported name must reach the table as itself.
    remapped = [r.split(", ")[1] for r in rows if r.split(", ")[1] in macro and macro[r.split(", ")[1]][0] != r.split(", ")[1]]
    for n in remapped:
        out.append(f"#undef {n}")
    out.append("#define CUW_WORK_HOOKS(X) \\")
    out.append(" \\\n".join(rows))
    out.append("")
    out.append("// The stream each queues its work on, as an expression of its parameters (stream order:")
    out.append("// backends/pool/fence.hpp). Work of several contexts or streams: CU_STREAM_PER_THREAD, which no")
    out.append("// entry point of the legacy stream names (work::queued counts it as another stream's).")
    out.extend(streams)
    out.append("")
    out.append("// The prefixes those names were matched by (X(\"cuLaunch\") ...).")
    out.append("#define CUW_WORK_PREFIXES(X) \\")
    out.append(" \\\n".join(f'  X("{p}")' for p in SUBMIT_PREFIXES))
    out.append("")
    sys.stdout.write("\n".join(out) + "\n")


def stream_of(name, proto):
    """The expression naming the stream `name` queues its work on: its CUstream parameter, the
    stream of its launch configuration, or, without one, the default stream its flavor names
    (nullptr: the legacy stream, or the per-thread one for a _ptds/_ptsz variant). Work that
    spans contexts or devices (peer copies, multi-device launches) is never the legacy
    stream's: CU_STREAM_PER_THREAD."""
    if "Peer" in name or "MultiDevice" in name:
        return "(CU_STREAM_PER_THREAD)"
    for p in split_params(proto):
        m = re.match(r"^(?:const\s+)?CUstream\s+(\w+)$", p)
        if m:
            return f"({m.group(1)})"
        m = re.match(r"^const\s+CUlaunchConfig\s*\*\s*(\w+)$", p)
        if m:
            return f"({m.group(1)} ? {m.group(1)}->hStream : CU_STREAM_PER_THREAD)"
    return "(static_cast<CUstream>(nullptr))"


def split_params(s):
    depth, cur, out = 0, "", []
    for c in s:
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        if c == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += c
    if cur.strip():
        out.append(cur.strip())
    return out


if __name__ == "__main__":
    main()
