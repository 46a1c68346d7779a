// cuwarden interposer core: the native stack walk (unwind.hpp).
//
// Warm path (every return address in the table), per frame: a hash probe of the table (one
// or two cache lines), the CFA from RSP or RBP, a load of the return address and, when the
// frame saved RBP, of RBP: about 20 instructions and three branches.
// Cold path (a return address seen for the first time): dl_iterate_phdr to the loaded object
// holding it, a binary search of its .eh_frame_hdr table, its FDE and CIE parsed and their CFA
// instructions run up to the address, the result compiled into a Rule and inserted.
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
#include <cstring>

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
// ---- the rule of one return address, in one word -----------------------------------------

enum Kind : uint8_t {
  kEmpty = 0,   ///< never stored: a slot's value before its first insert
  kStep = 1,    ///< go to the caller with the offsets below
  kEnd = 2,     ///< the walk ends here, as backtrace() would (see EndWhy)
  kRefuse = 3,  ///< not a rule kept here: the walk falls back to backtrace()
};
enum Why : uint8_t { kWhyRule = 0, kWhyCode = 1 };  ///< of a kRefuse, for the statistics
/// Of a kEnd: only the first is the stack's true end; the others are counted as walks ended early.
enum EndWhy : uint8_t {
  kEndOutermost = 0,  ///< the return address undefined (_start, clone): libgcc's end of the stack
  kEndNoFde = 1,      ///< code in a loaded object without an FDE: libgcc finds none and ends too
  kEndUnreadable = 2, ///< outside every object and unreadable: libgcc would fault (never kept)
};
constexpr uint8_t kKindMask = 3, kCfaRbp = 4, kRbpSaved = 8, kWhyShift = 4;

/// The CFA is RSP (or RBP, kCfaRbp) + cfa_off; the return address is at CFA + ra_off; RBP,
/// when kRbpSaved, at CFA + rbp_off, else unchanged. Offsets in bytes.
struct Rule {
  int32_t cfa_off = 0;
  int16_t rbp_off = 0;
  int8_t ra_off = 0;
  uint8_t bits = kEmpty;
};
static_assert(sizeof(Rule) == sizeof(uint64_t));

constexpr uint64_t refused(Why why) {
  return std::bit_cast<uint64_t>(Rule{0, 0, 0, static_cast<uint8_t>(kRefuse | why << kWhyShift)});
}
constexpr uint64_t ends(EndWhy why) {
  return std::bit_cast<uint64_t>(Rule{0, 0, 0, static_cast<uint8_t>(kEnd | why << kWhyShift)});
}

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

// ---- reading .eh_frame_hdr, CIEs and FDEs ---------------------------------------------------
// Every read is bounded by the loaded segment that holds .eh_frame_hdr (where linkers put
// .eh_frame too); an FDE or CIE outside it is refused. The object cannot be unloaded
// meanwhile: all of it runs inside dl_iterate_phdr's callback, under the loader's lock.

/// A cursor over [p, end): a read past the end yields 0 and clears ok.
struct Reader {
  const uint8_t* p;
  const uint8_t* end;
  bool ok = true;

  bool need(uint64_t n) noexcept {
    if (static_cast<uint64_t>(end - p) >= n) return true;
    ok = false;
    p = end;
    return false;
  }
  template <class T>
  T fixed() noexcept {
    T v{};
    if (need(sizeof v)) {
      std::memcpy(&v, p, sizeof v);
      p += sizeof v;
    }
    return v;
  }
  uint64_t uleb() noexcept {
    uint64_t v = 0;
    for (unsigned shift = 0;; shift += 7) {
      if (!need(1)) return 0;
      const uint8_t b = *p++;
      if (shift < 64) v |= uint64_t{b & 0x7fu} << shift;
      if (!(b & 0x80)) return v;
    }
  }
  int64_t sleb() noexcept {
    uint64_t v = 0;
    for (unsigned shift = 0;; shift += 7) {
      if (!need(1)) return 0;
      const uint8_t b = *p++;
      if (shift < 64) v |= uint64_t{b & 0x7fu} << shift;
      if (!(b & 0x80)) {
        if (shift + 7 < 64 && (b & 0x40)) v |= ~uint64_t{0} << (shift + 7);
        return static_cast<int64_t>(v);
      }
    }
  }
  void skip(uint64_t n) noexcept {
    if (need(n)) p += n;
  }
};

