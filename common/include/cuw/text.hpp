// cuwarden common: text that another user wrote (a process name, a job name, a function
// name from a module) made safe to show in a terminal, by the daemon's views and the CLI alike.
#pragma once

#include <string>
#include <string_view>

namespace cuw {

/// `s` with every byte that could act on a terminal replaced by '?': C0 controls
/// (U+0000..U+001F, ESC among them), DEL (U+007F), C1 controls (U+0080..U+009F, UTF-8
/// C2 80..C2 9F: some terminals act on U+009B as on ESC [), and every byte that is not part of
/// a valid UTF-8 sequence (overlong forms and surrogates included), so that a lone 0x9B cannot
/// reach a terminal that reads Latin-1 either. The result is valid UTF-8 with the same
/// printable characters. Pure; thread-safe.
std::string printable(std::string_view s);

}  // namespace cuw
