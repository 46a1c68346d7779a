// cuwarden interposer: driver_resource, a pool's upstream: the real driver's calls.
#include "backends/memory_resource.hpp"

#include "base/real.hpp"
#include "core/ledger.hpp"
#include "core/tracker.hpp"

namespace cuw::backends {

namespace {
void count(core::Tracker* t, int ordinal, core::Ledger::Call c) {
  if (!t) return;
  if (ring::DeviceSlot* d = t->device(ordinal)) core::Ledger::called(*d, c);
}
}  // namespace

CUresult driver_resource::do_allocate(CUdeviceptr* out, std::size_t bytes) {
  auto real = REAL(cuMemAlloc_v2);
  const CUresult r = real ? real(out, bytes) : CUDA_ERROR_NOT_INITIALIZED;
  count(tracker_, ordinal_, core::Ledger::Call::take);
  if (r == CUDA_SUCCESS && tracker_) core::Ledger::segment(*tracker_, ordinal_, *out, bytes, true);
  return r;
}

CUresult driver_resource::do_deallocate(CUdeviceptr p, std::size_t bytes) {
  auto real = REAL(cuMemFree_v2);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  // The record goes first: once the driver's free returns, the address may be another pool's
  // segment, whose record is not to be taken.
  if (tracker_) core::Ledger::segment(*tracker_, ordinal_, p, bytes, false);
  const CUresult r = real(p);
  count(tracker_, ordinal_, core::Ledger::Call::give);
  if (r != CUDA_SUCCESS && tracker_) core::Ledger::segment(*tracker_, ordinal_, p, bytes, true);  // still ours
  return r;
}

CUresult driver_resource::do_ipc_handle(CUipcMemHandle* handle, CUdeviceptr p) {
  auto real = REAL(cuIpcGetMemHandle);
  return real ? real(handle, p) : CUDA_ERROR_NOT_INITIALIZED;
}

}  // namespace cuw::backends
