// cuwarden interposer: event timestamps (see fast_clock.hpp).
#include "base/fast_clock.hpp"

#include "cuw/attrs.hpp"

#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/auxv.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace cuw::fast_clock {

namespace detail {
State g_state;
constinit thread_local ThreadState t_state __attribute__((tls_model("initial-exec")));
}  // namespace detail

using namespace detail;

namespace {

__extension__ typedef unsigned __int128 u128;

constexpr uint64_t kCalibrateNs = 50'000'000;  // rate measured over at least 50 ms
constexpr uint64_t kAnchorNs = 100'000'000;    // a thread re-anchors every ~100 ms

// First anchor of the process (for the rate).
std::atomic<uint64_t> g_first_ticks{0}, g_first_ns{0};

/// A (ticks, ns) pair read as close together as the machine allows: the counter on both
/// sides of clock_gettime, the narrowest of three tries (a thread preempted in between
/// would otherwise skew every time it reports until its next anchor).
Anchor read_pair() noexcept {
  Anchor best;
  uint64_t best_gap = ~0ULL;
  for (int i = 0; i < 3; ++i) {
    const uint64_t t0 = ticks();
    const uint64_t ns = realtime_ns_slow();
    const uint64_t t1 = ticks();
    if (t1 >= t0 && t1 - t0 < best_gap) {
      best_gap = t1 - t0;
      best = Anchor{t0 + (t1 - t0) / 2, ns};
    }
  }
  if (best.ns == 0) best = Anchor{ticks(), realtime_ns_slow()};
  return best;
}

bool kernel_uses_counter() noexcept;

/// Before the rate is known: the time is a plain clock_gettime; the process's first call
/// takes the first anchor, and the first call 50 ms later measures the rate against it.
uint64_t calibrate() noexcept {
  const uint64_t ns = realtime_ns_slow();
  const uint64_t first_ns = g_first_ns.load(std::memory_order_acquire);
  if (first_ns == 0) {
    uint64_t zero = 0;
    const Anchor a = read_pair();
    if (g_first_ticks.compare_exchange_strong(zero, a.ticks, std::memory_order_acq_rel))
      g_first_ns.store(a.ns, std::memory_order_release);
    return ns;
  }
  if (ns < first_ns + kCalibrateNs) return ns;
  static std::atomic<bool> measuring{false};
  if (measuring.exchange(true, std::memory_order_acq_rel)) return ns;  // another thread is on it
  const Anchor a = read_pair();
  const uint64_t first = g_first_ticks.load(std::memory_order_acquire);
  if (a.ticks > first && a.ns > first_ns) {
    const u128 mult = (static_cast<u128>(a.ns - first_ns) << 32) / (a.ticks - first);
    if (mult > 0 && mult < (static_cast<u128>(1) << 40)) {  // up to 256 ns per tick
      const uint64_t m = static_cast<uint64_t>(mult);
      g_state.period.store(static_cast<uint64_t>((static_cast<u128>(kAnchorNs) << 32) / m), std::memory_order_relaxed);
      g_state.mult.store(m, std::memory_order_release);
      return ns;
    }
  }
  measuring.store(false, std::memory_order_release);  // a counter that went backwards: try later
  return ns;
}

bool kernel_uses_counter() noexcept {
  const int fd = ::open("/sys/devices/system/clocksource/clocksource0/current_clocksource", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[64] = {};
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
#if defined(__x86_64__)
  return std::strncmp(buf, "tsc\n", 4) == 0;
#elif defined(__aarch64__)
  return std::strncmp(buf, "arch_sys_counter\n", 17) == 0;
#else
  return false;
#endif
}

}  // namespace

namespace {

/// The System V ELF hash (System V ABI, "Hash Table").
uint32_t elf_hash(const char* s) noexcept {
  uint32_t h = 0;
  for (; *s; ++s) {
    h = (h << 4) + static_cast<unsigned char>(*s);
    const uint32_t g = h & 0xf0000000u;
    if (g) h ^= g >> 24;
    h &= ~g;
  }
  return h;
}

/// The address of the default (non-hidden) definition of function `name` in the vDSO image
/// the kernel mapped at `base` (getauxval(AT_SYSINFO_EHDR)), or nullptr. Read the way the
/// kernel's own example does (tools/testing/selftests/vDSO/parse_vdso.c): the first PT_LOAD
/// gives the load offset, which turns link-time addresses (0-based on current kernels,
/// 0xffffffffff700000-based on old x86-64 ones) into mapped ones; PT_DYNAMIC gives the
/// tables, the System V hash table (x86-64 and arm64 vDSOs both have one) the symbol. Every table, entry and the result must lie inside
/// the PT_LOAD segment, or nullptr: a vDSO it does not understand costs the libc fallback,
/// never a fault.
void* vdso_function(uintptr_t base, const char* name) noexcept {
  if (base == 0) return nullptr;
  const auto* eh = reinterpret_cast<const ElfW(Ehdr)*>(base);
  if (std::memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
      eh->e_phentsize != sizeof(ElfW(Phdr)) || eh->e_phoff + eh->e_phnum * sizeof(ElfW(Phdr)) > 4096)
    return nullptr;  // the headers sit in the image's first page
  const auto* ph = reinterpret_cast<const ElfW(Phdr)*>(base + eh->e_phoff);
  uintptr_t load = 0, lo = 0, hi = 0;
  const ElfW(Phdr)* dyn_ph = nullptr;
  for (int i = 0; i < eh->e_phnum; ++i) {
    if (ph[i].p_type == PT_LOAD && hi == 0) {
      load = base + ph[i].p_offset - ph[i].p_vaddr;
      lo = base + ph[i].p_offset;
      hi = lo + ph[i].p_memsz;
    } else if (ph[i].p_type == PT_DYNAMIC) {
      dyn_ph = &ph[i];
    }
  }
  if (hi <= lo || !dyn_ph) return nullptr;
  auto inside = [lo, hi](uintptr_t p, uintptr_t bytes) { return p >= lo && p <= hi && bytes <= hi - p; };
  const uintptr_t dyn = base + dyn_ph->p_offset;
  if (!inside(dyn, dyn_ph->p_memsz)) return nullptr;
  const uint32_t* hash = nullptr;
  const ElfW(Sym)* symtab = nullptr;
  const char* strtab = nullptr;
  const ElfW(Versym)* versym = nullptr;
  uintptr_t strsz = 0;
  for (const auto* d = reinterpret_cast<const ElfW(Dyn)*>(dyn);
       reinterpret_cast<uintptr_t>(d + 1) <= dyn + dyn_ph->p_memsz && d->d_tag != DT_NULL; ++d) {
    const uintptr_t at = d->d_un.d_ptr + load;  // link-time address + load offset
    switch (d->d_tag) {
      case DT_HASH: hash = reinterpret_cast<const uint32_t*>(at); break;
      case DT_SYMTAB: symtab = reinterpret_cast<const ElfW(Sym)*>(at); break;
      case DT_STRTAB: strtab = reinterpret_cast<const char*>(at); break;
      case DT_STRSZ: strsz = d->d_un.d_val; break;
      case DT_VERSYM: versym = reinterpret_cast<const ElfW(Versym)*>(at); break;
      default: break;
    }
  }
  const auto addr = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
  if (!hash || !symtab || !strtab || !inside(addr(hash), 8) || !inside(addr(strtab), strsz)) return nullptr;
  const uint32_t nbucket = hash[0], nchain = hash[1];
  if (nbucket == 0 || !inside(addr(hash), (2ull + nbucket + nchain) * 4) ||
      !inside(addr(symtab), uintptr_t{nchain} * sizeof(ElfW(Sym))) ||
      (versym && !inside(addr(versym), uintptr_t{nchain} * sizeof(ElfW(Versym)))))
    return nullptr;
  const uint32_t* bucket = hash + 2;
  const uint32_t* chain = bucket + nbucket;
  const size_t name_len = std::strlen(name);
  uint32_t steps = 0;
  for (uint32_t i = bucket[elf_hash(name) % nbucket]; i != STN_UNDEF && i < nchain && steps < nchain;
       i = chain[i], ++steps) {
    const ElfW(Sym)& s = symtab[i];
    if (ELF64_ST_TYPE(s.st_info) != STT_FUNC || s.st_shndx == SHN_UNDEF || s.st_name >= strsz ||
        strsz - s.st_name <= name_len || std::memcmp(strtab + s.st_name, name, name_len + 1) != 0)
      continue;
    const int bind = ELF64_ST_BIND(s.st_info);
    if ((bind != STB_GLOBAL && bind != STB_WEAK) || (versym && (versym[i] & 0x8000))) continue;  // hidden
    const uintptr_t fn = s.st_value + load;
    return inside(fn, 1) ? reinterpret_cast<void*>(fn) : nullptr;
  }
  return nullptr;
}

}  // namespace

clock_fn detail::vdso_clock_gettime() noexcept {
  // The vDSO's own entry point (Linux: Documentation/ABI/stable/vdso: x86-64 and arm64 names).
#if defined(__x86_64__)
  void* p = vdso_function(static_cast<uintptr_t>(getauxval(AT_SYSINFO_EHDR)), "__vdso_clock_gettime");
#elif defined(__aarch64__)
  void* p = vdso_function(static_cast<uintptr_t>(getauxval(AT_SYSINFO_EHDR)), "__kernel_clock_gettime");
#else
  void* p = nullptr;
#endif
  return p ? reinterpret_cast<clock_fn>(p) : &::clock_gettime;
}

/// A new anchor for the thread, with its copies of the rate and period.
CUW_COLD uint64_t detail::reanchor() noexcept {
  const Anchor a = read_pair();
  t_state.anchor = a;
  t_state.mult = g_state.mult.load(std::memory_order_acquire);  // period was stored before it
  t_state.period = g_state.period.load(std::memory_order_relaxed);
  return a.ns;
}

CUW_COLD uint64_t detail::slow_path() noexcept {
  if (!g_state.ready.load(std::memory_order_acquire)) return realtime_ns_slow();
  if (g_state.mode.load(std::memory_order_relaxed) == Mode::coarse) {
    t_state.coarse_fn = g_state.coarse_fn.load(std::memory_order_relaxed);  // set before ready
    t_state.mult = kCoarse;  // every later call of this thread: coarse_ns(coarse_fn), inline
    return coarse_ns(t_state.coarse_fn);
  }
  if (!g_state.usable.load(std::memory_order_relaxed)) return realtime_ns_slow();
  if (g_state.mult.load(std::memory_order_acquire) == 0) return calibrate();
  return reanchor();  // the thread's first call since the rate was measured
}

void init(Mode mode) noexcept {
  static std::atomic<bool> done{false};
  if (done.exchange(true)) return;
  g_state.mode.store(mode, std::memory_order_relaxed);
  g_state.coarse_fn.store(vdso_clock_gettime(), std::memory_order_relaxed);
  g_state.usable.store(mode == Mode::fine && kernel_uses_counter(), std::memory_order_relaxed);
  g_state.ready.store(true, std::memory_order_release);
}

uint64_t realtime_ns_slow() noexcept {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace cuw::fast_clock
