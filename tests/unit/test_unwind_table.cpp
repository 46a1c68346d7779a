// Unit tests: the call sites' stack walk with its rule table built small
// (CUW_UNWIND_TABLE_BITS=4: 16 slots, 8 rules, fewer than one walk's frames): a full table is
// emptied and filled again, so walks keep giving backtrace()'s frames and never fall back, and
// an unloaded library is still noticed however often the table is emptied.
#include <dlfcn.h>

#include <cstdint>

#include "core/callsites/unwind.hpp"
#include "unwind_chains.hpp"
#include "unwind_check.hpp"

namespace unwind = cuw::core::unwind;

TEST_CASE("unwind: a full table is emptied and walks go on giving backtrace()'s frames", "[unwind]") {
  const unwind::Stats before = unwind::stats();
  constexpr int kWalks = 50;
  std::vector<Capture> c(2 * kWalks);
  for (int i = 0; i < kWalks; ++i) both([](Job* j) { chain_nofp(j); }, &c[2 * i]);  // one call instruction
  const unwind::Stats after = unwind::stats();
  for (int i = 0; i < kWalks; ++i) require_same(&c[2 * i]);
  REQUIRE(c[0].n > 8);  // more frames than the table keeps
  REQUIRE(after.resets - before.resets >= static_cast<uint64_t>(kWalks));
  REQUIRE(after.not_stored_probes == before.not_stored_probes);
  REQUIRE(after.not_stored_busy == before.not_stored_busy);
}

TEST_CASE("unwind: with the table full, unloading a library still empties it", "[unwind]") {
  const unwind::Stats before = walk_across_an_unload();
  REQUIRE(unwind::stats().invalidations == before.invalidations + 1);
}
