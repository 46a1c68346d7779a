// cuwarden interposer: IPC of pooled memory (ipc.hpp): our handles, the exporter's listener,
// the importer's mappings.
#include "backends/ipc.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "backends/driver_calls.hpp"
#include "base/log.hpp"
#include "base/work_epoch.hpp"
#include "core/tracker.hpp"

namespace cuw::backends::ipc {

namespace {

constexpr uint64_t kMagic = 0x31637069777563ULL;  // "cuwipc1"
constexpr int kChunk = 64;                         // descriptors per message (SCM_MAX_FD is 253)
constexpr int kTimeoutMs = 5000;                   // an importer's wait for the listener, per step

/// Our handle, in CUipcMemHandle's 64 bytes.
struct Handle {
  uint64_t magic;
  uint64_t pid;    ///< the exporter (names its socket)
  uint64_t nonce;  ///< the exporter's listener: a reused pid answers no handle of another
  uint64_t ptr;    ///< the block, in the exporter
  uint64_t bytes;  ///< its requested size
  uint64_t reserved[3];
};
static_assert(sizeof(Handle) == sizeof(CUipcMemHandle));

struct Request {
  uint64_t magic;
  uint64_t nonce;
  uint64_t ptr;
  uint64_t bytes;
};

struct Reply {
  int32_t status;  ///< CUresult
  uint32_t how;    ///< ipc_span::kind
  uint64_t bytes;
  uint64_t offset;
  uint64_t granule_bytes;
  CUipcMemHandle legacy;
};

// The entry points used here, unhooked: an import is not the program's allocation.
struct Calls {
  CUresult (*retain)(CUmemGenericAllocationHandle*, void*) = nullptr;
  CUresult (*export_fd)(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long) = nullptr;
  CUresult (*import_fd)(CUmemGenericAllocationHandle*, void*, CUmemAllocationHandleType) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*address_free)(CUdeviceptr, size_t) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*legacy_open)(CUdeviceptr*, CUipcMemHandle, unsigned int) = nullptr;
  CUresult (*legacy_close)(CUdeviceptr) = nullptr;
};

const Calls& calls() {
  static const Calls c = [] {
    Calls x;
    resolve(x.retain, "cuMemRetainAllocationHandle");
    resolve(x.export_fd, "cuMemExportToShareableHandle");
    resolve(x.import_fd, "cuMemImportFromShareableHandle");
    resolve(x.release, "cuMemRelease");
    resolve(x.reserve, "cuMemAddressReserve");
    resolve(x.address_free, "cuMemAddressFree");
    resolve(x.map, "cuMemMap");
    resolve(x.unmap, "cuMemUnmap");
    resolve(x.set_access, "cuMemSetAccess");
    resolve(x.legacy_open, "cuIpcOpenMemHandle_v2");
    if (!x.legacy_open) resolve(x.legacy_open, "cuIpcOpenMemHandle");
    resolve(x.legacy_close, "cuIpcCloseMemHandle");
    return x;
  }();
  return c;
}

/// The listener's abstract socket address for exporter `pid` (per user: another user's
/// process cannot take the name first and answer our importers).
socklen_t address(sockaddr_un* a, uint64_t pid) {
  std::memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  const int n = std::snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "cuwarden-ipc-%u-%llu",
                              static_cast<unsigned>(getuid()), static_cast<unsigned long long>(pid));
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + static_cast<size_t>(n));
}

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

/// Reads exactly `n` bytes within kTimeoutMs per wait.
bool read_all(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n) {
    pollfd pf{fd, POLLIN, 0};
    const int k = poll(&pf, 1, kTimeoutMs);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    const ssize_t r = recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

/// Sends `count` (1..kChunk) descriptors with their count as the message.
bool send_fds(int sock, const int* fds, uint32_t count) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kChunk)] = {};
  iovec iov{&count, sizeof count};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = CMSG_SPACE(sizeof(int) * count);
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * count);
  std::memcpy(CMSG_DATA(c), fds, sizeof(int) * count);
  for (;;) {
    const ssize_t w = sendmsg(sock, &m, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    return w == static_cast<ssize_t>(sizeof count);
  }
}

