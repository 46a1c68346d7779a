// cuwarden interposer core: the native stack walk of a call site (x86-64), from the rules of
// .eh_frame, each compiled once per return address into a small rule kept in a lock-free
// table (as sampling profilers do: bytehound, framehop, samply).
//
// Why not glibc's backtrace(): it runs libgcc's DWARF unwinder, which finds and interprets
// each frame's FDE again on every call (about 150 ns a frame); a walk with the rules cached
// costs a hash probe and two loads a frame. Why not frame pointers: the libraries allocations
// come through (libcudart, PyTorch's wheels) are built without them.
//
// A rule says where the frame's CFA is (RSP or RBP plus an offset), where its return address
// is (CFA + offset) and whether RBP was saved (CFA + offset) or is unchanged: what x86-64
// needs to go from one frame to the next. Frames whose CFI says anything else (a CFA or RBP
// given by an expression or another register, signal frames, code outside every loaded
// object) make walk() answer kFallback, and the caller asks backtrace(): the frames are
// always backtrace()'s own. Other registers' rules are not needed and not kept.
//
// Safety: every read of the stack lies within the calling thread's stack, [the walk's own
// stack pointer, the stack's top), so a wrong rule gives a wrong frame, never a fault; a rule
// that would lead off the stack makes the walk fall back. A rule can only be wrong after a
// library is unloaded and another loaded at its address: the table is emptied when the
// loader's count of unloads changes, which is looked at only when a return address is not in
// the table (not on every walk: that is a dl_iterate_phdr call). A return address that cannot
// be read (outside every object and unmapped or PROT_NONE) ends the walk there: backtrace()
// would fault on it.
#pragma once

#include <cstdint>

namespace cuw::core::unwind {

/// walk()'s answer when it cannot give backtrace()'s frames: call backtrace() instead.
inline constexpr int kFallback = -1;

/// The calling thread's return addresses, innermost first, at most `max` into `out`: the
/// frames glibc's backtrace() would return if called in place of walk() (out[0] is the return
/// address into walk()'s caller). Returns how many (0..max), or kFallback when this walk cannot
/// tell them (see the file's comment; also the thread running on a stack other than its own,
/// e.g. a signal's alternate stack or a coroutine's). Not
/// async-signal-safe (a return address seen for the first time takes the cold path:
/// dl_iterate_phdr and a lock that is only tried). Thread-safe, lock-free and allocation-free
/// when every return address is in the table and the thread's stack is known (prepare() or an
/// earlier walk on it; otherwise a thread other than the main one looks it up with
/// pthread_getattr_np, which allocates); always kFallback on other architectures.
/// Cost: about 5-10 ns a frame warm; a return address seen for the first time, 1-3 us.
int walk(void** out, int max) noexcept;

/// Why walks fell back, and how often the cold path ran. Counted with relaxed atomics, only
/// on those rare paths; a snapshot, for benchmarks and tests. Thread-safe.
struct Stats {
  uint64_t cold = 0;               ///< return addresses looked up in the loaded objects' .eh_frame
  uint64_t invalidations = 0;      ///< the table emptied: an object was unloaded
  uint64_t resets = 0;             ///< the table emptied: it was full (a cache's reset)
  uint64_t not_stored_probes = 0;  ///< rules not kept: no free slot near their key's
  uint64_t not_stored_busy = 0;    ///< rules not kept: another thread held the table's lock
  uint64_t fallback_rule = 0;      ///< a frame whose rule is not one kept (expression, signal frame)
  uint64_t fallback_code = 0;      ///< a return address outside every loaded object (JIT code)
  uint64_t fallback_stack = 0;     ///< another stack in use (a signal's, a coroutine's)
  uint64_t fallback_bounds = 0;    ///< the thread's stack not found (tried again every 1,024 walks)
  uint64_t fallback_frame = 0;     ///< a frame's CFA or saved registers outside the stack (a stale rule)
  uint64_t ended_early = 0;        ///< walks ended before the outermost frame (code without FDE, unreadable)
};
Stats stats() noexcept;

/// Find the main thread's stack, and the calling thread's, now rather than in their first
/// walks: a thread's lookup allocates (pthread_getattr_np), which a hook had better not do
/// (the main thread's needs neither that nor /proc: __libc_stack_end and the stack's rlimit).
/// Cold; thread-safe; call outside any allocation (CallSites::init, at the first CUDA call).
void prepare() noexcept;

/// Empty the rule table, as if no walk had run (benchmarks: the cost of the cold path).
/// Thread-safe: concurrent walks see each rule or none. Waits (spinning, yielding) while a
/// walk inserts; not for a hook.
void forget() noexcept;

/// In a fork's child, before anything else there (the tracker's atfork child handler): frees
/// the table's lock if a thread of the parent held it at the fork (the child has no such
/// thread: walks would never insert again and forget() would never return), emptying the
/// table, which that thread may have left part-written; and notes whether the child's main
/// thread is the program's (forked from it) or another's (whose stack is found otherwise).
/// Async-signal-safe.
void after_fork_child() noexcept;

}  // namespace cuw::core::unwind
