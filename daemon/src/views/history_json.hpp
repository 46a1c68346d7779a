// cuwarden daemon view: the history document of the HTTP API (docs/http.md, "History").
#pragma once

#include <nlohmann/json.hpp>

#include "model/series.hpp"

namespace cuw::daemon {

/// `/api/v1/history`: range, interval, time, then every process's, job's and GPU's series,
/// each as parallel arrays (t in unix seconds; caps null where there is none). Pure.
nlohmann::ordered_json history_json(const HistoryCopy& h);

/// `/api/v1/processes/PID/history`: the first process of `h` alone (h holds one). Pure.
nlohmann::ordered_json process_history_json(const HistoryCopy& h);

}  // namespace cuw::daemon
