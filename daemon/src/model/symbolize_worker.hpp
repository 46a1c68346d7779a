// cuwarden daemon model: naming a snapshot's native frames in a sandboxed worker process.
//
// The module paths come from a process's live segment, which the process's owner writes
// freely: a root daemon that opened them would read, and hand back names and lines from,
// files that owner cannot read (a library in a root-only directory, a link flipped to a 0600
// file), open device nodes as root, and run libdw's parser as root on ELF/DWARF the owner
// crafted. So the daemon process never opens such a path. symbolize() runs cuwardend itself
// again in worker mode (`cuwardend --symbolize-worker`), hands it the module list and the pcs
// on a pipe, and reads the names back from another. Before it opens anything the worker takes
// the process owner's uid, gid and groups, sets PR_SET_NO_NEW_PRIVS, drops every capability,
// takes RLIMIT_AS (1 GiB) and RLIMIT_CPU, and installs a seccomp allow-list (read-only opens,
// writes to its own stdout and stderr only, no sockets, no exec, no signals to others). The
// daemon kills it at the deadline; the frames it did not name keep their module and offset,
// and TakenSnapshot::symbols_note says why.
//
// Why fork and exec rather than a plain fork: the daemon has threads (loop, socket, HTTP,
// pool) when a snapshot is asked for, and a forked child of a threaded process may only call
// async-signal-safe functions until it execs, while libdw allocates. The exec also leaves
// nothing of the daemon's memory (other users' states and snapshots) in the worker for a
// parser that hostile input took over to read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "model/snapshots.hpp"

namespace cuw::daemon {

/// argv[1] that makes cuwardend run as a symbolization worker (main.cpp checks it first).
inline constexpr const char* kSymbolizeWorkerFlag = "--symbolize-worker";

struct SymbolizeOptions {
  std::string worker = "/proc/self/exe";  ///< the program run with kSymbolizeWorkerFlag (the
                                          ///< daemon's own binary, even after an upgrade replaced it)
  uint64_t deadline_ns = 5'000'000'000;   ///< per request: the worker is killed past it
  std::size_t max_pcs = 20000;            ///< distinct pcs per request; the rest keep module + offset
};

/// Name every native frame of `t` (function, file, line: Symbolizer::resolve's frames, inlined
/// calls expanded) in a worker process with the rights of `t.uid`, the process's owner.
/// Frames it did not name (deadline, worker failure, past max_pcs, a file the owner cannot
/// read) keep pc, module and offset; `t.symbols_note` then says why ("" when every frame the
/// worker was given came back). Idempotent. Thread-safe; blocks up to o.deadline_ns plus the
/// worker's start. The process must ignore SIGPIPE (the daemon does): a worker that dies
/// before reading its whole request would otherwise take the caller with it.
void symbolize(TakenSnapshot& t, const SymbolizeOptions& o);

/// The worker: reads its request on stdin, drops its rights as above, answers on stdout, and
/// returns the exit status. Called by main() before anything else when argv[1] is
/// kSymbolizeWorkerFlag.
int symbolize_worker_main();

}  // namespace cuw::daemon
