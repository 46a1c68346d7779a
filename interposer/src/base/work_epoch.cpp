// cuwarden interposer base: the work epoch and capture count (see work_epoch.hpp).
#include "base/work_epoch.hpp"

#include <cstring>

#include "base/hook_table.hpp"
#include "base/log.hpp"
#include "base/real.hpp"

namespace cuw::work {

void queued(CUstream stream, bool per_thread) noexcept {
  if (detail::g_counting.load(std::memory_order_relaxed))
    (on_legacy(stream, per_thread) ? detail::g_epoch : detail::g_other).fetch_add(1, std::memory_order_release);
}

bool queues_work(const char* n) noexcept {
  static constexpr const char* kPrefixes[] = {
#define CUW_PREFIX(p) p,
      CUW_WORK_PREFIXES(CUW_PREFIX)
#undef CUW_PREFIX
  };
  if (!n) return false;
  for (const char* p : kPrefixes)
    if (std::strncmp(n, p, std::strlen(p)) == 0) return true;
  return false;
}

void untracked_entry_point(const char* name, int cuda_version) noexcept {
  if (!detail::g_untracked.exchange(true, std::memory_order_acq_rel))
    log::info(
        "cuwarden: cache: %s (CUDA %d) queues GPU work through an entry point cuwarden does not hook; freed "
        "blocks now always wait for an event before reuse (slower, still safe)",
        name, cuda_version);
}

void capture_ended() noexcept {
  int n = detail::g_captures.load(std::memory_order_relaxed);
  while (n > 0 && !detail::g_captures.compare_exchange_weak(n, n - 1, std::memory_order_acq_rel)) {
  }
}

bool stream_capturing(CUstream stream, bool per_thread) noexcept {
  using fn = CUresult (*)(CUstream, CUstreamCaptureStatus*);
  static auto is_cap = reinterpret_cast<fn>(hook::driver_symbol("cuStreamIsCapturing"));
  static auto is_cap_pt = reinterpret_cast<fn>(hook::driver_symbol("cuStreamIsCapturing_ptsz"));
  auto q = per_thread && is_cap_pt ? is_cap_pt : is_cap;
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  return q && q(stream, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
}

}  // namespace cuw::work
