// Unit tests: the interposer's record of each CUDA array's context (array_owners.hpp).
#include <catch2/catch.hpp>

#include <algorithm>

#include "core/array_owners.hpp"

using cuw::core::ArrayOwner;
using cuw::core::ArrayOwners;

namespace {
CUcontext ctx(uintptr_t v) { return reinterpret_cast<CUcontext>(v); }

uint64_t remember(ArrayOwners& o, uint64_t key, CUcontext c) {
  ArrayOwners::Node n = ArrayOwners::make_node(c);
  return o.remember(key, n);
}

ArrayOwners::Snapshot snapshot(const ArrayOwners& o, CUcontext c) {
  ArrayOwners::Snapshot s;
  s.reserve(o.size());
  REQUIRE(o.snapshot(c, s));
  return s;
}
}  // namespace

TEST_CASE("array owners: a snapshot names a context's arrays with the serial they had", "[array_owners]") {
  ArrayOwners o;
  const uint64_t s1 = remember(o, 0x100, ctx(1));
  const uint64_t s2 = remember(o, 0x200, ctx(2));
  const uint64_t s3 = remember(o, 0x300, ctx(1));
  CHECK(s1 != 0);
  CHECK(s2 > s1);
  CHECK(s3 > s2);
  auto snap = snapshot(o, ctx(1));
  std::sort(snap.begin(), snap.end());
  REQUIRE(snap.size() == 2);
  CHECK(snap[0] == std::make_pair(uint64_t{0x100}, s1));
  CHECK(snap[1] == std::make_pair(uint64_t{0x300}, s3));
  CHECK(snapshot(o, ctx(3)).empty());
}

TEST_CASE("array owners: a handle remembered again gets a new serial, and the old one no longer matches",
          "[array_owners]") {
  ArrayOwners o;
  const uint64_t old = remember(o, 0x100, ctx(1));
  const uint64_t fresh = remember(o, 0x100, ctx(1));  // the same context handle, a new array
  CHECK(fresh != old);
  CHECK(o.size() == 1);
  CHECK_FALSE(o.forget(0x100, old));  // a sweep of the old context leaves it
  REQUIRE(o.find(0x100) != nullptr);
  CHECK(o.find(0x100)->serial == fresh);
  ArrayOwners::Node dead;
  CHECK(o.forget(0x100, fresh, &dead));
  CHECK_FALSE(dead.empty());  // handed back, to be freed after the lock
  CHECK(o.find(0x100) == nullptr);
  CHECK(o.size() == 0);
}

TEST_CASE("array owners: entries marked ctx_gone are left out of later snapshots, and serial 0 forgets any entry",
          "[array_owners]") {
  ArrayOwners o;
  remember(o, 0x100, ctx(1));
  remember(o, 0x200, ctx(1));
  o.find(0x100)->ctx_gone = true;
  const auto snap = snapshot(o, ctx(1));
  REQUIRE(snap.size() == 1);
  CHECK(snap[0].first == 0x200);
  CHECK(o.forget(0x100, 0));
  CHECK_FALSE(o.forget(0x100, 0));
}

TEST_CASE("array owners: a snapshot without room appends nothing and says so", "[array_owners]") {
  ArrayOwners o;
  for (uint64_t k = 1; k <= 10; ++k) remember(o, k * 0x100, ctx(1));
  ArrayOwners::Snapshot s;
  s.emplace_back(0xdead, 7);  // what the caller had before
  s.reserve(4);
  CHECK_FALSE(o.snapshot(ctx(1), s));
  REQUIRE(s.size() == 1);
  CHECK(s[0].first == 0xdead);
  s.reserve(s.size() + o.size());
  CHECK(o.snapshot(ctx(1), s));
  CHECK(s.size() == 11);
}

TEST_CASE("array owners: an empty node remembers nothing, and unmatches what was at its handle", "[array_owners]") {
  ArrayOwners o;
  ArrayOwners::Node none;
  CHECK(o.remember(0x100, none) == 0);
  CHECK(o.size() == 0);
  // A destruction of context 1 has its snapshot; the driver then hands 0x100 to a new array
  // that cannot be remembered (no memory for its node): the snapshot must not match it.
  const uint64_t old = remember(o, 0x100, ctx(1));
  const auto snap = snapshot(o, ctx(1));
  REQUIRE(snap.size() == 1);
  CHECK(o.remember(0x100, none) == 0);
  REQUIRE(o.find(0x100) != nullptr);
  CHECK(o.find(0x100)->serial != old);
  CHECK(o.find(0x100)->ctx == nullptr);
  CHECK_FALSE(o.forget(0x100, snap[0].second));
  CHECK(snapshot(o, ctx(1)).empty());
  CHECK(snapshot(o, nullptr).empty());  // no context: never swept
}

TEST_CASE("array owners: a handle remembered again is no longer marked ctx_gone", "[array_owners]") {
  ArrayOwners o;
  remember(o, 0x100, ctx(1));
  o.find(0x100)->ctx_gone = true;
  ArrayOwners::Node n = ArrayOwners::make_node(ctx(2));
  REQUIRE_FALSE(n.empty());
  REQUIRE(o.remember(0x100, n) != 0);
  CHECK_FALSE(n.empty());  // the entry was overwritten: the node is the caller's to free
  CHECK_FALSE(o.find(0x100)->ctx_gone);
  CHECK(o.find(0x100)->ctx == ctx(2));
  CHECK(snapshot(o, ctx(2)).size() == 1);
}
