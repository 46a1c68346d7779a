// cuwarden daemon view: a Snapshot as the report for people (see snapshot_views.hpp).
#include "views/snapshot_views.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <map>
#include <set>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "base/util.hpp"
#include "cuw/ring.hpp"
#include "cuw/size.hpp"
#include "cuw/text.hpp"
#include "views/counters_json.hpp"
#include "views/pickle.hpp"
#include "views/detail/snapshot.hpp"

namespace cuw::daemon {

using json = nlohmann::ordered_json;
using namespace snapshot_detail;

std::string snapshot_text(const Snapshot& s, const TextOptions& opts) {
  std::string out;
  const std::string name = printable(process_name(s.comm, s.cmdline));
  out += "cuwarden snapshot of pid " + std::to_string(s.pid) + " (" + name + ")";
  if (!s.user.empty()) out += ", user " + printable(s.user);
  if (!s.job.empty()) out += ", job " + printable(s.job);
  out += "\n";
  if (!s.cmdline.empty()) out += "  command: " + printable(s.cmdline) + "\n";
  out += "  taken " + utc(s.time_ns) + (s.exited ? ", from what the exited process left" : "") + "\n";
  out += "  pool " + (s.pool.empty() ? std::string("off") : printable(s.pool)) + "; live records " +
         (s.exact ? "exact" : "not available (counters only)") + "; " + std::to_string(s.events_dropped) +
         " events dropped" + (s.events_dropped ? " (the history below may miss some; the live records do not)" : "") +
         "; call sites " +
         (s.callsite_frames ? "on (" + std::to_string(s.callsite_frames) + " native frames)" : std::string("off")) +
         "\n\n";

  out += "GPU  " + pad("Name", 24) + pad("Used", 12, true) + pad("Reserved", 12, true) + pad("Peak", 12, true) +
         pad("Cap", 12, true) + pad("Cached", 12, true) + "\n";
  for (const SnapDevice& d : s.devices) {
    out += pad(std::to_string(d.ordinal), 5) + pad(printable(d.name).substr(0, 23), 24) +
           pad(format_bytes(d.get(counters::Id::used)), 12, true) +
           pad(format_bytes(d.get(counters::Id::reserved)), 12, true) +
           pad(format_bytes(d.get(counters::Id::peak)), 12, true) + pad(cap_text(d.get(counters::Id::limit)), 12, true) +
           pad(format_bytes(d.get(counters::Id::cached)), 12, true) + "\n";
  }
  if (s.devices.empty()) out += "(no device)\n";

  if (!s.exact) {
    out += "\nThe live allocations could not be read; the figures above are the process's counters.\n";
    return out;
  }

  // Call sites by live bytes.
  const frames::Rules& rules = rules_or_builtin(opts.rules);
  const auto labels = site_labels(s, rules);
  const auto totals = site_totals(s);
  std::vector<std::pair<uint32_t, SiteTotal>> sites(totals.begin(), totals.end());
  std::stable_sort(sites.begin(), sites.end(),
                   [](const auto& a, const auto& b) { return a.second.bytes > b.second.bytes; });
  std::size_t live = 0;
  for (const SnapAlloc& a : s.allocations) live += a.kind != SnapKind::host;
  out += "\nLive device memory by call site";
  if (sites.size() > opts.top) out += " (top " + std::to_string(opts.top) + " of " + std::to_string(sites.size()) + ")";
  out += ":\n";
  if (const std::string note = segments_note(s); !note.empty()) out += "  " + note + "\n";
  if (sites.empty()) out += "  (no live device allocation)\n";
  for (std::size_t i = 0; i < sites.size() && i < opts.top; ++i) {
    const auto& [id, t] = sites[i];
    out += "  " + pad(format_bytes(t.bytes), 11, true) + "  " + pad(std::to_string(t.count), 6, true) +
           (t.count == 1 ? " allocation " : " allocations") + "  ";
    if (id == 0) {
      out += s.callsite_frames ? "(no call site captured)\n" : "(call sites off: CUWARDEN_CALLSITES=16 records them)\n";
      continue;
    }
    out += "site " + std::to_string(id) + "\n";
    const SnapSite* site = s.site(id);
    auto l = labels.find(id);
    if (!site || l == labels.end()) {
      out += "      (frames unknown)\n";
      continue;
    }
    for (const std::string& line : site_lines(*site, l->second, rules, opts.full)) out += "      " + line + "\n";
  }

  // The largest live allocations.
  std::vector<const SnapAlloc*> big;
  for (const SnapAlloc& a : s.allocations)
    if (a.kind != SnapKind::host) big.push_back(&a);
  std::stable_sort(big.begin(), big.end(), [](const SnapAlloc* a, const SnapAlloc* b) { return a->bytes > b->bytes; });
  out += "\nLargest live allocations";
  if (big.size() > opts.top) out += " (top " + std::to_string(opts.top) + " of " + std::to_string(live) + ")";
  out += ":\n";
  if (!big.empty())
    out += "  " + pad("Address", 16) + pad("Size", 11, true) + "  " + pad("GPU", 4) + pad("Stream", 16) + pad("Age", 14) +
           "Site\n";
  for (std::size_t i = 0; i < big.size() && i < opts.top; ++i) {
    const SnapAlloc& a = *big[i];
    std::string where = "-";
    if (a.site) {
      where = std::to_string(a.site);
      if (auto l = labels.find(a.site); l != labels.end()) where += ": " + l->second.one_line();
    }
    const std::string kind =
        a.kind == SnapKind::device || a.kind == SnapKind::pooled ? "" : std::string(" (") + kind_name(a.kind) + ")";
    const std::string stream = a.stream ? hex(a.stream) : std::string("default");  // 0: the legacy default stream
    out += "  " + pad(hex(a.address), 16) + pad(format_bytes(a.bytes), 11, true) + "  " + pad(std::to_string(a.device), 4) +
           pad(stream, 16) + pad(duration(sat_sub(s.time_ns, a.time_ns)), 14) + where + kind + "\n";
  }

  uint64_t host_bytes = 0, host_count = 0;
  for (const SnapAlloc& a : s.allocations)
    if (a.kind == SnapKind::host) host_bytes += a.bytes, ++host_count;
  if (host_count)
    out += "\nPinned host memory (not device memory, never capped): " + std::to_string(host_count) +
           (host_count == 1 ? " allocation, " : " allocations, ") + format_bytes(host_bytes) + "\n";
  return out;
}

}  // namespace cuw::daemon
