// cuwarden fuzz target: an out-of-memory report file as a restarted daemon reads it back from
// its state directory (model/oom_store.hpp): written by an earlier daemon, but cut short by a
// full disk or replaced by whoever could write there, so every byte is hostile.
// Invariants: parse_oom_report_file never throws, never crashes or hangs (a deep nesting is
// refused before the recursive parser sees it), and what it accepts writes back to text that
// it accepts again with the same counts.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "model/oom_store.hpp"

namespace cd = cuw::daemon;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1u << 20)) return 0;
  std::string why;
  const auto r = cd::parse_oom_report_file(std::string_view(reinterpret_cast<const char*>(data), size), &why);
  if (!r) {
    if (why.empty()) std::abort();  // a refusal always says why
    return 0;
  }
  const std::string again = cd::oom_report_file_text(*r);
  const auto r2 = cd::parse_oom_report_file(again, &why);
  if (!r2 || r2->pid != r->pid || r2->snapshot.snap.sites.size() != r->snapshot.snap.sites.size() ||
      r2->snapshot.snap.allocations.size() != r->snapshot.snap.allocations.size() ||
      r2->snapshot.snap.trace.size() != r->snapshot.snap.trace.size())
    std::abort();
  return 0;
}