// DW_EH_PE_* pointer encodings (LSB: "DWARF Exception Header Encoding").
constexpr uint8_t kPeOmit = 0xff, kPeAbsptr = 0x00, kPeUleb = 0x01, kPeU2 = 0x02, kPeU4 = 0x03, kPeU8 = 0x04,
                  kPeSleb = 0x09, kPeS2 = 0x0a, kPeS4 = 0x0b, kPeS8 = 0x0c, kPePcrel = 0x10, kPeDatarel = 0x30;

/// A DW_EH_PE-encoded value; with `apply`, made absolute (pcrel from the field's own address,
/// datarel from `data_base`). False for what .eh_frame on x86-64 does not use (textrel,
/// funcrel, aligned). The indirect bit is ignored: only personality pointers carry it, and
/// those are skipped, never followed.
bool read_encoded(Reader& r, uint8_t enc, uint64_t data_base, bool apply, uint64_t* out) noexcept {
  if (enc == kPeOmit) {
    *out = 0;
    return true;
  }
  const uint64_t here = reinterpret_cast<uintptr_t>(r.p);
  uint64_t v = 0;
  switch (enc & 0x0f) {
    case kPeAbsptr: v = r.fixed<uint64_t>(); break;
    case kPeUleb: v = r.uleb(); break;
    case kPeU2: v = r.fixed<uint16_t>(); break;
    case kPeU4: v = r.fixed<uint32_t>(); break;
    case kPeU8: v = r.fixed<uint64_t>(); break;
    case kPeSleb: v = static_cast<uint64_t>(r.sleb()); break;
    case kPeS2: v = static_cast<uint64_t>(int64_t{r.fixed<int16_t>()}); break;
    case kPeS4: v = static_cast<uint64_t>(int64_t{r.fixed<int32_t>()}); break;
    case kPeS8: v = static_cast<uint64_t>(r.fixed<int64_t>()); break;
    default: return false;
  }
  if (apply) {
    switch (enc & 0x70) {
      case 0x00: break;
      case kPePcrel: v += here; break;
      case kPeDatarel:
        if (data_base == 0) return false;
        v += data_base;
        break;
      default: return false;
    }
  }
  *out = v;
  return r.ok;
}

/// One .eh_frame record's contents after its length: [body, end). False if it does not fit
/// in [lo, hi), is a terminator, or uses the 64-bit length (which libgcc does not read either).
bool record(const uint8_t* at, const uint8_t* lo, const uint8_t* hi, const uint8_t** body, const uint8_t** end) {
  if (at < lo || at >= hi) return false;
  Reader r{at, hi};
  const uint32_t len = r.fixed<uint32_t>();
  if (!r.ok || len == 0 || len == 0xffffffffu || len > static_cast<uint64_t>(hi - r.p)) return false;
  *body = r.p;
  *end = r.p + len;
  return true;
}

/// What a CIE says that matters here.
struct Cie {
  uint64_t code_align = 1;
  int64_t data_align = 0;
  uint64_t ra_column = 0;
  uint8_t fde_enc = kPeAbsptr;
  bool z = false;  ///< augmentation data present (FDEs have it too)
  bool signal_frame = false;
  const uint8_t* insns = nullptr;
  const uint8_t* insns_end = nullptr;
};

