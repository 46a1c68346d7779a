// cuwarden daemon model: GPU order and indices (see gpus.hpp).
#include "model/gpus.hpp"

#include <algorithm>
#include <set>

#include "base/util.hpp"

namespace cuw::daemon {

std::vector<GpuRow> gpu_rows(const State& st, std::set<uint32_t>* over_limit) {
  struct Acc {
    GpuRow row;
    int first_ordinal = 1 << 30;
  };
  std::map<std::string, Acc> gpus;
  for (const auto& g : st.gpus) {
    GpuRow& out = gpus[g.uuid].row;
    out.uuid = g.uuid;
    out.name = g.name;
    out.bus_id = g.bus_id;
    out.index = static_cast<int>(g.index);
    out.total = g.memory_total;
    out.driver_used = g.memory_used;
    out.driver_used_known = true;
  }
  // A member of a job with a cap is capped on every GPU it uses, with or without a cap of
  // its own.
  std::set<uint32_t> in_capped_job;
  for (const JobState& j : st.jobs)
    if (j.view.cap != job::kNoLimit)
      for (const auto& m : j.view.members) in_capped_job.insert(m.pid);
  // Rings are any user's to write, so a UUID only a ring names is a row only where NVML is
  // not loaded, only while a process names it that runs or one that ran did (kept in
  // gpu_index_kept, bounded), at most kMaxRingGpus of them (fake rings of exited pids made
  // thousands of rows), and at most kMaxRingGpusPerUid from one uid's rings (one user's
  // running processes naming made-up GPUs pushed another user's GPU out of the rows).
  std::set<std::string> from_rings;
  std::map<uint32_t, std::set<std::string>> by_uid;  // the rows each uid's rings made
  if (!st.nvml) {
    const auto take = [&](uint32_t uid, const std::string& uuid) {
      std::set<std::string>& mine = by_uid[uid];
      if (mine.count(uuid)) return;
      if (mine.size() >= kMaxRingGpusPerUid) {
        if (over_limit) over_limit->insert(uid);
        return;
      }
      if (!from_rings.count(uuid) && from_rings.size() >= kMaxRingGpus) return;
      mine.insert(uuid);
      from_rings.insert(uuid);
    };
    struct Named {
      uint32_t uid;
      std::string uuid;
      bool kept;
    };
    std::vector<Named> named;  // kept ones and those of running processes, each uuid spelt once
    for (const ProcessState& p : st.processes)
      for (uint32_t d = 0; d < ring::kMaxDevices; ++d)
        if (p.header.devices[d].present) {
          std::string uuid = format_uuid(p.header.devices[d].uuid);
          const bool kept = st.gpu_index_kept.count(uuid) != 0;
          if (kept || !p.exited) named.push_back({p.uid, std::move(uuid), kept});
        }
    for (const bool kept : {true, false})  // kept ones first, then those of running processes
      for (const Named& n : named)
        if (n.kept == kept) take(n.uid, n.uuid);
  }
  for (const ProcessState& p : st.processes) {
    for (uint32_t d = 0; d < ring::kMaxDevices; ++d) {
      const DeviceSnapshot& ds = p.header.devices[d];
      if (!ds.present) continue;
      const std::string uuid = format_uuid(ds.uuid);
      if (st.nvml ? !gpus.count(uuid) : !from_rings.count(uuid)) continue;
      Acc& a = gpus[uuid];
      if (a.row.uuid.empty()) {
        a.row.uuid = uuid;
        a.row.name = field_text(ds.name, sizeof ds.name);
        a.row.total = ds.physical_total;
      }
      a.first_ordinal = std::min(a.first_ordinal, static_cast<int>(d));
      if (p.exited) continue;
      if (!p.suspended) {  // a suspended process's bytes are on the host
        a.row.used += ds.used;
        a.row.reserved += ds.reserved;
      }
      ++a.row.processes;
      if (ds.limit != ring::kNoLimit || in_capped_job.count(p.pid)) ++a.row.capped;
    }
  }
  // A GPU NVML does not number keeps the index it was first given; new ones come after.
  for (auto& [uuid, a] : gpus)
    if (a.row.index < 0)
      if (auto it = st.gpu_index_kept.find(uuid); it != st.gpu_index_kept.end()) a.row.index = it->second;
  std::vector<Acc*> order;
  for (auto& [uuid, a] : gpus) order.push_back(&a);
  std::sort(order.begin(), order.end(), [](const Acc* a, const Acc* b) {
    const bool ai = a->row.index >= 0, bi = b->row.index >= 0;
    if (ai != bi) return ai;
    if (ai) return a->row.index < b->row.index;
    if (a->first_ordinal != b->first_ordinal) return a->first_ordinal < b->first_ordinal;
    return a->row.uuid < b->row.uuid;
  });
  int next_index = 0;
  for (const Acc* a : order) next_index = std::max(next_index, a->row.index + 1);
  for (const auto& [uuid, index] : st.gpu_index_kept) next_index = std::max(next_index, index + 1);
  for (const auto& [uid, uuids] : by_uid)
    for (const std::string& uuid : uuids)
      if (auto it = gpus.find(uuid); it != gpus.end()) it->second.row.uids.push_back(uid);  // ascending
  std::vector<GpuRow> rows;
  rows.reserve(order.size());
  for (Acc* a : order) {
    if (a->row.index < 0) a->row.index = next_index++;
    rows.push_back(std::move(a->row));
  }
  return rows;
}

std::map<std::string, int> gpu_index_of(const std::vector<GpuRow>& rows) {
  std::map<std::string, int> out;
  for (const auto& r : rows) out[r.uuid] = r.index;
  return out;
}

}  // namespace cuw::daemon
