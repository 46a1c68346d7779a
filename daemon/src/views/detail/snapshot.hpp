// cuwarden daemon view, private: what the snapshot views (snapshot_views.hpp), one file per
// format (snapshot_text, snapshot_json, snapshot_pytorch, snapshot_perfetto, snapshot_summary,
// snapshot_leaks), share: text helpers (snapshot_detail.cpp) and PyTorch's model of the
// memory (torch_model.cpp), which the pickle and the summary read. For those files only. Pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuw/frames.hpp"
#include "model/snapshot.hpp"

namespace cuw::daemon::snapshot_detail {

inline constexpr uint64_t kMiB = 1ULL << 20;
/// PyTorch's split between its small and large pools (memory_stats: "size >= 1MB"; its
/// _snapshot docstring: segment_type 'large' (>1MB)); cuwarden's cache splits the same way.
inline constexpr uint64_t kSmallMax = kMiB;
inline constexpr uint32_t kCudaErrorOutOfMemory = 2;  // CUDA_ERROR_OUT_OF_MEMORY

// ---- text helpers ---------------------------------------------------------------------------

/// Untrusted text for a terminal (cuw/text.hpp): valid UTF-8, C0 and C1 controls as '?'.
std::string printable(std::string_view s);
/// "0x" and lower-case hex digits.
std::string hex(uint64_t v);
/// "850 ms", "12.3 s", "4 min 05 s", "2 h 03 min".
std::string duration(uint64_t ns);
/// CLOCK_REALTIME ns as "2026-12-01 23:58:09 UTC".
std::string utc(uint64_t ns);
/// "device", "pooled", "handle", "array" or "host".
const char* kind_name(SnapKind k);
/// Whether ring API number `api` gives memory back.
bool is_free_api(uint16_t api);
/// Whether the process ran a pool: any backend but "off" (an empty name is "off").
bool pooling(const Snapshot& s);
/// What follows the last '/' of `path`.
std::string_view base_name(std::string_view path);
/// One frame as `function (file:line)`; a native frame without a line shows its module and
/// offset instead, which is what a person can feed to addr2line.
std::string frame_text(const SnapFrame& f);
/// cuwarden's own frames and the CUDA libraries' sit innermost in every native stack and
/// say nothing about which code asked: the text views skip them.
bool runtime_frame(const SnapFrame& f);
/// The frames a person reads first: Python frames (innermost first), then the native ones
/// past the runtime's, at most `max`.
std::vector<const SnapFrame*> frames_to_show(const SnapSite* site, std::size_t max);

/// One frame as the JSON views write it: {python, function, file, line, module, offset, pc,
/// class}, text made valid UTF-8; class by `rules` (cuw/frames.hpp).
nlohmann::ordered_json frame_json(const SnapFrame& f, const frames::Rules& rules);

// ---- the call-site presenter (cuw/frames.hpp) -----------------------------------------------

/// `r`, or the built-in rules when null.
const frames::Rules& rules_or_builtin(const frames::Rules* r);
/// A frame's class by `rules`.
frames::Class frame_class(const SnapFrame& f, const frames::Rules& rules);
/// A snapshot frame as the presenter reads it (text as frame_text, made printable).
frames::Frame present(const SnapFrame& f, const frames::Rules& rules);
/// The printed form of each of `sites` (told apart among them), by site id. Site 0 is not
/// in `sites`' ids: its callers say "(no call site captured)".
std::map<uint32_t, frames::Label> site_labels(const std::vector<const SnapSite*>& sites, const frames::Rules& rules);
/// Where the process runs a framework's caching allocator (a frame of PyTorch's
/// CUDACachingAllocator, XLA's BFC allocator or CuPy's memory pool in a site's stack), the
/// sentence saying that a call site is where a segment was made, not the tensors now in it,
/// and what shows tensors; empty otherwise.
std::string segments_note(const Snapshot& s);
/// Every site of `s`, labelled among them all.
std::map<uint32_t, frames::Label> site_labels(const Snapshot& s, const frames::Rules& rules);
/// A site's lines for the text views, without indentation: the head, the folded frames as
/// one line in parentheses, and each frame that tells it apart ("< FRAME  (+N frames)");
/// with `full`, every frame instead of the fold line, each with its class.
std::vector<std::string> site_lines(const SnapSite& site, const frames::Label& l, const frames::Rules& rules, bool full);

/// Live device memory per call site (host memory is not device memory).
struct SiteTotal {
  uint64_t bytes = 0, count = 0;
};
std::map<uint32_t, SiteTotal> site_totals(const Snapshot& s);

/// a - b, 0 when b is larger.
uint64_t sat_sub(uint64_t a, uint64_t b);
/// `s` padded with spaces to `w` columns (counting UTF-8 code points, not bytes).
std::string pad(const std::string& s, std::size_t w, bool right = false);
/// `s` cut to `w` columns (UTF-8 code points).
std::string fit(const std::string& s, std::size_t w);

// ---- PyTorch's model (torch_model.cpp) ------------------------------------------------------

struct TBlock {
  uint64_t address = 0, size = 0, requested = 0;
  bool active = false;
  uint32_t site = 0;
};

struct TSegment {
  int device = 0;
  uint64_t address = 0, size = 0, stream = 0;
  bool pool = false;    ///< a pool's driver memory (else one allocation's own)
  bool large = true;
  uint32_t site = 0;    ///< own segments: the allocation's call site
  std::vector<TBlock> blocks;
  uint64_t allocated() const {
    uint64_t n = 0;
    for (const TBlock& b : blocks) n += b.active ? b.size : 0;
    return n;
  }
  uint64_t requested() const {
    uint64_t n = 0;
    for (const TBlock& b : blocks) n += b.active ? b.requested : 0;
    return n;
  }
};

/// Live device allocations laid out as PyTorch's segments and blocks (snapshot_pytorch's
/// contract). `unplaced`: live device allocations left out (no device ordinal, or overlapping

enum class Action : uint8_t { alloc, free_requested, free_completed, segment_alloc, segment_free, oom };
/// The action's name in a PyTorch device trace.
const char* action_name(Action a);

struct TEntry {
  Action action = Action::alloc;
  uint64_t addr = 0, size = 0, stream = 0, time_ns = 0, device_free = 0;
  uint32_t site = 0;
};

/// A snapshot as PyTorch's segments, blocks and device traces (snapshot_pytorch's contract).
struct TorchModel {
  std::vector<TSegment> segments;
  std::vector<std::vector<TEntry>> traces;  ///< by device ordinal
  uint64_t unplaced = 0, left_out = 0;
};
TorchModel torch_model(const Snapshot& s);

}  // namespace cuw::daemon::snapshot_detail
