// cuwarden interposer core: which run directory this process may use.
#pragma once

#include <string>

namespace cuw::core {

/// The run directory a process of effective uid `uid` uses, given CUWARDEN_RUN_DIR's `dir`.
/// `dir` itself when it is a real directory (never a link) owned by root or by `uid`, and not
/// writable by others unless sticky; otherwise (absent, or another user's, who could delete
/// or replace every file in it) a per-user one: `<dir>-<uid>`, else `$XDG_RUNTIME_DIR/cuwarden`,
/// each made 0700 when absent and used only when it is `uid`'s and writable by nobody else.
/// Never creates `dir` itself nor any parent. Empty when none is usable (the ring is then
/// private). `*note` (empty when `dir` was used) says what was done, in one sentence;
/// `*suspicious` is true when `dir` belongs to another user (a warning, not a mere
/// absence). Reads and makes directories: call it only from the first CUDA call on.
std::string choose_run_dir(const std::string& dir, unsigned uid, std::string* note, bool* suspicious);

}  // namespace cuw::core
