// fakecuda: legacy IPC handles of device memory, and peer access between contexts.
//
// IPC: a handle names the driver allocation that contains the address (like the driver,
// an interior pointer exports the whole allocation, from its base) and the exporting
// process. Opening one in the process that exported it fails, as on the driver
// (CUDA_ERROR_INVALID_CONTEXT); another process cannot map this simulated device memory
// (a private mapping), so opening answers CUDA_ERROR_NOT_SUPPORTED there.
// fakecuda_ipc_handle_range() decodes a handle for tests.
//
// Peer access: cuCtxEnablePeerAccess / cuCtxDisablePeerAccess keep the driver's state
// machine (already enabled, not enabled, same device); every device can reach every other.
#include <unistd.h>

#include <cstring>
#include <set>
#include <utility>

#include "internal.hpp"  // before fakecuda.h: it sets up cuda.h for the driver side
#include "../fakecuda.h"

namespace fc {
namespace {

constexpr uint64_t kIpcMagic = 0x6370696b61667563ULL;  // "cufakipc"

struct IpcPayload {
  uint64_t magic;
  uint64_t pid;
  uint64_t base;
  uint64_t size;
};
static_assert(sizeof(IpcPayload) <= sizeof(CUipcMemHandle));

std::mutex g_peer_mu;
auto& g_peer = *new std::set<std::pair<Context*, Context*>>;  // (from, to); never destroyed

}  // namespace
}  // namespace fc

using namespace fc;

FC_API CUresult cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  FC_ENTER();
  Context* ctx;
  if (CUresult rc = require_context(&ctx)) return rc;
  if (!pHandle) return CUDA_ERROR_INVALID_VALUE;
  Allocation a;
  if (!table_find(dptr, &a) || a.kind != AllocKind::device) return CUDA_ERROR_INVALID_VALUE;
  IpcPayload p{kIpcMagic, static_cast<uint64_t>(getpid()), a.base, a.size};
  std::memset(pHandle, 0, sizeof *pHandle);
  std::memcpy(pHandle->reserved, &p, sizeof p);
  return CUDA_SUCCESS;
}

FC_API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) {
  FC_ENTER();
  Context* ctx;
  if (CUresult rc = require_context(&ctx)) return rc;
  if (!pdptr || (Flags & ~static_cast<unsigned>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))) return CUDA_ERROR_INVALID_VALUE;
  IpcPayload p;
  std::memcpy(&p, handle.reserved, sizeof p);
  if (p.magic != kIpcMagic) return CUDA_ERROR_INVALID_VALUE;
  if (p.pid == static_cast<uint64_t>(getpid())) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_ERROR_NOT_SUPPORTED;
}

// CUDA 4.1's ABI of the same call (cuda.h maps the name to _v2; the driver exports both).
FC_API CUresult cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) {
  return cuIpcOpenMemHandle_v2(pdptr, handle, Flags);
}

FC_API CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  FC_ENTER();
  (void)dptr;
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  return CUDA_ERROR_INVALID_VALUE;  // nothing is ever opened here
}

FC_API CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags) {
  FC_ENTER();
  Context* ctx;
  if (CUresult rc = require_context(&ctx)) return rc;
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Context* peer = context_from_handle(peerContext);
  if (!peer) return CUDA_ERROR_INVALID_CONTEXT;
  if (peer->ordinal == ctx->ordinal) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard lk(g_peer_mu);
  if (!g_peer.insert({ctx, peer}).second) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  return CUDA_SUCCESS;
}

FC_API CUresult cuCtxDisablePeerAccess(CUcontext peerContext) {
  FC_ENTER();
  Context* ctx;
  if (CUresult rc = require_context(&ctx)) return rc;
  Context* peer = context_from_handle(peerContext);
  if (!peer) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard lk(g_peer_mu);
  return g_peer.erase({ctx, peer}) ? CUDA_SUCCESS : CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
}

// ------------------------------------------------------------------ test extensions

FC_API int fakecuda_ipc_handle_range(const CUipcMemHandle* handle, CUdeviceptr* base, size_t* size) {
  if (!handle) return -1;
  IpcPayload p;
  std::memcpy(&p, handle->reserved, sizeof p);
  if (p.magic != kIpcMagic) return -1;
  if (base) *base = p.base;
  if (size) *size = p.size;
  return 0;
}

FC_API int fakecuda_peer_access_enabled(CUcontext from, CUcontext to) {
  Context* a = context_from_handle(from);
  Context* b = context_from_handle(to);
  if (!a || !b) return 0;
  std::lock_guard lk(g_peer_mu);
  return g_peer.count({a, b}) ? 1 : 0;
}
