// cuwarden daemon view: Prometheus text (see metrics_text.hpp).
#include "views/metrics_text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "base/util.hpp"
#include "cuw/counters.hpp"
#include "model/gpus.hpp"

namespace cuw::daemon {

namespace {

using Buf = fmt::memory_buffer;

void family(Buf& b, std::string_view name, std::string_view type, std::string_view help) {
  fmt::format_to(std::back_inserter(b), "# HELP cuwarden_{} {}\n# TYPE cuwarden_{} {}\n", name, help, name, type);
}

void sample(Buf& b, std::string_view name, std::string_view labels, uint64_t v) {
  fmt::format_to(std::back_inserter(b), "cuwarden_{}{{{}}} {}\n", name, labels, v);
}

// The job labels of a series: cuwarden_job, and the job's origin where its name says it:
// slurm_job_id for the jobs the Slurm plugin names slurm-<jobid>, pod for the pods whose
// manifest names their job pod-<name> (cluster/kubernetes), so that a site can join
// cuwarden's series with Slurm's or Kubernetes' own.
std::string job_labels(const std::string& job) {
  std::string out = fmt::format("cuwarden_job=\"{}\"", escape_label(job));
  constexpr std::string_view kSlurm = "slurm-", kPod = "pod-";
  if (job.size() > kSlurm.size() && job.size() <= kSlurm.size() + 10 && job.starts_with(kSlurm) &&
      std::all_of(job.begin() + kSlurm.size(), job.end(), [](char c) { return c >= '0' && c <= '9'; }))
    fmt::format_to(std::back_inserter(out), ",slurm_job_id=\"{}\"", job.substr(kSlurm.size()));
  else if (job.size() > kPod.size() && job.starts_with(kPod))
    fmt::format_to(std::back_inserter(out), ",pod=\"{}\"", escape_label(job.substr(kPod.size())));
  return out;
}

}  // namespace

std::string escape_label(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (std::size_t i = 0; i < v.size();) {
    const auto c = static_cast<unsigned char>(v[i]);
    if (c < 0x80) {
      switch (c) {
        case '\\': out += "\\\\"; break;
        case '"': out += "\\\""; break;
        case '\n': out += "\\n"; break;
        default: out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    // Prometheus refuses a whole scrape over one invalid UTF-8 byte, and process names,
    // job names and cmdlines are cut at fixed widths (or chosen by any user): a sequence
    // that is not well-formed UTF-8 becomes U+FFFD.
    const std::size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    bool ok = len != 0 && i + len <= v.size();
    for (std::size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(v[i + k]) & 0xc0) == 0x80;
    if (ok && len == 3) {
      const auto c1 = static_cast<unsigned char>(v[i + 1]);
      ok = !(c == 0xe0 && c1 < 0xa0) && !(c == 0xed && c1 >= 0xa0);  // overlong, surrogates
    }
    if (ok && len == 4) {
      const auto c1 = static_cast<unsigned char>(v[i + 1]);
      ok = !(c == 0xf0 && c1 < 0x90) && !(c == 0xf4 && c1 >= 0x90);  // overlong, past U+10FFFF
    }
    if (ok) {
      out.append(v, i, len);
      i += len;
    } else {
      out += "\xef\xbf\xbd";
      ++i;
    }
  }
  return out;
}

std::string metrics_text(const State& st) {
  static const RetiredCounters kNone;
  const RetiredCounters& retired = st.retired ? *st.retired : kNone;
  const std::vector<GpuRow> gpus = gpu_rows(st);
  const std::map<std::string, int> index_of = gpu_index_of(gpus);
  const std::string host = escape_label(st.hostname);

  // One label set per (running process, device), built once and used by every gauge row.
  struct Series {
    std::string labels;
    std::array<uint64_t, counters::kDeviceCount> values;
  };
  std::vector<Series> live;
  // Counter rows per (uuid, job, user): live and exited processes, then the retired ones.
  struct Sum {
    int gpu_index = -1;
    std::array<uint64_t, counters::kDeviceCount> values{};
  };
  std::map<RetiredCounters::Key, Sum> sums;
  std::map<std::pair<std::string, std::string>, uint64_t> dropped;
  unsigned running = 0, suspended = 0, overdue = 0;
  uint64_t suspended_bytes = 0;
  for (const ProcessState& p : st.processes) {
    if (p.suspended && !p.exited) {
      ++suspended;
      overdue += p.suspended_overdue ? 1 : 0;
      suspended_bytes += p.suspended_host_bytes;
    }
    const std::string job = field_text(p.header.job, sizeof p.header.job);
    dropped[{job, p.user}] += p.header.events_dropped;
    if (!p.exited) ++running;
    std::string name;
    for (uint32_t d = 0; d < ring::kMaxDevices; ++d) {
      const DeviceSnapshot& ds = p.header.devices[d];
      if (!ds.present) continue;
      const std::string uuid = format_uuid(ds.uuid);
      const auto at = index_of.find(uuid);
      if (at == index_of.end()) continue;  // not a GPU row (gpus.hpp): a ring's word alone
      const int index = at->second;
      auto values = ds.values();
      if (p.suspended)  // its device bytes are on the host (the counters still count them)
        for (std::size_t i = 0; i < counters::kDeviceCount; ++i)
          if (counters::kDevice[i].shown == counters::Shown::held) values[i] = 0;
      Sum& s = sums[{uuid, job, p.user}];
      s.gpu_index = index;
      for (std::size_t i = 0; i < counters::kDeviceCount; ++i) s.values[i] += values[i];
      if (p.exited) continue;
      if (name.empty())
        name = escape_label(process_name(field_text(p.header.comm, sizeof p.header.comm),
                                         field_text(p.header.cmdline, sizeof p.header.cmdline)));
      live.push_back({fmt::format("hostname=\"{}\",gpu=\"{}\",uuid=\"{}\",pid=\"{}\",process=\"{}\",user=\"{}\",{}",
                                  host, index, uuid, p.pid, name, escape_label(p.user), job_labels(job)),
                      values});
    }
  }
  for (const auto& [key, row] : retired.by_gpu) {
    Sum& s = sums[key];
    if (s.gpu_index < 0) {
      auto it = index_of.find(key.uuid);
      s.gpu_index = it != index_of.end() ? it->second : row.gpu_index;
    }
    for (std::size_t i = 0; i < counters::kDeviceCount; ++i) s.values[i] += row.values[i];
  }
  for (const auto& [key, n] : retired.events_dropped) dropped[key] += n;

  Buf b;
  b.reserve(256 + live.size() * 2048);
  for (std::size_t i = 0; i < counters::kDeviceCount; ++i) {
    const counters::Info& row = counters::kDevice[i];
    if (row.type == counters::Type::gauge) {
      family(b, row.metric, "gauge", row.help);
      for (const Series& s : live) {
        if (row.shown == counters::Shown::cap && s.values[i] == ring::kNoLimit) continue;
        sample(b, row.metric, s.labels, s.values[i]);
      }
    } else {
      family(b, row.metric, "counter", row.help);
      for (const auto& [key, s] : sums)
        sample(b, row.metric,
               fmt::format("hostname=\"{}\",gpu=\"{}\",uuid=\"{}\",user=\"{}\",{}", host, s.gpu_index, key.uuid,
                           escape_label(key.user), job_labels(key.job)),
               s.values[i]);
    }
  }
  family(b, "tamper_total", "counter",
         "Caps a process raised in its own ring past what the daemon allows (put back), and stretches the driver "
         "saw it hold more than its cap allows");
  for (const ProcessState& p : st.processes)
    if (!p.exited)
      sample(b, "tamper_total",
             fmt::format("hostname=\"{}\",pid=\"{}\",process=\"{}\",user=\"{}\"", host, p.pid,
                         escape_label(process_name(field_text(p.header.comm, sizeof p.header.comm),
                                                   field_text(p.header.cmdline, sizeof p.header.cmdline))),
                         escape_label(p.user)),
             p.tampers);
  family(b, "events_dropped_total", "counter", "Events the rings had no room for (counters stay exact)");
  for (const auto& [key, n] : dropped)
    sample(b, "events_dropped_total",
           fmt::format("hostname=\"{}\",user=\"{}\",{}", host, escape_label(key.second), job_labels(key.first)),
           n);

  // Jobs: used and peak bytes per GPU, and the cap when there is one.
  struct JobRow {
    std::string labels;
    uint64_t used, peak, cap;
  };
  std::vector<JobRow> job_rows;
  for (const JobState& j : st.jobs) {
    if (j.view.members.empty()) continue;
    for (std::size_t g = 0; g < j.view.gpus.size() && g < j.view.used.size(); ++g) {
      uint8_t raw[16];
      std::copy(std::begin(j.view.gpus[g].uuid), std::end(j.view.gpus[g].uuid), raw);
      const std::string uuid = format_uuid(raw);
      auto it = index_of.find(uuid);
      job_rows.push_back({fmt::format("hostname=\"{}\",{},user=\"{}\",gpu=\"{}\",uuid=\"{}\"", host, job_labels(j.name),
                                      escape_label(j.user), it != index_of.end() ? it->second : j.view.gpus[g].index,
                                      uuid),
                          j.view.used[g], j.view.gpus[g].peak, j.view.cap});
    }
  }
  family(b, "job_memory_used_bytes", "gauge", "Bytes a job's members hold on a GPU, together");
  for (const JobRow& r : job_rows) sample(b, "job_memory_used_bytes", r.labels, r.used);
  family(b, "job_memory_peak_bytes", "gauge", "The most a job's members have held on a GPU together since the job began");
  for (const JobRow& r : job_rows) sample(b, "job_memory_peak_bytes", r.labels, r.peak);
  family(b, "job_memory_limit_bytes", "gauge", "A job's cap on each GPU (absent when it has none)");
  for (const JobRow& r : job_rows)
    if (r.cap != job::kNoLimit) sample(b, "job_memory_limit_bytes", r.labels, r.cap);

  auto gpu_labels = [&](const GpuRow& g) {
    return fmt::format("hostname=\"{}\",gpu=\"{}\",uuid=\"{}\",name=\"{}\"", host, g.index, g.uuid, escape_label(g.name));
  };
  family(b, "device_memory_total_bytes", "gauge", "The GPU's memory");
  for (const GpuRow& g : gpus) sample(b, "device_memory_total_bytes", gpu_labels(g), g.total);
  family(b, "device_memory_used_bytes", "gauge", "Bytes the running interposed processes hold on the GPU, together");
  for (const GpuRow& g : gpus) sample(b, "device_memory_used_bytes", gpu_labels(g), g.used);
  family(b, "device_driver_used_bytes", "gauge", "The driver's own figure for the GPU's used memory (NVML)");
  for (const GpuRow& g : gpus)
    if (g.driver_used_known) sample(b, "device_driver_used_bytes", gpu_labels(g), g.driver_used);
  family(b, "processes", "gauge", "Interposed processes running");
  sample(b, "processes", fmt::format("hostname=\"{}\"", host), running);
  family(b, "suspended_processes", "gauge", "Interposed processes suspended (their device memory on the host)");
  sample(b, "suspended_processes", fmt::format("hostname=\"{}\"", host), suspended);
  family(b, "suspended_host_bytes", "gauge", "Device bytes of the suspended processes, held on the host");
  sample(b, "suspended_host_bytes", fmt::format("hostname=\"{}\"", host), suspended_bytes);
  family(b, "suspended_overdue_processes", "gauge",
         "Processes suspended by policy past their job's max_suspended, with no room yet to resume them");
  sample(b, "suspended_overdue_processes", fmt::format("hostname=\"{}\"", host), overdue);
  family(b, "build_info", "gauge", "The daemon's version");
  sample(b, "build_info", fmt::format("version=\"{}\"", CUWARDEN_VERSION), 1);
  return fmt::to_string(b);
}

}  // namespace cuw::daemon
