// cuwarden daemon base: the characters Debian's toml++ 3.3.0 cannot be given.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace cuw::daemon {

/// The first character of `text` on which toml++ 3.3.0 reaches __builtin_unreachable
/// (undefined behaviour, not an error) when its parser asks whether it is whitespace:
/// is_non_ascii_horizontal_whitespace() has no case for U+00A1..U+0499, U+2C5E..U+2FFF,
/// U+3001..U+3057 and U+FB26..U+FEFE (upstream marzer/tomlplusplus issues 190 and 295, fixed
/// after 3.3.0). Latin-1 letters, Greek and Cyrillic are among them, so such characters are
/// refused anywhere in a file (in a comment too) before toml++ sees it. Sets *line and
/// *column (1-based; the column in bytes) and returns the code point, or 0 when there is none.
/// Bytes that are not UTF-8 are left to toml++, which refuses them. Thread-safe.
char32_t toml_unsafe_char(std::string_view text, std::size_t* line, std::size_t* column);

/// "FILE:LINE:COLUMN: character U+XXXX is not accepted in a WHAT (...)" for what
/// toml_unsafe_char found, or "" when `text` has none.
std::string toml_unsafe_message(std::string_view text, const std::string& source, std::string_view what);

}  // namespace cuw::daemon
