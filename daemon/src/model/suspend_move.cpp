// cuwarden daemon model: `cuwarden resume PID|job:NAME --gpu N`, a restore onto another GPU.
//
// The driver's restore takes pairs of GPU UUIDs (old, new) and keeps each of the process's
// CUDA ordinals and device addresses while putting it on the new GPU. It wants every GPU
// the process has in the pairs (cuda.h: "must contain every checkpointed GPU"; drivers
// answer CUDA_ERROR_INVALID_VALUE to fewer), a new GPU of the same chip, and room there;
// a restore that fails for want of room leaves the process FAILED. So the daemon checks,
// before the driver is called, everything it can:
//   - GPU N is one NVML lists (by index, as nvidia-smi numbers it, or by UUID);
//   - N is not a GPU it held memory on (then it is a plain resume, where it was);
//   - it held memory on one GPU (several: refused, saying which; moving several is not
//     offered);
//   - N is the same chip as its GPU (NVML's names compared);
//   - N has its footprint free now, plus the resume margin (suspend.hpp), counting what the
//     request's earlier processes take there;
//   - its job's cap per GPU, if any, still holds on N with its share moved there;
//   - its ring is writable (the daemon must tell the interposer that its UUIDs changed).
// The pairs name every device the process sees (RingHeader::visible_devices, with each one's
// UUID), each onto itself but the old GPU onto N, and N, if the process sees it too, onto the
// old GPU (the driver wants one GPU per device, so the two swap).
#include <algorithm>
#include <cctype>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "base/util.hpp"
#include "cuw/job.hpp"
#include "cuw/size.hpp"
#include "model/detail/registry_process.hpp"
#include "model/registry.hpp"

