// cuwarden interposer core: a return address's rule from .eh_frame (eh_frame.hpp): the
// .eh_frame_hdr table searched, the FDE and CIE parsed, their CFA instructions run.
#include "core/callsites/eh_frame.hpp"

#include <cstddef>
#include <cstring>

namespace cuw::core::unwind::detail {

// x86-64 only (elsewhere walk() falls back at once and asks for no rule).
#if defined(__x86_64__)
namespace {

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

}  // namespace

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
#endif  // __x86_64__

}  // namespace cuw::core::unwind::detail
