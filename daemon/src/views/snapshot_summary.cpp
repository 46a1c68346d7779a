// cuwarden daemon view: a Snapshot as torch.cuda.memory_summary()'s table (see
// snapshot_views.hpp).
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

namespace {

/// A cell: a number, or unknown ("-").
struct Cell {
  bool known = false;
  uint64_t v = 0;
};
Cell known(uint64_t v) { return {true, v}; }
const Cell kUnknown{};

/// A counter by its field name, if this build's counter list has it (alloc_bytes and
/// free_bytes may come: the summary shows them as soon as they do).
Cell counter_named(const SnapDevice& d, std::string_view field) {
  for (std::size_t i = 0; i < counters::kDeviceCount; ++i)
    if (counters::kDevice[i].field == field) return known(d.counters[i]);
  return kUnknown;
}

/// torch.cuda.memory_summary's _format_size: the unit chosen by the row's "all" value.
std::string size_cell(const Cell& c, uint64_t pref) {
  if (!c.known) return "     -    ";  // in the last digit's column
  static const char* prefixes[] = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
  uint64_t sz = c.v;
  double p = static_cast<double>(pref);
  int k = 0;
  while (k < 5 && p >= 768.0 * 1024) {
    ++k;
    sz /= 1024;
    p /= 1024;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%6" PRIu64 " %s", sz, prefixes[k]);
  return buf;
}

/// torch.cuda.memory_summary's _format_count.
std::string count_cell(const Cell& c, uint64_t pref) {
  if (!c.known) return "      -   ";  // where the last digit goes, as in size_cell
  static const char* prefixes[] = {" ", "K", "M"};
  uint64_t n = c.v;
  double p = static_cast<double>(pref);
  int k = 0;
  while (k < 2 && p >= 750.0 * 1000) {
    ++k;
    n /= 1000;
    p /= 1000;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%7" PRIu64 " %s ", n, prefixes[k]);
  return buf;
}

struct Row {
  const char* name;
  bool bytes;
  Cell all[4], large[4], small[4];  ///< Cur, Peak, Tot Alloc, Tot Freed
};

}  // namespace

std::string summary_text(const Snapshot& s) {
  const TorchModel m = torch_model(s);
  const bool pools = pooling(s);
  std::string out;
  const std::string rule_eq(75, '='), rule(75, '-');
  auto line = [&](const std::string& body) { out += "|" + pad(fit(body, 75), 75) + "|\n"; };

  for (const SnapDevice& d : s.devices) {
    // What the live records say, split at 1 MiB as PyTorch's pools are.
    uint64_t alloc_l = 0, alloc_s = 0, req_l = 0, req_s = 0, n_l = 0, n_s = 0;
    uint64_t seg_l = 0, seg_s = 0, segn_l = 0, segn_s = 0, nonrel_l = 0, nonrel_s = 0, nonreln_l = 0, nonreln_s = 0;
    for (const TSegment& g : m.segments) {
      if (g.device != d.ordinal) continue;
      (g.large ? seg_l : seg_s) += g.size;
      ++(g.large ? segn_l : segn_s);
      bool any_active = false;
      for (const TBlock& b : g.blocks) any_active = any_active || b.active;
      for (const TBlock& b : g.blocks) {
        if (b.active) {
          const bool large = b.requested > kSmallMax;
          (large ? alloc_l : alloc_s) += b.size;
          (large ? req_l : req_s) += b.requested;
          ++(large ? n_l : n_s);
        } else if (any_active) {
          // Free space in a segment a live block keeps: the pool cannot give it back.
          (g.large ? nonrel_l : nonrel_s) += b.size;
          ++(g.large ? nonreln_l : nonreln_s);
        }
      }
    }
    const bool rec = s.exact;
    auto R = [&](uint64_t v) { return rec ? known(v) : kUnknown; };
    const uint64_t used = d.get(counters::Id::used), peak = d.get(counters::Id::peak);
    const bool context_counted = d.get(counters::Id::context_bytes) != 0;
    // The peak counter is of used bytes: the program's allocations without a pool, what the
    // pool holds from the driver with one (its cached bytes are part of used).
    const Cell peak_alloc = !pools && !context_counted ? known(peak) : kUnknown;
    const Cell peak_reserved = !context_counted ? known(peak) : kUnknown;
    const Cell tot_alloc_bytes = counter_named(d, "alloc_bytes"), tot_freed_bytes = counter_named(d, "free_bytes");
    // Active = allocated + freed blocks a pool still holds for their streams' work: the same
    // without a pool; a pool's pending frees are not counted anywhere.
    const Cell active_all = !pools ? known(d.get(counters::Id::in_use)) : kUnknown;

    std::vector<Row> rows;
    rows.push_back({"Allocated memory", true,
                    {known(d.get(counters::Id::in_use)), peak_alloc, tot_alloc_bytes, tot_freed_bytes},
                    {R(alloc_l), kUnknown, kUnknown, kUnknown},
                    {R(alloc_s), kUnknown, kUnknown, kUnknown}});
    rows.push_back({"Active memory", true,
                    {active_all, !pools ? peak_alloc : kUnknown, !pools ? tot_alloc_bytes : kUnknown,
                     !pools ? tot_freed_bytes : kUnknown},
                    {!pools ? R(alloc_l) : kUnknown, kUnknown, kUnknown, kUnknown},
                    {!pools ? R(alloc_s) : kUnknown, kUnknown, kUnknown, kUnknown}});
    rows.push_back({"Requested memory", true,
                    {R(req_l + req_s), kUnknown, kUnknown, kUnknown},
                    {R(req_l), kUnknown, kUnknown, kUnknown},
                    {R(req_s), kUnknown, kUnknown, kUnknown}});
    rows.push_back({"GPU reserved memory", true,
                    {known(d.get(counters::Id::reserved)), peak_reserved, kUnknown, kUnknown},
                    {R(seg_l), kUnknown, kUnknown, kUnknown},
                    {R(seg_s), kUnknown, kUnknown, kUnknown}});
    rows.push_back({"Non-releasable memory", true,
                    {R(nonrel_l + nonrel_s), kUnknown, kUnknown, kUnknown},
                    {R(nonrel_l), kUnknown, kUnknown, kUnknown},
                    {R(nonrel_s), kUnknown, kUnknown, kUnknown}});
    rows.push_back({"Allocations", false,
                    {known(d.get(counters::Id::live_allocations)), kUnknown, known(d.get(counters::Id::alloc_count)),
                     known(d.get(counters::Id::free_count))},
                    {R(n_l), kUnknown, kUnknown, kUnknown},
                    {R(n_s), kUnknown, kUnknown, kUnknown}});
    rows.push_back({"Active allocs", false,
                    {!pools ? known(d.get(counters::Id::live_allocations)) : kUnknown, kUnknown,
                     !pools ? known(d.get(counters::Id::alloc_count)) : kUnknown,
                     !pools ? known(d.get(counters::Id::free_count)) : kUnknown},
                    {!pools ? R(n_l) : kUnknown, kUnknown, kUnknown, kUnknown},
                    {!pools ? R(n_s) : kUnknown, kUnknown, kUnknown, kUnknown}});
    rows.push_back({"GPU reserved segments", false,
                    {R(segn_l + segn_s), kUnknown, kUnknown, kUnknown},
                    {R(segn_l), kUnknown, kUnknown, kUnknown},
                    {R(segn_s), kUnknown, kUnknown, kUnknown}});
    rows.push_back({"Non-releasable allocs", false,
                    {R(nonreln_l + nonreln_s), kUnknown, kUnknown, kUnknown},
                    {R(nonreln_l), kUnknown, kUnknown, kUnknown},
                    {R(nonreln_s), kUnknown, kUnknown, kUnknown}});

    out += "|" + rule_eq + "|\n";
    line(" cuwarden memory summary (torch.cuda.memory_summary's table), device ID " + std::to_string(d.ordinal));
    // Names last, each on its line: a long one is what the frame cuts, never the figures.
    line(" pid " + std::to_string(s.pid) + ", pool " + (s.pool.empty() ? std::string("off") : printable(s.pool)) +
         ", " + printable(process_name(s.comm, s.cmdline)));
    line(" used " + format_bytes(used) + " on " + printable(d.name));
    out += "|" + rule + "|\n";
    char buf[120];
    std::snprintf(buf, sizeof buf, "           CUDA OOMs: %-12" PRIu64 " |        driver errors: %-8" PRIu64,
                  d.get(counters::Id::refusals), d.get(counters::Id::driver_errors));
    line(buf);
    out += "|" + rule_eq + "|\n";
    line("        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ");
    for (const Row& r : rows) {
      out += "|" + rule + "|\n";
      uint64_t pref[4];
      for (int c = 0; c < 4; ++c) {
        // The unit follows the "all" value, as PyTorch's; an unknown "all" takes the largest split.
        pref[c] = r.all[c].known ? r.all[c].v : std::max(r.large[c].v, r.small[c].v);
      }
      auto emit = [&](const char* label, const Cell (&cells)[4]) {
        std::string l = " " + pad(label, 21) + " ";
        for (int c = 0; c < 4; ++c)
          l += "| " + (r.bytes ? size_cell(cells[c], pref[c]) : count_cell(cells[c], pref[c])) + " ";
        line(l);
      };
      emit(r.name, r.all);
      emit("      from large pool", r.large);
      emit("      from small pool", r.small);
    }
    out += "|" + rule + "|\n";
    const Cell none4[4] = {kUnknown, kUnknown, kUnknown, kUnknown};
    for (const char* name : {"Oversize allocations", "Oversize GPU segments"}) {
      std::string l = " " + pad(name, 21) + " ";
      for (int c = 0; c < 4; ++c) l += "| " + count_cell(none4[c], 0) + " ";
      line(l);
    }
    out += "|" + rule_eq + "|\n";
  }
  if (s.devices.empty()) out += "(no device)\n";
  out += "-: not known to cuwarden. Peaks and totals are counters kept since the process started;\n"
         "the rest comes from the live allocations at the snapshot" +
         std::string(s.exact ? "" : " (not readable for this one)") +
         ". Large: requests over 1 MiB.\n"
         "Reserved memory: " +
         std::string(pools ? "the pool's driver allocations" : "every live allocation is its own (no pool)") +
         ". Non-releasable: free space in segments that a live block keeps.\n" +
         (pools ? "Active memory and allocs: a pool's frees still waiting for their streams are not counted.\n" : "") +
         "Oversize: PyTorch's max_split_size, which cuwarden has not.\n";
  return out;
}

}  // namespace cuw::daemon
