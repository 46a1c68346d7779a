// cuwarden daemon view: a Snapshot's live device memory as folded stacks for flame graphs
// (see snapshot_views.hpp).
#include <map>
#include <string>
#include <vector>

#include "views/detail/snapshot.hpp"
#include "views/snapshot_views.hpp"

namespace cuw::daemon {

using namespace snapshot_detail;

namespace {
/// A frame's text as one field of a folded line: ';' separates frames, and the last space
/// of the line the count, which readers find from the end, so spaces may stay.
std::string field(const SnapFrame& f) {
  std::string t = frame_text(f);  // printable: no control characters, no newline
  for (char& c : t)
    if (c == ';') c = ',';
  return t;
}
}  // namespace

std::string snapshot_folded(const Snapshot& s, const frames::Rules* rules_in) {
  const frames::Rules& rules = rules_or_builtin(rules_in);
  std::map<std::string, uint64_t> stacks;
  for (const auto& [id, t] : site_totals(s)) {
    if (t.bytes == 0) continue;
    const SnapSite* site = s.site(id);
    if (!site || site->frames.empty()) {
      stacks[id == 0 ? "(no call site)" : "(frames unknown)"] += t.bytes;
      continue;
    }
    std::vector<frames::Frame> fs;
    for (const SnapFrame& f : site->frames) fs.push_back(present(f, rules));
    const std::vector<std::size_t> order = frames::calling_order(fs);
    std::string line;
    for (auto it = order.rbegin(); it != order.rend(); ++it) {  // root first
      if (!line.empty()) line += ';';
      line += field(site->frames[*it]);
    }
    stacks[line] += t.bytes;
  }
  std::string out;
  for (const auto& [stack, bytes] : stacks) out += stack + " " + std::to_string(bytes) + "\n";
  return out;
}

}  // namespace cuw::daemon