namespace cuw::daemon {

namespace {

/// "GPU-xxxxxxxx-xxxx-..." (or without "GPU-", any case) into CUuuid bytes.
bool parse_uuid(const std::string& text, uint8_t (&out)[16]) {
  std::string hex;
  const std::string s = text.rfind("GPU-", 0) == 0 ? text.substr(4) : text;
  for (char c : s) {
    if (c == '-') continue;
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
    hex.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  if (hex.size() != 32) return false;
  for (int i = 0; i < 16; ++i) out[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return true;
}

}  // namespace

std::string Registry::prepare_move(const Process& p, const RingSnapshot& s, const std::vector<NvmlGpu>& gpus,
                                   const std::string& gpu, uint64_t planned, uint64_t planned_job, SuspendTarget& t,
                                   bool* refused, bool* in_place) {
  *refused = true;
  *in_place = false;
  if (!nvml_ || !nvml_->available()) {
    *refused = false;
    return "without NVML the daemon cannot tell the GPUs apart: resume it without --gpu";
  }
  const NvmlGpu* to = nullptr;
  const bool by_index = !gpu.empty() && gpu.size() <= 3 && gpu.find_first_not_of("0123456789") == std::string::npos;
  const std::string asked = ascii_lower(gpu);
  for (const NvmlGpu& g : gpus)
    if (by_index ? std::to_string(g.index) == gpu : ascii_lower(g.uuid) == asked || ascii_lower(g.uuid) == "gpu-" + asked)
      to = &g;
  if (!to) {
    std::string have;
    for (const NvmlGpu& g : gpus) have += fmt::format("{}{} ({})", have.empty() ? "" : ", ", g.index, g.uuid);
    *refused = false;
    return fmt::format("no GPU {} on this node (NVML lists {})", gpu, have.empty() ? "none" : have);
  }
  // Where it was: the GPUs it held memory on when it was suspended.
  std::vector<std::pair<std::string, uint64_t>> held;
  for (const auto& [uuid, bytes] : p.suspended_footprint)
    if (bytes > 0) held.emplace_back(uuid, bytes);
  if (held.empty() && !p.suspended_footprint.empty()) held.push_back(p.suspended_footprint.front());
  auto name_of = [&](const std::string& uuid) {
    for (const NvmlGpu& g : gpus)
      if (g.uuid == uuid) return fmt::format("GPU {} ({})", g.index, uuid);
    return uuid;
  };
  for (const auto& h : held)
    if (h.first == to->uuid) {
      *in_place = true;  // on it already: a plain resume, with its checks
      return "";
    }
  if (held.size() > 1) {
    std::string list;
    for (const auto& [uuid, bytes] : held) list += fmt::format("{}{} with {}", list.empty() ? "" : ", ", name_of(uuid), format_bytes(bytes));
    return fmt::format("pid {} held memory on several GPUs ({}); --gpu moves a process from one GPU only: resume it "
                       "without --gpu",
                       p.pid, list);
  }
  if (held.empty()) return fmt::format("pid {} held no device memory when it was suspended: nothing to move", p.pid);
  const std::string from_uuid = held[0].first;
  const uint64_t bytes = held[0].second;
  const NvmlGpu* from = nullptr;
  for (const NvmlGpu& g : gpus)
    if (g.uuid == from_uuid) from = &g;
  if (!from) {
    *refused = false;
    return fmt::format("pid {} was suspended from {}, which NVML no longer lists", p.pid, from_uuid);
  }
  if (from->name != to->name)
    return fmt::format("GPU {} ({}) is a {}, and pid {} was suspended from GPU {} ({}), a {}: the driver restores "
                       "only onto a GPU of the same chip",
                       to->index, to->uuid, to->name, p.pid, from->index, from->uuid, from->name);
  const uint64_t free = to->memory_total > to->memory_used ? to->memory_total - to->memory_used : 0;
  const uint64_t need = planned + bytes + resume_margin(planned + bytes);
  if (free < need)
    return fmt::format("GPU {} ({}) has {} free; pid {} needs {}{} plus a margin of {} ({} in all): no restore is "
                       "forced (one without room would leave the process FAILED)",
                       to->index, to->uuid, format_bytes(free), p.pid, format_bytes(bytes),
                       planned ? fmt::format(" (and the job's processes before it {})", format_bytes(planned)) : "",
                       format_bytes(need - planned - bytes), format_bytes(need));
  t.from_index = from->index;
  t.from_uuid = from->uuid;
  t.to_index = to->index;
  t.to_uuid = to->uuid;
  t.footprint = {{to->uuid, bytes}};
  // Its job's cap per GPU holds on the new GPU too: the job's share moves there (the
  // interposer moves it at its next allocation, past the cap: it is memory already held).
  const std::string job_name = field_text(s.job, sizeof s.job);
  for (uint32_t o = 0; o < ring::kMaxDevices; ++o)
    if (s.devices[o].present && format_uuid(s.devices[o].uuid) == from->uuid) t.job_share += s.devices[o].used;
  if (JobTable::Job* j = job_name.empty() ? nullptr : jobs_.find(p.uid, job_name)) {
    JobTable::View v;
    if (jobs_.view(*j, &v) && v.cap != job::kNoLimit) {
      uint64_t there = 0;
      for (std::size_t i = 0; i < v.gpus.size() && i < v.used.size(); ++i)
        if (format_uuid(v.gpus[i].uuid) == to->uuid) there = v.used[i];
      if (there + planned_job + t.job_share > v.cap)
        return fmt::format("job '{}' has a cap of {} per GPU and holds {} on GPU {} ({}){}: pid {}'s {} would pass it",
                           job_name, format_bytes(v.cap), format_bytes(there), to->index, to->uuid,
                           planned_job ? fmt::format(", {} more with the processes before it", format_bytes(planned_job))
                                       : "",
                           p.pid, format_bytes(t.job_share));
    }
  }
  if (!p.ring->writable())
    return fmt::format("pid {}'s ring is read-only to the daemon, which could not tell it that its GPU changed",
                       p.pid);
  uint8_t old_bytes[16], new_bytes[16];
  if (!parse_uuid(from->uuid, old_bytes) || !parse_uuid(to->uuid, new_bytes)) {
    *refused = false;
    return fmt::format("NVML's UUID {} or {} is not one the driver takes", from->uuid, to->uuid);
  }
  // Every device the process sees, each once; those its interposer never named (an older
  // library) cannot be told apart: its present devices then.
  const uint32_t visible = s.visible_devices ? s.visible_devices : s.device_count;
  bool found = false;
  for (uint32_t o = 0; o < visible && o < ring::kMaxDevices; ++o) {
    const DeviceSnapshot& d = s.devices[o];
    if (!s.visible_devices && !d.present) continue;
    CheckpointDriver::GpuPair pair{};
    std::memcpy(pair.old_uuid, d.uuid, 16);
    std::memcpy(pair.new_uuid, d.uuid, 16);
    if (std::memcmp(d.uuid, old_bytes, 16) == 0) {
      std::memcpy(pair.new_uuid, new_bytes, 16);
      found = true;
    } else if (std::memcmp(d.uuid, new_bytes, 16) == 0) {
      std::memcpy(pair.new_uuid, old_bytes, 16);  // it sees GPU N too: the two swap
    }
    if (std::memcmp(pair.old_uuid, pair.new_uuid, 16) != 0) {
      std::array<uint8_t, 16> u{};
      std::memcpy(u.data(), pair.new_uuid, 16);
      t.moved.emplace_back(o, u);
    }
    t.pairs.push_back(pair);
  }
  if (!found) {
    *refused = false;
    t.pairs.clear();
    t.moved.clear();
    return fmt::format("pid {}'s ring names no device on {} ({}), the GPU it was suspended from", p.pid,
                       name_of(from->uuid), "its interposer may predate --gpu");
  }
  return "";
}

void Registry::note_moved(const SuspendTarget& t) {
  for (auto& [name, p] : procs_) {
    if (p->pid != t.pid || p->start_time != t.start_time) continue;
    for (const auto& [ordinal, uuid] : t.moved) {
      uint8_t u[16];
      std::memcpy(u, uuid.data(), 16);
      p->ring->set_moved_uuid(ordinal, u);
    }
    if (!p->ring->notify_moved())
      spdlog::warn("resume: pid {}'s ring could not be told of its move: it counts on {} until it exits", p->pid,
                   t.from_uuid);
    for (auto& f : p->suspended_footprint)
      if (f.first == t.from_uuid) f.first = t.to_uuid;
    spdlog::info("resume: pid {} resumed onto GPU {} ({}) from GPU {} ({})", p->pid, t.to_index, t.to_uuid, t.from_index,
                 t.from_uuid);
  }
}

}  // namespace cuw::daemon
