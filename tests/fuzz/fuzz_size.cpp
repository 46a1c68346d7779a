// cuwarden fuzz target: sizes and caps as users type them (CUWARDEN_LIMIT, --limit).
// Invariants: no crash; an accepted absolute size prints back (str()) to a text that parses
// to the same number of bytes; percentages are in (0, 1]; per-device ordinals are 0..63.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "cuw/size.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string why;
  for (bool allow_percent : {false, true}) {
    why.clear();
    auto s = cuw::parse_size(text, allow_percent, &why);
    if (!s) {
      if (why.empty()) std::abort();  // a refusal always says why
      continue;
    }
    if (s->percent) {
      if (!allow_percent || !(s->share > 0.0 && s->share <= 1.0)) std::abort();
      (void)s->resolve(~0ull);
      (void)s->resolve(0);
    } else {
      (void)cuw::format_mib(s->bytes);
    }
    (void)s->str();
  }
  why.clear();
  if (auto l = cuw::parse_limit(text, &why)) {
    for (const auto& [ordinal, spec] : l->per_device) {
      if (ordinal < 0 || ordinal > 63) std::abort();
      (void)spec.str();
    }
    for (int d = -1; d < 65; ++d) (void)l->for_device(d);
  } else if (why.empty()) {
    std::abort();
  }
  if (size >= 8) {
    uint64_t v;
    __builtin_memcpy(&v, data, 8);
    (void)cuw::format_bytes(v);
    (void)cuw::format_mib(v);
  }
  return 0;
}
