// cuwarden interposer core: what the program's standard error is told about its memory: the
// out-of-memory paragraph (Tracker::report_oom) and the leak report at exit
// (Tracker::report_leaks, CUWARDEN_LEAKS=report). Both read the process's own live segment
// (cuw/live.hpp), as the daemon does, so they never take the tracker's lock for long.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tracker.hpp"
#include "cuw/frames.hpp"
#include "cuw/live.hpp"
#include "cuw/size.hpp"
#include "cuw/tensors.hpp"

namespace cuw::core {

namespace {

/// Live bytes and allocations per call site, largest first.
struct SiteTotal {
  uint32_t site = 0;
  uint64_t bytes = 0, count = 0;
};

std::vector<SiteTotal> by_site(const live::Contents& c, bool device_only, int ordinal) {
  std::unordered_map<uint32_t, SiteTotal> m;
  for (const live::Record& r : c.records) {
    if (r.table == live::Table::segments) continue;  // the pool's own memory, not the program's
    if (device_only && (r.table == live::Table::host || (ordinal >= 0 && r.device != ordinal))) continue;
    SiteTotal& t = m[r.site];
    t.site = r.site;
    t.bytes += r.bytes;
    ++t.count;
  }
  std::vector<SiteTotal> v;
  v.reserve(m.size());
  for (auto& [k, t] : m) v.push_back(t);
  std::sort(v.begin(), v.end(), [](const SiteTotal& a, const SiteTotal& b) { return a.bytes > b.bytes; });
  return v;
}

/// The process's own live records. A file is copied with pread, like the daemon does: a
/// region given back (punched) reads as zero there, where touching it through the mapping
/// could fault a page in.
bool read_own(const LiveSegment& seg, live::Contents* c) {
  if (!seg.usable()) return false;
  if (seg.is_file()) {
    std::string why;
    return live::read_file(seg.path(), -1, c, &why, false);
  }
  return live::read(seg.base(), seg.size(), c, false) == live::ReadError::none;
}

void write_stderr(const std::string& text) {
  std::size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::write(STDERR_FILENO, text.data() + off, text.size() - off);
    if (n <= 0) return;
    off += static_cast<std::size_t>(n);
  }
}

}  // namespace

namespace {
/// The refusal report_oom() noted on this thread, for flush_oom_report().
struct PendingOom {
  int ordinal = -1;
  uint64_t bytes = 0;
  ring::Api api = ring::Api::unknown;
  ring::EventKind kind = ring::EventKind::refuse;
  uint32_t result = 0;
  uint32_t site = 0;
};
thread_local PendingOom t_pending;
}  // namespace

std::vector<std::string> Tracker::labels(const std::vector<uint32_t>& ids) const {
  std::vector<std::vector<frames::Frame>> stacks;
  stacks.reserve(ids.size());
  for (uint32_t id : ids) stacks.push_back(live_->sites.present(id));
  const std::vector<frames::Label> l = frames::label_sites(stacks);
  std::vector<std::string> out;
  out.reserve(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == 0) out.emplace_back("(no call site)");
    else if (stacks[i].empty()) out.emplace_back("(unknown frames)");
    else out.push_back(l[i].one_line() + (l[i].folded_text.empty() ? "" : "  [" + l[i].folded_text + "]"));
  }
  return out;
}

void Tracker::report_oom(int ordinal, uint64_t bytes, ring::Api api, ring::EventKind kind, uint32_t result) noexcept {
  fast_clock::detail::ThreadState& ts = thread_state();
  if (ts.oom_pending) return;  // the first refusal of the hook is the one to tell
  t_pending = PendingOom{ordinal, bytes, api, kind, result, ts.site};
  ts.oom_pending = 1;
}

