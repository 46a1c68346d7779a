// cuwarden daemon view: out-of-memory reports (model/state.hpp OomReport) as the CLI's
// `cuwarden oom` and the JSON API read them.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "cuw/frames.hpp"
#include "model/snapshot.hpp"
#include "model/state.hpp"

namespace cuw::daemon {

/// A report: {pid, process_name, user, time_ns, kind, api, device, bytes, cap_bytes (null:
/// no cap), used_after, result, asked_at (the refused call's site's printed form, cuw/frames.hpp,
/// told apart from the sites listed; null: none captured), exact, index, sites: [{live_bytes,
/// live_allocations, frame}]}
/// with the top `top` call sites of the device by live bytes; `named` is the report's
/// snapshot with its frames named (symbolize). `index`: how many reports of the process are
/// newer (what `cuwarden snapshot --oom N` takes); `rules`: the frame classes (null: the
/// built-in ones). Pure.
nlohmann::ordered_json oom_json(const OomReport& r, const Snapshot& named, std::size_t index, std::size_t top = 3,
                                const frames::Rules* rules = nullptr);

}  // namespace cuw::daemon
