// cuwarden interposer core: the rule a walk keeps for one return address (one word, in
// unwind.cpp's table), and how it is made from the .eh_frame of the object holding the
// address: its FDE found through .eh_frame_hdr's sorted table, its CIE's and FDE's CFA
// instructions run up to the address, the row reached compiled into a Rule (x86-64).
#pragma once

#include <bit>
#include <cstdint>

namespace cuw::core::unwind::detail {

/// What a rule tells the walk (Rule::bits & kKindMask).
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

#if defined(__x86_64__)
/// The rule for code address `key` from its object's .eh_frame_hdr (at `hdr`, within the
/// loaded segment [lo, hi)): kStep, kEnd (kEndOutermost, kEndNoFde) or kRefuse (kWhyRule),
/// never kEmpty. Reads nothing outside [lo, hi). Cold (parses and runs the CFI); thread-safe; call it with the object
/// loaded (inside dl_iterate_phdr's callback, which holds the loader's lock).
uint64_t rule_from(uint64_t key, const uint8_t* hdr, const uint8_t* lo, const uint8_t* hi) noexcept;
#endif

}  // namespace cuw::core::unwind::detail
