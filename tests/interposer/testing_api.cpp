// Interposer tests: the queries testing_api.h declares, linked into libcuwarden_testing.so
// with the product's objects (never into libcuwarden.so).
#include "testing_api.h"

#include "backends/cache/whole_blocks.hpp"
#include "backends/vmm/granule_arena.hpp"
#include "backends/start.hpp"
#include "core/tracker.hpp"
#include "hooks/runtime.hpp"

namespace backends = cuw::backends;
namespace core = cuw::core;

namespace {
backends::backend* started(core::Tracker** t) {
  *t = core::Tracker::instance_if_created();
  return backends::started(*t);
}
}  // namespace

extern "C" __attribute__((visibility("default"))) int cuwarden_testing_pool_stats(int ordinal, cuwt_pool_stats* out) {
  core::Tracker* t = nullptr;
  backends::backend* b = started(&t);
  if (!b || !out) return -1;
  const backends::pool_stats s = b->stats(*t, ordinal);
  *out = cuwt_pool_stats{s.reserved, s.cached, s.largest_free};
  return 0;
}

extern "C" __attribute__((visibility("default"))) size_t cuwarden_testing_blocks(cuwt_block* out, size_t cap) {
  core::Tracker* t = nullptr;
  backends::backend* b = started(&t);
  if (!b) return 0;
  size_t n = 0;
  b->for_each_block(*t, [&](const backends::block_info& bi) {
    if (n < cap)
      out[n] = cuwt_block{bi.address, bi.bytes, bi.requested, bi.ordinal, static_cast<int32_t>(bi.status)};
    ++n;
  });
  return n;
}

extern "C" __attribute__((visibility("default"))) const char* cuwarden_testing_backend_name() {
  core::Tracker* t = nullptr;
  backends::backend* b = started(&t);
  if (!b) return nullptr;
  if (b == &backends::g_passthrough) return "off";
  if (dynamic_cast<backends::pooled_backend<backends::whole_blocks>*>(b)) return "cache";
  if (dynamic_cast<backends::pooled_backend<backends::granule_arena>*>(b)) return "vmm";
  return "?";
}

extern "C" __attribute__((visibility("default"))) uint64_t cuwarden_testing_runtime_answers() {
  return cuw::hooks::runtime::answered_on_this_thread();
}

extern "C" __attribute__((visibility("default"))) int64_t cuwarden_testing_refusals(int ordinal) {
  core::Tracker* t = core::Tracker::instance_if_created();
  const cuw::ring::DeviceSlot* d = t ? t->device_if_filled(ordinal) : nullptr;
  return d ? static_cast<int64_t>(d->refusals.load(std::memory_order_acquire)) : -1;
}

extern "C" __attribute__((visibility("default"))) int cuwarden_testing_hold_lock(int book, int hold) {
  core::Tracker* t = core::Tracker::instance_if_created();
  if (!t) return -1;
  cuw::spin_lock& l = book < 0 ? t->lock() : t->pool_book(book).mu;
  if (hold) l.lock();
  else l.unlock();
  return 0;
}
