// cuwarden daemon view: helpers the snapshot views share (see detail/snapshot.hpp).
#include "views/detail/snapshot.hpp"

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

namespace cuw::daemon::snapshot_detail {

/// Untrusted text for a terminal (cuw/text.hpp): valid UTF-8, C0 and C1 controls as '?'.
std::string printable(std::string_view s) { return cuw::printable(s); }

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

/// "850 ms", "12.3 s", "4 min 05 s", "2 h 03 min".
std::string duration(uint64_t ns) {
  char buf[48];
  const uint64_t ms = ns / 1000000;
  if (ms < 1000) std::snprintf(buf, sizeof buf, "%" PRIu64 " ms", ms);
  else if (ms < 60000) std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(ms) / 1000.0);
  else if (ms < 3600000) std::snprintf(buf, sizeof buf, "%" PRIu64 " min %02" PRIu64 " s", ms / 60000, ms / 1000 % 60);
  else std::snprintf(buf, sizeof buf, "%" PRIu64 " h %02" PRIu64 " min", ms / 3600000, ms / 60000 % 60);
  return buf;
}

/// CLOCK_REALTIME ns as "2026-12-01 23:58:09 UTC".
std::string utc(uint64_t ns) {
  const time_t t = static_cast<time_t>(ns / 1000000000ULL);
  struct tm tm {};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

const char* kind_name(SnapKind k) {
  switch (k) {
    case SnapKind::device: return "device";
    case SnapKind::pooled: return "pooled";
    case SnapKind::handle: return "handle";
    case SnapKind::array: return "array";
    case SnapKind::host: return "host";
  }
  return "unknown";
}

bool is_free_api(uint16_t api) {
  switch (static_cast<ring::Api>(api)) {
    case ring::Api::cuMemFree:
    case ring::Api::cuMemFreeAsync:
    case ring::Api::cuMemRelease:
    case ring::Api::cuArrayDestroy:
    case ring::Api::cuMipmappedArrayDestroy:
    case ring::Api::cuMemFreeHost: return true;
    default: return false;
  }
}

// Every backend but "off" pools (CUWARDEN_POOL's values, options.hpp); an empty field is a
// writer that named none, which ran the driver's calls.
bool pooling(const Snapshot& s) { return !s.pool.empty() && s.pool != "off"; }

std::string_view base_name(std::string_view path) {
  const auto slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

/// One frame as `function (file:line)`; a native frame without a line shows its module and
/// offset instead, which is what a person can feed to addr2line.
std::string frame_text(const SnapFrame& f) {
  std::string fn = f.function.empty() ? "??" : printable(f.function);
  if (!f.file.empty()) return fn + " (" + printable(f.file) + ":" + std::to_string(f.line) + ")";
  if (!f.module.empty()) return fn + " (" + printable(base_name(f.module)) + "+" + hex(f.offset) + ")";
  return fn + " (" + hex(f.pc) + ")";
}

/// cuwarden's own frames and the CUDA libraries' sit innermost in every native stack and
/// say nothing about which code asked: the text views skip them.
bool runtime_frame(const SnapFrame& f) {
  if (f.python) return false;
  const std::string_view m = base_name(f.module);
  return m.rfind("libcuwarden", 0) == 0 || m.rfind("libcuda.", 0) == 0 || m.rfind("libcudart", 0) == 0;
}

/// The frames a person reads first: Python frames (innermost first), then the native ones
/// past the runtime's, at most `max`.
std::vector<const SnapFrame*> frames_to_show(const SnapSite* site, std::size_t max) {
  std::vector<const SnapFrame*> out;
  if (!site) return out;
  for (const SnapFrame& f : site->frames)
    if (f.python && out.size() < max) out.push_back(&f);
  bool skipping = true;
  for (const SnapFrame& f : site->frames) {
    if (f.python) continue;
    if (skipping && runtime_frame(f)) continue;
    skipping = false;
    if (out.size() < max) out.push_back(&f);
  }
  return out;
}

/// Live device memory per call site (host memory is not device memory).
std::map<uint32_t, SiteTotal> site_totals(const Snapshot& s) {
  std::map<uint32_t, SiteTotal> out;
  for (const SnapAlloc& a : s.allocations) {
    if (a.kind == SnapKind::host) continue;
    SiteTotal& t = out[a.site];
    t.bytes += a.bytes;
    t.count += a.count;
  }
  return out;
}

uint64_t sat_sub(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

/// `s` padded with spaces to `w` columns (counting UTF-8 code points, not bytes).
std::string pad(const std::string& s, std::size_t w, bool right) {
  std::size_t cols = 0;
  for (char c : s)
    if ((static_cast<unsigned char>(c) & 0xc0) != 0x80) ++cols;
  if (cols >= w) return s;
  const std::string fill(w - cols, ' ');
  return right ? fill + s : s + fill;
}

/// `s` cut to `w` columns (UTF-8 code points).
std::string fit(const std::string& s, std::size_t w) {
  std::size_t cols = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xc0) == 0x80) continue;
    if (cols++ == w) return s.substr(0, i);
  }
  return s;
}


nlohmann::ordered_json frame_json(const SnapFrame& f, const frames::Rules& rules) {
  return {{"python", f.python},      {"function", pickle::valid_utf8(f.function)},
          {"file", pickle::valid_utf8(f.file)}, {"line", f.line},
          {"module", pickle::valid_utf8(f.module)}, {"offset", f.offset},
          {"pc", f.pc}, {"class", frames::class_name(frame_class(f, rules))},
          {"text", pickle::valid_utf8(frame_text(f))}};
}

