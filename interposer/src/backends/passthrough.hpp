// cuwarden interposer: the passthrough backend (CUWARDEN_POOL=off, the default). Every call
// goes to the driver entry point the program called; the core counts, caps and records it
// (core/record.hpp). Nothing is kept, so there is nothing to give back, no block to
// enumerate, and no notice to act on.
//
// Its methods are inline and public: with passthrough chosen, the hooks call them directly
// (backends/start.hpp: with_backend), so the hot path of an allocation stays one stretch of
// code in the hook (one compare more than calling the core directly); a pooling backend
// hands them what it does not serve. The do_* overrides are for calls through `backend&`.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "backends/backend.hpp"
#include "core/record.hpp"
#include "core/tracker.hpp"
#include "cuw/attrs.hpp"
#include "cuw/ring.hpp"

namespace cuw::backends {

class passthrough final : public backend {
 public:
  constexpr passthrough() noexcept : backend(core::PoolKind::off) {}

  CUW_INLINE CUresult allocate(core::Tracker& t, CUdeviceptr* dptr, size_t bytes, alloc_fn real) {
    bool assumed = false;
    const int ordinal = t.allocation_device(&assumed);
    return core::tracked_alloc(t, ring::Api::cuMemAlloc, ordinal, assumed, bytes, 0, dptr,
                               [&] { return real(dptr, bytes); });
  }
  CUW_INLINE CUresult deallocate(core::Tracker& t, CUdeviceptr dptr, free_fn real) {
    return core::tracked_free(t, t.pointers(), dptr, ring::Api::cuMemFree, 0, [&] { return real(dptr); });
  }
  CUW_INLINE CUresult allocate_async(core::Tracker& t, CUdeviceptr* dptr, size_t bytes, CUstream stream,
                                     alloc_async_fn real) {
    return core::tracked_alloc_async(t, ring::Api::cuMemAllocAsync, nullptr, stream, bytes, dptr,
                                     [&] { return real(dptr, bytes, stream); });
  }
  CUW_INLINE CUresult deallocate_async(core::Tracker& t, CUdeviceptr dptr, CUstream stream, bool /*per_thread*/,
                                       free_async_fn real) {
    return core::tracked_free(t, t.pointers(), dptr, ring::Api::cuMemFreeAsync, reinterpret_cast<uint64_t>(stream),
                              [&] { return real(dptr, stream); });
  }
  void stream_created(core::Tracker&, CUstream, unsigned) {}
  void stream_destroying(core::Tracker&, CUstream) {}
  bool context_destroy(core::Tracker&, call_ref<CUcontext()> which, call_ref<bool()> destroy) {
    which();
    return destroy();
  }
  CUresult context_retain(core::Tracker&, call_ref<CUresult()> call) { return call(); }
  void peer_access_changed(core::Tracker&, CUcontext, bool) {}
  void capture_beginning(core::Tracker&) {}
  bool locate(core::Tracker&, CUdeviceptr, range*, bool*) { return false; }
  CUresult ipc_export(core::Tracker&, CUipcMemHandle* handle, CUdeviceptr p, ipc_export_fn real) {
    return real(handle, p);
  }
  CUresult ipc_import(core::Tracker&, CUdeviceptr* p, CUipcMemHandle handle, unsigned flags, ipc_import_fn real) {
    return real(p, handle, flags);
  }
  CUresult ipc_close(core::Tracker&, CUdeviceptr p, ipc_close_fn real) { return real(p); }
  bool for_each_block(core::Tracker&, call_ref<void(const block_info&)>) { return true; }
  pool_stats stats(core::Tracker&, int) { return {}; }
  uint64_t release() override { return 0; }

 private:
  CUresult do_allocate(core::Tracker& t, CUdeviceptr* dptr, size_t bytes, alloc_fn real) override {
    return allocate(t, dptr, bytes, real);
  }
  CUresult do_deallocate(core::Tracker& t, CUdeviceptr dptr, free_fn real) override {
    return deallocate(t, dptr, real);
  }
  CUresult do_allocate_async(core::Tracker& t, CUdeviceptr* dptr, size_t bytes, CUstream stream,
                             alloc_async_fn real) override {
    return allocate_async(t, dptr, bytes, stream, real);
  }
  CUresult do_deallocate_async(core::Tracker& t, CUdeviceptr dptr, CUstream stream, bool per_thread,
                               free_async_fn real) override {
    return deallocate_async(t, dptr, stream, per_thread, real);
  }
  void do_stream_created(core::Tracker& t, CUstream s, unsigned flags) override { stream_created(t, s, flags); }
  void do_stream_destroying(core::Tracker& t, CUstream s) override { stream_destroying(t, s); }
  bool do_context_destroy(core::Tracker& t, call_ref<CUcontext()> which, call_ref<bool()> destroy) override {
    return context_destroy(t, which, destroy);
  }
  CUresult do_context_retain(core::Tracker& t, call_ref<CUresult()> call) override { return context_retain(t, call); }
  void do_peer_access_changed(core::Tracker& t, CUcontext peer, bool enabled) override {
    peer_access_changed(t, peer, enabled);
  }
  void do_capture_beginning(core::Tracker& t) override { capture_beginning(t); }
  bool do_locate(core::Tracker& t, CUdeviceptr p, range* out, bool* live) override { return locate(t, p, out, live); }
  CUresult do_ipc_export(core::Tracker& t, CUipcMemHandle* handle, CUdeviceptr p, ipc_export_fn real) override {
    return ipc_export(t, handle, p, real);
  }
  CUresult do_ipc_import(core::Tracker& t, CUdeviceptr* p, CUipcMemHandle handle, unsigned flags,
                         ipc_import_fn real) override {
    return ipc_import(t, p, handle, flags, real);
  }
  CUresult do_ipc_close(core::Tracker& t, CUdeviceptr p, ipc_close_fn real) override { return ipc_close(t, p, real); }
  /// Passthrough pools nothing: its exports are the driver's own handles.
  CUresult do_ipc_describe(core::Tracker&, CUdeviceptr, uint64_t, ipc_span*) override {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  bool do_for_each_block(core::Tracker& t, call_ref<void(const block_info&)> visit) override {
    return for_each_block(t, visit);
  }
  pool_stats do_stats(core::Tracker& t, int ordinal) override { return stats(t, ordinal); }
};

}  // namespace cuw::backends
