// cuwarden interposer core: the cap-adjusted view of a device's memory (see meminfo.hpp).
#include "core/meminfo.hpp"

namespace cuw::core {

bool capped_view(const Tracker& t, ring::DeviceSlot& d, uint64_t real_total, uint64_t real_free, uint64_t* total,
                 uint64_t* free_b) {
  const uint64_t limit = d.limit.load(std::memory_order_relaxed);
  uint64_t job_cap = ring::kNoLimit, job_used = 0;
  const bool in_job = t.job_view(d.ordinal, &job_cap, &job_used);
  if (limit == ring::kNoLimit && !in_job) return false;
  uint64_t cap_total = limit < real_total ? limit : real_total;
  // Bytes the cache keeps for reuse are free for the program: it gives them back (or
  // reuses them) before refusing anything.
  const uint64_t counted = d.used.load(std::memory_order_relaxed);
  const uint64_t cached = d.cached.load(std::memory_order_relaxed);
  const uint64_t used = cached < counted ? counted - cached : 0;
  uint64_t cap_free = used >= cap_total ? 0 : cap_total - used;
  if (in_job) {
    // The job counts what each member holds from the driver, our cache included.
    if (job_cap < cap_total) cap_total = job_cap;
    const uint64_t job_in_use = cached < job_used ? job_used - cached : 0;
    const uint64_t job_free = job_in_use >= job_cap ? 0 : job_cap - job_in_use;
    if (job_free < cap_free) cap_free = job_free;
  }
  *total = cap_total;
  *free_b = real_free < cap_free ? real_free : cap_free;
  return true;
}

}  // namespace cuw::core
