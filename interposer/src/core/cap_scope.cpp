// cuwarden interposer core: CUWARDEN_CAP_SCOPE=process, a cap that counts what the driver
// holds for the process beyond its allocations (the context, its modules, the rounding of
// allocations to pages), as HAMi-core and the driver-level limits do: the sum of the caps
// on a GPU is then what its processes hold. The figure is NVML's per-process one (what
// nvidia-smi shows) minus the bytes the process's allocations reserve; it is measured when
// a context is retained or destroyed, before the first charge on a device, when an
// allocation comes near the cap, before one is refused, and on cuMemGetInfo, and kept in the
// device's context_bytes, inside `used`.
#include <time.h>
#include <unistd.h>

#include <mutex>

#include "base/log.hpp"
#include "base/nvml_process.hpp"
#include "core/tracker.hpp"

namespace cuw::core {

namespace {
uint64_t mono_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ULL + static_cast<uint64_t>(ts.tv_nsec);
}
constexpr uint64_t kMinIntervalNs = 10'000'000ULL;  // 10 ms between measurements of an unchanged device
constexpr uint64_t kGiveUpNs = 2'000'000'000ULL;    // 2 s of a process NVML does not list
}  // namespace

CUW_COLD bool Tracker::measure_context(int ordinal, bool force) noexcept {
  if (!process_scope_.load(std::memory_order_relaxed) || exiting()) return false;  // NVML may be gone at exit
  ring::DeviceSlot* d = device_if_filled(ordinal);
  if (!d) return false;
  ContextMeasures& m = live_->context;
  std::lock_guard<std::mutex> lk(m.mu);
  const uint64_t now = mono_ns();
  if (!force && m.measured_ns[ordinal] != 0 && now - m.measured_ns[ordinal] < kMinIntervalNs) return false;
  if (m.first_try_ns[ordinal] == 0) m.first_try_ns[ordinal] = now;
  m.measured_ns[ordinal] = now;

  uint64_t held = 0;
  const hook::NvmlProcess r = hook::nvml_process_bytes(d->uuid, static_cast<uint32_t>(getpid()), &held);
  if (r != hook::NvmlProcess::found) {
    // Not listed: the driver lists a context a moment after making it, so charge() asks
    // again (at most every 10 ms) until it is. A process that holds memory there and is
    // still not listed after kGiveUpNs is hidden from NVML (it reports host pids, which a PID
    // namespace hides): then it counts allocations only, as the ring then says.
    const bool hidden = r == hook::NvmlProcess::unavailable ||
                        (d->live_allocations.load(std::memory_order_relaxed) > 0 &&
                         now - m.first_try_ns[ordinal] > kGiveUpNs);
    if (hidden) {
      fall_back_to_allocations(r == hook::NvmlProcess::unavailable
                                   ? "NVML cannot report this process's memory"
                                   : "NVML does not list this process (a PID namespace hides it?)");
      return false;
    }
    filled_.fetch_or(1u << (kUnmeasured + ordinal), std::memory_order_relaxed);
    // Not listed and holding nothing there: no context on the device any more (destroyed),
    // so nothing of the driver's is counted either.
    uint64_t down = 0;
    {
      std::lock_guard<spin_lock> l(mu_);
      if (d->reserved.load(std::memory_order_relaxed) == 0) {
        down = d->context_bytes.load(std::memory_order_relaxed);
        if (down) uncharge_locked(*d, down);
        d->context_bytes.store(0, std::memory_order_relaxed);
      }
    }
    if (down) job_uncharge(ordinal, down);
    return down != 0;
  }
  filled_.fetch_and(~(1u << (kUnmeasured + ordinal)), std::memory_order_relaxed);
  // An allocation of another thread between its driver call and its count is in NVML's
  // figure and not yet in `reserved`: counted here too until the next measurement (bounded
  // by what is in flight during the query).
  uint64_t up = 0, down = 0;
  {
    std::lock_guard<spin_lock> l(mu_);
    const uint64_t allocations = d->reserved.load(std::memory_order_relaxed);
    const uint64_t context = held > allocations ? held - allocations : 0;
    const uint64_t old = d->context_bytes.load(std::memory_order_relaxed);
    if (context > old) force_charge_locked(*d, up = context - old);
    else if (context < old) uncharge_locked(*d, down = old - context);
    d->context_bytes.store(context, std::memory_order_relaxed);
  }
  if (up) job_force_charge(ordinal, up);
  if (down) job_uncharge(ordinal, down);
  return down != 0;
}

CUW_COLD void Tracker::context_before_charge(ring::DeviceSlot& d, int ordinal, uint64_t bytes) noexcept {
  bool need = filled_.load(std::memory_order_relaxed) >> (kUnmeasured + ordinal) & 1;
  if (!need) need = near_cap(d.limit.load(std::memory_order_relaxed), d.used.load(std::memory_order_relaxed) + bytes);
  uint64_t job_cap = 0, job_used = 0;
  if (!need && job_view(ordinal, &job_cap, &job_used)) need = near_cap(job_cap, job_used + bytes);
  if (need) measure_context(ordinal, false);
}

CUW_COLD void Tracker::fall_back_to_allocations(const char* why) noexcept {
  if (!process_scope_.exchange(false, std::memory_order_relaxed)) return;
  header_->cap_scope = static_cast<uint32_t>(ring::CapScope::allocations);
  log::warn("cuwarden: CUWARDEN_CAP_SCOPE=process: %s; caps count allocations only", why);
}

}  // namespace cuw::core
