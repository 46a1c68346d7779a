// cuwarden interposer: IPC of pooled memory (ipc.hpp): our handles, the exporter's listener,
// the importer's mappings.
#include "backends/ipc.hpp"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "backends/driver_calls.hpp"
#include "base/log.hpp"
#include "base/work_epoch.hpp"
#include "core/tracker.hpp"

namespace cuw::backends::ipc {

namespace {

constexpr uint64_t kMagic = 0x31637069777563ULL;  // "cuwipc1"
constexpr int kChunk = 64;                         // descriptors per message (SCM_MAX_FD is 253)
constexpr int kStepMs = 5000;                      // the listener's wait for one step of an importer
constexpr int kOpenMs = 10000;                     // an importer's whole wait for the listener
constexpr uint64_t kMaxSpan = 1ULL << 40;          // no span is larger (a reply saying so is wrong)
constexpr std::size_t kMaxExports = 1 << 16;       // exports remembered before freed ones are swept

/// Our handle, in CUipcMemHandle's 64 bytes.
struct Handle {
  uint64_t magic;
  uint64_t pid;    ///< the exporter (its socket's name)
  uint64_t nonce;  ///< the exporter's listener (its socket's name): a reused pid answers no handle of another
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
  uint64_t nonce;  ///< the listener's, echoed
  int32_t status;  ///< CUresult
  uint32_t how;    ///< ipc_span::kind
  uint64_t bytes;  ///< the span
  uint64_t offset;
  uint64_t granule_bytes;
  CUipcMemHandle legacy;
};

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

uint64_t mono_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000 + static_cast<uint64_t>(ts.tv_nsec) / 1000000;
}

/// Milliseconds left until `deadline` (mono_ms), at least 0.
int left_ms(uint64_t deadline) {
  const uint64_t now = mono_ms();
  return now >= deadline ? 0 : static_cast<int>(deadline - now);
}

/// The listener's abstract socket address: the user, the exporter's pid and its nonce (no
/// other user's process can hold the name first: its names carry its own uid and the
/// credentials are checked; a reused pid gets another nonce).
socklen_t address(sockaddr_un* a, uint64_t pid, uint64_t nonce) {
  std::memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  const int n = std::snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "cuwarden-ipc-%u-%llu-%016llx",
                              static_cast<unsigned>(geteuid()), static_cast<unsigned long long>(pid),
                              static_cast<unsigned long long>(nonce));
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + static_cast<size_t>(n));
}

/// Whether the process at the other end of `sock` is this user's, or root's.
bool trusted_peer(int sock) {
  ucred cred{};
  socklen_t len = sizeof cred;
  return getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && (cred.uid == geteuid() || cred.uid == 0);
}

/// Waits until `sock` is readable (`events` POLLIN) or writable (POLLOUT), at most `ms`.
bool wait_for(int sock, short events, int ms) {
  pollfd pf{sock, events, 0};
  for (;;) {
    const int k = poll(&pf, 1, ms);
    if (k < 0 && errno == EINTR) continue;
    return k > 0 && (pf.revents & events);
  }
}

