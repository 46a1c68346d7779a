// cuwarden daemon view: out-of-memory reports (model/state.hpp OomReport) as the CLI's
// `cuwarden oom` and the JSON API read them, and the one-line name of a call site.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "model/snapshot.hpp"
#include "model/state.hpp"

namespace cuw::daemon {

/// One line naming call site `site` of `s` for people: its innermost Python frame
/// ("train.py:42 in step") when it has one, else its first native frame outside the CUDA
/// runtime and driver ("forward (model.cpp:88)"), else "(no call site)". Pure.
std::string site_line(const Snapshot& s, uint32_t site);

/// A report: {pid, process_name, user, time_ns, kind, api, device, bytes, cap_bytes (null:
/// no cap), used_after, result, asked_at (the refused call's site as site_line() names it;
/// null: none captured), exact, index, sites: [{live_bytes, live_allocations, frame}]}
/// with the top `top` call sites of the device by live bytes; `named` is the report's
/// snapshot with its frames named (symbolize). `index`: how many reports of the process are
/// newer (what `cuwarden snapshot --oom N` takes). Pure.
nlohmann::ordered_json oom_json(const OomReport& r, const Snapshot& named, std::size_t index, std::size_t top = 3);

}  // namespace cuw::daemon
