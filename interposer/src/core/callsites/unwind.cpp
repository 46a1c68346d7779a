// cuwarden interposer core: the native stack walk (unwind.hpp).
//
// Warm path (every return address in the table), per frame: a hash probe of the table (one
// or two cache lines), the CFA from RSP or RBP, a load of the return address and, when the
// frame saved RBP, of RBP: about 20 instructions and three branches.
// Cold path (a return address seen for the first time): dl_iterate_phdr to the loaded object
// holding it, a binary search of its .eh_frame_hdr table, its FDE and CIE parsed and their CFA
// instructions run up to the address (eh_frame.cpp), the result compiled into a Rule and
// inserted.
#include "core/callsites/unwind.hpp"

#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cstddef>

#include "core/callsites/eh_frame.hpp"

/// ld.so's: the stack pointer the program started with (weak: absent outside glibc).
extern "C" void* __libc_stack_end __attribute__((weak));

namespace cuw::core::unwind {

namespace {

// ---- the table: return address - 1 -> rule --------------------------------------------------

// 8192 slots of 16 bytes (128 KiB of .bss, touched only where rules land), at most half of
// them used so that probes stay short. A PyTorch training's allocations come from a few
// thousand distinct return addresses; past that, the table is emptied and fills again with
// those still met (a cache: a reset costs a cold lookup per address met afterwards). Tests
// build it smaller (CUW_UNWIND_TABLE_BITS) to reach that.
#ifndef CUW_UNWIND_TABLE_BITS
#define CUW_UNWIND_TABLE_BITS 13
#endif
constexpr int kTableBits = CUW_UNWIND_TABLE_BITS;
static_assert(kTableBits >= 3 && kTableBits <= 20);
constexpr std::size_t kSlots = std::size_t{1} << kTableBits;

/// Written only under g_busy (a rule, then its key into an empty slot, both release; or every
/// key to 0); read without a lock: key, rule (both acquire), then key again; a reader keeps
/// the rule only if both keys are its own (a rule stored after the slot was emptied makes the
/// second load see the emptying). A slot emptied and given the same key again between a
/// reader's two loads of it (two libraries unloaded within those nanoseconds) could pair that
/// key with another's rule: a wrong frame, within the stack's bounds like any other.
struct Slot {
  std::atomic<uint64_t> key{0};
  std::atomic<uint64_t> rule{0};
};
constinit Slot g_slots[kSlots];

/// The lock of inserts and emptying: a flag rather than a std::mutex, because walks only try it
/// (never wait in a hook), forget() spins on it, and a fork's child clears it when a thread the
/// child does not have held it at the fork (after_fork_child), which a mutex does not allow.
std::atomic<bool> g_busy{false};
uint32_t g_fill = 0;  ///< keys in the table (under g_busy)

struct Counters {
  std::atomic<uint64_t> cold{0}, invalidations{0}, resets{0}, not_stored_probes{0}, not_stored_busy{0},
      fallback_rule{0}, fallback_code{0}, fallback_stack{0}, fallback_bounds{0}, fallback_frame{0}, ended_early{0};
};
Counters g_count;

bool try_lock() noexcept {
  return !g_busy.load(std::memory_order_relaxed) && !g_busy.exchange(true, std::memory_order_acquire);
}
void unlock() noexcept { g_busy.store(false, std::memory_order_release); }

void empty_locked() noexcept {
  // Keys only: a rule word is written before its key (release), so a reader that finds its
  // key finds its rule; a stale rule word behind an empty key is never read.
  for (Slot& s : g_slots) s.key.store(0, std::memory_order_relaxed);
  g_fill = 0;
}

// From here to walk(): x86-64 only (elsewhere walk() falls back at once).
#if defined(__x86_64__)
// The rule of one return address, in one word, and how .eh_frame makes it: eh_frame.hpp.
using namespace detail;

// ---- the table's reads and inserts ----------------------------------------------------------

constexpr uint32_t kMaxFill = kSlots / 2;
constexpr int kProbes = kSlots < 32 ? static_cast<int>(kSlots) : 32;

inline std::size_t slot_of(uint64_t key) {
  return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ULL) >> (64 - kTableBits));
}