/// Receives one message of send_fds: the descriptors into fds (at most kChunk), their count.
int recv_fds(int sock, int* fds) {
  pollfd pf{sock, POLLIN, 0};
  for (;;) {
    const int k = poll(&pf, 1, kTimeoutMs);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    break;
  }
  uint32_t count = 0;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kChunk)] = {};
  iovec iov{&count, sizeof count};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  ssize_t r;
  do r = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
  while (r < 0 && errno == EINTR);
  int got = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const int n = static_cast<int>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    for (int i = 0; i < n; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (got < kChunk) fds[got++] = fd;
      else ::close(fd);
    }
  }
  if (r != static_cast<ssize_t>(sizeof count) || (m.msg_flags & MSG_CTRUNC) || count != static_cast<uint32_t>(got)) {
    for (int i = 0; i < got; ++i) ::close(fds[i]);
    return -1;
  }
  return got;
}

// ---- the exporter ----------------------------------------------------------------------

struct Exporter {
  std::once_flag once;
  int sock = -1;
  uint64_t nonce = 0;
  backend* pool = nullptr;
  bool ok = false;
};

Exporter& exporter() {
  static Exporter* e = new Exporter;  // never destroyed: the listener may run at exit
  return *e;
}

/// Answers one importer: the block's span, then (granules) its descriptors in chunks.
void serve(int conn) {
  Exporter& ex = exporter();
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || (cred.uid != getuid() && cred.uid != 0)) return;
  Request rq{};
  if (!read_all(conn, &rq, sizeof rq) || rq.magic != kMagic || rq.nonce != ex.nonce) return;
  Reply rp{};
  ipc_span sp;
  core::Tracker* t = core::Tracker::instance_if_created();
  rp.status = t ? ex.pool->ipc_describe(*t, rq.ptr, rq.bytes, &sp) : CUDA_ERROR_INVALID_HANDLE;
  if (rp.status == CUDA_SUCCESS) {
    rp.how = static_cast<uint32_t>(sp.how);
    rp.bytes = sp.bytes;
    rp.offset = sp.offset;
    rp.granule_bytes = sp.granule_bytes;
    rp.legacy = sp.legacy;
    if (sp.how == ipc_span::kind::granules && (!calls().retain || !calls().export_fd || !sp.granule_bytes))
      rp.status = CUDA_ERROR_NOT_SUPPORTED;
  }
  if (!write_all(conn, &rp, sizeof rp) || rp.status != CUDA_SUCCESS || sp.how != ipc_span::kind::granules) return;
  // Each granule: a reference of our own (the pool may unmap it meanwhile), exported, sent.
  const uint64_t count = sp.bytes / sp.granule_bytes;
  for (uint64_t i = 0; i < count;) {
    int fds[kChunk];
    uint32_t n = 0;
    for (; n < kChunk && i < count; ++n, ++i) {
      CUmemGenericAllocationHandle h = 0;
      fds[n] = -1;
      if (calls().retain(&h, reinterpret_cast<void*>(sp.base + i * sp.granule_bytes)) == CUDA_SUCCESS) {
        int fd = -1;
        if (calls().export_fd(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS) fds[n] = fd;
        calls().release(h);
      }
      if (fds[n] < 0) {  // unmapped meanwhile, or not exportable: the importer sees a short answer
        for (uint32_t k = 0; k < n; ++k) ::close(fds[k]);
        return;
      }
    }
    const bool sent = send_fds(conn, fds, n);
    for (uint32_t k = 0; k < n; ++k) ::close(fds[k]);
    if (!sent) return;
  }
}