bool write_all(int fd, const void* data, size_t n, uint64_t deadline) {
  const char* p = static_cast<const char*>(data);
  while (n) {
    if (!wait_for(fd, POLLOUT, left_ms(deadline))) return false;
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* data, size_t n, uint64_t deadline) {
  char* p = static_cast<char*>(data);
  while (n) {
    if (!wait_for(fd, POLLIN, left_ms(deadline))) return false;
    const ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

/// Sends `count` (1..kChunk) descriptors with their count as the message.
bool send_fds(int sock, const int* fds, uint32_t count, uint64_t deadline) {
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
    if (!wait_for(sock, POLLOUT, left_ms(deadline))) return false;
    const ssize_t w = sendmsg(sock, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    return w == static_cast<ssize_t>(sizeof count);
  }
}

/// Receives one message of send_fds: the descriptors into fds (at most kChunk), their count,
/// or -1 (nothing within the deadline, or a malformed message: whatever came is closed).
int recv_fds(int sock, int* fds, uint64_t deadline) {
  if (!wait_for(sock, POLLIN, left_ms(deadline))) return -1;
  uint32_t count = 0;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kChunk)] = {};
  iovec iov{&count, sizeof count};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  ssize_t r;
  do r = recvmsg(sock, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  while (r < 0 && errno == EINTR);
  int got = 0;
  if (r > 0) {
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
  }
  if (r != static_cast<ssize_t>(sizeof count) || (m.msg_flags & MSG_CTRUNC) || count != static_cast<uint32_t>(got)) {
    for (int i = 0; i < got; ++i) ::close(fds[i]);
    return -1;
  }
  return got;
}

// ---- state, and fork --------------------------------------------------------------------

/// An export the listener may serve: the block as it was when exported.
struct Export {
  uint64_t requested = 0;
  uint64_t generation = 0;
  ipc_span::kind how{};
  CUipcMemHandle legacy{};  ///< legacy: the slab's handle, made at export (no driver call later)
};

struct Exporter {
  std::mutex mu;               // guards everything here
  bool started = false;        // the listener was tried (started or failed) in this process
  bool ok = false;             // and runs
  int sock = -1;
  uint64_t nonce = 0;
  backend* pool = nullptr;
  std::map<CUdeviceptr, Export> exports;  // by block
};

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

Exporter& exporter() {
  static Exporter* e = new Exporter;  // never destroyed: the listener may run at exit
  return *e;
}
Importer& importer() {
  static Importer* i = new Importer;
  return *i;
}

void update_count(Importer& im) {
  im.count.store(im.by_block.size() + im.slabs.size(), std::memory_order_release);
}

/// After fork the child has neither the listener thread nor the parent's contexts: it starts
/// afresh (a listener of its own at its first export; no imports).
void fork_safe() {
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork(
        [] {
          exporter().mu.lock();
          importer().open_mu.lock();
          importer().mu.lock();
        },
        [] {
          importer().mu.unlock();
          importer().open_mu.unlock();
          exporter().mu.unlock();
        },
        [] {
          Exporter& ex = exporter();
          if (ex.sock >= 0) ::close(ex.sock);
          ex.sock = -1;
          ex.started = ex.ok = false;
          ex.exports.clear();
          Importer& im = importer();
          im.by_block.clear();
          im.by_handle.clear();
          im.slabs.clear();
          update_count(im);
          im.mu.unlock();
          im.open_mu.unlock();
          ex.mu.unlock();
        });
  });
}

// ---- the exporter ----------------------------------------------------------------------

