// cuwarden daemon view: the state document from a published State (see state_json.hpp).
#include "views/state_json.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/util.hpp"
#include "views/counters_json.hpp"
#include "model/gpus.hpp"

namespace cuw::daemon {

using json = nlohmann::ordered_json;  // fields in the documented order

namespace {

json null_if_nolimit(uint64_t v) { return v == ring::kNoLimit ? json(nullptr) : json(v); }
json state_cap_json(uint64_t v) { return v == job::kNoLimit ? json(nullptr) : json(v); }

std::string name_of(const RingSnapshot& s) {
  return process_name(field_text(s.comm, sizeof s.comm), field_text(s.cmdline, sizeof s.cmdline));
}

json jobs_json(const State& st, const std::map<std::string, int>& index_of) {
  json out = json::array();
  for (const JobState& j : st.jobs) {
    const JobTable::View& v = j.view;
    if (v.members.empty()) continue;  // a job with no members holds nothing
    // What the members asked for (CUWARDEN_JOB_LIMIT), most common first; the job's cap is
    // the lowest member limit, which `cuwarden` shows next to the disagreement.
    std::map<uint64_t, unsigned> asked;
    for (const auto& m : v.members) ++asked[m.requested];
    std::vector<std::pair<uint64_t, unsigned>> asked_sorted(asked.begin(), asked.end());
    std::stable_sort(asked_sorted.begin(), asked_sorted.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    json requested = json::array();
    for (const auto& [bytes, n] : asked_sorted) requested.push_back({{"bytes", state_cap_json(bytes)}, {"members", n}});
    json gpus = json::array();
    uint64_t refusals = 0;
    for (std::size_t i = 0; i < v.gpus.size(); ++i) {
      const auto& g = v.gpus[i];
      uint8_t uuid[16];
      std::memcpy(uuid, g.uuid, sizeof uuid);
      const std::string u = format_uuid(uuid);
      auto it = index_of.find(u);
      gpus.push_back({{"job_gpu", g.index},
                      {"uuid", u},
                      {"gpu_index", it != index_of.end() ? json(it->second) : json(nullptr)},
                      {"memory_total_bytes", g.physical_total},
                      {"used_bytes", v.used[i]},
                      {"peak_bytes", g.peak},
                      {"limit_bytes", state_cap_json(v.cap)}});
    }
    json members = json::array();
    for (const auto& m : v.members) {
      refusals += m.refusals;
      std::string pname;
      for (const ProcessState& p : st.processes)
        if (p.pid == m.pid && (p.start_time & 0x7fffffffULL) == job::owner_start_low(m.owner)) pname = name_of(p.header);
      json charged = json::array();
      uint64_t total = 0;
      for (const auto& g : v.gpus) {
        const uint64_t b = g.index >= 0 && g.index < static_cast<int>(job::kMaxGpus) ? m.charged[g.index] : 0;
        uint8_t uuid[16];
        std::memcpy(uuid, g.uuid, sizeof uuid);
        charged.push_back({{"uuid", format_uuid(uuid)}, {"bytes", b}});
        total += b;
      }
      members.push_back({{"pid", m.pid},
                         {"slot", m.slot},
                         {"process_name", pname},
                         {"limit_bytes", state_cap_json(m.limit)},
                         {"requested_bytes", state_cap_json(m.requested)},
                         {"used_bytes", total},
                         {"charged", std::move(charged)},
                         {"joined_ns", m.joined_ns},
                         {"refusals", m.refusals}});
    }
    out.push_back({{"name", j.name},
                   {"user", j.user},
                   {"uid", j.uid},
                   {"file", st.run_dir + "/" + j.file},
                   {"limit_bytes", state_cap_json(v.cap)},
                   {"caps_requested", std::move(requested)},
                   {"caps_disagree", asked.size() > 1},
                   {"refusals", refusals},
                   {"gpus", std::move(gpus)},
                   {"members", std::move(members)}});
  }
  return out;
}

json limit_change_json(const LimitChange& c) {
  json j = {{"time_ns", c.time_ns},
            {"by", c.by ? json(*c.by) : json(nullptr)},
            {"by_uid", c.by_uid ? json(*c.by_uid) : json(nullptr)},
            {"by_pid", c.by_pid ? json(*c.by_pid) : json(nullptr)},
            {"target", c.target}};
  if (c.kind == LimitChange::Target::pid) {
    j["pid"] = c.pid;
    j["device"] = c.device ? json(*c.device) : json(nullptr);
  } else {
    j["job"] = c.job;
    j["uid"] = c.uid;
  }
  if (c.asked) j["asked"] = *c.asked;
  if (c.has_limits) {
    j["old_limit"] = null_if_nolimit(c.old_limit);
    j["new_limit"] = null_if_nolimit(c.new_limit);
  }
  j["outcome"] = c.outcome;
  if (c.reason) j["reason"] = *c.reason;
  return j;
}

}  // namespace

json state_json(const State& st) {
  std::map<std::string, const NvmlGpu*> nvml_by_uuid;
  for (const auto& g : st.gpus) nvml_by_uuid[g.uuid] = &g;
  const std::vector<GpuRow> rows = gpu_rows(st);
  const std::map<std::string, int> index_of = gpu_index_of(rows);

  json processes = json::array();
  for (const ProcessState& p : st.processes) {
    const RingSnapshot& s = p.header;
    json devices = json::array();
    for (uint32_t d = 0; d < ring::kMaxDevices; ++d) {
      const DeviceSnapshot& ds = s.devices[d];
      if (!ds.present) continue;
      const std::string uuid = format_uuid(ds.uuid);
      json dev = {
          {"ordinal", d},
          {"uuid", uuid},
          {"name", field_text(ds.name, sizeof ds.name)},
          {"memory_total_bytes", ds.physical_total},
      };
      // The counters, from their list (counters.hpp). An exited process holds nothing: the
      // driver freed its memory at exit, whatever the counters said last.
      // A suspended one holds nothing on the device either (its bytes are on the host), though
      // its counters, and so its caps and job shares, still count them.
      put_counters(dev, counters::kDevice, ds.values(), p.exited || p.suspended);
      if (p.exited) dev["used_at_exit_bytes"] = ds.used;
      if (auto it = nvml_by_uuid.find(uuid); it != nvml_by_uuid.end()) {
        auto pu = it->second->process_used.find(p.pid);
        const bool known = pu != it->second->process_used.end() && !p.exited;
        dev["driver_used_bytes"] = known ? json(pu->second) : json(nullptr);
        // What the driver holds for the process that no cap counts: with the default scope
        // its context and modules; with CUWARDEN_CAP_SCOPE=process, what grew since the
        // interposer last measured.
        const uint64_t counted = p.exited || p.suspended ? 0 : ds.used;
        dev["outside_cap_bytes"] = known ? json(pu->second > counted ? pu->second - counted : 0) : json(nullptr);
      }
      const auto at = index_of.find(uuid);
      dev["gpu_index"] = at != index_of.end() ? json(at->second) : json(nullptr);  // not a GPU row (gpus.hpp)
      devices.push_back(std::move(dev));
    }
    const char* state = p.exited ? "exited" : p.suspended ? "suspended" : "running";
    processes.push_back({
        {"pid", p.pid},
        {"user", p.user},
        {"uid", p.uid},
        {"process_name", name_of(s)},
        {"cmdline", field_text(s.cmdline, sizeof s.cmdline)},
        {"job", field_text(s.job, sizeof s.job)},
        {"pool", field_text(s.pool, sizeof s.pool)},
        {"cap_scope", s.cap_scope == static_cast<uint32_t>(ring::CapScope::process) ? "process" : "allocations"},
        {"state", state},
        {"start_time", p.start_time},
        {"created_ns", s.created_ns},
        {"exited_ns", p.exited ? json(p.exited_ns) : json(nullptr)},
        {"events_written", s.events_written},
        {"events_dropped", s.events_dropped},
        {"events_received", p.events_received},
        {"events_lost", p.events_lost},
        {"events_readable", p.events_readable},
        {"tampers", p.tampers},
        {"consumer_heartbeat_ns", s.heartbeat_ns},
        {"ring", st.run_dir + "/" + p.file_name},
        {"devices", std::move(devices)},
        {"suspended_host_bytes", p.suspended ? json(p.suspended_host_bytes) : json(nullptr)},
        {"suspended_since_ns", p.suspended ? json(p.suspended_since_ns) : json(nullptr)},
        {"suspended_by", p.suspended ? json(p.suspended_by) : json(nullptr)},
        {"priority", p.priority},
        {"waiting_for_room", p.waiting_for_room},
        {"suspended_overdue", p.suspended ? json(p.suspended_overdue) : json(nullptr)},
    });
  }

  // GPU processes the driver lists that no ring stands for: not under cuwarden (started
  // without it, or in a container that does not share the run directory), with the driver's
  // figure, so that what fills a GPU is all in view.
  std::set<uint32_t> managed;
  for (const ProcessState& p : st.processes)
    if (!p.exited) managed.insert(p.pid);
  json unmanaged = json::array();
  for (const NvmlGpu& g : st.gpus)
    for (const auto& [pid, bytes] : g.process_used) {
      if (managed.count(pid)) continue;
      const auto name = g.process_name.find(pid);
      const auto index = index_of.find(g.uuid);
      unmanaged.push_back({{"pid", pid},
                           {"process_name", name != g.process_name.end() ? name->second : ""},
                           {"gpu_index", index != index_of.end() ? index->second : static_cast<int>(g.index)},
                           {"uuid", g.uuid},
                           {"driver_used_bytes", bytes}});
    }

  json gpu_list = json::array();
  for (const GpuRow& g : rows) {
    json j = {
        {"index", g.index},
        {"uuid", g.uuid},
        {"name", g.name},
        {"memory_total_bytes", g.total},
        {"used_bytes", g.used},
        {"reserved_bytes", g.reserved},
        {"limit_bytes", nullptr},  // no device-wide cap yet: per-process caps are below
        {"processes", g.processes},
        {"capped_processes", g.capped},
    };
    if (!g.bus_id.empty()) j["bus_id"] = g.bus_id;
    if (g.driver_used_known) j["driver_used_bytes"] = g.driver_used;
    gpu_list.push_back(std::move(j));
  }
  json jobs = jobs_json(st, index_of);

  json limit_changes = json::array();
  for (const auto& c : st.limit_changes) limit_changes.push_back(limit_change_json(c));

  json problems = json::array();
  for (const auto& pr : st.problems) problems.push_back({{"path", st.run_dir + "/" + pr.file}, {"reason", pr.reason}});

  json out = {
      {"version", CUWARDEN_VERSION},
      {"hostname", st.hostname},
      {"time_ns", st.time_ns},
      {"run_dir", st.run_dir},
      {"nvml", st.nvml},
      {"events_seq", st.events_seq},
      {"gpus", std::move(gpu_list)},
      {"processes", std::move(processes)},
      {"unmanaged_processes", std::move(unmanaged)},
      {"jobs", std::move(jobs)},
      {"problems", std::move(problems)},
      {"policy", st.policy_file ? json(*st.policy_file) : json(nullptr)},
      {"limit_changes", std::move(limit_changes)},
  };
  // nvidia-smi's driver_version (cuwarden --query-gpu), where NVML says it.
  if (!st.driver_version.empty()) out["driver_version"] = st.driver_version;
  return out;
}

}  // namespace cuw::daemon
