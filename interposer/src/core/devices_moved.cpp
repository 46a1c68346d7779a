// cuwarden interposer core: the process's devices after a restore onto other GPUs
// (`cuwarden resume --gpu`). The driver keeps each CUDA ordinal and its device addresses
// but puts it on another physical GPU, so what the ring says of each device's identity
// (its UUID, by which the daemon matches NVML and the job segment counts a GPU) is stale.
// The daemon says so with ring::kDevicesMoved in the header's held_back word, which every
// allocation loads anyway (ring.hpp says why that word); its cold branch lands here before
// the allocation is counted.
#include <cstring>
#include <mutex>

#include "base/log.hpp"
#include "base/real.hpp"
#include "core/tracker.hpp"

namespace cuw::core {

namespace {

using uuid_fn = CUresult (*)(CUuuid*, CUdevice);

/// The UUID the driver gives `ordinal` now: true and *out, or false.
bool uuid_now(int ordinal, CUuuid* out) {
  static auto get_uuid = reinterpret_cast<uuid_fn>(hook::driver_symbol("cuDeviceGetUuid_v2"));
  static auto get_uuid_v1 = reinterpret_cast<uuid_fn>(hook::driver_symbol("cuDeviceGetUuid"));
  return (get_uuid && get_uuid(out, ordinal) == CUDA_SUCCESS) || (get_uuid_v1 && get_uuid_v1(out, ordinal) == CUDA_SUCCESS);
}

}  // namespace

CUW_COLD void Tracker::note_visible_devices() noexcept {
  using count_fn = CUresult (*)(int*);
  static auto get_count = reinterpret_cast<count_fn>(hook::driver_symbol("cuDeviceGetCount"));
  int n = 0;
  if (!get_count || get_count(&n) != CUDA_SUCCESS || n <= 0) return;
  const int visible = n < static_cast<int>(ring::kMaxDevices) ? n : static_cast<int>(ring::kMaxDevices);
  for (int o = 0; o < visible; ++o) {
    ring::DeviceSlot& d = header_->devices[o];
    if (d.present.load(std::memory_order_acquire)) continue;  // filled with its own
    CUuuid u{};
    if (uuid_now(o, &u)) std::memcpy(d.uuid, u.bytes, sizeof d.uuid);
  }
  header_->visible_devices.store(static_cast<uint32_t>(visible), std::memory_order_release);
}

CUW_COLD void Tracker::devices_moved() noexcept {
  // Cleared first: a second move while this runs sets it again, and the next allocation
  // looks once more.
  header_->held_back.fetch_and(~ring::kDevicesMoved, std::memory_order_relaxed);
  std::lock_guard<std::mutex> dl(device_mu_);
  const uint32_t visible = header_->visible_devices.load(std::memory_order_relaxed);
  for (uint32_t o = 0; o < visible && o < ring::kMaxDevices; ++o) {
    const int ordinal = static_cast<int>(o);
    ring::DeviceSlot& d = header_->devices[o];
    CUuuid u{};
    if (!uuid_now(ordinal, &u) || std::memcmp(d.uuid, u.bytes, sizeof d.uuid) == 0) continue;
    if (!(filled_.load(std::memory_order_acquire) >> o & 1)) {
      std::memcpy(d.uuid, u.bytes, sizeof d.uuid);  // never used: nothing counted on it
      continue;
    }
    // The job's share of this device moves with it: what the process holds here, taken off
    // the old GPU's entry and put on the new one's (the process's own counters stay with
    // the ordinal). The bytes are read, then the ordinal's entry switched: a charge or free
    // counted in `used` (an atomic, no lock) before the read is in `held`, one that reads the
    // entry after the switch goes to the new entry. Left open: a call of another thread that
    // reads the ordinal's entry on one side of these two steps and changes `used` on the
    // other leaves its bytes on the wrong one of the two GPUs' entries; the job's total stays
    // exact. It needs another thread's allocation or free in flight at the first allocation
    // after the resume.
    const int g_new = job_slot_ >= 0 ? job_->gpu_index(reinterpret_cast<const uint8_t*>(u.bytes), d.physical_total) : -1;
    uint64_t held = 0;
    int g_old = -1;
    held = d.used.load(std::memory_order_relaxed);
    g_old = job_gpu(ordinal);
    if (job_slot_ >= 0) job_gpu_[o].store(static_cast<int8_t>(g_new), std::memory_order_relaxed);
    std::memcpy(d.uuid, u.bytes, sizeof d.uuid);
    if (g_old >= 0 && held) job_->uncharge(job_slot_, g_old, held);
    if (g_new >= 0 && held) job_->force_charge(job_slot_, g_new, held);
    log::info("cuwarden: device %d was restored onto another GPU; %llu bytes counted there now", ordinal,
              static_cast<unsigned long long>(held));
  }
}

}  // namespace cuw::core