/// Answers one importer: the export is checked against the block as it is now, then the
/// span is sent (granules: retained first, checked again, then their descriptors in chunks).
void serve(int conn) {
  Exporter& ex = exporter();
  const uint64_t deadline = mono_ms() + kStepMs;
  if (!trusted_peer(conn)) return;
  Request rq{};
  if (!read_all(conn, &rq, sizeof rq, deadline) || rq.magic != kMagic) return;
  Reply rp{};
  rp.nonce = ex.nonce;
  rp.status = CUDA_ERROR_INVALID_HANDLE;
  Export e;
  bool known = false;
  backend* pool = nullptr;
  {
    std::lock_guard<std::mutex> g(ex.mu);
    auto it = ex.exports.find(rq.ptr);
    known = rq.nonce == ex.nonce && it != ex.exports.end() && it->second.requested == rq.bytes;
    if (known) e = it->second;
    pool = ex.pool;
  }
  core::Tracker* t = core::Tracker::instance_if_created();
  ipc_span now;
  const auto still = [&] {
    return t && pool->ipc_describe(*t, rq.ptr, rq.bytes, &now) == CUDA_SUCCESS && now.generation == e.generation;
  };
  if (known && !still()) {  // freed since: forget it
    std::lock_guard<std::mutex> g(ex.mu);
    ex.exports.erase(rq.ptr);
    known = false;
  }
  std::vector<CUmemGenericAllocationHandle> held;  // granules: our own references
  if (known && e.how == ipc_span::kind::legacy) {
    rp.status = CUDA_SUCCESS;
    rp.legacy = e.legacy;
  } else if (known && (!vmm().retain || !vmm().export_fd || !now.exportable || !now.granule_bytes)) {
    rp.status = CUDA_ERROR_NOT_SUPPORTED;
  } else if (known) {
    // References of our own to the granules (the pool may unmap them meanwhile), then the
    // block checked again: still the one exported, so these are its granules.
    const ipc_span first = now;
    bool all = true;
    try {
      held.reserve(first.bytes / first.granule_bytes);
    } catch (...) {
      all = false;
    }
    for (uint64_t off = 0; all && off < first.bytes; off += first.granule_bytes) {
      CUmemGenericAllocationHandle h = 0;
      all = vmm().retain(&h, reinterpret_cast<void*>(first.base + off)) == CUDA_SUCCESS;
      if (all) held.push_back(h);
    }
    if (all && still() && now.base == first.base && now.bytes == first.bytes) rp.status = CUDA_SUCCESS;
  }
  const auto drop = [&] {
    for (CUmemGenericAllocationHandle h : held) vmm().release(h);
  };
  if (rp.status == CUDA_SUCCESS) {
    rp.how = static_cast<uint32_t>(now.how);
    rp.bytes = now.bytes;
    rp.offset = now.offset;
    rp.granule_bytes = now.granule_bytes;
  }
  if (!write_all(conn, &rp, sizeof rp, deadline) || rp.status != CUDA_SUCCESS || now.how != ipc_span::kind::granules) {
    drop();
    return;
  }
  for (std::size_t i = 0; i < held.size();) {
    int fds[kChunk];
    uint32_t n = 0;
    for (; n < kChunk && i < held.size(); ++n, ++i) {
      fds[n] = -1;
      if (vmm().export_fd(&fds[n], held[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != CUDA_SUCCESS) {
        for (uint32_t k = 0; k < n; ++k) ::close(fds[k]);
        drop();
        return;  // the importer sees a short answer
      }
    }
    const bool sent = send_fds(conn, fds, n, deadline);
    for (uint32_t k = 0; k < n; ++k) ::close(fds[k]);
    if (!sent) break;
  }
  drop();
}

void* listen_loop(void* arg) {
  const int sock = static_cast<int>(reinterpret_cast<intptr_t>(arg));
  for (;;) {
    const int conn = accept4(sock, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        usleep(10000);
        continue;
      }
      log::always("cuwarden: the IPC listener stopped (%s): pooled blocks exported so far no longer open",
                  std::strerror(errno));
      return nullptr;
    }
    serve(conn);
    ::close(conn);
  }
}

/// Starts the listener (under ex.mu). False when it cannot (logged).
bool start_listener_locked(Exporter& ex) {
  if (ex.started) return ex.ok;
  ex.started = true;
  if (getrandom(&ex.nonce, sizeof ex.nonce, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof ex.nonce))
    ex.nonce = (static_cast<uint64_t>(getpid()) << 32) ^ mono_ms() ^ reinterpret_cast<uintptr_t>(&ex);
  ex.sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a;
  const socklen_t alen = address(&a, static_cast<uint64_t>(getpid()), ex.nonce);
  if (ex.sock < 0 || bind(ex.sock, reinterpret_cast<sockaddr*>(&a), alen) != 0 || listen(ex.sock, 64) != 0) {
    log::always("cuwarden: cannot listen for IPC imports of pooled memory (%s); cuIpcGetMemHandle of a pooled "
                "block fails",
                std::strerror(errno));
    if (ex.sock >= 0) ::close(ex.sock);
    ex.sock = -1;
    return false;
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
  const int rc = pthread_create(&th, &attr, listen_loop, reinterpret_cast<void*>(static_cast<intptr_t>(ex.sock)));
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (rc != 0) {
    log::always("cuwarden: cannot start the IPC listener (%s); cuIpcGetMemHandle of a pooled block fails",
                std::strerror(rc));
    ::close(ex.sock);
    ex.sock = -1;
    return false;
  }
  pthread_setname_np(th, "cuwarden-ipc");
  log::always("cuwarden: an IPC handle of a pooled block opens only in processes that also run under cuwarden "
              "(any CUWARDEN_POOL); elsewhere cuIpcOpenMemHandle fails with CUDA_ERROR_INVALID_VALUE");
  ex.ok = true;
  return true;
}

// ---- the importer ----------------------------------------------------------------------

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

CUresult make_handle(CUipcMemHandle* out, const ipc_span& span, backend* exporter_pool) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  if (span.how == ipc_span::kind::granules && !span.exportable) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      log::always("cuwarden: cuIpcGetMemHandle of a pooled block: this device cannot export memory as file "
                  "descriptors; returning CUDA_ERROR_NOT_SUPPORTED (CUWARDEN_POOL=off exports it)");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  fork_safe();
  Exporter& ex = exporter();
  std::lock_guard<std::mutex> g(ex.mu);
  ex.pool = exporter_pool;
  if (!start_listener_locked(ex)) return CUDA_ERROR_OUT_OF_MEMORY;
  try {
    if (ex.exports.size() >= kMaxExports) {
      // Forget exports of blocks freed since (their handles open nothing anyway).
      core::Tracker* t = core::Tracker::instance_if_created();
      for (auto it = ex.exports.begin(); it != ex.exports.end();) {
        ipc_span now;
        const bool live = t && ex.pool->ipc_describe(*t, it->first, it->second.requested, &now) == CUDA_SUCCESS &&
                          now.generation == it->second.generation;
        it = live ? std::next(it) : ex.exports.erase(it);
      }
      if (ex.exports.size() >= kMaxExports) return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ex.exports[span.block] = Export{span.requested, span.generation, span.how, span.legacy};
  } catch (...) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  Handle h{kMagic, static_cast<uint64_t>(getpid()), ex.nonce, span.block, span.requested, {}};
  std::memcpy(out, &h, sizeof h);
  return CUDA_SUCCESS;
}

bool is_ours(const CUipcMemHandle& h) noexcept {
  uint64_t magic;
  std::memcpy(&magic, &h, sizeof magic);
  return magic == kMagic;
}

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
