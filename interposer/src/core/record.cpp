// cuwarden interposer core: the recording API's rare entry points (see record.hpp).
#include "core/record.hpp"

#include <mutex>

namespace cuw::core {

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
      Ledger::resized(*d, est, actual);
      rec.bytes = actual;
      t.pointers().insert(dptr, rec);
      adjusted = true;
    }
  }
  if (adjusted && actual > est) t.job_force_charge(ordinal, actual - est);
  else if (adjusted) t.job_uncharge(ordinal, est - actual);
}

}  // namespace cuw::core
