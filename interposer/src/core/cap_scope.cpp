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
  if (!config_.cap_scope_process) return false;
  ring::DeviceSlot* d = device_if_filled(ordinal);
  if (!d) return false;
  ContextMeasures& m = *context_measures_;
  std::lock_guard<std::mutex> lk(m.mu);
  const uint64_t now = mono_ns();
  const uint64_t ops = d->alloc_count.load(std::memory_order_relaxed) + d->free_count.load(std::memory_order_relaxed);
  const bool found_before = !(filled_.load(std::memory_order_relaxed) >> (kUnmeasured + ordinal) & 1) && m.measured_ns[ordinal] != 0;
  if (!force && m.measured_ns[ordinal] != 0 && now - m.measured_ns[ordinal] < kMinIntervalNs &&
      (ops == m.measured_ops[ordinal] || !found_before))
    return false;
  if (m.first_try_ns[ordinal] == 0) m.first_try_ns[ordinal] = now;
  m.measured_ns[ordinal] = now;
  m.measured_ops[ordinal] = ops;

  uint64_t held = 0;
  const hook::NvmlProcess r = hook::nvml_process_bytes(d->uuid, static_cast<uint32_t>(getpid()), &held);
  if (r != hook::NvmlProcess::found) {
    // Not listed: the driver lists a context a moment after making it, so charge() asks
    // again (at most every 10 ms) until it is; a process that holds memory there and is
    // still not listed after kGiveUpNs is hidden from NVML (it reports host pids, which a PID
    // namespace hides): then, as without NVML, the cap counts allocations only.
    const bool give_up = r == hook::NvmlProcess::unavailable ||
                         (d->live_allocations.load(std::memory_order_relaxed) > 0 &&
                          now - m.first_try_ns[ordinal] > kGiveUpNs);
    if (give_up) {
      filled_.fetch_and(~(1u << (kUnmeasured + ordinal)), std::memory_order_relaxed);
      if (!m.unmeasurable_logged) {
        m.unmeasurable_logged = true;
        log::warn("cuwarden: CUWARDEN_CAP_SCOPE=process: %s; caps count allocations only",
                  r == hook::NvmlProcess::unavailable
                      ? "NVML (libnvidia-ml.so.1) cannot report this process's memory"
                      : "NVML does not list this process (a PID namespace?)");
      }
    } else {
      filled_.fetch_or(1u << (kUnmeasured + ordinal), std::memory_order_relaxed);
    }
    // Not listed and holding nothing there: no context on the device any more (destroyed),
    // so nothing of the driver's is counted either.
    uint64_t down = 0;
    if (r == hook::NvmlProcess::not_listed) {
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
  uint64_t up = 0, down = 0, allocations = 0, context = 0;
  {
    std::lock_guard<spin_lock> l(mu_);
    allocations = d->reserved.load(std::memory_order_relaxed);
    context = held > allocations ? held - allocations : 0;
    const uint64_t old = d->context_bytes.load(std::memory_order_relaxed);
    if (context > old) force_charge_locked(*d, up = context - old);
    else if (context < old) uncharge_locked(*d, down = old - context);
    d->context_bytes.store(context, std::memory_order_relaxed);
  }
  if (up) job_force_charge(ordinal, up);
  if (down) job_uncharge(ordinal, down);
  log::debug("cuwarden: device %d: NVML %llu bytes, allocations %llu: %llu beyond them counted in the cap", ordinal,
             static_cast<unsigned long long>(held), static_cast<unsigned long long>(allocations),
             static_cast<unsigned long long>(context));
  return down != 0;
}

CUW_COLD bool Tracker::context_grew_past_cap(ring::DeviceSlot& d, int ordinal) noexcept {
  // Every allocation near the cap changes the counts: the time alone bounds the queries.
  {
    ContextMeasures& m = *context_measures_;
    std::lock_guard<std::mutex> lk(m.mu);
    if (m.measured_ns[ordinal] != 0 && mono_ns() - m.measured_ns[ordinal] < kMinIntervalNs) return false;
  }
  measure_context(ordinal, true);
  std::lock_guard<spin_lock> l(mu_);
  const uint64_t limit = d.limit.load(std::memory_order_relaxed);
  return limit != ring::kNoLimit && d.used.load(std::memory_order_relaxed) > limit;
}

}  // namespace cuw::core
