// cuwarden interposer core: call sites (CUWARDEN_CALLSITES=N). An allocation's stack, N
// native return addresses and, with CUWARDEN_PYFRAMES, the calling thread's Python frames,
// is captured in the hook before its critical section and named by a small id: each
// distinct stack is stored once, in the live segment's sites log, and referred to by id in
// events and live records afterwards (heaptrack's model). The ELF modules its addresses lie
// in are logged beside it (path, load bias, build-id) so that the daemon symbolizes them
// from the files, without rights over the process and after it exited; Python code names go
// to the codes log. In the process itself, only dladdr names frames (the OOM paragraph and
// the leak report).
//
// The native frames come from core/callsites/unwind.hpp's walk: .eh_frame's rules, compiled once per
// return address and cached, because the libraries a CUDA program's allocations come through
// (libtorch, libcudart, the interpreter) are mostly built without frame pointers, where a
// frame-pointer walk stops after a frame or two or follows a register holding anything, and
// because glibc's backtrace(), which reads .eh_frame as well, interprets every frame's rules
// again on each call. Where the walk's rules do not reach (a signal frame, a CFA given by an
// expression, JIT code, a stack other than the thread's own) it answers "fall back" and the
// capture is backtrace()'s: the frames are the same either way. Both costs are measured in
// bench/ (callsites_cost).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/live_segment.hpp"
#include "cuw/frames.hpp"

namespace cuw::core {

/// The process's call-site table. init() once; capture() from any thread.
class CallSites {
 public:
  static constexpr int kMaxNative = 64;
  static constexpr int kMaxPython = 64;
  /// Frames asked of the unwinder beyond those kept: this library's own (the hook,
  /// SiteScope's constructor, capture()) and, when backtrace() answers, a runtime's
  /// interceptor of it above them (ASan's).
  static constexpr int kOwnFrames = 4;

  /// Start capturing `native` frames (1..kMaxNative) per allocation, and Python frames when
  /// `python` and an interpreter the reader knows is in the process, into `segment`.
  /// Warms backtrace(), the fallback, up (its first call loads libgcc_s). Cold; not
  /// thread-safe (the tracker's constructor).
  void init(LiveSegment* segment, int native, bool python) noexcept;
  bool enabled() const noexcept { return native_ > 0; }

  /// The calling thread's call site now: its id (>= 1), storing it first if new; 0 when
  /// off or the stack could not be stored. Thread-safe; never blocks on anything but the
  /// table's own mutex (held for a hash lookup, or an append to the log when new). Cost:
  /// the unwind (about 0.1 us for 16 frames seen before; backtrace()'s 2-4 us where the walk
  /// falls back), a hash and a lookup: about 0.25 us in all (bench/ callsites_cost).
  uint32_t capture() noexcept;

  /// The frames of site `id`: native return addresses and Python frames (code << 32 | line),
  /// innermost first. False for an unknown id. Thread-safe.
  bool frames(uint32_t id, std::vector<uint64_t>* native, std::vector<uint64_t>* python) const;

  /// The frames of site `id` for the presenter (cuw/frames.hpp), from inside the process:
  /// native frames named by dladdr ("forward+0x1c (libtorch_cuda.so)"), Python frames as
  /// "step (train.py:42)", classed by the built-in rules; empty for an unknown id.
  /// Allocates; not for a hook's hot path. Thread-safe.
  std::vector<frames::Frame> present(uint32_t id) const;

  /// One debug line (CUWARDEN_LOG=debug): the sites stored and how the native walks went
  /// (unwind::stats(): return addresses looked up, walks left to backtrace() and why, walks
  /// ended early). Below debug it returns at once, without the table's lock. Cold;
  /// thread-safe.
  void log_stats() const noexcept;

 private:
  struct Entry {
    uint64_t hash = 0;
    uint32_t id = 0;
  };
  uint32_t store_locked(const uint64_t* frames, int native, int python, uint64_t hash) noexcept;
  void note_modules_locked(const uint64_t* pcs, int n) noexcept;
  void publish_codes_locked() noexcept;

  LiveSegment* segment_ = nullptr;
  int native_ = 0;
  bool python_ = false;
  uintptr_t own_lo_ = 0, own_hi_ = 0;  ///< this library's text: frames there are skipped
  mutable std::mutex mu_;
  std::vector<Entry> index_;            ///< open addressing by hash, power-of-two size
  uint32_t count_ = 0;
  std::vector<std::vector<uint64_t>> stacks_;  ///< by id - 1: native frames, then Python ones
  std::vector<uint16_t> native_counts_;        ///< by id - 1
  /// Modules logged: [start, end) each, sorted by start.
  std::vector<std::pair<uint64_t, uint64_t>> modules_;
  uint32_t codes_published_ = 1;  ///< Python code ids below this are in the codes log
};

}  // namespace cuw::core
