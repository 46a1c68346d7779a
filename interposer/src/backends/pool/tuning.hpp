// cuwarden interposer: what the pool's files share: its tuning and its
// size classes (the driver entry points it calls unhooked are backends/driver_calls.hpp).
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cstdint>

#include "backends/pool/pool.hpp"
#include "backends/driver_calls.hpp"

namespace cuw::backends::pool::tuning {

inline constexpr uint32_t kSealBlocks = 64;             ///< an open batch this large is sealed by the free
inline constexpr uint32_t kPollEvery = 16;              ///< a free polls sealed batches this often
inline constexpr uint64_t kGrowPending = 64ULL << 20;   ///< past this many pending bytes, wait rather than grow
inline constexpr uint64_t kGivePending = 1ULL << 30;    ///< memory waiting to go back past this: wait for it
inline constexpr uint32_t kSealMinBlocks = 16;          ///< a missing small request seals a batch this large
inline constexpr uint64_t kSealMinBytes = 8ULL << 20;   ///< ... or holding this many bytes

inline uint64_t class_size(int cls) noexcept {
  if (cls < 4) return static_cast<uint64_t>(cls + 1) * 512;
  const int k = 11 + (cls - 4) / 4, j = (cls - 4) % 4;
  return (1ULL << k) + static_cast<uint64_t>(j + 1) * (1ULL << (k - 2));
}

inline uint64_t large_slack(uint64_t rounded) noexcept {
  return std::max<uint64_t>(kLargeRound, rounded / 8);
}


}  // namespace cuw::backends::pool::tuning
