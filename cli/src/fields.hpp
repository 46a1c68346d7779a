// cuwarden CLI: the fields of --query-compute-apps. nvidia-smi's own fields and cuwarden's
// process fields are one table in fields.cpp (name, kind, help, how its cell is read); every
// device counter that has a query name in its row (counters.hpp) is one too, so a counter
// added there can be queried with no change here.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "cuw/counters.hpp"
#include "table.hpp"

namespace cuw::cli {

/// One field a user may name.
struct QueryField {
  std::string name;    ///< as typed ("used_memory")
  std::string header;  ///< the CSV header, nvidia-smi's spelling where it has one ("used_gpu_memory")
  CellKind kind = CellKind::text;
  std::string key;     ///< device counters: the key in the daemon's device entry; else empty
  std::string help;    ///< what it holds, one sentence
};

/// Every field, nvidia-smi's first, then cuwarden's, with the rows of `counters` that have a
/// query name in the list's order. The default list is the real one; tests pass a longer one.
std::vector<QueryField> query_fields(std::span<const counters::Info> counters = counters::kDevice);

/// The field named `name` (an alias such as nvidia-smi's `used_gpu_memory` included), or null.
const QueryField* find_query_field(const std::vector<QueryField>& fields, const std::string& name);

/// What `cuwarden --help-query-compute-apps` prints, as nvidia-smi's option of that name: each
/// field quoted (with its other name, if any) and what it holds. Shell completion reads it.
std::string query_fields_reference(std::span<const counters::Info> counters = counters::kDevice);

/// "pid, process_name, ..." for --help.
std::string query_fields_help(std::span<const counters::Info> counters = counters::kDevice);

/// The cell of field `f` for process `p` on device entry `d` of state `st`; `gpu_by_uuid`
/// holds the state's GPU entries. A key the state lacks gives an empty cell ([N/A]).
Cell query_cell(const QueryField& f, const nlohmann::ordered_json& st, const nlohmann::ordered_json& p,
                const nlohmann::ordered_json& d, const std::map<std::string, nlohmann::ordered_json>& gpu_by_uuid);

/// The fields of --query-gpu, nvidia-smi's names and headers: index, uuid, name, pci.bus_id,
/// memory.total/used/free/reserved, count, driver_version, timestamp.
const std::vector<QueryField>& gpu_query_fields();

/// What `cuwarden --help-query-gpu` prints: each field quoted and what it holds.
std::string gpu_fields_reference();

/// The cell of --query-gpu field `f` for GPU entry `g` of state `st`. What the daemon does
/// not know (no NVML: the bus id, the driver's own figures) is an empty cell ([N/A]).
Cell gpu_query_cell(const QueryField& f, const nlohmann::ordered_json& st, const nlohmann::ordered_json& g);

/// The title of counter `id` when a table shows it ("Used", "OOMs").
inline std::string column_title(counters::Id id) {
  return std::string(counters::kDevice[static_cast<std::size_t>(id)].column);
}
/// How a cell of counter `id` prints: bytes or a plain count.
inline CellKind cell_kind(counters::Id id) {
  return counters::kDevice[static_cast<std::size_t>(id)].unit == counters::Unit::bytes ? CellKind::bytes
                                                                                      : CellKind::integer;
}
/// The state JSON key of counter `id` ("used_bytes", "ooms").
inline const char* json_key(counters::Id id) { return counters::kDevice[static_cast<std::size_t>(id)].json.data(); }

}  // namespace cuw::cli
