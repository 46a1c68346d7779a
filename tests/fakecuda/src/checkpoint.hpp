// fakecuda: the checkpoint channel, the file through which another process (the controller:
// cuwarden's daemon, a test) asks this one to lock, checkpoint, restore or unlock.
//
// How a request travels (the real driver has a thread in each CUDA process that does the
// work, whose id cuCheckpointProcessGetRestoreThreadId answers; this is ours):
//   - cuInit, with CUWARDEN_FAKE_DIR set, creates DIR/proc-<pid> (mode 0600: its owner or root
//     may control it, as the driver's checks allow) and starts the service thread, which
//     waits on the file's `request` word (a futex in shared memory).
//   - The controller opens the file, checks that it belongs to the live process of that pid
//     (start time), takes flock(LOCK_EX) (one controller at a time), writes op and argument,
//     increments `request` and wakes it, then waits on `done` (waking every 50 ms to see
//     whether the process still lives: a process that dies mid-request answers
//     CUDA_ERROR_OPERATING_SYSTEM).
//   - The service thread runs the operation in the process (checkpoint.cpp), writes `result`
//     and sets `done` to the request's number.
// Because the work is done by that thread, the process's own threads need not cooperate: a
// thread running host code is not interrupted (the closed gate stops it at its next CUDA
// call), a thread inside a CUDA call is waited for (the lock waits for every call inside the
// driver to return and every stream to drain, within the lock's timeout), and a thread
// waiting at the closed gate is already out of the way. A process stopped by SIGSTOP cannot
// answer: the controller waits (the real driver hangs there too, whatever the timeout).
// `state`, `blocked_calls` and `host_bytes` are read by controllers without a request.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace fc {

constexpr uint32_t kChannelMagic = 0x6b636366;  // "fcck"
constexpr uint32_t kChannelVersion = 2;  // 2: the restore's GPU pairs
constexpr uint32_t kMaxPairs = 16;       // a restore's GPU pairs (CUcheckpointGpuPair) at most

enum ChannelOp : uint32_t { kOpLock = 1, kOpCheckpoint = 2, kOpRestore = 3, kOpUnlock = 4 };

struct ChannelFile {
  std::atomic<uint32_t> magic;  // written last (release): the rest is complete once it is set
  uint32_t version;
  uint32_t size;  // sizeof(ChannelFile)
  uint32_t reserved0;
  int32_t pid;
  int32_t service_tid;   // the service thread (cuCheckpointProcessGetRestoreThreadId)
  uint64_t start_time;   // process_start_time(pid): tells a reused pid from its owner
  std::atomic<uint32_t> state;          // CUprocessState
  std::atomic<uint32_t> request;        // futex: number of the latest request
  std::atomic<uint32_t> done;           // futex: number of the latest request answered
  std::atomic<uint32_t> blocked_calls;  // the process's calls waiting at the closed gate
  uint32_t op;          // ChannelOp of request `request`
  uint32_t timeout_ms;  // kOpLock: CUcheckpointLockArgs::timeoutMs
  int32_t result;       // CUresult of request `done`
  uint32_t reserved1;
  std::atomic<uint64_t> host_bytes;  // bytes copied to the host while checkpointed
  uint64_t reserved2[7];
  uint32_t pair_count;                // kOpRestore: pairs in use (0: restore in place)
  uint32_t reserved3;
  uint8_t pairs[kMaxPairs][32];       // kOpRestore: CUcheckpointGpuPair {oldUuid, newUuid}
};
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint32_t>) == 4, "futex words must be plain 32-bit words");
static_assert(offsetof(ChannelFile, state) == 32 && offsetof(ChannelFile, host_bytes) == 64);
static_assert(offsetof(ChannelFile, pairs) == 136 && sizeof(ChannelFile) == 136 + kMaxPairs * 32);

// The channel file of process `pid` under CUWARDEN_FAKE_DIR.
std::string channel_path(int pid);
// futex(2) on a word of a shared mapping; `timeout_ms` 0 waits without end.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, unsigned timeout_ms);
void futex_wake(std::atomic<uint32_t>* word);

}  // namespace fc