bool parse_cie(const uint8_t* body, const uint8_t* end, Cie* c) noexcept {
  Reader r{body, end};
  if (r.fixed<uint32_t>() != 0) return false;  // a CIE's id in .eh_frame
  const uint8_t version = r.fixed<uint8_t>();
  if (version != 1 && version != 3) return false;
  const auto* aug = reinterpret_cast<const char*>(r.p);
  const std::size_t aug_len = strnlen(aug, static_cast<std::size_t>(end - r.p));
  r.skip(aug_len + 1);
  if (!r.ok || (aug[0] != '\0' && aug[0] != 'z')) return false;  // "eh" (pre-2000 GCC) and unknown ones
  c->code_align = r.uleb();
  c->data_align = r.sleb();
  c->ra_column = version == 1 ? r.fixed<uint8_t>() : r.uleb();
  if (aug[0] == 'z') {
    c->z = true;
    const uint64_t len = r.uleb();
    if (!r.need(len)) return false;
    Reader a{r.p, r.p + len};
    for (std::size_t i = 1; i < aug_len; ++i) {
      uint64_t ignored = 0;
      switch (aug[i]) {
        case 'R':
          c->fde_enc = a.fixed<uint8_t>();
          if (c->fde_enc & 0x80) return false;  // an indirect start address: not emitted for x86-64
          break;
        case 'L': (void)a.fixed<uint8_t>(); break;  // the LSDA's encoding: its pointer is in the FDE's data
        case 'P': {
          const uint8_t enc = a.fixed<uint8_t>();
          if ((enc & 0x70) == 0x50) return false;  // DW_EH_PE_aligned: not emitted for x86-64
          if (!read_encoded(a, enc, 0, false, &ignored)) return false;
          break;
        }
        case 'S': c->signal_frame = true; break;
        default: return false;  // not on x86-64 ('B', 'G': AArch64)
      }
      if (!a.ok) return false;
    }
    r.p += len;
  }
  c->insns = r.p;
  c->insns_end = end;
  return r.ok;
}

// ---- running CFA instructions ---------------------------------------------------------------

// DWARF register numbers on x86-64 (psABI): RBP 6, RSP 7, the return address column 16.
constexpr uint64_t kRegRbp = 6, kRegRsp = 7, kRegRa = 16;

enum class How : uint8_t { same, undefined, offset, other };
struct RegRule {
  How how = How::same;
  int64_t off = 0;  ///< bytes from the CFA, for How::offset
};
/// The rules in effect at one address, of what a walk needs.
struct Row {
  uint64_t cfa_reg = kRegRsp;
  int64_t cfa_off = 0;
  bool cfa_expr = false;
  RegRule rbp, rsp, ra;
};

struct Machine {
  static constexpr int kDepth = 8;  ///< DW_CFA_remember_state nesting kept (GCC emits one)
  Row row;
  Row initial;  ///< after the CIE's instructions: what DW_CFA_restore returns to
  Row saved[kDepth];
  int depth = 0;
  bool unknown = false;  ///< an instruction not understood: the rule is refused

  RegRule* reg(uint64_t n) noexcept {
    return n == kRegRbp ? &row.rbp : n == kRegRsp ? &row.rsp : n == kRegRa ? &row.ra : nullptr;
  }
  void set(uint64_t n, How how, int64_t off = 0) noexcept {
    if (RegRule* r = reg(n)) *r = RegRule{how, off};
  }
  void restore(uint64_t n) noexcept {
    if (RegRule* r = reg(n)) *r = n == kRegRbp ? initial.rbp : n == kRegRsp ? initial.rsp : initial.ra;
  }
  void set_factored(uint64_t n, int64_t factor, int64_t data_align) noexcept {
    int64_t off = 0;
    if (__builtin_mul_overflow(factor, data_align, &off)) unknown = true;
    else set(n, How::offset, off);
  }
};

