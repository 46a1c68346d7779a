// cuwarden daemon model: history and retired counters (see series.hpp).
#include "model/series.hpp"

#include <algorithm>
#include <set>
#include <spdlog/spdlog.h>

#include "base/util.hpp"
#include "model/gpus.hpp"

namespace cuw::daemon {

namespace {

constexpr uint32_t kClockBackS = 5;  ///< a step back of the wall clock past this restarts the history

/// An allocation refused: by a cap, a job's cap, or the driver running out of memory
/// (CUDA_ERROR_OUT_OF_MEMORY is 2; a failed free is a driver error too, not an OOM).
bool is_oom(const ring::Event& e) {
  using K = ring::EventKind;
  return e.kind == static_cast<uint8_t>(K::refuse) || e.kind == static_cast<uint8_t>(K::job_refuse) ||
         (e.kind == static_cast<uint8_t>(K::driver_error) && e.result == 2);
}

}  // namespace

void SeriesStore::record(const State& st) {
  const uint32_t t = static_cast<uint32_t>(st.time_ns / 1'000'000'000ULL);
  const std::vector<GpuRow> rows = gpu_rows(st);
  const std::map<std::string, int> index_of = gpu_index_of(rows);
  std::lock_guard<std::mutex> g(mu_);
  // The wall clock set back (by hand, or a first NTP sync) past a moment's jitter: points
  // already kept would lie in the future of every new one, and the series only go forward,
  // so they start again rather than stand still until the clock passes them.
  if (last_t_ != 0 && t + kClockBackS < last_t_) {
    spdlog::warn("history: the clock went back {} s; the history starts again from now", last_t_ - t);
    procs_.clear();
    jobs_.clear();
    gpus_.clear();
    last_t_ = 0;
  }
  if (last_t_ != 0 && t <= last_t_) return;  // one sample a second at most, never backwards
  last_t_ = t;
  time_ns_ = st.time_ns;

  constexpr std::array<bool, 4> kProcessMax{true, true, false, false};  // used, reserved: max; peak, cap: last
  constexpr std::array<bool, 2> kPairMax{true, false};
  // A thousand idle processes recorded every second: what does not change is not made again
  // (their names are read afresh every kRenameS, a device's UUID once).
  constexpr uint32_t kRenameS = 30;
  for (const ProcessState& p : st.processes) {
    ProcessEntry& e = procs_[p.file_name];
    e.seen_t = t;
    e.pid = p.pid;
    e.start_time = p.start_time;
    if (e.named_t == 0 || t - e.named_t >= kRenameS) {
      e.name = process_name(field_text(p.header.comm, sizeof p.header.comm),
                            field_text(p.header.cmdline, sizeof p.header.cmdline));
      e.user = p.user;
      e.job = field_text(p.header.job, sizeof p.header.job);
      e.named_t = t;
    }
    e.exited = p.exited;
    for (uint32_t d = 0; d < ring::kMaxDevices; ++d) {
      const DeviceSnapshot& ds = p.header.devices[d];
      if (!ds.present) continue;
      DeviceSeries& dsr = e.devices[d];
      if (dsr.uuid.empty()) dsr.uuid = format_uuid(ds.uuid);
      if (auto it = index_of.find(dsr.uuid); it != index_of.end()) dsr.gpu_index = it->second;
      // An exited process holds nothing (the driver freed it), whatever its counters said.
      const uint64_t used = p.exited ? 0 : ds.used, reserved = p.exited ? 0 : ds.reserved;
      dsr.series.add(t, {used, reserved, ds.peak, ds.limit}, kProcessMax);
    }
    p.history->for_each_after(e.oom_seq, [&](const StoredEvent& ev) {
      if (!is_oom(ev.e)) return;
      e.ooms.push_back({ev.e.time_ns, static_cast<uint32_t>(ev.e.device < 0 ? 0 : ev.e.device), ev.e.bytes, ev.e.kind});
      if (e.ooms.size() > kOomMarks) e.ooms.pop_front();
    });
    e.oom_seq = st.events_seq;
  }
  for (auto it = procs_.begin(); it != procs_.end();) it = it->second.seen_t == t ? std::next(it) : procs_.erase(it);

  std::set<std::string> jobs_seen;
  for (const JobState& j : st.jobs) {
    if (j.view.members.empty()) continue;
    jobs_seen.insert(j.file);
    JobEntry& e = jobs_[j.file];
    e.name = j.name;
    e.user = j.user;
    for (std::size_t i = 0; i < j.view.gpus.size() && i < j.view.used.size(); ++i) {
      uint8_t uuid[16];
      std::copy(std::begin(j.view.gpus[i].uuid), std::end(j.view.gpus[i].uuid), uuid);
      const std::string u = format_uuid(uuid);
      auto& [index, series] = e.gpus[u];
      if (auto it = index_of.find(u); it != index_of.end()) index = it->second;
      series.add(t, {j.view.used[i], j.view.cap}, kPairMax);
    }
  }
  std::erase_if(jobs_, [&](const auto& kv) { return !jobs_seen.count(kv.first); });

  for (const GpuRow& r : rows) {
    GpuEntry& e = gpus_[r.uuid];
    e.seen_t = t;
    e.uids = r.uids;
    e.index = r.index;
    e.name = r.name;
    e.total = r.total;
    e.series.add(t, {r.used, r.driver_used_known ? r.driver_used : HistoryCopy::kUnknown}, kPairMax);
  }
  // A GPU no longer a row (one a ring named while its process ran) is forgotten after the
  // longest range shown, and the longest unseen go first past kMaxGpus.
  std::erase_if(gpus_, [&](const auto& kv) { return t - kv.second.seen_t > kForgetGpuS; });
  // Those only one uid's rings made rows are kept at most kMaxRingGpusPerUid, its longest
  // unseen going first: one user cycling made-up GPUs pushed out the history of another's.
  std::map<uint32_t, std::vector<std::map<std::string, GpuEntry>::iterator>> alone;
  for (auto it = gpus_.begin(); it != gpus_.end(); ++it)
    if (it->second.uids.size() == 1) alone[it->second.uids[0]].push_back(it);
  for (auto& [uid, its] : alone) {
    if (its.size() <= kMaxRingGpusPerUid) continue;
    if (gpu_limit_logged_.insert(uid).second)
      spdlog::warn("history: uid {} reached its limit of {} GPUs that only its rings name: its longest unseen are "
                   "forgotten first",
                   uid, kMaxRingGpusPerUid);
    std::sort(its.begin(), its.end(), [](const auto& a, const auto& b) { return a->second.seen_t < b->second.seen_t; });
    for (std::size_t i = 0; i + kMaxRingGpusPerUid < its.size(); ++i) gpus_.erase(its[i]);
  }
  while (gpus_.size() > kMaxGpus)
    gpus_.erase(std::min_element(gpus_.begin(), gpus_.end(), [](const auto& a, const auto& b) {
      return a.second.seen_t < b.second.seen_t;
    }));
}

std::optional<HistoryCopy> SeriesStore::copy(bool day, std::optional<uint32_t> pid) const {
  HistoryCopy out;
  out.day = day;
  std::lock_guard<std::mutex> g(mu_);
  out.time_ns = time_ns_;
  for (const auto& [file, p] : procs_) {
    if (pid && p.pid != *pid) continue;
    // Of two rings of one pid (a process image replaced by exec), the running one.
    if (pid && !out.processes.empty() && !out.processes.back().exited) continue;
    if (pid) out.processes.clear();
    HistoryCopy::Process cp{file, p.pid, p.start_time, p.name, p.user, p.job, p.exited, {}, {}};
    for (const auto& [ordinal, d] : p.devices)
      cp.devices.push_back({ordinal, d.uuid, d.gpu_index, d.series.points(day)});
    cp.ooms.assign(p.ooms.begin(), p.ooms.end());
    out.processes.push_back(std::move(cp));
  }
  if (pid) {
    if (out.processes.empty()) return std::nullopt;
    return out;
  }
  for (const auto& [file, j] : jobs_) {
    HistoryCopy::Job cj{j.name, j.user, {}};
    for (const auto& [uuid, is] : j.gpus) cj.gpus.push_back({uuid, is.first, is.second.points(day)});
    out.jobs.push_back(std::move(cj));
  }
  for (const auto& [uuid, gp] : gpus_) out.gpus.push_back({gp.index, uuid, gp.name, gp.total, gp.series.points(day)});
  std::sort(out.gpus.begin(), out.gpus.end(), [](const auto& a, const auto& b) { return a.index < b.index; });
  return out;
}

std::pair<std::size_t, std::size_t> SeriesStore::footprint() const {
  std::lock_guard<std::mutex> g(mu_);
  std::size_t bytes = 0, n = 0;
  for (const auto& [f, p] : procs_)
    for (const auto& [o, d] : p.devices) bytes += d.series.bytes(), ++n;
  for (const auto& [f, j] : jobs_)
    for (const auto& [u, s] : j.gpus) bytes += s.second.bytes(), ++n;
  for (const auto& [u, gp] : gpus_) bytes += gp.series.bytes(), ++n;
  return {bytes, n};
}

}  // namespace cuw::daemon