/// The rule of `key`, or 0 (kEmpty) when it is not in the table. Lock-free.
inline uint64_t lookup(uint64_t key) noexcept {
  std::size_t i = slot_of(key);
  for (int p = 0; p < kProbes; ++p, i = (i + 1) & (kSlots - 1)) {
    const uint64_t k = g_slots[i].key.load(std::memory_order_acquire);
    if (k == key) {
      const uint64_t r = g_slots[i].rule.load(std::memory_order_acquire);
      return g_slots[i].key.load(std::memory_order_relaxed) == key ? r : 0;
    }
    if (k == 0) return 0;
  }
  return 0;
}

/// The loader's unload count (dl_phdr_info::dlpi_subs) the table's rules were made under.
unsigned long long g_subs = 0;  ///< (under g_busy)
bool g_subs_known = false;      ///< (under g_busy)

/// False when no slot within kProbes of key's is empty: the address stays out (its walks take
/// the cold path) until the table is next emptied.
bool insert_locked(uint64_t key, uint64_t rule) noexcept {
  if (g_fill >= kMaxFill) {
    empty_locked();
    g_count.resets.fetch_add(1, std::memory_order_relaxed);
  }
  std::size_t i = slot_of(key);
  for (int p = 0; p < kProbes; ++p, i = (i + 1) & (kSlots - 1)) {
    const uint64_t k = g_slots[i].key.load(std::memory_order_relaxed);
    if (k == key) return true;  // another thread's insert
    if (k != 0) continue;
    g_slots[i].rule.store(rule, std::memory_order_release);
    g_slots[i].key.store(key, std::memory_order_release);
    ++g_fill;
    return true;
  }
  return false;
}

/// dl_iterate_phdr's search for the object holding `key`, which computes its rule there.
struct Search {
  uint64_t key;
  uint64_t rule = 0;  ///< kEmpty: no object holds key
  unsigned long long subs = 0;
  bool subs_known = false;
};

int search_object(dl_phdr_info* info, size_t size, void* arg) {
  auto* s = static_cast<Search*>(arg);
  if (!s->subs_known && size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) {
    s->subs = info->dlpi_subs;
    s->subs_known = true;
  }
  const ElfW(Phdr)* eh = nullptr;
  bool holds = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    const uint64_t at = info->dlpi_addr + ph.p_vaddr;
    if (ph.p_type == PT_LOAD && s->key >= at && s->key - at < ph.p_memsz) holds = true;
    else if (ph.p_type == PT_GNU_EH_FRAME) eh = &ph;
  }
  if (!holds) return 0;
  // An object without .eh_frame_hdr: its FDEs, if any, are found only by libgcc's search of
  // frames registered with __register_frame_info, which this walk does not see.
  s->rule = refused(kWhyRule);
  if (!eh) return 1;
  const uint64_t hdr = info->dlpi_addr + eh->p_vaddr;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    const uint64_t at = info->dlpi_addr + ph.p_vaddr;
    if (ph.p_type == PT_LOAD && hdr >= at && hdr - at < ph.p_filesz) {
      s->rule = rule_from(s->key, reinterpret_cast<const uint8_t*>(hdr), reinterpret_cast<const uint8_t*>(at),
                          reinterpret_cast<const uint8_t*>(at + ph.p_filesz));
      return 1;
    }
  }
  s->rule = refused(kWhyRule);
  return 1;
}

/// Whether backtrace() may be left a return address outside every loaded object: libgcc reads
/// the 9 bytes there (its test for the signal trampoline's code) unless an FDE registered with
/// __register_frame covers it (a JIT's: numba's, llvmlite's). JIT code can be read; a return
/// address read through a wrong rule mostly cannot, and backtrace() would fault on it.
/// process_vm_readv on our own pid fails (EFAULT) where a load would fault, PROT_NONE mappings
/// too (CUDA reserves its address ranges so), where mincore succeeds. Any other failure (a
/// seccomp filter refusing the call) says no as well: a walk ended short, never a fault.
bool readable(uint64_t pc) noexcept {
  constexpr std::size_t kRead = 9;
  unsigned char buf[kRead];
  iovec here{buf, kRead}, there{reinterpret_cast<void*>(pc), kRead};
  return ::process_vm_readv(::getpid(), &here, 1, &there, 1, 0) == static_cast<ssize_t>(kRead);
}

