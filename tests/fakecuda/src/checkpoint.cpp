// fakecuda: the checkpointed process's side of the checkpoint API — the call gate, the four
// operations as the driver documents them (cuda.h, "CUDA Checkpointing"), and the service
// thread that runs them for another process (the channel: checkpoint.hpp).
//
// States (CUprocessState): RUNNING -lock-> LOCKED -checkpoint-> CHECKPOINTED -restore-> LOCKED
// -unlock-> RUNNING. An operation in another state answers CUDA_ERROR_ILLEGAL_STATE and
// changes nothing. What each does here:
//   lock        closes the gate: calls that arrive wait; then waits for the calls inside the
//               driver to return and for every stream's submitted work to complete. Past
//               `timeoutMs` (0: no limit) it reopens the gate and answers CUDA_ERROR_NOT_READY,
//               the process still RUNNING (measured on driver 595: a 1 s lock during a 7 s
//               kernel returned NOT_READY after 1.0 s and the job went on).
//   checkpoint  copies every device byte of the process (arena blocks: cuMemAlloc, pools,
//               arrays; VMM device handles) into host memory of the process itself, drops
//               the device pages (they read as zero until restored) and gives the process's
//               whole share of each device back (context memory included), so NVML shows it
//               holding nothing. Graph memory (allocation nodes) keeps its pages where they
//               are, a simplification: its share goes back with the rest. What the driver cannot carry (managed memory,
//               legacy IPC exports or imports, cuMem handles exported or imported as shareable
//               handles, an MPS client) fails it: CUDA_ERROR_NOT_SUPPORTED and the process FAILED (the
//               driver does not roll back; driver 595 leaves such a process's context dead,
//               580 was seen to survive managed memory: this simulates the former).
//   restore     takes the shares back (CUDA_ERROR_OUT_OF_MEMORY and FAILED when the devices no
//               longer have the room, as the driver's restore fails) and copies the bytes back
//               to the same device addresses; the process is LOCKED again. With GPU pairs
//               (gpuPairs) it first moves each device the process sees onto the device its
//               pair names (remap_devices: same ordinal, same addresses, the new UUID and the
//               new device's shared capacity); pairs that leave a device out or name an
//               unknown one answer CUDA_ERROR_INVALID_VALUE, a device of another name (chip)
//               CUDA_ERROR_NOT_SUPPORTED, both before anything changes (still CHECKPOINTED:
//               the driver validates its arguments first); too little room on the new
//               device is the OUT_OF_MEMORY and FAILED above.
//   unlock      opens the gate: the waiting calls go on.
// A FAILED process's calls answer CUDA_ERROR_ILLEGAL_STATE, and so do the four operations.
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "checkpoint.hpp"
#include "internal.hpp"

