// Unit tests: a pool's free lists (interposer/src/backends/pool/free_lists.hpp), on blocks
// made by hand: the bytes they count as blocks come and go, and after clear().
#include <catch2/catch.hpp>

#include "backends/pool/free_lists.hpp"

namespace {

constexpr uint64_t kMiB = 1ULL << 20;
constexpr uint64_t kUnit = 2 * kMiB;  // a granule

struct Segment {
  int cls = -1;  // large blocks
  bool split = true;
};
struct Block {
  CUdeviceptr ptr = 0;
  uint64_t size = 0;
  Segment* seg = nullptr;
  Block* prev = nullptr;
  Block* next = nullptr;
};
using Lists = cuw::backends::pool::free_lists<Block, 4>;

}  // namespace

TEST_CASE("free lists: a split segment's free blocks count the whole units inside them", "[free_lists]") {
  Lists f(kUnit);
  Segment s;
  // 1 MiB into a unit, 7 MiB long: the units at 2, 4 and 6 MiB lie wholly inside.
  Block a{kMiB, 7 * kMiB, &s};
  Block b{16 * kMiB, 4 * kMiB, &s};
  f.push(&a);
  f.push(&b);
  CHECK(f.large_bytes() == 11 * kMiB);
  CHECK(f.whole_bytes() == 10 * kMiB);
  f.unlink(&a);
  CHECK(f.large_bytes() == 4 * kMiB);
  CHECK(f.whole_bytes() == 4 * kMiB);
}

TEST_CASE("free lists: clear() forgets the whole units with the blocks", "[free_lists]") {
  // A pool whose context is gone clears its lists, then publishes what they serve: the vmm
  // layout's answer is whole_bytes(), which must say nothing is free.
  Lists f(kUnit);
  Segment s;
  Block a{0, 6 * kMiB, &s};
  f.push(&a);
  REQUIRE(f.whole_bytes() == 6 * kMiB);
  f.clear();
  CHECK(f.large_bytes() == 0);
  CHECK(f.whole_bytes() == 0);
  CHECK(f.largest_size() == 0);
  // Blocks pushed afterwards are counted from nothing.
  Block b{32 * kMiB, 4 * kMiB, &s};
  f.push(&b);
  CHECK(f.large_bytes() == 4 * kMiB);
  CHECK(f.whole_bytes() == 4 * kMiB);
}
