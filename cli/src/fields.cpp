// cuwarden CLI: the fields of --query-compute-apps (see fields.hpp).
#include "fields.hpp"

#include <algorithm>
#include <cmath>

#include "json_access.hpp"

namespace cuw::cli {

using json = nlohmann::ordered_json;

namespace {

/// nvidia-smi's fields, in its order; used_memory is the `used` counter's row.
constexpr const char* kNvidiaSmi[] = {"pid", "process_name", "used_memory", "gpu_uuid", "gpu_name", "gpu_bus_id",
                                      "timestamp"};

/// What a field that is not a device counter reads: the state, the process entry, its device
/// entry and the state's GPU entries by UUID.
struct Row {
  const json& st;
  const json& p;
  const json& d;
  const std::map<std::string, json>& gpu_by_uuid;
};

/// Every field that is not a device counter: nvidia-smi's (but used_memory), then cuwarden's
/// own, in the order they are listed. Adding one is one line here.
struct Own {
  const char* name;
  CellKind kind;
  const char* help;
  Cell (*cell)(const Row&);
};
constexpr Own kOwn[] = {
    {"pid", CellKind::integer, "Process id, as the host sees it",
     [](const Row& r) { return jcell(r.p, "pid", CellKind::integer); }},
    {"process_name", CellKind::text, "Process name, from its command line",
     [](const Row& r) { return Cell::str(jstr(r.p, "process_name")); }},
    {"gpu_uuid", CellKind::text, "UUID of the GPU", [](const Row& r) { return Cell::str(jstr(r.d, "uuid")); }},
    {"gpu_name", CellKind::text, "Product name of the GPU", [](const Row& r) { return Cell::str(jstr(r.d, "name")); }},
    {"gpu_bus_id", CellKind::text, "PCI bus id of the GPU (from NVML; [N/A] without it)",
     [](const Row& r) {
       auto it = r.gpu_by_uuid.find(jstr(r.d, "uuid"));
       return it != r.gpu_by_uuid.end() && it->second.contains("bus_id") ? Cell::str(jstr(it->second, "bus_id"))
                                                                         : Cell::none();
     }},
    {"timestamp", CellKind::text, "When the daemon answered, local time: YYYY/MM/DD HH:MM:SS.mmm",
     [](const Row& r) { return Cell::str(local_time(jnum(r.st, "time_ns"), "%Y/%m/%d %H:%M:%S", true)); }},
    {"job", CellKind::text, "The job (CUWARDEN_JOB) the process belongs to, or empty",
     [](const Row& r) { return Cell::str(jstr(r.p, "job")); }},
    {"user", CellKind::text, "The user the process runs as", [](const Row& r) { return Cell::str(jstr(r.p, "user")); }},
    {"fragmentation", CellKind::text,
     "Share of a pool's free large blocks that one request cannot get: 0 % under vmm (it stitches), [N/A] without a "
     "pool",
     [](const Row& r) {
       const std::string pool = jstr(r.p, "pool", "off");
       if (pool.empty() || pool == "off") return Cell::none();
       const double free = jnum(r.d, "pool_free_bytes"), largest = jnum(r.d, "pool_largest_free_bytes");
       const long pct = free > 0 ? std::lround(100.0 * (1.0 - std::min(largest, free) / free)) : 0;
       return Cell::str(std::to_string(pct) + " %");
     }},
    {"driver_used_memory", CellKind::bytes,
     "What NVML says the process holds on the GPU (context and modules included)",
     [](const Row& r) { return jcell(r.d, "driver_used_bytes", CellKind::bytes); }},
    {"outside_cap_memory", CellKind::bytes, "Of the driver's figure, what no cap counts",
     [](const Row& r) { return jcell(r.d, "outside_cap_bytes", CellKind::bytes); }},
    {"cap_scope", CellKind::text,
     "What the process's caps count: allocations, or process (also its context and modules)",
     [](const Row& r) { return Cell::str(jstr(r.p, "cap_scope", "allocations")); }},
    {"state", CellKind::text,
     "running, or suspended (its device memory on the host: used_memory is 0 until it is resumed)",
     [](const Row& r) { return Cell::str(jstr(r.p, "state")); }},
    {"suspended_host_memory", CellKind::bytes,
     "While suspended, the device memory the process holds on the host ([N/A] while it runs)",
     [](const Row& r) { return jcell(r.p, "suspended_host_bytes", CellKind::bytes); }},
    {"suspended_since", CellKind::text,
     "While suspended, since when, local time: YYYY/MM/DD HH:MM:SS.mmm ([N/A] while it runs)",
     [](const Row& r) {
       if (!r.p.contains("suspended_since_ns") || !r.p["suspended_since_ns"].is_number_unsigned()) return Cell::none();
       return Cell::str(local_time(jnum(r.p, "suspended_since_ns"), "%Y/%m/%d %H:%M:%S", true));
     }},
};
const Own* own_named(const std::string& name) {
  for (const auto& o : kOwn)
    if (name == o.name) return &o;
  return nullptr;
}
/// Other names nvidia-smi accepts for the same field.
struct Alias {
  const char* alias;
  const char* name;
};
constexpr Alias kAliases[] = {{"name", "process_name"}, {"used_gpu_memory", "used_memory"}};

QueryField own_field(const Own& o) { return {o.name, o.name, o.kind, "", o.help}; }

QueryField counter_field(const counters::Info& row) {
  QueryField f;
  f.name = std::string(row.query);
  f.header = f.name == "used_memory" ? "used_gpu_memory" : f.name;  // nvidia-smi's CSV header
  f.kind = row.unit == counters::Unit::bytes ? CellKind::bytes : CellKind::integer;
  f.key = std::string(row.json);
  f.help = std::string(row.help);
  return f;
}

}  // namespace

std::vector<QueryField> query_fields(std::span<const counters::Info> counters) {
  std::vector<QueryField> out;
  auto counter_named = [&](const std::string& name) -> const counters::Info* {
    for (const auto& row : counters)
      if (row.query == name) return &row;
    return nullptr;
  };
  auto theirs = [](std::string_view name) {
    return std::find(std::begin(kNvidiaSmi), std::end(kNvidiaSmi), name) != std::end(kNvidiaSmi);
  };
  for (const char* name : kNvidiaSmi) {
    if (const counters::Info* row = counter_named(name)) out.push_back(counter_field(*row));
    else if (const Own* o = own_named(name)) out.push_back(own_field(*o));
  }
  for (const auto& row : counters)
    if (!row.query.empty() && !theirs(row.query)) out.push_back(counter_field(row));
  for (const auto& o : kOwn)
    if (!theirs(o.name)) out.push_back(own_field(o));
  return out;
}

const QueryField* find_query_field(const std::vector<QueryField>& fields, const std::string& name) {
  for (const auto& f : fields)
    if (f.name == name) return &f;
  std::string n = name;
  for (const auto& a : kAliases)
    if (n == a.alias) n = a.name;
  for (const auto& f : fields)
    if (f.name == n) return &f;
  return nullptr;
}

std::string query_fields_reference(std::span<const counters::Info> counters) {
  std::string out = "List of valid properties to query for the switch \"--query-compute-apps=\":\n";
  for (const auto& f : query_fields(counters)) {
    out += "\n\"" + f.name + "\"";
    for (const auto& a : kAliases)
      if (f.name == a.name) out += std::string(" or \"") + a.alias + "\"";
    out += "\n" + f.help + (f.kind == CellKind::bytes ? " (MiB in CSV; bytes with --format=json)" : "") + ".\n";
  }
  return out;
}

std::string query_fields_help(std::span<const counters::Info> counters) {
  std::string nvidia, own;
  for (const auto& f : query_fields(counters)) {
    const bool theirs = std::find(std::begin(kNvidiaSmi), std::end(kNvidiaSmi), f.name) != std::end(kNvidiaSmi);
    std::string& s = theirs ? nvidia : own;
    s += (s.empty() ? "" : ", ") + f.name;
  }
  return "comma-separated fields, as nvidia-smi: " + nvidia + "; cuwarden's own: " + own;
}

const std::vector<QueryField>& gpu_query_fields() {
  static const std::vector<QueryField> fields = {
      {"index", "index", CellKind::integer, "", "The GPU's number, as cuwarden and NVML number it"},
      {"uuid", "uuid", CellKind::text, "", "UUID of the GPU"},
      {"name", "name", CellKind::text, "", "Product name of the GPU"},
      {"pci.bus_id", "pci.bus_id", CellKind::text, "", "PCI bus id of the GPU (from NVML; [N/A] without it)"},
      {"memory.total", "memory.total", CellKind::bytes, "", "The GPU's memory"},
      {"memory.used", "memory.used", CellKind::bytes, "",
       "Memory in use on the GPU: the driver's figure (NVML), else what cuwarden tracks of its processes"},
      {"memory.free", "memory.free", CellKind::bytes, "", "memory.total less memory.used"},
      {"memory.reserved", "memory.reserved", CellKind::bytes, "",
       "Memory the driver and firmware keep for themselves ([N/A]: cuwarden does not know it)"},
      {"count", "count", CellKind::integer, "", "How many GPUs the daemon knows"},
      {"driver_version", "driver_version", CellKind::text, "", "The driver's version (from NVML; [N/A] without it)"},
      {"timestamp", "timestamp", CellKind::text, "", "When the daemon answered, local time: YYYY/MM/DD HH:MM:SS.mmm"},
  };
  return fields;
}

std::string gpu_fields_reference() {
  std::string out = "List of valid properties to query for the switch \"--query-gpu=\":\n";
  for (const auto& f : gpu_query_fields())
    out += "\n\"" + f.name + "\"\n" + f.help +
           (f.kind == CellKind::bytes ? " (MiB in CSV; bytes with --format=json)" : "") + ".\n";
  return out;
}

Cell gpu_query_cell(const QueryField& f, const json& st, const json& g) {
  const std::string& n = f.name;
  const bool driver = g.contains("driver_used_bytes") && g["driver_used_bytes"].is_number_unsigned();
  const uint64_t total = jnum(g, "memory_total_bytes");
  const uint64_t used = driver ? g["driver_used_bytes"].get<uint64_t>() : jnum(g, "used_bytes");
  if (n == "index") return jcell(g, "index", CellKind::integer);
  if (n == "uuid") return Cell::str(jstr(g, "uuid"));
  if (n == "name") return Cell::str(jstr(g, "name"));
  if (n == "pci.bus_id") return g.contains("bus_id") ? Cell::str(jstr(g, "bus_id")) : Cell::none();
  if (n == "memory.total") return jcell(g, "memory_total_bytes", CellKind::bytes);
  if (n == "memory.used") return Cell::bytes(used);
  if (n == "memory.free") return Cell::bytes(total > used ? total - used : 0);
  if (n == "count") return Cell::num(jarr(st, "gpus").size());
  if (n == "driver_version")
    return st.contains("driver_version") ? Cell::str(jstr(st, "driver_version")) : Cell::none();
  if (n == "timestamp") return Cell::str(local_time(jnum(st, "time_ns"), "%Y/%m/%d %H:%M:%S", true));
  return Cell::none();  // memory.reserved
}

Cell query_cell(const QueryField& f, const json& st, const json& p, const json& d,
                const std::map<std::string, json>& gpu_by_uuid) {
  if (!f.key.empty()) return jcell(d, f.key.c_str(), f.kind);
  if (const Own* o = own_named(f.name)) return o->cell(Row{st, p, d, gpu_by_uuid});
  return Cell::none();
}

}  // namespace cuw::cli
