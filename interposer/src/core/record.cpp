// cuwarden interposer core: the recording API's rare paths (see record.hpp).
#include "core/record.hpp"

#include <mutex>

namespace cuw::core {

CUW_COLD void count_driver_error(Tracker& t, ring::DeviceSlot& d, int ordinal, ring::Api api, uint64_t bytes,
                                 uint64_t aux, CUresult r, bool charged, uint64_t now) {
  {
    std::lock_guard<cuw::spin_lock> lk(t.lock());
    if (charged) t.uncharge_locked(d, bytes);
    cuw::core::locked_add(d.driver_errors, 1);
    t.emit_locked(ring::EventKind::driver_error, api, ordinal, 0, bytes, aux, r, now);
  }
  if (charged) t.job_uncharge(ordinal, bytes);
}

CUW_COLD void keep_live(Tracker& t, cuw::core::LiveTable& table, uint64_t key, const LiveRecord& rec, bool committed,
                        ring::Api api, uint64_t aux, CUresult r, uint64_t now) {
  std::optional<LiveRecord> other;
  {
    std::lock_guard<cuw::spin_lock> lk(t.lock());
    table.insert(key, rec, &other);
    if (__builtin_expect(other.has_value(), 0)) {
      // The driver handed `key` out again while this free was in flight (an array freed
      // with its context, say): the allocation `rec` counts is gone. The new one keeps the
      // key; ours is counted freed (api reused), unless the free was counted already.
      table.insert(key, *other);
      if (!committed) t.count_freed_unseen_locked(key, rec, ring::Api::reused, now);
    } else {
      ring::DeviceSlot& d = t.header().devices[rec.device];
      if (committed) {
        t.count_uncapped_locked(d, rec.bytes);
        t.uncount_free_locked(d, rec.device, rec.bytes, pooled(static_cast<ring::Api>(rec.api)));
      }
      t.emit_locked(ring::EventKind::driver_error, api, rec.device, key, rec.bytes, aux, r, now);
    }
  }
  if (other.has_value()) {
    if (!committed) t.job_uncharge(rec.device, rec.bytes);
  } else if (committed) {
    t.job_force_charge(rec.device, rec.bytes);
  }
}

CUW_COLD void settle_pitch(Tracker& t, int ordinal, CUdeviceptr dptr, uint64_t est, uint64_t actual) {
  ring::DeviceSlot* d = t.device(ordinal);
  if (!d || actual == est) return;
  bool adjusted = false;
  {
    std::lock_guard<cuw::spin_lock> lk(t.lock());
    LiveRecord rec;
    if (t.pointers().take(dptr, &rec)) {
      if (actual > est) t.force_charge_locked(*d, actual - est);
      else t.uncharge_locked(*d, est - actual);
      cuw::core::locked_add(d->reserved, actual - est);  // wraps for a decrease
      rec.bytes = actual;
      t.pointers().insert(dptr, rec);
      adjusted = true;
    }
  }
  if (adjusted && actual > est) t.job_force_charge(ordinal, actual - est);
  else if (adjusted) t.job_uncharge(ordinal, est - actual);
}

}  // namespace cuw::core