/// Runs the CFA instructions [r.p, r.end) of an FDE (or CIE) starting at location `loc`, up
/// to the row that holds `target`. False if the instructions are malformed.
bool run(Reader r, const Cie& cie, uint64_t loc, uint64_t target, Machine& m) noexcept {
  // DW_CFA_* opcodes (DWARF 5 section 6.4.2, and the GNU ones GCC emits).
  enum : uint8_t {
    nop = 0x00, set_loc = 0x01, advance_loc1 = 0x02, advance_loc2 = 0x03, advance_loc4 = 0x04,
    offset_extended = 0x05, restore_extended = 0x06, undefined = 0x07, same_value = 0x08, register_ = 0x09,
    remember_state = 0x0a, restore_state = 0x0b, def_cfa = 0x0c, def_cfa_register = 0x0d, def_cfa_offset = 0x0e,
    def_cfa_expression = 0x0f, expression = 0x10, offset_extended_sf = 0x11, def_cfa_sf = 0x12,
    def_cfa_offset_sf = 0x13, val_offset = 0x14, val_offset_sf = 0x15, val_expression = 0x16,
    gnu_args_size = 0x2e, gnu_negative_offset_extended = 0x2f,
  };
  while (r.p < r.end) {
    const uint8_t op = r.fixed<uint8_t>();
    uint64_t advance = 0;
    switch (op >> 6) {
      case 1: advance = op & 0x3f; break;  // DW_CFA_advance_loc
      case 2: m.set_factored(op & 0x3f, static_cast<int64_t>(r.uleb()), cie.data_align); break;  // DW_CFA_offset
      case 3: m.restore(op & 0x3f); break;  // DW_CFA_restore
      default:
        switch (op) {
          case nop: break;
          case set_loc: {
            uint64_t to = 0;
            if (!read_encoded(r, cie.fde_enc, 0, true, &to)) return false;
            if (to > target) return true;
            loc = to;
            break;
          }
          case advance_loc1: advance = r.fixed<uint8_t>(); break;
          case advance_loc2: advance = r.fixed<uint16_t>(); break;
          case advance_loc4: advance = r.fixed<uint32_t>(); break;
          case offset_extended: {
            const uint64_t n = r.uleb();
            m.set_factored(n, static_cast<int64_t>(r.uleb()), cie.data_align);
            break;
          }
          case restore_extended: m.restore(r.uleb()); break;
          case undefined: m.set(r.uleb(), How::undefined); break;
          case same_value: m.set(r.uleb(), How::same); break;
          case register_: {
            const uint64_t n = r.uleb();
            (void)r.uleb();
            m.set(n, How::other);
            break;
          }
          case remember_state:
            if (m.depth == Machine::kDepth) return false;
            m.saved[m.depth++] = m.row;
            break;
          case restore_state:
            if (m.depth == 0) return false;
            m.row = m.saved[--m.depth];  // the CFA too, as libgcc does
            break;
          case def_cfa:
            m.row.cfa_reg = r.uleb();
            m.row.cfa_off = static_cast<int64_t>(r.uleb());
            m.row.cfa_expr = false;
            break;
          case def_cfa_register:
            m.row.cfa_reg = r.uleb();
            m.row.cfa_expr = false;
            break;
          case def_cfa_offset: m.row.cfa_off = static_cast<int64_t>(r.uleb()); break;
          case def_cfa_expression:
            r.skip(r.uleb());
            m.row.cfa_expr = true;
            break;
          case expression:
          case val_expression: {
            const uint64_t n = r.uleb();
            r.skip(r.uleb());
            m.set(n, How::other);
            break;
          }
          case offset_extended_sf: {
            const uint64_t n = r.uleb();
            m.set_factored(n, r.sleb(), cie.data_align);
            break;
          }
          case def_cfa_sf:
            m.row.cfa_reg = r.uleb();
            if (__builtin_mul_overflow(r.sleb(), cie.data_align, &m.row.cfa_off)) return false;
            m.row.cfa_expr = false;
            break;
          case def_cfa_offset_sf:
            if (__builtin_mul_overflow(r.sleb(), cie.data_align, &m.row.cfa_off)) return false;
            break;
          case val_offset: {
            const uint64_t n = r.uleb();
            (void)r.uleb();
            m.set(n, How::other);
            break;
          }
          case val_offset_sf: {
            const uint64_t n = r.uleb();
            (void)r.sleb();
            m.set(n, How::other);
            break;
          }
          case gnu_args_size: (void)r.uleb(); break;
          case gnu_negative_offset_extended: {
            const uint64_t n = r.uleb();
            // Negated as unsigned: a garbage operand of 2^63 must not overflow a signed negation.
            m.set_factored(n, static_cast<int64_t>(0 - r.uleb()), cie.data_align);
            break;
          }
          default: return false;  // DW_CFA_GNU_window_save (SPARC, AArch64's negate_ra_state), vendor ones
        }
    }
    if (!r.ok || m.unknown) return false;
    if (advance != 0) {
      loc += advance * cie.code_align;
      if (loc > target) return true;
    }
  }
  return r.ok;
}

