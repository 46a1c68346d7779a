// cuwarden CLI: the rows of `cuwarden events`, shared with `cuwarden top`'s detail view.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "table.hpp"

namespace cuw::cli {

/// The columns of an event line: fixed widths, since lines print as events come
/// (render_line with a null row gives the header).
Table events_table();

/// One event of get_events' reply as cells of events_table(): local time to the
/// millisecond, pid, API, kind, GPU, bytes ("none" for a limit change to no cap), address,
/// used bytes after it, and who made a change that came through the daemon.
std::vector<Cell> event_row(const nlohmann::ordered_json& e);

}  // namespace cuw::cli
