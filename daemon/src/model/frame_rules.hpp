// cuwarden daemon model: a site's own frame classes (`cuwardend --frames FILE`, default
// /etc/cuwarden/frames.toml), read with toml++, added before the built-in rules of
// common/include/cuw/frames.hpp, so that a site names its own framework or allocator library
// and the views fold it as they fold PyTorch's. The file:
//
//   [[rule]]
//   path = "/opt/lab/lib/libslab"   # part of a native module's path or a Python file's path
//   class = "framework"             # user, framework, cuda, interpreter, libc, cuwarden
//
// Rules are checked in the file's order; the first whose path part a frame's path contains
// gives its class.
#pragma once

#include <string>
#include <vector>

#include "cuw/frames.hpp"

namespace cuw::daemon {

/// The default site list (absent: the built-in rules alone).
inline constexpr const char* kDefaultFramesFile = "/etc/cuwarden/frames.toml";

/// Adds the rules of the TOML file `path` to `*rules`. Returns false with `*error` set when
/// the file cannot be read (a missing file is an error only when `must_exist`: the default
/// file is optional), is not TOML, or a rule lacks its path, has an unknown class or an
/// unknown key; then `*rules` is unchanged. Cold; not thread-safe on `rules`.
bool load_frame_rules(const std::string& path, bool must_exist, frames::Rules* rules, std::string* error);

}  // namespace cuw::daemon