void* listen_loop(void*) {
  Exporter& ex = exporter();
  for (;;) {
    const int conn = accept4(ex.sock, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) {
        if (errno == EMFILE || errno == ENFILE) usleep(10000);
        continue;
      }
      return nullptr;
    }
    // A slow importer cannot hold the listener for long.
    timeval tv{kTimeoutMs / 1000, 0};
    setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    serve(conn);
    ::close(conn);
  }
}

bool start_listener(backend* pool) {
  Exporter& ex = exporter();
  std::call_once(ex.once, [&] {
    ex.pool = pool;
    int rnd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (rnd >= 0) {
      if (read(rnd, &ex.nonce, sizeof ex.nonce) != static_cast<ssize_t>(sizeof ex.nonce)) ex.nonce = 0;
      ::close(rnd);
    }
    ex.nonce ^= static_cast<uint64_t>(getpid()) << 32 ^ reinterpret_cast<uintptr_t>(&ex);
    ex.sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a;
    const socklen_t alen = address(&a, static_cast<uint64_t>(getpid()));
    if (ex.sock < 0 || bind(ex.sock, reinterpret_cast<sockaddr*>(&a), alen) != 0 || listen(ex.sock, 64) != 0) {
      log::always("cuwarden: cannot listen for IPC imports of pooled memory (%s); cuIpcGetMemHandle of a pooled "
                  "block fails",
                  std::strerror(errno));
      if (ex.sock >= 0) ::close(ex.sock);
      ex.sock = -1;
      return;
    }
    // The program's signals stay with its own threads.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 << 10);
    const int rc = pthread_create(&th, &attr, listen_loop, nullptr);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (rc != 0) {
      log::always("cuwarden: cannot start the IPC listener (%s); cuIpcGetMemHandle of a pooled block fails",
                  std::strerror(rc));
      ::close(ex.sock);
      ex.sock = -1;
      return;
    }
    pthread_setname_np(th, "cuwarden-ipc");
    log::always("cuwarden: an IPC handle of a pooled block opens only in processes that also run under cuwarden "
                "(any CUWARDEN_POOL); elsewhere cuIpcOpenMemHandle fails with CUDA_ERROR_INVALID_VALUE");
    ex.ok = true;
  });
  return ex.ok;
}

// ---- the importer ----------------------------------------------------------------------

struct Import {
  uint64_t bytes = 0;         ///< the block
  ipc_span::kind how{};
  CUdeviceptr span_base = 0;  ///< granules: our reserved range; legacy: the opened allocation
  uint64_t span_bytes = 0;
  uint64_t granule_bytes = 0;  ///< granules: each mapped alone (and so unmapped)
  std::string legacy_key;     ///< legacy: the allocation's handle bytes
};

struct Legacy {
  CUdeviceptr base = 0;
  int refs = 0;
};

std::mutex g_mu;
auto& g_imports = *new std::map<CUdeviceptr, Import>;      // by the block's address here
auto& g_legacy = *new std::map<std::string, Legacy>;       // opened allocations, by handle
std::atomic<uint64_t> g_count{0};                          // g_imports.size()

