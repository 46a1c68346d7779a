// Interposer tests: device identity. Caps are per CUDA ordinal as the process sees it;
// each ordinal's counters carry the physical GPU's UUID, whatever CUDA_VISIBLE_DEVICES did.
// Environment (set by ctest): two simulated devices of 1 GiB and 512 MiB, the visible list
// given in CUWT_EXPECT_PHYSICAL order, CUWARDEN_LIMIT=0=100MiB,1=200MiB.
#include <cstdlib>
#include <cstring>
#include <string>

#include "support.hpp"

using namespace cuwtest;

namespace {
using cuwtest::kMiB;
}

TEST_CASE("ordinals, caps and UUIDs follow CUDA_VISIBLE_DEVICES", "[visible]") {
  const char* expect = std::getenv("CUWT_EXPECT_TOTALS_MIB");  // e.g. "512,1024": per ordinal
  REQUIRE(expect);
  int count = 0;
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  REQUIRE(cuDeviceGetCount(&count) == CUDA_SUCCESS);
  std::string totals(expect);
  const uint64_t caps[2] = {100 * kMiB, 200 * kMiB};
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    INFO("ordinal " << ordinal);
    make_context(ordinal);
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc(&p, kMiB) == CUDA_SUCCESS);
    auto& d = dev_counters(ordinal);
    REQUIRE(d.present.load() == 1);
    // The physical device behind this ordinal, by its memory size and its UUID.
    const uint64_t want_total = std::strtoull(totals.c_str(), nullptr, 10) * kMiB;
    totals = totals.find(',') == std::string::npos ? "" : totals.substr(totals.find(',') + 1);
    CHECK(d.physical_total == want_total);
    CUdevice dev = 0;
    REQUIRE(cuDeviceGet(&dev, ordinal) == CUDA_SUCCESS);
    CUuuid uuid{};
    REQUIRE(cuDeviceGetUuid(&uuid, dev) == CUDA_SUCCESS);
    CHECK(std::memcmp(d.uuid, uuid.bytes, 16) == 0);
    // The cap of this ordinal, not of the physical index.
    CHECK(d.limit.load() == caps[ordinal]);
    CHECK(used(ordinal) == kMiB);
    CUdeviceptr q = 0;
    CHECK(cuMemAlloc(&q, caps[ordinal]) == CUDA_ERROR_OUT_OF_MEMORY);
    REQUIRE(cuMemAlloc(&q, caps[ordinal] - kMiB) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(q) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
    CHECK(used(ordinal) == 0);
  }
  CHECK(count == static_cast<int>(std::count(expect, expect + std::strlen(expect), ',') + 1));
}
