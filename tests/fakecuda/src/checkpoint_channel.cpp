// fakecuda: cuCheckpointProcess* — the controller's side. On this process's own pid the
// operation runs here (checkpoint.cpp); on another pid it travels through that process's
// channel file (checkpoint.hpp says how) and runs on its service thread.
//
// Errors, as cuda.h documents them and as measured on drivers 580 and 595 (a wrong state:
// CUDA_ERROR_ILLEGAL_STATE and nothing changes; a pid with no process: CUDA_ERROR_OPERATING_SYSTEM;
// a process without CUDA, or a zombie: CUDA_ERROR_NOT_INITIALIZED; a lock past its timeout:
// CUDA_ERROR_NOT_READY). Simulation's own: without CUWARDEN_FAKE_DIR another process cannot be
// reached (CUDA_ERROR_NOT_INITIALIZED, as if it had no CUDA); a channel the caller may not open
// (another user's process, the caller not root) is CUDA_ERROR_OPERATING_SYSTEM; a restore's
// GPU pairs (gpuPairs) travel with the request, at most kMaxPairs of them (more:
// CUDA_ERROR_INVALID_VALUE), and the process checks them (checkpoint.cpp); a restore needs the caller to have called cuInit (the driver requires cuInit or persistence
// mode, which is off here): CUDA_ERROR_NOT_INITIALIZED. The calls are not gated: a locked
// process may still query and unlock itself.
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "checkpoint.hpp"
#include "internal.hpp"  // before fakecuda.h: it sets up cuda.h for the driver side
#include "../fakecuda.h"

