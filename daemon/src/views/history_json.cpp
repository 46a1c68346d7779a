// cuwarden daemon view: history document (see history_json.hpp).
#include "views/history_json.hpp"

#include "cuw/job.hpp"
#include "cuw/ring.hpp"

namespace cuw::daemon {

using json = nlohmann::ordered_json;

namespace {

json process_json(const HistoryCopy::Process& p) {
  json devices = json::array();
  for (const auto& d : p.devices) {
    json t = json::array(), used = json::array(), reserved = json::array(), peak = json::array(),
         limit = json::array();
    for (const auto& pt : d.points) {
      t.push_back(pt.t);
      used.push_back(pt.v[0]);
      reserved.push_back(pt.v[1]);
      peak.push_back(pt.v[2]);
      limit.push_back(pt.v[3] == ring::kNoLimit ? json(nullptr) : json(pt.v[3]));
    }
    devices.push_back({{"ordinal", d.ordinal},
                       {"uuid", d.uuid},
                       {"gpu_index", d.gpu_index},
                       {"t", std::move(t)},
                       {"used_bytes", std::move(used)},
                       {"reserved_bytes", std::move(reserved)},
                       {"peak_bytes", std::move(peak)},
                       {"limit_bytes", std::move(limit)}});
  }
  json ooms = json::array();
  for (const auto& o : p.ooms)
    ooms.push_back({{"time_ns", o.time_ns}, {"ordinal", o.ordinal}, {"bytes", o.bytes}, {"kind", ring::kind_name(o.kind)}});
  return {{"pid", p.pid},
          {"start_time", p.start_time},
          {"process_name", p.name},
          {"user", p.user},
          {"job", p.job},
          {"state", p.exited ? "exited" : "running"},
          {"devices", std::move(devices)},
          {"ooms", std::move(ooms)}};
}

void header(json& out, const HistoryCopy& h) {
  out["range"] = h.day ? "day" : "hour";
  out["interval_s"] = h.day ? 60 : 1;
  out["time_ns"] = h.time_ns;
}

}  // namespace

json history_json(const HistoryCopy& h) {
  json out = json::object();
  header(out, h);
  json procs = json::array();
  for (const auto& p : h.processes) procs.push_back(process_json(p));
  json jobs = json::array();
  for (const auto& j : h.jobs) {
    json gpus = json::array();
    for (const auto& g : j.gpus) {
      json t = json::array(), used = json::array(), limit = json::array();
      for (const auto& pt : g.points) {
        t.push_back(pt.t);
        used.push_back(pt.v[0]);
        limit.push_back(pt.v[1] == job::kNoLimit ? json(nullptr) : json(pt.v[1]));
      }
      gpus.push_back({{"uuid", g.uuid},
                      {"gpu_index", g.gpu_index},
                      {"t", std::move(t)},
                      {"used_bytes", std::move(used)},
                      {"limit_bytes", std::move(limit)}});
    }
    jobs.push_back({{"name", j.name}, {"user", j.user}, {"gpus", std::move(gpus)}});
  }
  json gpus = json::array();
  for (const auto& g : h.gpus) {
    json t = json::array(), used = json::array(), driver = json::array();
    for (const auto& pt : g.points) {
      t.push_back(pt.t);
      used.push_back(pt.v[0]);
      driver.push_back(pt.v[1] == HistoryCopy::kUnknown ? json(nullptr) : json(pt.v[1]));
    }
    gpus.push_back({{"index", g.index},
                    {"uuid", g.uuid},
                    {"name", g.name},
                    {"memory_total_bytes", g.total},
                    {"t", std::move(t)},
                    {"used_bytes", std::move(used)},
                    {"driver_used_bytes", std::move(driver)}});
  }
  out["processes"] = std::move(procs);
  out["jobs"] = std::move(jobs);
  out["gpus"] = std::move(gpus);
  return out;
}

json process_history_json(const HistoryCopy& h) {
  json out = h.processes.empty() ? json::object() : process_json(h.processes.front());
  header(out, h);
  return out;
}

}  // namespace cuw::daemon
