// cuwarden interposer core: the cap-adjusted view of a device's memory (see meminfo.hpp).
#include "core/meminfo.hpp"

#include <algorithm>
#include <cstring>

namespace cuw::core {

bool capped_view(const Tracker& t, ring::DeviceSlot& d, uint64_t real_total, uint64_t real_free, uint64_t* total,
                 uint64_t* free_b) {
  const uint64_t limit = d.limit.load(std::memory_order_relaxed);
  uint64_t job_cap = ring::kNoLimit, job_used = 0;
  const bool in_job = t.job_view(d.ordinal, &job_cap, &job_used);
  if (limit == ring::kNoLimit && !in_job) return false;
  uint64_t cap_total = limit < real_total ? limit : real_total;
  // Bytes a pooling backend keeps for reuse are free for the program: it gives them back
  // (or reuses them) before anything is refused.
  const uint64_t counted = d.used.load(std::memory_order_relaxed);
  const uint64_t cached = d.cached.load(std::memory_order_relaxed);
  const uint64_t used = cached < counted ? counted - cached : 0;
  uint64_t cap_free = used >= cap_total ? 0 : cap_total - used;
  if (in_job) {
    // The job counts what each member holds from the driver, a pool's cache included.
    if (job_cap < cap_total) cap_total = job_cap;
    const uint64_t job_in_use = cached < job_used ? job_used - cached : 0;
    const uint64_t job_free = job_in_use >= job_cap ? 0 : job_cap - job_in_use;
    if (job_free < cap_free) cap_free = job_free;
  }
  *total = cap_total;
  *free_b = real_free < cap_free ? real_free : cap_free;
  return true;
}

void report_meminfo(Tracker& t, size_t* free_bytes, size_t* total_bytes) {
  if (t.config().meminfo_physical) return;
  const int ordinal = t.current_device();
  ring::DeviceSlot* d = t.device(ordinal);
  if (!d) return;
  t.refresh_pools(ordinal, nullptr, true, false);  // keep `reserved` current for whoever watches
  t.measure_context(ordinal, false);                // CUWARDEN_CAP_SCOPE=process: free counts it
  const uint64_t physical = d->physical_total ? d->physical_total : (total_bytes ? *total_bytes : ~0ULL);
  uint64_t total, free_b;
  if (!capped_view(t, *d, physical, free_bytes ? *free_bytes : ~0ULL, &total, &free_b)) {
    // Uncapped: the driver's figures, plus what a pool keeps for reuse (free for the program).
    const uint64_t cached = d->cached.load(std::memory_order_relaxed);
    if (free_bytes && cached) *free_bytes += std::min<uint64_t>(cached, physical - std::min<uint64_t>(*free_bytes, physical));
    return;
  }
  if (total_bytes) *total_bytes = total;
  if (free_bytes) *free_bytes = free_b;
}

void report_total_mem(Tracker& t, int dev, size_t* bytes) {
  if (t.config().meminfo_physical || dev < 0 || dev >= static_cast<int>(ring::kMaxDevices)) return;
  // The runtime asks this of every device at its start; asking is no use of the device, so
  // an unused one's slot stays unfilled (no row in the daemon's table): its cap comes from
  // the configuration, as the slot would hold it.
  const ring::DeviceSlot* d = t.device_if_filled(dev);
  const uint64_t limit = d ? d->limit.load(std::memory_order_relaxed) : t.configured_limit(dev, *bytes);
  if (limit < *bytes) *bytes = limit;
  uint64_t job = t.job_cap(), job_used = 0;
  if (d && !t.job_view(dev, &job, &job_used)) job = ring::kNoLimit;  // a GPU the job does not count
  if (job < *bytes) *bytes = job;
}

namespace {
/// The slot of the process's device whose UUID NVML writes as `uuid`, or nullptr.
ring::DeviceSlot* slot_for_uuid(Tracker& t, const char* uuid) {
  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" -> 16 bytes
  uint8_t bytes[16];
  int n = 0;
  for (const char* c = std::strncmp(uuid, "GPU-", 4) == 0 ? uuid + 4 : uuid; *c && n < 32; ++c) {
    int v = (*c >= '0' && *c <= '9') ? *c - '0' : (*c >= 'a' && *c <= 'f') ? *c - 'a' + 10
            : (*c >= 'A' && *c <= 'F') ? *c - 'A' + 10 : -1;
    if (v < 0) continue;
    if (n % 2 == 0) bytes[n / 2] = static_cast<uint8_t>(v << 4);
    else bytes[n / 2] = static_cast<uint8_t>(bytes[n / 2] | v);
    ++n;
  }
  if (n != 32) return nullptr;
  for (uint32_t o = 0; o < ring::kMaxDevices; ++o) {
    ring::DeviceSlot& d = t.header().devices[o];
    if (d.present.load(std::memory_order_acquire) && std::memcmp(d.uuid, bytes, 16) == 0) return &d;
  }
  return nullptr;
}
}  // namespace

bool report_nvml(Tracker& t, const char* uuid, unsigned long long* total, unsigned long long* free_b,
                 unsigned long long* used) {
  if (t.config().meminfo_physical) return false;
  ring::DeviceSlot* d = slot_for_uuid(t, uuid);
  uint64_t capped_total, capped_free;
  if (!d || !capped_view(t, *d, *total, *free_b, &capped_total, &capped_free)) return false;
  *total = capped_total;
  *free_b = capped_free;
  *used = capped_total - capped_free;
  return true;
}

}  // namespace cuw::core