namespace fc {

std::string channel_path(int pid) { return std::string(shared_dir() ? shared_dir() : "") + "/proc-" + std::to_string(pid); }

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, unsigned timeout_ms) {
  timespec ts{static_cast<time_t>(timeout_ms / 1000), static_cast<long>(timeout_ms % 1000) * 1000000L};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, timeout_ms ? &ts : nullptr, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

namespace {

bool process_exists(int pid) { return kill(pid, 0) == 0 || errno == EPERM; }

// Another process's channel, mapped for the duration of one call.
class Remote {
 public:
  ~Remote() {
    if (ch_) munmap(ch_, sizeof(ChannelFile));
    if (fd_ >= 0) close(fd_);
  }
  CUresult open_pid(int pid) {
    pid_ = pid;
    if (!process_exists(pid)) return CUDA_ERROR_OPERATING_SYSTEM;
    start_ = process_start_time(pid);
    if (start_ == 0 || !shared_dir()) return CUDA_ERROR_NOT_INITIALIZED;  // a zombie, or unreachable
    fd_ = open(channel_path(pid).c_str(), O_RDWR | O_CLOEXEC);
    if (fd_ < 0) return errno == ENOENT ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_OPERATING_SYSTEM;
    struct stat st {};
    if (fstat(fd_, &st) != 0 || st.st_size != static_cast<off_t>(sizeof(ChannelFile))) return CUDA_ERROR_NOT_INITIALIZED;
    void* p = mmap(nullptr, sizeof(ChannelFile), PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OPERATING_SYSTEM;
    ch_ = static_cast<ChannelFile*>(p);
    // Every byte of the file is the other process's word: check it before trusting it.
    const uint32_t magic = ch_->magic.load(std::memory_order_acquire);
    if (magic != kChannelMagic || ch_->version != kChannelVersion || ch_->size != sizeof(ChannelFile) ||
        ch_->pid != pid || ch_->start_time != start_)
      return CUDA_ERROR_NOT_INITIALIZED;  // a file left by an earlier process of this pid
    return CUDA_SUCCESS;
  }
  ChannelFile* channel() const { return ch_; }

  // Sends `op` (kOpRestore: with `count` GPU pairs) and waits for its answer.
  CUresult request(uint32_t op, uint32_t timeout_ms, const CUcheckpointGpuPair* pairs = nullptr, unsigned count = 0) {
    while (flock(fd_, LOCK_EX) != 0)
      if (errno != EINTR) return CUDA_ERROR_OPERATING_SYSTEM;
    CUresult rc = CUDA_SUCCESS;
    // A controller that died mid-request left its operation running: it completes first.
    uint32_t seq = ch_->request.load();
    if (!wait_done(seq)) {
      rc = CUDA_ERROR_OPERATING_SYSTEM;
    } else {
      ch_->op = op;
      ch_->timeout_ms = timeout_ms;
      ch_->pair_count = count;
      if (count) std::memcpy(ch_->pairs, pairs, count * sizeof *pairs);
      ch_->request.store(++seq, std::memory_order_release);
      futex_wake(&ch_->request);
      rc = wait_done(seq) ? static_cast<CUresult>(ch_->result) : CUDA_ERROR_OPERATING_SYSTEM;
    }
    flock(fd_, LOCK_UN);
    return rc;
  }

 private:
  // Until request `seq` is answered: true, or false once the process is gone.
  bool wait_done(uint32_t seq) {
    for (;;) {
      const uint32_t done = ch_->done.load(std::memory_order_acquire);
      if (done == seq) return true;
      if (process_start_time(pid_) != start_) return false;
      futex_wait(&ch_->done, done, 50);
    }
  }

  int pid_ = 0;
  uint64_t start_ = 0;
  int fd_ = -1;
  ChannelFile* ch_ = nullptr;
};

template <typename T>
bool all_zero(const T& v) {
  const auto* b = reinterpret_cast<const unsigned char*>(&v);
  for (size_t i = 0; i < sizeof v; ++i)
    if (b[i]) return false;
  return true;
}

CUresult operate(int pid, uint32_t op, uint32_t timeout_ms, const CUcheckpointGpuPair* pairs = nullptr,
                 unsigned count = 0) {
  if (pid <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (pid == getpid()) {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    switch (op) {
      case kOpLock: return process_lock(timeout_ms);
      case kOpCheckpoint: return process_checkpoint();
      case kOpRestore: return process_restore(pairs, count);
      default: return process_unlock();
    }
  }
  Remote r;
  if (CUresult rc = r.open_pid(pid)) return rc;
  return r.request(op, timeout_ms, pairs, count);
}

}  // namespace
}  // namespace fc

using namespace fc;

FC_API CUresult cuCheckpointProcessGetState(int pid, CUprocessState* state) {
  FC_COUNT();
  if (!state || pid <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (pid == getpid()) {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    *state = process_state();
    return CUDA_SUCCESS;
  }
  Remote r;
  if (CUresult rc = r.open_pid(pid)) return rc;
  *state = static_cast<CUprocessState>(r.channel()->state.load());
  return CUDA_SUCCESS;
}

FC_API CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int* tid) {
  FC_COUNT();
  if (!tid || pid <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (pid == getpid()) {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (process_restore_tid() == 0) return CUDA_ERROR_NOT_SUPPORTED;  // no service thread
    *tid = process_restore_tid();
    return CUDA_SUCCESS;
  }
  Remote r;
  if (CUresult rc = r.open_pid(pid)) return rc;
  *tid = r.channel()->service_tid;
  return CUDA_SUCCESS;
}

FC_API CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs* args) {
  FC_COUNT();
  if (args && (args->reserved0 != 0 || !all_zero(args->reserved1))) return CUDA_ERROR_INVALID_VALUE;
  return operate(pid, kOpLock, args ? args->timeoutMs : 0);
}

FC_API CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs* args) {
  FC_COUNT();
  if (args && !all_zero(args->reserved)) return CUDA_ERROR_INVALID_VALUE;
  return operate(pid, kOpCheckpoint, 0);
}

FC_API CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs* args) {
  FC_COUNT();
  if (args) {
    if (!all_zero(args->reserved) || args->reserved1 != 0) return CUDA_ERROR_INVALID_VALUE;
    if (args->gpuPairsCount > 0 && !args->gpuPairs) return CUDA_ERROR_INVALID_VALUE;
    if (args->gpuPairsCount > kMaxPairs) return CUDA_ERROR_INVALID_VALUE;
  }
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  return operate(pid, kOpRestore, 0, args ? args->gpuPairs : nullptr, args ? args->gpuPairsCount : 0);
}

FC_API CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs* args) {
  FC_COUNT();
  if (args && !all_zero(args->reserved)) return CUDA_ERROR_INVALID_VALUE;
  return operate(pid, kOpUnlock, 0);
}

FC_API int fakecuda_process_checkpoint_info(int pid, fakecuda_checkpoint_info* out) {
  if (!out || pid <= 0) return -1;
  if (pid == getpid()) {
    *out = fakecuda_checkpoint_info{static_cast<int>(process_state()), process_blocked_calls(), process_host_bytes(),
                                    process_restore_tid()};
    return 0;
  }
  Remote r;
  if (r.open_pid(pid) != CUDA_SUCCESS) return -1;
  const ChannelFile* ch = r.channel();
  *out = fakecuda_checkpoint_info{static_cast<int>(ch->state.load()), ch->blocked_calls.load(),
                                  static_cast<size_t>(ch->host_bytes.load()), ch->service_tid};
  return 0;
}