const frames::Rules& rules_or_builtin(const frames::Rules* r) { return r ? *r : frames::Rules::builtin(); }

frames::Class frame_class(const SnapFrame& f, const frames::Rules& rules) {
  return f.python ? rules.python(f.file) : rules.native(f.module);
}

frames::Frame present(const SnapFrame& f, const frames::Rules& rules) {
  frames::Frame p;
  p.python = f.python;
  p.cls = frame_class(f, rules);
  p.text = frame_text(f);
  p.where = printable(frames::where_of(f.python, f.python ? f.file : f.module));
  p.function = f.function;
  return p;
}

std::map<uint32_t, frames::Label> site_labels(const std::vector<const SnapSite*>& sites, const frames::Rules& rules) {
  std::vector<std::vector<frames::Frame>> in;
  in.reserve(sites.size());
  for (const SnapSite* s : sites) {
    std::vector<frames::Frame> fs;
    fs.reserve(s->frames.size());
    for (const SnapFrame& f : s->frames) fs.push_back(present(f, rules));
    in.push_back(std::move(fs));
  }
  const std::vector<frames::Label> labels = frames::label_sites(in);
  std::map<uint32_t, frames::Label> out;
  for (std::size_t i = 0; i < sites.size(); ++i) out[sites[i]->id] = labels[i];
  return out;
}

std::string segments_note(const Snapshot& s) {
  // The allocator's own functions: the frames between the tensor's maker and cudaMalloc.
  static constexpr std::string_view kPools[][2] = {
      {"CUDACachingAllocator", "PyTorch's (torch.cuda.memory._snapshot() shows its tensors)"},
      {"BFCAllocator", "XLA's (jax.profiler.save_device_memory_profile shows its buffers)"},
      {"cupy::cuda::memory", "CuPy's"},
      {"cupy/cuda/memory", "CuPy's"},
  };
  const auto through = [](const SnapSite& site, std::string_view needle) {
    for (const SnapFrame& f : site.frames)
      if (f.function.find(needle) != std::string::npos || f.file.find(needle) != std::string::npos ||
          f.module.find(needle) != std::string::npos)
        return true;
    return false;
  };
  // PyTorch's caching allocator asks the driver for whole segments, each a multiple of 2 MiB
  // (its small pool's 2 MiB, its large pool's 20 MiB, a larger request rounded up to 2 MiB).
  // Without it (PYTORCH_NO_CUDA_MEMORY_CACHING=1) the same functions allocate each tensor,
  // of any size: then a site is where the tensor was made, and there is nothing to say.
  const auto pytorch_uncached = [&] {
    std::set<uint32_t> sites;
    for (const SnapSite& site : s.sites)
      if (through(site, kPools[0][0])) sites.insert(site.id);
    for (const SnapAlloc& a : s.allocations)
      if (sites.count(a.site) && a.bytes % (2u << 20) != 0) return true;
    return false;
  };
  for (const SnapSite& site : s.sites)
    for (const auto& [needle, who] : kPools)
      if (through(site, needle)) {
        if (needle == kPools[0][0] && pytorch_uncached()) return {};
        return "The process runs " + std::string(who.substr(0, who.find(' '))) +
               " caching allocator: a call site here is where a segment it sub-allocates was made, not where the "
               "tensors now in it were" +
               (who.find('(') != std::string_view::npos ? " " + std::string(who.substr(who.find('('))) : std::string()) +
               ".";
      }
  return {};
}

std::map<uint32_t, frames::Label> site_labels(const Snapshot& s, const frames::Rules& rules) {
  std::vector<const SnapSite*> v;
  for (const SnapSite& st : s.sites)
    if (st.id != 0) v.push_back(&st);
  return site_labels(v, rules);
}

std::vector<std::string> site_lines(const SnapSite& site, const frames::Label& l, const frames::Rules& rules, bool full) {
  std::vector<std::string> out;
  if (site.frames.empty()) return {"(frames unknown)"};
  out.push_back(l.head);
  if (!full) {
    if (!l.folded_text.empty()) out.push_back("(" + l.folded_text + ")");
    for (const frames::Via& v : l.via)
      out.push_back("< " + v.text +
                    (v.skipped ? "  (+" + std::to_string(v.skipped) + (v.skipped == 1 ? " frame)" : " frames)") : ""));
    return out;
  }
  // Every frame with its class (frames::unfold, as top's unfolded call sites): the frames
  // inner to the head, then the rest outward in calling order (Python frames where the
  // evaluator ran them); the frames that tell the site apart are marked "<".
  std::vector<frames::Frame> fs;
  fs.reserve(site.frames.size());
  for (const SnapFrame& f : site.frames) fs.push_back(present(f, rules));
  bool outward = false;
  for (const frames::Unfolded& u : frames::unfold(fs, l)) {
    using Role = frames::Unfolded::Role;
    if (u.role == Role::head) continue;
    if (u.role != Role::inner && !outward) {
      out.push_back("all frames outward:");
      outward = true;
    }
    out.push_back((u.role == Role::via ? "< " : "  ") + fs[u.frame].text + "  [" + frames::class_name(fs[u.frame].cls) +
                  "]");
  }
  return out;
}

}  // namespace cuw::daemon::snapshot_detail