/// The cold path: the rule for `key` (a return address - 1), inserted into the table if its
/// lock is free (never waited for: a walk runs inside a hook). Every call looks at the
/// loader's unload count, whatever the table holds: the only place it is looked at.
__attribute__((cold, noinline)) uint64_t rule_cold(uint64_t key) noexcept {
  g_count.cold.fetch_add(1, std::memory_order_relaxed);
  Search s{key};
  dl_iterate_phdr(search_object, &s);
  if (s.rule == kEmpty) {
    // Outside every object. Readable (a JIT's code): its walks ask backtrace(), which finds
    // FDEs registered with __register_frame; kept. Unreadable: the walk ends, as backtrace()
    // would fault there; not kept, since a library may be loaded at that address later.
    if (!readable(key + 1)) return ends(kEndUnreadable);
    s.rule = refused(kWhyCode);
  }
  if (!try_lock()) {
    g_count.not_stored_busy.fetch_add(1, std::memory_order_relaxed);
    return s.rule;
  }
  // Unload counts only grow; one seen before another thread's newer one changes nothing.
  if (s.subs_known && (!g_subs_known || s.subs > g_subs)) {
    if (g_subs_known) {
      empty_locked();
      g_count.invalidations.fetch_add(1, std::memory_order_relaxed);
    }
    g_subs = s.subs;
    g_subs_known = true;
  }
  // A rule made before an unload that another thread has since seen (and emptied the table
  // for) may be the unloaded object's: it serves this walk, whose frame keeps its object
  // loaded, but is not kept.
  if (!s.subs_known || s.subs == g_subs) {
    if (!insert_locked(key, s.rule)) g_count.not_stored_probes.fetch_add(1, std::memory_order_relaxed);
  }
  unlock();
  return s.rule;
}

// ---- the thread's stack ---------------------------------------------------------------------

enum BoundsState : uint8_t { kNotLooked = 0, kKnown = 1, kFailed = 2 };
struct Bounds {
  uintptr_t lo = 0, hi = 0;
  uint8_t state = kNotLooked;
  uint16_t retry_in = 0;  ///< kFailed: walks left before the lookup is tried again
};
constinit thread_local Bounds t_bounds __attribute__((tls_model("initial-exec")));

/// A failed lookup of a thread's stack (pthread_getattr_np out of memory) is tried again after
/// this many walks, each left to backtrace() meanwhile: seldom enough that a lasting failure
/// costs nothing next to those, often enough that a passing one is soon over.
constexpr uint16_t kRetryWalks = 1024;

/// The main thread's stack, computed once (prepare(), or its first walk): hi 0 when unknown.
std::atomic<uintptr_t> g_main_lo{0}, g_main_hi{0};
/// In a fork's child whose parent forked from a thread other than its main one: the child's
/// main thread runs on that thread's stack, not the one __libc_stack_end lies in.
std::atomic<bool> g_main_moved{false};

/// The main thread's stack as glibc's pthread_getattr_np gives it, without what that does for
/// the main thread (read /proc/self/maps through stdio, which allocates): the top is the end
/// of the page holding __libc_stack_end (the stack pointer the program started with, above
/// every frame), the bottom the stack's rlimit below it. The kernel keeps other mappings below
/// that bottom (mmap_base leaves the rlimit and a guard gap under the stack), so a stack
/// pointer in the range is on this stack. An unlimited rlimit (no such gap is left then, but
/// mappings grow up from far below) counts as 1 GiB: deeper walks fall back.
bool main_stack(uintptr_t* lo, uintptr_t* hi) noexcept {
  if (&__libc_stack_end == nullptr || __libc_stack_end == nullptr) return false;
  const uintptr_t top = (reinterpret_cast<uintptr_t>(__libc_stack_end) | 4095) + 1;
  rlimit rl{};
  if (::getrlimit(RLIMIT_STACK, &rl) != 0) return false;
  constexpr uintptr_t kUnlimited = uintptr_t{1} << 30;
  uintptr_t size = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > kUnlimited ? kUnlimited : rl.rlim_cur;
  size &= ~uintptr_t{4095};
  if (size == 0 || size >= top) return false;
  *lo = top - size;
  *hi = top;
  return true;
}

