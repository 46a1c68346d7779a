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
#include <string_view>
#include <vector>

#include "cuw/frames.hpp"
#include "model/snapshots.hpp"

namespace cuw::daemon {

/// argv[1] that makes cuwardend run as a symbolization worker (main.cpp checks it first).
inline constexpr const char* kSymbolizeWorkerFlag = "--symbolize-worker";

struct SymbolizeOptions {
  std::string worker = "/proc/self/exe";  ///< the program run with kSymbolizeWorkerFlag (the
                                          ///< daemon's own binary, even after an upgrade replaced it)
  uint64_t deadline_ns = 5'000'000'000;   ///< per request: the worker is killed past it
  std::size_t max_pcs = 20000;            ///< distinct pcs per request; the rest keep module + offset
  /// What class each named frame is (cuw/frames.hpp): the built-in rules and the site's own
  /// (`cuwardend --frames FILE`, model/frame_rules.hpp). Carried here because every view of a
  /// named snapshot reads both.
  frames::Rules frames;
};

/// What the daemon asks a worker (one JSON object on the worker's stdin): the owner whose
/// rights it takes, its CPU limit, the process's modules and the pcs to name.
struct SymbolizeRequest {
  uint32_t uid = 0;
  uint64_t cpu_seconds = 5;  ///< RLIMIT_CPU, seconds
  std::vector<ModuleInfo> modules;
  std::vector<uint64_t> pcs;
};

/// The request's text, as the daemon writes it. Never throws but for allocation.
std::string symbolize_request_text(const SymbolizeRequest& r);

/// Parse a request as the worker reads it: false (and *out untouched) unless it is an object
/// with an unsigned 32-bit "uid", unsigned "cpu_seconds" if present, "modules" an array of
/// [start, end, bias, path, build_id] (three unsigned integers, two strings) and "pcs" an
/// array of unsigned integers. Never throws but for allocation. Thread-safe.
bool parse_symbolize_request(std::string_view text, SymbolizeRequest* out);

/// The daemon's reading of the worker's reply, which is untrusted (the worker parsed hostile
/// files): every complete line of `pending` ([index, [[function, file, line], ...]]) names
/// named[index] if that is still empty; malformed lines and out-of-range or repeated indexes
/// are skipped; names and files are cut to 4096 bytes, frames to Symbolizer::kMaxInlineFrames.
/// The lines read are erased from `pending` (a partial last line stays). Returns how many
/// entries of `named` it filled. Never throws but for allocation.
std::size_t take_symbolize_reply(std::string& pending, std::vector<std::vector<SnapFrame>>& named);

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
