// cuwarden daemon view: a process's memory at one instant (model/snapshot.hpp) in each form
// `cuwarden snapshot`, `cuwarden summary` and `cuwarden snapshot --leaks` write: a report for
// people, JSON, PyTorch's snapshot pickle (pytorch.org/memory_viz and
// `python -m torch.cuda._memory_viz stats|trace|segments|memory`), a Chrome trace that
// Perfetto's UI opens, a table in the shape of torch.cuda.memory_summary(), and the call
// sites whose live bytes only grew across snapshots. Each form is a file of its own
// (snapshot_text.cpp, snapshot_json.cpp, ...; README.md names them).
//
// Every function here is pure: it reads its arguments only, so any thread may call it. Text
// that came from the process (names, paths, frames) is untrusted: the text views replace
// control characters (a terminal escape in a function name must not reach the terminal) and
// every view replaces invalid UTF-8.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cuw/frames.hpp"
#include "model/snapshot.hpp"

namespace cuw::daemon {

/// What the text reports list.
struct TextOptions {
  std::size_t top = 10;  ///< call sites and live allocations listed, largest first
  /// Every frame of each call site listed (with its class), not only the printed form.
  bool full = false;
  /// The frame classes (cuw/frames.hpp): the daemon's with the site's own rules; null: the
  /// built-in ones. Not owned.
  const frames::Rules* rules = nullptr;
};

/// The report for people: a header (pid, command, pool, whether the live records are exact,
/// events dropped, call sites on or off), one row per device (used, reserved, peak, cap,
/// cached), the call sites holding the most live bytes (bytes, count, and the site's printed
/// form, cuw/frames.hpp: its innermost user frame as `function (file:line)`, a Python one
/// first; the frames inner to it folded into one line; the frames that tell it from other
/// sites with the same head; with opts.full every frame and its class), then the
/// largest live allocations (address, size, device, stream, age at snapshot time, call site).
/// Pinned host memory is listed apart: it is not device memory.
std::string snapshot_text(const Snapshot& s, const TextOptions& opts = {});

/// Everything in the snapshot, as JSON. Keys (stable; new keys may be added, none renamed):
///   pid, process_name, comm, cmdline, user, job, pool ("off" | "cache" | "vmm"), time_ns,
///   exited, exact, events_dropped, callsite_frames,
///   devices: [{ordinal, uuid, name, memory_total_bytes, <every counter of counters.hpp by its
///     json key: used_bytes, peak_bytes, limit_bytes (null: no cap), ...>, live_bytes,
///     live_allocations}],   live_*: the device's live records (host memory excluded)
///   host: {bytes, allocations}   pinned host memory (not device memory, never capped)
///   allocations: [{address, bytes, device, stream, time_ns, age_ns, site, api, kind}]
///     by address; kind "device" | "pooled" | "handle" | "array" | "host"; api by name
///   segments: [{address, bytes, device}]   driver memory a pool holds, by address
///   sites: [{id, live_bytes, live_allocations, label, label_head, label_folded, label_via,
///     head_frame, calling_order, frames: [{python, function, file, line, module, offset, pc,
///     class, text}]}]   by id; frames innermost first (native, then Python), text: as the
///     text report prints the frame; label: the printed
///     form on one line (cuw/frames.hpp Label::one_line), label_head: its head,
///     label_folded: "8 frames in ..." ("" when none), label_via: [{frame, skipped, text}]
///     the frames that tell it apart (Label::via: index in frames, frames skipped before it),
///     head_frame: the index in frames of the label's head (-1: none), calling_order: the
///     indices of frames in calling order, innermost first (frames::calling_order); class:
///     "user" | "framework" | "cuda" | "interpreter" | "libc" | "cuwarden"
///   segments_note: where a framework's caching allocator runs, that its sites are where its
///     segments were made, not the tensors in them, and what shows tensors; "" otherwise
///   trace: [{time_ns, kind, api, device, address, bytes, used_after, stream, aux, site, result}]
///     oldest first; kind and api by name (ring.hpp kind_name / api_name)
/// Numbers are bytes, counts or CLOCK_REALTIME nanoseconds.
nlohmann::ordered_json snapshot_json(const Snapshot& s, const frames::Rules* rules = nullptr);

/// The bytes of a pickle (protocol 4) in the format of torch.cuda.memory._snapshot():
/// {"segments": [...], "device_traces": [[...] per device ordinal], "allocator_settings": {...},
/// "external_annotations": []}.
///
/// Segments: a pool's driver memory (Snapshot::segments; address-contiguous ones a live block
/// crosses are joined), each tiled exactly, in address order, by its live pooled blocks
/// ("active_allocated", size as the pool rounds the request where that can be told, never
/// past the next block) and "inactive" blocks for the gaps; every other live device
/// allocation (passthrough, cuMemCreate handles, arrays) is a segment of its own with one
/// block. Host memory is left out (allocator_settings counts it). `device` is an int.
///
/// device_traces from Snapshot::trace: alloc -> "alloc", free -> "free_requested" +
/// "free_completed", a pool's segment events -> "segment_alloc" / "segment_free"; an
/// allocation that is its own segment is also a "segment_alloc" before its alloc and a
/// "segment_free" after its free; a refusal (cap or job cap) or the driver's out-of-memory
/// error -> "oom" with device_free (what the cap left; 0 where that cannot be told). Entries
/// the record cannot support (events lost: a free whose memory no segment holds, a segment
/// released while a live block lies in it) are left out and counted in allocator_settings,
/// so that memory_viz's state history, which replays the trace backwards from the segments,
/// never meets a block outside every segment. Frames: {filename, line, name}, innermost
/// first, as PyTorch orders them.
std::string snapshot_pytorch(const Snapshot& s);

/// Chrome trace-event JSON for ui.perfetto.dev: counter tracks ("GPU N used", "GPU N
/// reserved", "GPU N cap", one arg "bytes") at every event of the history and at snapshot
/// time, instant events (process scope) for refusals and cap changes, process and thread
/// names; ts in microseconds since the Unix epoch; displayTimeUnit "ms".
std::string snapshot_perfetto(const Snapshot& s);

/// Call sites grouped by what the user sees: sites whose user frames (cuw/frames.hpp's class
/// user, by their printed text, in calling order) are equal become one, the one with the
/// smallest id, which their allocations and events then name (so every view adds their
/// counts and bytes). A site without user frames is grouped by the name the presenter gives it
/// (an operator's, "(backward) MmBackward0"); one without frames with none. Call it once the
/// frames are named. Returns each merged id and the id it went into; `snapshot --by native`
/// keeps the sites apart by skipping this.
std::map<uint32_t, uint32_t> merge_sites_by_user_frames(Snapshot& s, const frames::Rules* rules = nullptr);

/// Renames sites as merge_sites_by_user_frames returned (`to`: id -> id it went into) in
/// another snapshot of the same process (a sample, whose frames may not be named): its
/// allocations and events name the new ids, the merged sites are dropped.
void remap_sites(Snapshot& s, const std::map<uint32_t, uint32_t>& to);

/// Live device memory as folded stacks, the input of flamegraph.pl, inferno and speedscope: one
/// line per call site, `frame;frame;...;frame BYTES`, the outermost frame first (calling
/// order, cuw/frames.hpp calling_order), each frame as the text report names it with ';'
/// and control characters replaced; sites whose frames print the same are one line (bytes
/// added). Allocations with no call site are one frame, "(no call site)". Host memory is
/// left out. Sorted by stack text.
std::string snapshot_folded(const Snapshot& s, const frames::Rules* rules = nullptr);

/// torch.cuda.memory_summary()'s table for each device of the process, filled from what a
/// snapshot has (its counters and live records; large/small split at 1 MiB); "-" marks what
/// cuwarden cannot know (and the notes under the tables say why).
std::string summary_text(const Snapshot& s);

/// A call site whose live device bytes differ between two samples of one process.
struct SiteChange {
  uint32_t site = 0;                          ///< 0: the allocations with no call site
  SnapSite frames;                            ///< as the newer sample names it (else the older)
  uint64_t before = 0, after = 0;             ///< live bytes
  uint64_t count_before = 0, count_after = 0; ///< live allocations
};

/// The call sites whose live bytes differ between `then` and `now` (two samples of one
/// process), largest change first. Throws std::invalid_argument for different processes.
std::vector<SiteChange> changed_sites(const Snapshot& then, const Snapshot& now);

/// changed_sites() as JSON: {pid, from_ns, to_ns, sites: [{site, label, before_bytes,
/// after_bytes, before_count, after_count, frames}]} (label and frames as snapshot_json's).
nlohmann::ordered_json since_json(const Snapshot& then, const Snapshot& now, const frames::Rules* rules = nullptr);

/// changed_sites() for people (`cuwarden snapshot PID --since 10m`): the window, then each
/// site's change (+/- bytes, before -> after) and its printed form (opts.top sites). Says
/// so when a sample's live records could not be read.
std::string since_text(const Snapshot& then, const Snapshot& now, const TextOptions& opts = {});

/// What makes a call site a leak suspect.
struct LeakOptions {
  /// Snapshots taken before the process's first allocation (the oldest live record or event
  /// the snapshots hold) plus this are left out: a model's weights and a framework's first
  /// caches are made then and held, which is not a leak.
  uint64_t warmup_ns = 60'000'000'000ULL;
  std::size_t window = 3;               ///< the last snapshots (after the warm-up) looked at
  uint64_t min_growth = 1ULL << 20;     ///< bytes a site must grow by over them, at least ...
  double min_share = 0.01;              ///< ... and this share of its live bytes at the last
};

/// A call site whose live bytes grew over the last opts.window snapshots after the warm-up,
/// never falling between two of them, by at least max(min_growth, min_share of its bytes).
/// Site 0 gathers the allocations with no call site.
struct LeakSuspect {
  uint32_t site = 0;
  SnapSite frames;                ///< the site as the newest snapshot names it
  std::vector<uint64_t> bytes;    ///< live bytes at each snapshot of the window, oldest first
  uint64_t first_count = 0, last_count = 0;  ///< live allocations at the first and last
  uint64_t growth() const noexcept { return bytes.empty() ? 0 : bytes.back() - bytes.front(); }
};

/// The leak suspects of `snaps` (snapshots of one process, any order: sorted by time here;
/// those whose live records are not exact are skipped, and those of the warm-up), largest
/// growth first. Empty with fewer than opts.window usable snapshots. Throws
/// std::invalid_argument when the snapshots are of different processes.
std::vector<LeakSuspect> growing_sites(const std::vector<Snapshot>& snaps, const LeakOptions& opts = {});

/// growing_sites() as JSON: {pid, snapshots, first_ns, last_ns, skipped, sites: [{site,
/// growth_bytes, bytes: [...], first_count, last_count, label, frames: [...]}]} (frames and
/// label as snapshot_json writes them).
/// Also: warmup_ns, window, warming (snapshots left out as the warm-up's).
nlohmann::ordered_json leaks_json(const std::vector<Snapshot>& snaps, const frames::Rules* rules = nullptr,
                                  const LeakOptions& opts = {});

/// growing_sites() for people: the window, then each suspect's growth, its live bytes over
/// time and its printed form (opts.top sites; every frame with opts.full).
std::string leaks_text(const std::vector<Snapshot>& snaps, const TextOptions& opts = {}, const LeakOptions& leak = {});

}  // namespace cuw::daemon
