// cuwarden interposer core: pinned and registered host memory, tracked and shown per device
// (the context's), never capped.
#pragma once

#include <mutex>
#include <optional>

#include "core/ledger.hpp"
#include "core/tracker.hpp"
#include "cuw/ring.hpp"

namespace cuw::core {

template <class Call>
CUresult tracked_host_alloc(ring::Api api, uint64_t bytes, Call&& call, void* const* result) {
  Tracker& t = Tracker::get();
  const CUresult r = call();
  if (r != CUDA_SUCCESS || !result) return r;
  const int ordinal = t.current_device();
  ring::DeviceSlot* d = t.device(ordinal);
  const uint64_t key = reinterpret_cast<uint64_t>(*result);
  const uint64_t now = cuw::core::now_ns();
  std::lock_guard<cuw::spin_lock> lk(t.lock());
  std::optional<LiveRecord> stale;  // freed where we did not see it (as count_freed_unseen_locked)
  t.host().insert(
      key, LiveRecord{bytes, static_cast<int8_t>(ordinal), static_cast<uint16_t>(api), 0, live::make_tag(now, thread_state().site)},
      &stale);
  if (stale) {
    if (static_cast<unsigned>(stale->device) < ring::kMaxDevices)
      Ledger::host(&t.header().devices[stale->device], stale->bytes, false);
    t.emit_at(ring::EventKind::host_free, ring::Api::reused, stale->device, key, stale->bytes, 0, CUDA_SUCCESS,
              now);
  }
  Ledger::host(d, bytes, true);
  t.emit_at(ring::EventKind::host_alloc, api, ordinal, key, bytes, 0, CUDA_SUCCESS, now);
  return r;
}

template <class Call>
CUresult tracked_host_free(ring::Api api, void* p, Call&& call) {
  Tracker& t = Tracker::get();
  LiveRecord rec;
  bool live = false;
  if (p) {
    std::lock_guard<cuw::spin_lock> lk(t.lock());
    live = t.host().take(reinterpret_cast<uint64_t>(p), &rec);
  }
  const CUresult r = call();
  if (!live) return r;
  ring::DeviceSlot* d = t.device(rec.device);
  const uint64_t now = cuw::core::now_ns();
  std::lock_guard<cuw::spin_lock> lk(t.lock());
  if (r != CUDA_SUCCESS) {
    t.host().insert(reinterpret_cast<uint64_t>(p), rec);
    return r;
  }
  Ledger::host(d, rec.bytes, false);
  t.emit_at(ring::EventKind::host_free, api, rec.device, reinterpret_cast<uint64_t>(p), rec.bytes, 0, CUDA_SUCCESS,
            now);
  return r;
}

}  // namespace cuw::core
