// cuwarden common: printable() (see cuw/text.hpp).
#include "cuw/text.hpp"

#include <cstdint>

namespace cuw {

std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out += (c < 0x20 || c == 0x7f) ? '?' : static_cast<char>(c);
      ++i;
      continue;
    }
    // A multi-byte sequence: its length from the lead byte, each continuation 10xxxxxx, and
    // the code point neither overlong, nor a surrogate, nor past U+10FFFF.
    const std::size_t n = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? (c <= 0xef ? 3 : 0) : c >= 0xc2 ? 2 : 0;
    uint32_t cp = n == 2 ? c & 0x1f : n == 3 ? c & 0x0f : c & 0x07;
    bool ok = n != 0 && i + n <= s.size();
    for (std::size_t k = 1; ok && k < n; ++k) {
      const auto x = static_cast<unsigned char>(s[i + k]);
      ok = (x & 0xc0) == 0x80;
      cp = cp << 6 | (x & 0x3f);
    }
    ok = ok && !(n == 3 && cp < 0x800) && !(n == 4 && cp < 0x10000) && !(cp >= 0xd800 && cp <= 0xdfff) &&
         cp <= 0x10ffff;
    if (!ok) {
      out += '?';
      ++i;
      continue;
    }
    if (cp <= 0x9f) out += '?';  // C1 controls
    else out.append(s.substr(i, n));
    i += n;
  }
  return out;
}

}  // namespace cuw
