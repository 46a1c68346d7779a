// fakecuda: legacy IPC handles of device memory, and peer access between contexts.
//
// IPC: a handle names the driver allocation that contains the address (like the driver,
// an interior pointer exports the whole allocation, from its base) and the exporting
// process. Opening one in the process that exported it fails, as on the driver
// (CUDA_ERROR_INVALID_CONTEXT); another process maps the allocation's bytes from the
// exporter's arena (a memfd, reached through /proc/PID/fd), shared both ways, until
// cuIpcCloseMemHandle (which waits for the context's work first, as cuMemFree does) or the
// destruction of the context that opened it. The same handle opened again in a context answers
// the same address, counted. A handle whose exporter is gone, or a forked child's (its arena is
// private), answers CUDA_ERROR_INVALID_HANDLE / CUDA_ERROR_NOT_SUPPORTED.
// fakecuda_ipc_handle_range() decodes a handle for tests.
//
// Peer access: cuCtxEnablePeerAccess / cuCtxDisablePeerAccess keep the driver's state
// machine (already enabled, not enabled, same device); every device can reach every other.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
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
  int64_t arena_fd;      // the exporter's arena memfd, -1 if it cannot be shared
  uint64_t arena_off;    // the allocation's offset in it
  uint64_t ordinal;
};
static_assert(sizeof(IpcPayload) <= sizeof(CUipcMemHandle));

// Open IPC mappings of this process, by address: the same handle opened again in a context
// gets the same address, and each close drops one reference.
struct Opened {
  Context* ctx;
  uint64_t pid;
  uint64_t base;
  int refs;
};
std::mutex g_open_mu;
auto& g_open = *new std::map<uintptr_t, Opened>;

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
  Arena& arena = device(a.ordinal)->arena();
  IpcPayload p{kIpcMagic, static_cast<uint64_t>(getpid()), a.base, a.size, arena.fd(), a.base - arena.base(),
               static_cast<uint64_t>(a.ordinal)};
  std::memset(pHandle, 0, sizeof *pHandle);
  std::memcpy(pHandle->reserved, &p, sizeof p);
  table_mark_exported(a.base);  // the checkpoint cannot carry it any more
  return CUDA_SUCCESS;
}

FC_API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) {
  FC_ENTER();
  Context* ctx;
  if (CUresult rc = require_context(&ctx)) return rc;
  // The driver takes exactly CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS (it refuses 0: measured on the H200).
  if (!pdptr || Flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) return CUDA_ERROR_INVALID_VALUE;
  IpcPayload p;
  std::memcpy(&p, handle.reserved, sizeof p);
  if (p.magic != kIpcMagic) return CUDA_ERROR_INVALID_VALUE;
  if (p.pid == static_cast<uint64_t>(getpid())) return CUDA_ERROR_INVALID_CONTEXT;
  if (p.arena_fd < 0) return CUDA_ERROR_NOT_SUPPORTED;
  {
    // The same handle opened again in this context: the same address, counted.
    std::lock_guard lk(g_open_mu);
    for (auto& [addr, o] : g_open)
      if (o.ctx == ctx && o.pid == p.pid && o.base == p.base) {
        ++o.refs;
        *pdptr = addr;
        return CUDA_SUCCESS;
      }
  }
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%llu/fd/%lld", static_cast<unsigned long long>(p.pid),
                static_cast<long long>(p.arena_fd));
  const int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;  // the exporter is gone
  // The allocation's pages, at a page-aligned offset of the memfd (blocks are 512-aligned).
  const uint64_t page = 4096, lo = p.arena_off / page * page, skew = p.arena_off - lo;
  void* m = mmap(nullptr, p.size + skew, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(lo));
  close(fd);
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  Allocation a;
  a.base = reinterpret_cast<uintptr_t>(m) + skew;
  a.size = p.size;
  a.block = p.size + skew;
  a.kind = AllocKind::ipc;
  a.ordinal = static_cast<int>(p.ordinal);
  a.ctx = ctx;
  table_insert(a);
  {
    std::lock_guard lk(g_open_mu);
    g_open[a.base] = Opened{ctx, p.pid, p.base, 1};
  }
  *pdptr = a.base;
  return CUDA_SUCCESS;
}

// CUDA 4.1's ABI of the same call (cuda.h maps the name to _v2; the driver exports both).
FC_API CUresult cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) {
  return cuIpcOpenMemHandle_v2(pdptr, handle, Flags);
}

FC_API CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  Allocation a;
  if (!table_find(dptr, &a) || a.base != dptr || a.kind != AllocKind::ipc) return CUDA_ERROR_INVALID_VALUE;
  {
    std::lock_guard lk(g_open_mu);
    auto it = g_open.find(dptr);
    if (it != g_open.end() && --it->second.refs > 0) return CUDA_SUCCESS;
    if (it != g_open.end()) g_open.erase(it);
  }
  // Like cuMemFree, the close waits for work that may still use the mapping.
  if (a.ctx) context_synchronize(a.ctx);
  table_erase(dptr, &a);
  ipc_unmap(a);
  return CUDA_SUCCESS;
}

void fc::ipc_unmap(const Allocation& a) {
  {
    std::lock_guard lk(g_open_mu);
    g_open.erase(a.base);
  }
  const uintptr_t skew = a.block - a.size;
  munmap(reinterpret_cast<void*>(a.base - skew), a.block);
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
