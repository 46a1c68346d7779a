// cuwarden job tests: the witness file shared by the job tests and their apps (job_app.cpp
// says how it is used).
#pragma once

#include <atomic>
#include <cstdint>

namespace cuwj {

inline constexpr unsigned kMaxApps = 256;

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
  AppSlot apps[kMaxApps];
};

}  // namespace cuwj
