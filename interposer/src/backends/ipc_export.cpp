// cuwarden interposer: the exporter's side of IPC of pooled memory (ipc.hpp): exports
// remembered, the listener thread that answers importers, make_handle().
#include "backends/ipc.hpp"

#include <pthread.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "backends/driver_calls.hpp"
#include "backends/ipc_wire.hpp"
#include "base/log.hpp"
#include "core/tracker.hpp"

namespace cuw::backends::ipc {

namespace detail {

namespace {

constexpr int kStepMs = 5000;                 // the listener's wait for one step of an importer
constexpr std::size_t kMaxExports = 1 << 16;  // exports remembered before freed ones are swept

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

Exporter& exporter() {
  static Exporter* e = new Exporter;  // never destroyed: the listener may run at exit
  return *e;
}

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

}  // namespace

void exporter_lock() { exporter().mu.lock(); }
void exporter_unlock() { exporter().mu.unlock(); }
void exporter_forget() {
  Exporter& ex = exporter();
  if (ex.sock >= 0) ::close(ex.sock);
  ex.sock = -1;
  ex.started = ex.ok = false;
  ex.exports.clear();
}

}  // namespace detail

using namespace detail;

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

}  // namespace cuw::backends::ipc
