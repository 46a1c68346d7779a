// cuwarden daemon model: native call-site frames (raw return addresses) to function and
// file:line, from the ELF files a process had loaded, opened by path with elfutils' libdw.
//
// Offline by design: the daemon never attaches to the process (no ptrace rights are needed
// over other users' processes, and an exited process symbolizes as well as a live one). The
// interposer records each module's path, load bias, address range and GNU build-id; a file
// whose build-id no longer matches (rebuilt or upgraded on disk) is not trusted: its frames
// carry module + offset only. Separate debug info is found under /usr/lib/debug (by build-id,
// as Debian's -dbgsym packages install it, or by .gnu_debuglink below that directory).
//
// Hostile input: the module list comes from a process's shared memory, so a path may name
// anything, and the file's owner may truncate it while it is mapped. Only absolute paths of
// regular files that start with an ELF header are opened (never blocking on a FIFO or a
// device), debug info is looked for only under root's /usr/lib/debug (not beside the module,
// where the module's owner could plant a FIFO), never over the network, and every libdw call
// runs under the fault guard (fault_guard.hpp): a truncated file costs its module's symbols,
// not the process. The daemon itself never runs it: it runs in a worker process that holds
// only the process owner's rights, in a sandbox (symbolize_worker.hpp).
// Not covered: libdw itself opens files that a module's DWARF names (split-DWARF .dwo and .dwp
// files, a dwz alt file by its path) with a plain open(), which a FIFO planted by the module's
// owner would block, and with it every resolve() (they share a lock): resolve on a thread
// that may wait, not on one that must never block.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/snapshot.hpp"

namespace cuw::daemon {

/// One ELF object loaded in a process, as the interposer saw it with dl_iterate_phdr.
struct ModuleInfo {
  uint64_t start = 0, end = 0;  ///< address range of its PT_LOAD segments in the process, [start, end)
  uint64_t bias = 0;            ///< load bias (dl_iterate_phdr's dlpi_addr, link_map's l_addr)
  std::string path;             ///< absolute path of the file (anything else is never opened)
  std::string build_id;         ///< GNU build-id as hex (either case); empty: unknown, not checked
};

/// What a Symbolizer did so far (counts since construction).
struct SymbolizerStats {
  uint64_t resolves = 0;       ///< resolve() calls
  uint64_t cache_hits = 0;     ///< answered from the result cache
  uint64_t files_opened = 0;   ///< ELF files opened and reported to libdw (re-opens after eviction count again)
  uint64_t files_refused = 0;  ///< not opened: missing, not a regular ELF file, relative path
  uint64_t build_id_mismatches = 0;  ///< opened, but not the file the process loaded
  uint64_t faults = 0;         ///< SIGBUS/SIGSEGV while libdw read a file (its handle is then abandoned)
  uint64_t evictions = 0;      ///< open files closed to stay within kMaxOpenFiles
};

/// Resolves return addresses of a process to frames (SnapFrame: function demangled, source
/// file, line, module path, offset), expanding inlined calls.
///
/// Caches: one libdw handle per (path, build-id), shared by every process that loaded the
/// same file whatever its load address; results per (file, offset in the file). Bounded:
///  - at most kMaxOpenFiles files open at once, the least recently used closed first. The
///    files are mapped, not read; libdw's heap per open file grows with the units looked up
///    and holds compressed debug sections decompressed: measured 1.9 MiB for the 11 MiB test
///    program (DWARF inside), 11.7 MiB for libc with libc6-dbg installed, 14 KiB for a small
///    library without debug info. The worst case is kMaxOpenFiles times the largest.
///  - at most kMaxModules files remembered, with their verdict (a missing, refused or
///    mismatched file is tried once while remembered);
///  - at most 2 * kResultsPerGeneration cached pcs (the older generation is dropped when the
///    newer fills), each about 200 bytes plus its names: about 15 MiB at most (estimated).
///
/// Thread-safe: one mutex around resolve(). Measured (tests/unit/test_symbolizer.cpp prints
/// it): the first pc of an 11 MiB file with DWARF about 3 ms (open, headers, first unit),
/// 100 ms for libc with libc6-dbg (its debug sections are compressed); a new pc of an open
/// file 0.3 ms in a unit that includes Catch2; a cached pc 0.4 us with 40 modules listed.
/// The daemon must have called install_fault_guard() (its main does); without it a file
/// truncated under libdw is fatal, as any other fault.
class Symbolizer {
 public:
  static constexpr std::size_t kMaxOpenFiles = 32;
  static constexpr std::size_t kMaxModules = 1024;
  static constexpr std::size_t kResultsPerGeneration = 16384;
  static constexpr std::size_t kMaxInlineFrames = 32;  ///< per pc; deeper inline chains lose their outer calls

  Symbolizer();
  ~Symbolizer();
  Symbolizer(const Symbolizer&) = delete;
  Symbolizer& operator=(const Symbolizer&) = delete;

  /// The frames of `pc`, innermost first: the function containing it and, when the compiler
  /// inlined calls there, one frame per inlined call, each with the file:line of its own code
  /// (the innermost: the pc's line; the others: the line of the call that was inlined). Every
  /// frame carries `pc` itself, the module's path and offset = pc - bias (the address in the
  /// ELF file, as `addr2line -e FILE` takes it). Never empty:
  ///  - pc in no module's [start, end): one frame with only pc;
  ///  - pc below the module's bias (a broken record): pc and module, offset 0;
  ///  - the file is missing, unreadable, not ELF, or its build-id differs from the recorded
  ///    one: one frame with pc, module and offset, no function;
  ///  - no DWARF for the pc: one frame named by the ELF symbol (.symtab, else .dynsym), no file.
  /// `return_address`: pc was taken from a stack (a call's return address), so the line and
  /// function are those of pc - 1, the call instruction itself; false for an exact pc.
  /// `modules` is the process's module list, in any order (scanned linearly).
  std::vector<SnapFrame> resolve(const std::vector<ModuleInfo>& modules, uint64_t pc,
                                 bool return_address = true);

  SymbolizerStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cuw::daemon
