// cuwarden interposer: the importer's side of IPC of pooled memory (ipc.hpp): a handle of
// ours opened through its exporter's listener (granules mapped, or the slab opened), counted
// per context, closed, and forgotten with its context.
#include "backends/ipc.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backends/driver_calls.hpp"
#include "backends/ipc_wire.hpp"
#include "base/work_epoch.hpp"

namespace cuw::backends::ipc {

namespace detail {

namespace {

constexpr int kOpenMs = 10000;             // an importer's whole wait for the listener
constexpr uint64_t kMaxSpan = 1ULL << 40;  // no span is larger (a reply saying so is wrong)

// The entry points used here besides vmm()'s, unhooked: an import is not the program's
// allocation.
struct Calls {
  CUresult (*legacy_open)(CUdeviceptr*, CUipcMemHandle, unsigned int) = nullptr;
  CUresult (*legacy_close)(CUdeviceptr) = nullptr;
  CUresult (*address_range)(CUdeviceptr*, size_t*, CUdeviceptr) = nullptr;
  CUresult (*device_count)(int*) = nullptr;
  CUresult (*can_access_peer)(int*, CUdevice, CUdevice) = nullptr;
};

const Calls& calls() {
  static const Calls c = [] {
    Calls x;
    resolve(x.legacy_open, "cuIpcOpenMemHandle_v2");
    if (!x.legacy_open) resolve(x.legacy_open, "cuIpcOpenMemHandle");
    resolve(x.legacy_close, "cuIpcCloseMemHandle");
    resolve(x.address_range, "cuMemGetAddressRange_v2");
    resolve(x.device_count, "cuDeviceGetCount");
    resolve(x.can_access_peer, "cuDeviceCanAccessPeer");
    return x;
  }();
  return c;
}

/// One open of a block (counted: the same handle opened again in a context shares it).
struct Import {
  CUcontext ctx = nullptr;
  std::string key;            ///< the handle's bytes
  CUdeviceptr block = 0;      ///< what open() returned
  uint64_t bytes = 0;         ///< the block
  int refs = 1;
  ipc_span::kind how{};
  CUdeviceptr span_base = 0;  ///< granules: our reserved range; legacy: the opened slab
  uint64_t span_bytes = 0;
  uint64_t granule_bytes = 0;
  std::string legacy_key;     ///< legacy: the slab's handle's bytes
};

/// A slab opened in a context, shared by the blocks imported from it.
struct Legacy {
  CUdeviceptr base = 0;
  uint64_t size = 0;
  int refs = 0;
};

struct Importer {
  std::mutex mu;                                        // guards the maps
  std::map<CUdeviceptr, Import> by_block;               // by what open() returned
  std::map<std::pair<CUcontext, std::string>, CUdeviceptr> by_handle;
  std::map<std::pair<CUcontext, std::string>, Legacy> slabs;
  std::atomic<uint64_t> count{0};                       // by_block.size() + slabs.size()
  std::mutex open_mu;                                   // serializes the driver's legacy opens and closes
};

Importer& importer() {
  static Importer* i = new Importer;
  return *i;
}

void update_count(Importer& im) {
  im.count.store(im.by_block.size() + im.slabs.size(), std::memory_order_release);
}

/// Access to imported granules for the current device and every device that can reach the
/// memory's own, as CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS (the only flag the driver takes) asks
/// (mapped memory is not covered by peer access the program enables).
std::vector<CUmemAccessDesc> access_for(CUdevice current, int owner) {
  std::vector<CUmemAccessDesc> d;
  const auto add = [&](int dev) {
    for (const CUmemAccessDesc& x : d)
      if (x.location.id == dev) return;
    CUmemAccessDesc x{};
    x.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    x.location.id = dev;
    x.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    d.push_back(x);
  };
  add(current);
  int n = 0;
  if (owner >= 0 && calls().device_count &&
      calls().device_count(&n) == CUDA_SUCCESS) {
    for (int dev = 0; dev < n && dev < 64; ++dev) {
      int can = dev == owner ? 1 : 0;
      if (dev != owner && calls().can_access_peer) calls().can_access_peer(&can, dev, owner);
      if (can) add(dev);
    }
  }
  return d;
}

void unmap_granules(CUdeviceptr base, uint64_t bytes, uint64_t granule, uint64_t mapped) {
  for (uint64_t i = 0; i < mapped; ++i) vmm().unmap(base + i * granule, granule);
  vmm().address_free(base, bytes);
}

CUresult map_granules(int sock, const Reply& rp, uint64_t deadline, CUdeviceptr* out) {
  const Vmm& c = vmm();
  if (!c.import_fd || !c.reserve || !c.map || !c.set_access || !c.unmap || !c.address_free || !c.release)
    return CUDA_ERROR_NOT_SUPPORTED;
  CUdevice dev = 0;
  if (!drv().ctx_get_device || drv().ctx_get_device(&dev) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_CONTEXT;
  CUdeviceptr base = 0;
  CUresult r = c.reserve(&base, rp.bytes, rp.granule_bytes, 0, 0);
  if (r != CUDA_SUCCESS) return r;
  const uint64_t count = rp.bytes / rp.granule_bytes;
  uint64_t mapped = 0;
  int owner = -1;  // the memory's device, as this process numbers it
  while (mapped < count && r == CUDA_SUCCESS) {
    int fds[kChunk];
    const int n = recv_fds(sock, fds, deadline);
    if (n <= 0 || mapped + static_cast<uint64_t>(n) > count) {
      for (int k = 0; k < n; ++k) ::close(fds[k]);
      r = CUDA_ERROR_INVALID_HANDLE;  // no answer in time, or the block went away while it was sent
      break;
    }
    for (int k = 0; k < n; ++k) {
      CUmemGenericAllocationHandle h = 0;
      if (r == CUDA_SUCCESS)
        r = c.import_fd(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fds[k])),
                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      ::close(fds[k]);
      if (r != CUDA_SUCCESS) continue;
      if (owner < 0 && c.properties) {
        CUmemAllocationProp prop{};
        if (c.properties(&prop, h) == CUDA_SUCCESS && prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE)
          owner = prop.location.id;
      }
      r = c.map(base + mapped * rp.granule_bytes, rp.granule_bytes, 0, h, 0);
      c.release(h);  // the mapping holds the memory
      if (r == CUDA_SUCCESS) ++mapped;
    }
  }
  if (r == CUDA_SUCCESS) {
    try {
      const std::vector<CUmemAccessDesc> d = access_for(dev, owner);
      r = c.set_access(base, rp.bytes, d.data(), d.size());
    } catch (...) {
      r = CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  if (r != CUDA_SUCCESS) {
    unmap_granules(base, rp.bytes, rp.granule_bytes, mapped);
    return r == CUDA_ERROR_OUT_OF_MEMORY || r == CUDA_ERROR_INVALID_HANDLE ? r : CUDA_ERROR_MAP_FAILED;
  }
  *out = base;
  return CUDA_SUCCESS;
}

/// Opens the slab `rp` names in `ctx` (once per context; counted). CUDA_SUCCESS and its base.
CUresult open_slab(CUcontext ctx, const Reply& rp, unsigned flags, uint64_t block_bytes, std::string* key,
                   CUdeviceptr* base) {
  const Calls& c = calls();
  if (!c.legacy_open || !c.legacy_close || !c.address_range) return CUDA_ERROR_NOT_SUPPORTED;
  Importer& im = importer();
  std::lock_guard<std::mutex> serial(im.open_mu);
  try {
    key->assign(reinterpret_cast<const char*>(&rp.legacy), sizeof rp.legacy);
    {
      std::lock_guard<std::mutex> g(im.mu);
      auto it = im.slabs.find({ctx, *key});
      if (it != im.slabs.end()) {
        if (rp.offset > it->second.size || block_bytes > it->second.size - rp.offset) return CUDA_ERROR_INVALID_HANDLE;
        ++it->second.refs;
        *base = it->second.base;
        return CUDA_SUCCESS;
      }
    }
    Legacy l;
    CUresult r = c.legacy_open(&l.base, rp.legacy, flags);
    if (r != CUDA_SUCCESS) return r;
    CUdeviceptr b = 0;
    size_t size = 0;
    // The slab as the driver mapped it, not as the reply says: the block must lie inside.
    if (c.address_range(&b, &size, l.base) != CUDA_SUCCESS || b != l.base || rp.offset > size ||
        block_bytes > size - rp.offset) {
      c.legacy_close(l.base);
      return CUDA_ERROR_INVALID_HANDLE;
    }
    l.size = size;
    l.refs = 1;
    std::lock_guard<std::mutex> g(im.mu);
    im.slabs.emplace(std::make_pair(ctx, *key), l);
    update_count(im);
    *base = l.base;
    return CUDA_SUCCESS;
  } catch (...) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
}

/// Drops one reference to a slab (under im.open_mu); the driver's close with the last.
CUresult close_slab(CUcontext ctx, const std::string& key, bool call_driver) {
  Importer& im = importer();
  CUdeviceptr base = 0;
  {
    std::lock_guard<std::mutex> g(im.mu);
    auto it = im.slabs.find({ctx, key});
    if (it == im.slabs.end() || --it->second.refs > 0) return CUDA_SUCCESS;
    base = it->second.base;
    im.slabs.erase(it);
    update_count(im);
  }
  if (!call_driver) return CUDA_SUCCESS;
  CtxScope scope(ctx);
  return calls().legacy_close(base);  // waits for the context's work, as the driver's close does
}

/// Undoes one mapping open() made (the import is already out of the maps).
CUresult unmap_import(const Import& m, bool context_alive) {
  if (m.how == ipc_span::kind::granules) {
    if (context_alive) {
      // cuMemUnmap does not wait for the GPU, and work queued on the mapping may still run (a
      // copy out of it, as numba's staged import makes right before closing): wait first, as
      // the driver's own close of a legacy mapping does. Not during a capture, where waiting
      // is refused (closing a mapping a graph being captured reads is the program's error).
      CtxScope scope(m.ctx);
      if (!work::capturing() && drv().ctx_sync) drv().ctx_sync();
    }
    unmap_granules(m.span_base, m.span_bytes, m.granule_bytes, m.span_bytes / m.granule_bytes);
    return CUDA_SUCCESS;
  }
  std::lock_guard<std::mutex> serial(importer().open_mu);
  return close_slab(m.ctx, m.legacy_key, context_alive);
}

}  // namespace

void importer_lock() {
  importer().open_mu.lock();
  importer().mu.lock();
}
void importer_unlock() {
  importer().mu.unlock();
  importer().open_mu.unlock();
}
void importer_forget() {
  Importer& im = importer();
  im.by_block.clear();
  im.by_handle.clear();
  im.slabs.clear();
  update_count(im);
}

}  // namespace detail

using namespace detail;

CUresult open(CUdeviceptr* p, const CUipcMemHandle& handle, unsigned flags) {
  // As the driver: exactly CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS (it refuses 0: measured on the H200).
  if (!p || flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) return CUDA_ERROR_INVALID_VALUE;
  CUcontext ctx = nullptr;
  if (!drv().ctx_get_current || drv().ctx_get_current(&ctx) != CUDA_SUCCESS || !ctx) return CUDA_ERROR_INVALID_CONTEXT;
  Handle h;
  std::memcpy(&h, &handle, sizeof h);
  if (h.pid == static_cast<uint64_t>(getpid())) return CUDA_ERROR_INVALID_CONTEXT;  // as the driver answers
  fork_safe();
  Importer& im = importer();
  std::string key;
  try {
    key.assign(reinterpret_cast<const char*>(&handle), sizeof handle);
    std::lock_guard<std::mutex> g(im.mu);
    if (auto it = im.by_handle.find({ctx, key}); it != im.by_handle.end()) {  // opened before here: counted
      ++im.by_block[it->second].refs;
      *p = it->second;
      return CUDA_SUCCESS;
    }
  } catch (...) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }

