// cuwarden interposer: a minimal printf-style log, used only off the allocation path
// (configuration, ring creation, warnings). Deliberately not spdlog: inside someone else's
// process we want one write(2) per line, no registry, no static objects, no threads.
#pragma once

#include <string>

namespace cuw::log {

/// The level a CUWARDEN_LOG value names: 0 trace, 1 debug, 2 info, 3 warn, 4 error, 5 critical,
/// 6 off; -1 for anything else (`name` must not be null). No allocation; thread-safe.
int parse_level(const char* name) noexcept;

/// Set the level (parse_level's number) and, unless a line was already written (which
/// settles it from CUWARDEN_LOG_FILE), the destination (empty = stderr). Opens the file, so
/// call only from the first CUDA call onwards. Lines to a file begin with the time (UTC) and
/// the process id; lines to stderr are the message alone.
void init(int level, const std::string& file);

/// Whether debug() writes lines (CUWARDEN_LOG=debug or trace): for a caller whose line takes
/// work to gather (a lock, counters). No allocation; thread-safe.
bool debug_enabled() noexcept;

void debug(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void info(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void warn(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
/// Written whatever the level: configuration errors the user must see.
void always(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace cuw::log