CUresult map_granules(int sock, const Reply& rp, CUdeviceptr* out) {
  const Calls& c = calls();
  if (!c.import_fd || !c.reserve || !c.map || !c.set_access || !c.unmap || !c.address_free || !c.release)
    return CUDA_ERROR_NOT_SUPPORTED;
  if (!rp.granule_bytes || rp.bytes % rp.granule_bytes) return CUDA_ERROR_INVALID_HANDLE;
  CUdevice dev = 0;
  if (!drv().ctx_get_device || drv().ctx_get_device(&dev) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_CONTEXT;
  CUdeviceptr base = 0;
  CUresult r = c.reserve(&base, rp.bytes, rp.granule_bytes, 0, 0);
  if (r != CUDA_SUCCESS) return r;
  const uint64_t count = rp.bytes / rp.granule_bytes;
  uint64_t mapped = 0;
  while (mapped < count && r == CUDA_SUCCESS) {
    int fds[kChunk];
    const int n = recv_fds(sock, fds);
    if (n <= 0 || mapped + static_cast<uint64_t>(n) > count) {
      if (n > 0)
        for (int k = 0; k < n; ++k) ::close(fds[k]);
      r = CUDA_ERROR_INVALID_HANDLE;  // the block went away while it was being sent
      break;
    }
    for (int k = 0; k < n; ++k) {
      CUmemGenericAllocationHandle h = 0;
      if (r == CUDA_SUCCESS)
        r = c.import_fd(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fds[k])),
                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      ::close(fds[k]);
      if (r != CUDA_SUCCESS) continue;
      r = c.map(base + mapped * rp.granule_bytes, rp.granule_bytes, 0, h, 0);
      c.release(h);  // the mapping holds the memory
      if (r == CUDA_SUCCESS) ++mapped;
    }
  }
  if (r == CUDA_SUCCESS) {
    CUmemAccessDesc d{};
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = dev;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = c.set_access(base, rp.bytes, &d, 1);
  }
  if (r != CUDA_SUCCESS) {
    for (uint64_t i = 0; i < mapped; ++i) c.unmap(base + i * rp.granule_bytes, rp.granule_bytes);
    c.address_free(base, rp.bytes);
    return r == CUDA_ERROR_OUT_OF_MEMORY ? r : (r == CUDA_ERROR_INVALID_HANDLE ? r : CUDA_ERROR_MAP_FAILED);
  }
  *out = base;
  return CUDA_SUCCESS;
}

}  // namespace

CUresult make_handle(CUipcMemHandle* out, CUdeviceptr p, uint64_t bytes, backend* exporter_pool) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  if (!start_listener(exporter_pool)) return CUDA_ERROR_OPERATING_SYSTEM;
  Handle h{kMagic, static_cast<uint64_t>(getpid()), exporter().nonce, p, bytes, {}};
  std::memcpy(out, &h, sizeof h);
  return CUDA_SUCCESS;
}

bool is_ours(const CUipcMemHandle& h) noexcept {
  uint64_t magic;
  std::memcpy(&magic, &h, sizeof magic);
  return magic == kMagic;
}