  const uint64_t deadline = mono_ms() + kOpenMs;
  const int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (sock < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  sockaddr_un a;
  const socklen_t alen = address(&a, h.pid, h.nonce);
  int rc;
  for (;;) {  // a full backlog (EAGAIN) clears as the listener accepts: try again until the deadline
    rc = connect(sock, reinterpret_cast<sockaddr*>(&a), alen);
    if (rc == 0 || (errno != EINTR && errno != EAGAIN) || left_ms(deadline) == 0) break;
    if (errno == EAGAIN) usleep(10000);
  }
  const Request rq{kMagic, h.nonce, h.ptr, h.bytes};
  Reply rp{};
  if (rc != 0 || !write_all(sock, &rq, sizeof rq, deadline) || !trusted_peer(sock) ||
      !read_all(sock, &rp, sizeof rp, deadline) || rp.nonce != h.nonce) {
    ::close(sock);
    return CUDA_ERROR_INVALID_HANDLE;  // no exporter under that name (gone), or it would not say
  }
  if (rp.status != CUDA_SUCCESS) {
    ::close(sock);
    return static_cast<CUresult>(rp.status);
  }
  // What the reply says is checked before anything is mapped from it.
  const bool granules = rp.how == static_cast<uint32_t>(ipc_span::kind::granules);
  const bool legacy = rp.how == static_cast<uint32_t>(ipc_span::kind::legacy);
  if ((!granules && !legacy) || h.bytes == 0 || rp.bytes > kMaxSpan || rp.offset > rp.bytes ||
      h.bytes > rp.bytes - rp.offset ||
      (granules && (rp.granule_bytes == 0 || rp.granule_bytes > rp.bytes || rp.bytes % rp.granule_bytes))) {
    ::close(sock);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  Import m;
  m.ctx = ctx;
  m.bytes = h.bytes;
  m.how = static_cast<ipc_span::kind>(rp.how);
  m.span_bytes = rp.bytes;
  m.granule_bytes = rp.granule_bytes;
  CUresult r = granules ? map_granules(sock, rp, deadline, &m.span_base)
                        : open_slab(ctx, rp, flags, h.bytes, &m.legacy_key, &m.span_base);
  ::close(sock);
  if (r != CUDA_SUCCESS) return r;
  m.block = m.span_base + rp.offset;
  try {
    m.key = key;
    std::unique_lock<std::mutex> g(im.mu);
    if (auto it = im.by_handle.find({ctx, key}); it != im.by_handle.end()) {
      // Another thread opened the same handle meanwhile: count on its mapping, undo ours.
      ++im.by_block[it->second].refs;
      *p = it->second;
      g.unlock();
      unmap_import(m, true);
      return CUDA_SUCCESS;
    }
    im.by_handle[{ctx, key}] = m.block;
    im.by_block[m.block] = m;
    update_count(im);
  } catch (...) {
    // Cannot remember it: undo, rather than leave a mapping nothing closes.
    {
      std::lock_guard<std::mutex> g(im.mu);
      im.by_handle.erase({ctx, key});
      im.by_block.erase(m.block);
      update_count(im);
    }
    unmap_import(m, true);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *p = m.block;
  return CUDA_SUCCESS;
}

bool close(CUdeviceptr p, CUresult* result) {
  Importer& im = importer();
  if (im.count.load(std::memory_order_acquire) == 0) return false;
  Import m;
  {
    std::lock_guard<std::mutex> g(im.mu);
    auto it = im.by_block.find(p);
    if (it == im.by_block.end()) {
      // Inside a slab opened for blocks of it, not one of them: the driver would unmap the
      // slab under them.
      for (const auto& [k, l] : im.slabs)
        if (p >= l.base && p - l.base < l.size) {
          *result = CUDA_ERROR_INVALID_VALUE;
          return true;
        }
      return false;
    }
    if (--it->second.refs > 0) {
      *result = CUDA_SUCCESS;
      return true;
    }
    m = std::move(it->second);
    im.by_block.erase(it);
    im.by_handle.erase({m.ctx, m.key});
    update_count(im);
  }
  *result = unmap_import(m, true);
  return true;
}

bool imported(CUdeviceptr p, range* out) {
  Importer& im = importer();
  if (im.count.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard<std::mutex> g(im.mu);
  auto it = im.by_block.upper_bound(p);
  if (it == im.by_block.begin()) return false;
  --it;
  if (p - it->first >= std::max<uint64_t>(it->second.bytes, 1)) return false;
  if (out) *out = range{it->first, it->second.bytes};
  return true;
}

bool has_imports() noexcept { return importer().count.load(std::memory_order_acquire) != 0; }

void context_gone(CUcontext ctx) noexcept {
  Importer& im = importer();
  if (im.count.load(std::memory_order_acquire) == 0) return;
  std::vector<Import> gone;
  {
    std::lock_guard<std::mutex> g(im.mu);
    for (auto it = im.by_block.begin(); it != im.by_block.end();) {
      if (it->second.ctx != ctx) {
        ++it;
        continue;
      }
      im.by_handle.erase({ctx, it->second.key});
      try {
        gone.push_back(std::move(it->second));
      } catch (...) {  // its addresses stay reserved: nothing else can be done without memory
      }
      it = im.by_block.erase(it);
    }
    for (auto it = im.slabs.begin(); it != im.slabs.end();)
      it = it->first.first == ctx ? im.slabs.erase(it) : std::next(it);  // the driver unmapped them
    update_count(im);
  }
  // Mapped granules outlive the context: give their addresses back.
  for (const Import& m : gone)
    if (m.how == ipc_span::kind::granules) unmap_import(m, false);
}

}  // namespace cuw::backends::ipc
