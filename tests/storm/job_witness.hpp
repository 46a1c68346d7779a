// cuwarden job tests: the witness file shared by the job tests and their apps (job_app.cpp
// says how it is used).
#pragma once

#include <atomic>
#include <cstdint>

namespace cuwj {

inline constexpr unsigned kMaxApps = 256;
/// "rounds" mode: the largest request, in bytes (requests are 1 MiB to this, whole MiB).
inline constexpr uint64_t kLargestRequest = 4ull << 20;

struct alignas(64) AppSlot {
  std::atomic<uint64_t> held;      ///< bytes this app holds, as it counts them
  std::atomic<uint64_t> ops;       ///< calls made (progress)
  std::atomic<uint64_t> allocs;
  std::atomic<uint64_t> refusals;  ///< CUDA_ERROR_OUT_OF_MEMORY (the job was full)
  std::atomic<uint64_t> errors;    ///< anything else failing
  std::atomic<uint64_t> join_ns;   ///< "join" mode: main() to first allocation done
};

struct JobWitness {
  std::atomic<int64_t> global;       ///< bytes all apps hold, as they count them
  std::atomic<int64_t> max_global;   ///< highest `global` seen right after an allocation
  std::atomic<uint64_t> violations;  ///< allocations after which `global` passed the cap
  std::atomic<uint64_t> stop;        ///< set by the test: apps free everything
  std::atomic<uint64_t> drained;     ///< hammer apps that have freed everything
  std::atomic<uint64_t> exit;        ///< set by the test: drained apps exit
  // "rounds" mode (job_app.cpp): barriers counted over the whole run, never reset.
  std::atomic<uint64_t> churned;     ///< threads that finished a round's churn
  std::atomic<uint64_t> full;        ///< threads refused in a round's fill, now waiting
  std::atomic<uint64_t> released;    ///< set by the test: rounds it has checked
  AppSlot apps[kMaxApps];
};

}  // namespace cuwj