/// The rule a walk keeps for the row `m` ended on.
uint64_t compile(const Row& row) noexcept {
  if (row.ra.how == How::undefined) return ends(kEndOutermost);
  if (row.cfa_expr || (row.cfa_reg != kRegRsp && row.cfa_reg != kRegRbp)) return refused(kWhyRule);
  if (row.ra.how != How::offset || row.ra.off < INT8_MIN || row.ra.off > INT8_MAX) return refused(kWhyRule);
  if (row.rsp.how != How::same) return refused(kWhyRule);
  if (row.cfa_off < INT32_MIN || row.cfa_off > INT32_MAX) return refused(kWhyRule);
  Rule rule{static_cast<int32_t>(row.cfa_off), 0, static_cast<int8_t>(row.ra.off), kStep};
  if (row.cfa_reg == kRegRbp) rule.bits |= kCfaRbp;
  if (row.rbp.how == How::offset) {
    if (row.rbp.off < INT16_MIN || row.rbp.off > INT16_MAX) return refused(kWhyRule);
    rule.rbp_off = static_cast<int16_t>(row.rbp.off);
    rule.bits |= kRbpSaved;
  } else if (row.rbp.how != How::same) {
    return refused(kWhyRule);
  }
  return std::bit_cast<uint64_t>(rule);
}

/// The rule for code address `key` from its object's .eh_frame_hdr (at `hdr`, within the
/// loaded segment [lo, hi)).
uint64_t rule_from(uint64_t key, const uint8_t* hdr, const uint8_t* lo, const uint8_t* hi) noexcept {
  Reader r{hdr, hi};
  const uint8_t version = r.fixed<uint8_t>();
  const uint8_t frame_enc = r.fixed<uint8_t>();
  const uint8_t count_enc = r.fixed<uint8_t>();
  const uint8_t table_enc = r.fixed<uint8_t>();
  uint64_t ignored = 0, count = 0;
  const uint64_t base = reinterpret_cast<uintptr_t>(hdr);
  // Without a sorted table (libgcc then searches .eh_frame linearly): rare, and left to it.
  if (version != 1 || count_enc == kPeOmit || table_enc != (kPeDatarel | kPeS4) ||
      !read_encoded(r, frame_enc, base, true, &ignored) || !read_encoded(r, count_enc, base, true, &count) ||
      count == 0 || count > static_cast<uint64_t>(hi - r.p) / 8)
    return refused(kWhyRule);
  const uint8_t* table = r.p;
  auto initial = [&](uint64_t i) {
    int32_t v;
    std::memcpy(&v, table + 8 * i, 4);
    return base + static_cast<uint64_t>(int64_t{v});
  };
  if (key < initial(0)) return ends(kEndNoFde);
  uint64_t a = 0, b = count;  // the last entry whose start is <= key: in [a, b)
  while (b - a > 1) {
    const uint64_t mid = a + (b - a) / 2;
    if (initial(mid) <= key) a = mid;
    else b = mid;
  }
  int32_t fde_off;
  std::memcpy(&fde_off, table + 8 * a + 4, 4);
  const uint8_t* body = nullptr;
  const uint8_t* end = nullptr;
  if (!record(hdr + fde_off, lo, hi, &body, &end)) return refused(kWhyRule);
  Reader f{body, end};
  const uint32_t cie_delta = f.fixed<uint32_t>();
  const uint8_t* cie_body = nullptr;
  const uint8_t* cie_end = nullptr;
  Cie cie;
  if (cie_delta == 0 || static_cast<uint64_t>(body - lo) < cie_delta ||
      !record(body - cie_delta, lo, hi, &cie_body, &cie_end) || !parse_cie(cie_body, cie_end, &cie))
    return refused(kWhyRule);
  if (cie.signal_frame || cie.ra_column != kRegRa) return refused(kWhyRule);
  uint64_t start = 0, range = 0;
  if (!read_encoded(f, cie.fde_enc, 0, true, &start) || !read_encoded(f, cie.fde_enc & 0x0f, 0, false, &range))
    return refused(kWhyRule);
  if (key < start || key - start >= range) return ends(kEndNoFde);  // in a gap between FDEs
  if (cie.z) f.skip(f.uleb());
  if (!f.ok) return refused(kWhyRule);
  Machine m;
  if (!run(Reader{cie.insns, cie.insns_end}, cie, 0, ~uint64_t{0}, m)) return refused(kWhyRule);
  m.initial = m.row;
  m.depth = 0;
  if (!run(f, cie, start, key, m)) return refused(kWhyRule);
  return compile(m.row);
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