bool main_stack_known(uintptr_t* lo, uintptr_t* hi) noexcept {
  *hi = g_main_hi.load(std::memory_order_acquire);
  *lo = g_main_lo.load(std::memory_order_relaxed);
  if (*hi != 0) return true;
  if (!main_stack(lo, hi)) return false;
  g_main_lo.store(*lo, std::memory_order_relaxed);
  g_main_hi.store(*hi, std::memory_order_release);
  return true;
}

bool is_main_thread() noexcept {
  return static_cast<pid_t>(::syscall(SYS_gettid)) == ::getpid() && !g_main_moved.load(std::memory_order_relaxed);
}

/// The calling thread's stack into `b` (kKnown), or kFailed. Allocates (pthread_getattr_np
/// copies the thread's CPU affinity) except on the main thread.
void find_bounds(Bounds& b) noexcept {
  uintptr_t lo = 0, hi = 0;
  b.state = kFailed;
  if (is_main_thread()) {
    if (!main_stack_known(&lo, &hi)) return;
  } else {
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) != 0) return;
    void* addr = nullptr;
    size_t size = 0;
    const bool got = pthread_attr_getstack(&attr, &addr, &size) == 0 && size > 0;
    pthread_attr_destroy(&attr);
    if (!got) return;
    lo = reinterpret_cast<uintptr_t>(addr);
    hi = lo + size;
  }
  b.lo = lo;
  b.hi = hi;
  b.state = kKnown;
}

/// A walk on a thread whose stack is not known yet: looks it up on the first walk and, after a
/// failure, on every kRetryWalks-th. False (counted) when the walk must fall back.
__attribute__((cold, noinline)) bool bounds_cold(Bounds& b) noexcept {
  if (b.state == kFailed && --b.retry_in != 0) {
    g_count.fallback_bounds.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  find_bounds(b);
  if (b.state == kKnown) return true;
  b.retry_in = kRetryWalks;
  g_count.fallback_bounds.fetch_add(1, std::memory_order_relaxed);
  return false;
}

/// A frame whose CFA is not above the stack pointer, or whose CFA, return address or RBP slot
/// lies past the stack's top: a rule gone stale (an object unloaded and another loaded at its
/// address, not yet noticed), CFI that lies, or a stack deeper than its bounds say. backtrace()
/// redoes the capture from the frames' own CFI.
__attribute__((cold, noinline)) int stray() noexcept {
  g_count.fallback_frame.fetch_add(1, std::memory_order_relaxed);
  return kFallback;
}

/// A walk that ends before the stack's outermost frame: at code without an FDE, at a return
/// address that cannot be read, or at one below the first page but not 0 (0 ends the stack for
/// libgcc too; nothing is code below 4096, and libgcc would fault reading it).
__attribute__((cold, noinline)) int ended(int n) noexcept {
  g_count.ended_early.fetch_add(1, std::memory_order_relaxed);
  return n;
}

__attribute__((cold, noinline)) int fall_back(uint64_t rule) noexcept {
  const Rule r = std::bit_cast<Rule>(rule);
  if ((r.bits >> kWhyShift) == kWhyCode) g_count.fallback_code.fetch_add(1, std::memory_order_relaxed);
  else g_count.fallback_rule.fetch_add(1, std::memory_order_relaxed);
  return kFallback;
}
#endif  // __x86_64__

}  // namespace