CUresult open(CUdeviceptr* p, const CUipcMemHandle& handle, unsigned flags) {
  if (!p || (flags & ~static_cast<unsigned>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))) return CUDA_ERROR_INVALID_VALUE;
  CUcontext cur = nullptr;
  if (!drv().ctx_get_current || drv().ctx_get_current(&cur) != CUDA_SUCCESS || !cur) return CUDA_ERROR_INVALID_CONTEXT;
  Handle h;
  std::memcpy(&h, &handle, sizeof h);
  if (h.pid == static_cast<uint64_t>(getpid())) return CUDA_ERROR_INVALID_CONTEXT;  // as the driver answers
  const int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return CUDA_ERROR_OPERATING_SYSTEM;
  sockaddr_un a;
  const socklen_t alen = address(&a, h.pid);
  int rc;
  do rc = connect(sock, reinterpret_cast<sockaddr*>(&a), alen);
  while (rc != 0 && errno == EINTR);
  const Request rq{kMagic, h.nonce, h.ptr, h.bytes};
  Reply rp{};
  if (rc != 0 || !write_all(sock, &rq, sizeof rq) || !read_all(sock, &rp, sizeof rp)) {
    ::close(sock);
    return CUDA_ERROR_INVALID_HANDLE;  // no exporter listens under that name (gone), or it would not say
  }
  if (rp.status != CUDA_SUCCESS) {
    ::close(sock);
    return static_cast<CUresult>(rp.status);
  }
  if (rp.offset + h.bytes > rp.bytes) {
    ::close(sock);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  Import im;
  im.bytes = h.bytes;
  im.how = static_cast<ipc_span::kind>(rp.how);
  im.span_bytes = rp.bytes;
  im.granule_bytes = rp.granule_bytes;
  CUresult r = CUDA_SUCCESS;
  if (im.how == ipc_span::kind::granules) {
    r = map_granules(sock, rp, &im.span_base);
  } else if (im.how == ipc_span::kind::legacy) {
    if (!calls().legacy_open || !calls().legacy_close) {
      r = CUDA_ERROR_NOT_SUPPORTED;
    } else {
      // One open per driver allocation: the driver maps an allocation once per process.
      im.legacy_key.assign(reinterpret_cast<const char*>(&rp.legacy), sizeof rp.legacy);
      std::lock_guard<std::mutex> g(g_mu);
      Legacy& l = g_legacy[im.legacy_key];
      if (l.refs == 0) r = calls().legacy_open(&l.base, rp.legacy, flags);
      if (r == CUDA_SUCCESS) {
        ++l.refs;
        im.span_base = l.base;
      } else {
        g_legacy.erase(im.legacy_key);
      }
    }
  } else {
    r = CUDA_ERROR_INVALID_HANDLE;
  }
  ::close(sock);
  if (r != CUDA_SUCCESS) return r;
  const CUdeviceptr block = im.span_base + rp.offset;
  std::lock_guard<std::mutex> g(g_mu);
  try {
    g_imports[block] = std::move(im);
  } catch (...) {
    // Cannot remember it: undo, rather than leave a mapping nothing closes.
    if (im.how == ipc_span::kind::granules) {
      for (uint64_t i = 0; i < rp.bytes / rp.granule_bytes; ++i)
        calls().unmap(im.span_base + i * rp.granule_bytes, rp.granule_bytes);
      calls().address_free(im.span_base, rp.bytes);
    } else if (auto it = g_legacy.find(im.legacy_key); it != g_legacy.end() && --it->second.refs == 0) {
      calls().legacy_close(it->second.base);
      g_legacy.erase(it);
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  g_count.store(g_imports.size(), std::memory_order_release);
  *p = block;
  return CUDA_SUCCESS;
}

bool close(CUdeviceptr p, CUresult* result) {
  if (g_count.load(std::memory_order_acquire) == 0) return false;
  std::unique_lock<std::mutex> g(g_mu);
  auto it = g_imports.find(p);
  if (it == g_imports.end()) return false;
  Import im = std::move(it->second);
  g_imports.erase(it);
  g_count.store(g_imports.size(), std::memory_order_release);
  CUresult r = CUDA_SUCCESS;
  if (im.how == ipc_span::kind::granules) {
    g.unlock();
    // cuMemUnmap does not wait for the GPU, and work queued on the mapping may still run (a
    // copy out of it, as numba's staged import makes right before closing): wait first, as
    // the driver's own close of a legacy mapping does. Not during a capture, where waiting is
    // refused (the program closing a mapping its graph reads is its own error then).
    if (!work::capturing() && drv().ctx_sync) drv().ctx_sync();
    for (uint64_t off = 0; off < im.span_bytes && r == CUDA_SUCCESS; off += im.granule_bytes)
      r = calls().unmap(im.span_base + off, im.granule_bytes);
    if (r == CUDA_SUCCESS) r = calls().address_free(im.span_base, im.span_bytes);
  } else if (auto l = g_legacy.find(im.legacy_key); l != g_legacy.end() && --l->second.refs == 0) {
    const CUdeviceptr base = l->second.base;
    g_legacy.erase(l);
    g.unlock();
    r = calls().legacy_close(base);
  }
  *result = r;
  return true;
}

bool imported(CUdeviceptr p, range* out) {
  if (g_count.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_imports.upper_bound(p);
  if (it == g_imports.begin()) return false;
  --it;
  if (p - it->first >= std::max<uint64_t>(it->second.bytes, 1)) return false;
  if (out) *out = range{it->first, it->second.bytes};
  return true;
}

}  // namespace cuw::backends::ipc
