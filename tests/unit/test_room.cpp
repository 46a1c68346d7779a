// Unit tests for the daemon's choice of processes to suspend to make room
// (daemon/src/model/room.cpp: choose_victims): the fewest, then the lowest priority, then the
// most recently started.
#include <algorithm>
#include <catch2/catch.hpp>

#include "model/room.hpp"

using cuw::daemon::choose_victims;
using cuw::daemon::RoomCandidate;

namespace {

std::vector<uint32_t> pids(const std::vector<RoomCandidate>& v) {
  std::vector<uint32_t> out;
  for (const auto& c : v) out.push_back(c.pid);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("room: the fewest processes that cover the shortfall") {
  // One large one covers it alone: chosen over two small ones of lower priority.
  const std::vector<RoomCandidate> c = {{1, 100, -10, 40}, {2, 101, -10, 40}, {3, 50, -5, 100}};
  CHECK(pids(choose_victims(c, 70)) == std::vector<uint32_t>{3});
  // Nothing covers it: none.
  CHECK(choose_victims(c, 500).empty());
  CHECK(choose_victims({}, 1).empty());
  CHECK(choose_victims(c, 0).empty());
  // Two are needed whatever: of the lowest priority the most recently started (2), then
  // the one that completes it.
  CHECK(pids(choose_victims(c, 130)) == std::vector<uint32_t>{2, 3});
}

TEST_CASE("room: among as few, the lowest priority, then the most recently started") {
  const std::vector<RoomCandidate> c = {{1, 100, -1, 50}, {2, 200, -3, 50}, {3, 300, -3, 50}, {4, 400, -2, 50}};
  CHECK(pids(choose_victims(c, 50)) == std::vector<uint32_t>{3});       // -3, started last
  CHECK(pids(choose_victims(c, 100)) == std::vector<uint32_t>{2, 3});   // both -3
  CHECK(pids(choose_victims(c, 150)) == std::vector<uint32_t>{2, 3, 4});
  // A preferred one too small to be part of a smallest set is passed over.
  const std::vector<RoomCandidate> d = {{1, 100, -9, 10}, {2, 200, -1, 60}, {3, 300, -2, 60}};
  CHECK(pids(choose_victims(d, 60)) == std::vector<uint32_t>{3});
  CHECK(pids(choose_victims(d, 115)) == std::vector<uint32_t>{2, 3});
}