// Reads the stack of other frames (the sanitizers' instrumentation would flag it).
__attribute__((noinline, no_sanitize("address", "thread"))) int walk(void** out, int max) noexcept {
#if defined(__x86_64__)
  // This frame's registers at the instruction after the lea: its own CFI there gives its
  // caller (rip - 1 is inside the lea, which is where its rule is looked up, as for a
  // return address). RBP is read first: any of the outputs may be allocated to it.
  uintptr_t bp, sp, pc;
  __asm__ volatile("movq %%rbp, %0\n\tmovq %%rsp, %1\n\tleaq 0(%%rip), %2" : "=&r"(bp), "=&r"(sp), "=&r"(pc));
  Bounds& b = t_bounds;
  if (__builtin_expect(b.state != kKnown, 0) && !bounds_cold(b)) return kFallback;
  if (__builtin_expect(sp < b.lo || sp >= b.hi, 0)) {
    g_count.fallback_stack.fetch_add(1, std::memory_order_relaxed);
    return kFallback;
  }
  const uintptr_t lo = sp, hi = b.hi;
  int n = 0;
  while (n < max) {
    uint64_t word = lookup(pc - 1);
    if (__builtin_expect(word == kEmpty, 0)) word = rule_cold(pc - 1);
    const Rule r = std::bit_cast<Rule>(word);
    const uint8_t kind = r.bits & kKindMask;
    if (kind == kEnd) return __builtin_expect((r.bits >> kWhyShift) == kEndOutermost, 1) ? n : ended(n);
    if (__builtin_expect(kind != kStep, 0)) return fall_back(word);
    const uintptr_t cfa = ((r.bits & kCfaRbp) ? bp : sp) + static_cast<uintptr_t>(intptr_t{r.cfa_off});
    if (__builtin_expect(cfa <= sp || cfa > hi, 0)) return stray();  // never loop, never leave the stack
    const uintptr_t ra_at = cfa + static_cast<uintptr_t>(intptr_t{r.ra_off});
    if (__builtin_expect(ra_at < lo || ra_at > hi - 8, 0)) return stray();
    // Loaded by memcpy: a wrong rule's offsets can point anywhere in the stack, misaligned too
    // (a typed load there is undefined behaviour, which UBSan's CI build aborts on).
    uintptr_t ra;
    __builtin_memcpy(&ra, reinterpret_cast<const void*>(ra_at), sizeof ra);
    if (r.bits & kRbpSaved) {
      const uintptr_t bp_at = cfa + static_cast<uintptr_t>(intptr_t{r.rbp_off});
      if (__builtin_expect(bp_at < lo || bp_at > hi - 8, 0)) return stray();
      __builtin_memcpy(&bp, reinterpret_cast<const void*>(bp_at), sizeof bp);
    }
    sp = cfa;
    // 0 ends the stack (libgcc's test too); below the first page nothing is code, and 1 would
    // be the table's empty key.
    if (__builtin_expect(ra < 4096, 0)) return ra == 0 ? n : ended(n);
    out[n++] = reinterpret_cast<void*>(ra);
    pc = ra;
  }
  return n;
#else
  (void)out;
  (void)max;
  return kFallback;
#endif
}

Stats stats() noexcept {
  Stats s;
  s.cold = g_count.cold.load(std::memory_order_relaxed);
  s.invalidations = g_count.invalidations.load(std::memory_order_relaxed);
  s.resets = g_count.resets.load(std::memory_order_relaxed);
  s.not_stored_probes = g_count.not_stored_probes.load(std::memory_order_relaxed);
  s.not_stored_busy = g_count.not_stored_busy.load(std::memory_order_relaxed);
  s.fallback_rule = g_count.fallback_rule.load(std::memory_order_relaxed);
  s.fallback_code = g_count.fallback_code.load(std::memory_order_relaxed);
  s.fallback_stack = g_count.fallback_stack.load(std::memory_order_relaxed);
  s.fallback_bounds = g_count.fallback_bounds.load(std::memory_order_relaxed);
  s.fallback_frame = g_count.fallback_frame.load(std::memory_order_relaxed);
  s.ended_early = g_count.ended_early.load(std::memory_order_relaxed);
  return s;
}

void forget() noexcept {
  while (!try_lock()) sched_yield();
  empty_locked();
  unlock();
}

void prepare() noexcept {
#if defined(__x86_64__)
  uintptr_t lo, hi;
  (void)main_stack_known(&lo, &hi);
  Bounds& b = t_bounds;
  if (b.state != kNotLooked) return;
  find_bounds(b);
  if (b.state != kKnown) b.state = kNotLooked;  // the first walk tries again
#endif
}

void after_fork_child() noexcept {
#if defined(__x86_64__)
  // The forking thread is the child's main thread: the program's main thread if it runs on
  // that stack, else a thread whose stack pthread_getattr_np knows without /proc.
  uintptr_t lo, hi;
  const auto sp = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  g_main_moved.store(!main_stack_known(&lo, &hi) || sp < lo || sp >= hi, std::memory_order_relaxed);
#endif
  if (!g_busy.load(std::memory_order_relaxed)) return;
  // The thread that held it is not in the child: its insert or emptying stopped part way.
  // Every key left has its own rule (a rule is stored before its key), but g_fill may be off.
  empty_locked();
  unlock();
}

}  // namespace cuw::core::unwind