namespace fc {

std::atomic<uint32_t> g_calls{0};

namespace {

// With g_gate_cv: the waits of the gate's slow paths. Never destroyed: calls may still wait
// at the gate while the process exits.
std::mutex& g_gate_mu = *new std::mutex;
std::condition_variable& g_gate_cv = *new std::condition_variable;
std::atomic<uint32_t> g_blocked{0};

std::mutex g_op_mu;  // one operation at a time (the service thread, or the process itself)
std::atomic<uint32_t> g_state{CU_PROCESS_STATE_RUNNING};
std::atomic<ChannelFile*> g_channel{nullptr};  // this process's channel, or nullptr (no CUWARDEN_FAKE_DIR)
int g_service_pid = 0;             // the process that started the service (fork: not the child)
std::atomic<int> g_service_tid{0};

void set_state(CUprocessState s) {
  g_state.store(s);
  if (ChannelFile* ch = g_channel.load()) ch->state.store(s);
}

void set_blocked(int delta) {
  const uint32_t n = g_blocked.fetch_add(static_cast<uint32_t>(delta)) + static_cast<uint32_t>(delta);
  if (ChannelFile* ch = g_channel.load()) ch->blocked_calls.store(n);
}

// One range copied to the host: an arena block (by address) or a VMM handle (by memfd).
struct Saved {
  uintptr_t addr = 0;
  int fd = -1;
  size_t len = 0;
  size_t at = 0;  // offset in the host copy
};

struct Checkpoint {
  char* host = nullptr;  // one anonymous mapping in this process: the victim's own memory
  size_t host_len = 0;
  std::vector<Saved> ranges;
  std::vector<size_t> device_bytes;  // each visible device's share given back
};
Checkpoint& g_saved = *new Checkpoint;  // never destroyed, like the gate

void free_host_copy() {
  if (g_saved.host) munmap(g_saved.host, g_saved.host_len);
  g_saved = Checkpoint{};
  if (ChannelFile* ch = g_channel.load()) ch->host_bytes.store(0);
}

void fail() {
  free_host_copy();
  set_state(CU_PROCESS_STATE_FAILED);
  std::lock_guard lk(g_gate_mu);
  g_calls.fetch_or(kGateFailed);
  g_calls.fetch_and(~kGateClosed);
  g_gate_cv.notify_all();
}

void open_gate() {
  std::lock_guard lk(g_gate_mu);
  g_calls.fetch_and(~kGateClosed);
  g_gate_cv.notify_all();
}

}  // namespace

int gate_wait() noexcept {
  for (;;) {
    const uint32_t now = g_calls.load();
    if (now & kGateFailed) return CUDA_ERROR_ILLEGAL_STATE;  // the destructor uncounts it
    if (!(now & kGateClosed)) return 0;
    // Not inside after all: leave (waking a lock that waits for the count), wait for the gate.
    if (g_calls.fetch_sub(1) == (kGateClosed | 1)) gate_last_out();
    {
      std::unique_lock lk(g_gate_mu);
      if (g_calls.load() & kGateClosed) {
        set_blocked(1);
        g_gate_cv.wait(lk, [] { return !(g_calls.load() & kGateClosed); });
        set_blocked(-1);
      }
    }
    g_calls.fetch_add(1);
  }
}

void gate_last_out() noexcept {
  std::lock_guard lk(g_gate_mu);
  g_gate_cv.notify_all();
}

CUprocessState process_state() { return static_cast<CUprocessState>(g_state.load()); }
int process_restore_tid() { return g_service_tid.load(); }
unsigned process_blocked_calls() { return g_blocked.load(); }
size_t process_host_bytes() {
  std::lock_guard op(g_op_mu);
  return g_saved.host_len;
}

CUresult process_lock(unsigned timeout_ms) {
  std::lock_guard op(g_op_mu);
  if (process_state() != CU_PROCESS_STATE_RUNNING) return CUDA_ERROR_ILLEGAL_STATE;
  using clock = std::chrono::steady_clock;
  const auto deadline = timeout_ms ? clock::now() + std::chrono::milliseconds(timeout_ms) : clock::time_point::max();
  bool ok;
  {
    std::unique_lock lk(g_gate_mu);
    g_calls.fetch_or(kGateClosed);
    ok = g_gate_cv.wait_until(lk, deadline, [] { return (g_calls.load() & kGateCount) == 0; });
  }
  // No call is inside and none can enter: what the streams hold now is all there is.
  if (ok) {
    for (Stream* s : all_streams()) {
      if (!stream_wait_until(s, stream_submitted(s), deadline)) {
        ok = false;
        break;
      }
    }
  }
  if (!ok) {
    open_gate();
    return CUDA_ERROR_NOT_READY;
  }
  set_state(CU_PROCESS_STATE_LOCKED);
  return CUDA_SUCCESS;
}

CUresult process_checkpoint() {
  std::lock_guard op(g_op_mu);
  if (process_state() != CU_PROCESS_STATE_LOCKED) return CUDA_ERROR_ILLEGAL_STATE;
  const char* why = mps_client() ? "an MPS client's context" : table_uncarryable();
  if (!why) why = vmm_uncarryable();
  if (why) {
    if (trace_level() >= 1) trace("checkpoint: %s cannot be carried: the process FAILED", why);
    fail();
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  Checkpoint c;
  const int n = device_count();
  for (int i = 0; i < n; ++i) {
    Device* d = device(i);
    if (!d->arena_) continue;  // never allocated from: nothing to copy
    for (auto [addr, len] : d->arena_->used_blocks()) {
      c.ranges.push_back(Saved{addr, -1, len, c.host_len});
      c.host_len += len;
    }
  }
  for (auto [fd, len] : vmm_device_handles()) {
    c.ranges.push_back(Saved{0, fd, len, c.host_len});
    c.host_len += len;
  }
  if (c.host_len) {
    void* p = mmap(nullptr, c.host_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      fail();
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    c.host = static_cast<char*>(p);
  }
  for (const Saved& r : c.ranges) {
    if (r.fd < 0) {
      std::memcpy(c.host + r.at, reinterpret_cast<const void*>(r.addr), r.len);
    } else if (pread(r.fd, c.host + r.at, r.len, 0) != static_cast<ssize_t>(r.len)) {
      g_saved = c;
      fail();
      return CUDA_ERROR_OPERATING_SYSTEM;
    }
  }
  // The device keeps nothing of the process: its pages and its share of each device go.
  for (int i = 0; i < n; ++i) {
    Device* d = device(i);
    if (d->arena_) d->arena_->discard();
    const size_t bytes = d->used.load();
    d->unreserve(bytes);
    c.device_bytes.push_back(bytes);
  }
  for (const Saved& r : c.ranges)
    if (r.fd >= 0) fallocate(r.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(r.len));
  g_saved = c;
  if (ChannelFile* ch = g_channel.load()) ch->host_bytes.store(c.host_len);
  set_state(CU_PROCESS_STATE_CHECKPOINTED);
  return CUDA_SUCCESS;
}

CUresult process_restore(const CUcheckpointGpuPair* pairs, unsigned count) {
  std::lock_guard op(g_op_mu);
  if (process_state() != CU_PROCESS_STATE_CHECKPOINTED) return CUDA_ERROR_ILLEGAL_STATE;
  // Onto other GPUs: the pairs are checked before anything moves (a bad pair changes
  // nothing: the process stays CHECKPOINTED); the shares are then taken on the new devices.
  if (count > 0)
    if (const CUresult rc = remap_devices(pairs, count)) return rc;
  const int n = static_cast<int>(g_saved.device_bytes.size());
  for (int i = 0; i < n; ++i) {
    if (device(i)->reserve(g_saved.device_bytes[i])) continue;
    // The room is gone (another process took it): the driver's restore fails here and the
    // process cannot be restored any more.
    for (int k = 0; k < i; ++k) device(k)->unreserve(g_saved.device_bytes[k]);
    fail();
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  for (const Saved& r : g_saved.ranges) {
    if (r.fd < 0) {
      std::memcpy(reinterpret_cast<void*>(r.addr), g_saved.host + r.at, r.len);
    } else if (pwrite(r.fd, g_saved.host + r.at, r.len, 0) != static_cast<ssize_t>(r.len)) {
      fail();
      return CUDA_ERROR_OPERATING_SYSTEM;
    }
  }
  free_host_copy();
  set_state(CU_PROCESS_STATE_LOCKED);
  return CUDA_SUCCESS;
}

CUresult process_unlock() {
  std::lock_guard op(g_op_mu);
  if (process_state() != CU_PROCESS_STATE_LOCKED) return CUDA_ERROR_ILLEGAL_STATE;
  set_state(CU_PROCESS_STATE_RUNNING);
  open_gate();
  return CUDA_SUCCESS;
}

// ------------------------------------------------------------------ the service thread

namespace {

CUresult run_op(const ChannelFile* ch, uint32_t op, uint32_t timeout_ms) {
  switch (op) {
    case kOpLock: return process_lock(timeout_ms);
    case kOpCheckpoint: return process_checkpoint();
    case kOpRestore: {
      // The controller's words: bounded and copied before use.
      CUcheckpointGpuPair pairs[kMaxPairs];
      const unsigned n = ch->pair_count;
      if (n > kMaxPairs) return CUDA_ERROR_INVALID_VALUE;
      static_assert(sizeof(CUcheckpointGpuPair) == sizeof ch->pairs[0]);
      std::memcpy(pairs, ch->pairs, n * sizeof pairs[0]);
      return process_restore(pairs, n);
    }
    case kOpUnlock: return process_unlock();
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

void service_loop(ChannelFile* ch) {
  // The application's signals are its own business: none is delivered to this thread.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  pthread_setname_np(pthread_self(), "fakecuda-ckpt");
  ch->service_tid = static_cast<int>(syscall(SYS_gettid));
  g_service_tid.store(ch->service_tid);
  g_service_tid.notify_all();
  uint32_t answered = ch->done.load();
  for (;;) {
    const uint32_t want = ch->request.load(std::memory_order_acquire);
    if (want == answered) {
      futex_wait(&ch->request, want, 0);
      continue;
    }
    const CUresult rc = run_op(ch, ch->op, ch->timeout_ms);
    ch->result = rc;
    answered = want;
    ch->done.store(want, std::memory_order_release);
    futex_wake(&ch->done);
  }
}

void remove_channel() {
  if (g_channel.load() && g_service_pid == getpid()) unlink(channel_path(g_service_pid).c_str());
}

}  // namespace

void checkpoint_service_start() {
  static std::mutex mu;
  std::lock_guard lock(mu);
  const int pid = getpid();
  if (!shared_dir() || g_service_pid == pid) return;
  static const bool once = [] {
    // A forked child neither serves nor writes its parent's channel, and starts with an open
    // gate (the fork itself was no CUDA call).
    pthread_atfork(nullptr, nullptr, [] {
      g_channel.store(nullptr);
      g_calls.store(0);
      g_blocked.store(0);
      g_state.store(CU_PROCESS_STATE_RUNNING);
      g_service_tid.store(0);
    });
    std::atexit(remove_channel);
    return true;
  }();
  (void)once;
  const std::string path = channel_path(pid);
  unlink(path.c_str());  // a file left by an earlier process of this pid
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  void* p = MAP_FAILED;
  if (fd >= 0 && ftruncate(fd, sizeof(ChannelFile)) == 0)
    p = mmap(nullptr, sizeof(ChannelFile), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (fd >= 0) close(fd);
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "[fakecuda] cannot create %s: %s\n", path.c_str(), std::strerror(errno));
    std::abort();
  }
  auto* ch = static_cast<ChannelFile*>(p);  // zero-filled by ftruncate
  ch->pid = pid;
  ch->start_time = process_start_time(pid);
  ch->state.store(g_state.load());
  ch->blocked_calls.store(g_blocked.load());
  g_channel.store(ch);
  g_service_pid = pid;
  std::thread(service_loop, ch).detach();
  g_service_tid.wait(0);  // the thread's id is in the file before anyone can read it
  // Controllers read the magic first (acquire): the file is complete once they see it.
  ch->size = sizeof(ChannelFile);
  ch->version = kChannelVersion;
  ch->magic.store(kChannelMagic, std::memory_order_release);
}

}  // namespace fc