void Tracker::flush_oom_report(uint64_t asked) noexcept {
  thread_state().oom_pending = 0;
  const PendingOom p = t_pending;
  const int ordinal = p.ordinal;
  const ring::Api api = p.api;
  const ring::EventKind kind = p.kind;
  const uint32_t result = p.result;
  const uint64_t bytes = asked ? asked : p.bytes;
  // A framework that frees its cache and retries refuses again in a burst, and a program
  // may retry in a tight loop: the first paragraph says what the rest would, and the rest
  // are counted in one line at most once a second (thousands of paragraphs buried the
  // program's own output). A new paragraph after a minute: the situation may have changed.
  constexpr uint64_t kParagraphEveryNs = 60'000'000'000ULL;
  constexpr uint64_t kLineEveryNs = 1'000'000'000ULL;
  const uint64_t now = fast_clock::realtime_ns_slow();
  uint64_t last = live_->last_oom_report_ns.load(std::memory_order_relaxed);
  if ((last != 0 && now - last < kParagraphEveryNs) ||
      !live_->last_oom_report_ns.compare_exchange_strong(last, now, std::memory_order_relaxed))
  {
    live_->oom_unsaid.fetch_add(1, std::memory_order_relaxed);
    uint64_t line = live_->last_oom_line_ns.load(std::memory_order_relaxed);
    if (now - line >= kLineEveryNs && live_->last_oom_line_ns.compare_exchange_strong(line, now, std::memory_order_relaxed))
      report_unsaid_ooms();
    return;
  }
  live_->last_oom_line_ns.store(now, std::memory_order_relaxed);
  report_unsaid_ooms();  // those since the last paragraph come before the new one
  if (static_cast<unsigned>(ordinal) >= ring::kMaxDevices) return;
  try {
    const ring::DeviceSlot& d = header_->devices[ordinal];
    const uint64_t limit = d.limit.load(std::memory_order_relaxed);
    const uint64_t used = d.used.load(std::memory_order_relaxed);
    const uint64_t cached = d.cached.load(std::memory_order_relaxed);
    std::string s = "cuwarden: out of memory on GPU " + std::to_string(ordinal);
    if (d.name[0]) s += " (" + std::string(d.name, strnlen(d.name, sizeof d.name)) + ")";
    s += ": " + std::string(ring::api_name(static_cast<uint16_t>(api))) + " asked for " + format_bytes(bytes) + "; ";
    if (kind == ring::EventKind::job_refuse) {
      uint64_t jcap = 0, jused = 0;
      if (job_view(ordinal, &jcap, &jused))
        s += "job '" + config_.job + "' holds " + format_bytes(jused) + " of its cap of " + format_bytes(jcap) + "; ";
    } else if (kind == ring::EventKind::driver_error) {
      s += "the driver refused (CUresult " + std::to_string(result) + "); ";
    } else if (kind == ring::EventKind::refuse && held_back(ordinal)) {
      s += "held back by the daemon: a process of higher priority suspended from this GPU waits for its memory; ";
    }
    s += "this process uses " + format_bytes(used);
    if (limit != ring::kNoLimit) s += " of its cap of " + format_bytes(limit);
    if (cached) s += ", of which the pool keeps " + format_bytes(cached) + " free";
    s += ".\n";
    live::Contents c;
    const bool read = read_own(live_->segment, &c);
    std::vector<SiteTotal> sites;
    if (read) sites = by_site(c, true, ordinal);
    if (sites.size() > 3) sites.resize(3);
    // The sites the paragraph names, told apart among them (cuw/frames.hpp).
    std::vector<uint32_t> named;
    if (p.site) named.push_back(p.site);
    for (const SiteTotal& t : sites) named.push_back(t.site);
    const std::vector<std::string> label = labels(named);
    // Where the refused request came from (the hook captured it before asking).
    if (callsites_on() && p.site) s += "  Asked at: " + label[0] + "\n";
    if (read) {
      if (callsites_on()) {
        s += "  Largest call sites by live bytes:";
        int shown = 0;
        for (const SiteTotal& t : sites) {
          s += "\n    " + std::to_string(shown + 1) + ") " + format_bytes(t.bytes) + " in " + std::to_string(t.count) +
               (t.count == 1 ? " allocation: " : " allocations: ") + label[(p.site ? 1 : 0) + static_cast<std::size_t>(shown)];
          ++shown;
        }
        if (shown == 0) s += " none live";
        s += "\n";
      } else {
        uint64_t n = 0, b = 0;
        for (const SiteTotal& t : sites) n += t.count, b += t.bytes;
        s += "  " + std::to_string(n) + " live allocations hold " + format_bytes(b) +
             " (CUWARDEN_CALLSITES=16 records where each was made).\n";
      }
    }
    // With PyTorch's cache off (`cuwarden run --tensors` sets it) nothing frees a cache and
    // retries: its uncached path raises the refusal as a CUDA error at once.
    const tensors::Switch& torch = tensors::get(tensors::Id::PYTORCH_NO_CUDA_MEMORY_CACHING);
    const char* uncached = std::getenv(torch.variable);
    if (uncached != nullptr && std::strcmp(uncached, torch.value) == 0)
      s += std::string("  PyTorch's cache is off (") + torch.variable + "=" + torch.value +
           "): it raises this as a CUDA error and does not retry.";
    else
      s += "  The program may recover (frameworks free their caches and retry).";
    s += " Full snapshot: cuwarden snapshot " + std::to_string(getpid()) + "\n";
    write_stderr(s);
  } catch (...) {
    // No memory for the paragraph: the refusal itself stands, said by its return value.
  }
}

void Tracker::report_unsaid_ooms() noexcept {
  const uint64_t n = live_->oom_unsaid.exchange(0, std::memory_order_relaxed);
  if (n == 0) return;
  try {
    write_stderr("cuwarden: " + std::to_string(n) + (n == 1 ? " more allocation" : " more allocations") +
                 " refused since the last report (cuwarden snapshot " + std::to_string(getpid()) + ")\n");
  } catch (...) {
  }
}

void Tracker::report_leaks() noexcept {
  try {
    live::Contents c;
    if (!read_own(live_->segment, &c)) return;
    const std::vector<SiteTotal> sites = by_site(c, false, -1);
    uint64_t n = 0, b = 0;
    for (const SiteTotal& t : sites) n += t.count, b += t.bytes;
    const std::string pid = std::to_string(getpid());
    if (n == 0) {
      write_stderr("cuwarden: pid " + pid + ": no leaks: every tracked allocation was freed.\n");
      return;
    }
    std::string s = "cuwarden: pid " + pid + ": " + std::to_string(n) + (n == 1 ? " allocation" : " allocations") +
                    " never freed, " + format_bytes(b) + " in all, by call site:\n";
    std::vector<uint32_t> named;
    for (std::size_t i = 0; i < sites.size() && i < 20; ++i) named.push_back(sites[i].site);
    const std::vector<std::string> label = labels(named);
    for (std::size_t i = 0; i < sites.size(); ++i) {
      const SiteTotal& t = sites[i];
      if (i == 20) {
        s += "  ... and " + std::to_string(sites.size() - 20) + " more call sites\n";
        break;
      }
      s += "  " + format_bytes(t.bytes) + " in " + std::to_string(t.count) +
           (t.count == 1 ? " allocation: " : " allocations: ") +
           (callsites_on() ? label[i] : std::string("(call sites off: CUWARDEN_CALLSITES=16)")) + "\n";
    }
    write_stderr(s);
  } catch (...) {
  }
}

}  // namespace cuw::core
