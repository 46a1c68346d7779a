// cuwarden CLI: `cuwarden top` without a terminal. Rows come from the daemon's state (the
// document `cuwarden --json` prints); each row's used bytes over the last refreshes are kept
// here, in the client, started from the daemon's history (get_history); frames are lines of
// styled spans that the curses loop (top.cpp) draws and `--once` prints as plain text.
// Nothing here does I/O, so the unit tests drive it with hand-made states.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "table.hpp"

namespace cuw::cli::top {

/// How a span is drawn on a terminal; plain text ignores it.
enum class Style { normal, title, header, selected, dim, bar_used, bar_high, bar_cap, warn };

struct Span {
  std::string text;  ///< UTF-8, printable (text from processes has passed through printable())
  Style style = Style::normal;
};

/// One line of a frame.
struct Line {
  std::vector<Span> spans;
  /// The spans' text joined, with trailing spaces dropped.
  std::string plain() const;
};

/// `s` with control characters (C0, DEL, C1) and invalid UTF-8 replaced by '?'
/// (cuw::printable): process names, command lines, job names and call-site frames come from
/// other programs and must not drive the terminal.
std::string printable(std::string_view s);

/// "1 site", "3 sites": `n` and `one` or `many`.
std::string plural(uint64_t n, const char* one, const char* many);

/// Terminal columns of `s`: one per code point (everything top prints is one column wide).
std::size_t columns(std::string_view s);

/// `line` cut to `width` columns (spans past it dropped, the last one shortened).
Line clip(const Line& line, std::size_t width);

enum class SortKey { used, peak, cap, name, pid };
inline constexpr SortKey kSortKeys[] = {SortKey::used, SortKey::peak, SortKey::cap, SortKey::name, SortKey::pid};

/// The key's name as the sort line says it ("used").
std::string_view sort_name(SortKey k);
/// The key after `k` in kSortKeys, wrapping (the `s` key).
SortKey next_sort(SortKey k);
/// "largest first", "A to Z", ...: which way a key sorts, reversed or not.
std::string_view sort_order(SortKey k, bool reversed);

/// One process on one GPU, as a row of the status table (a process that has not used a GPU
/// yet has one row without one).
struct ProcRow {
  /// pid, start and GPU UUID: the same across refreshes, and new when a pid is reused.
  std::string key;
  uint64_t pid = 0;
  std::optional<uint64_t> gpu;  ///< the GPU's index as `cuwarden` numbers it
  std::string user, name, job, state;
  uint64_t used = 0, peak = 0;
  std::optional<uint64_t> cap;  ///< bytes; none: no cap
  bool job_cap = false;         ///< `cap` is the job's (the process has none of its own)
  nlohmann::ordered_json process;  ///< the process's entry of the state, for the detail view
  nlohmann::ordered_json device;   ///< its device entry (null without one)
};

/// One GPU: what the processes on it use, its memory, and the caps of those processes.
struct GpuRow {
  uint64_t index = 0;
  std::string name;
  uint64_t used = 0, total = 0;
  uint64_t caps = 0;       ///< the caps of the running processes on it, added up, in bytes
  unsigned capped = 0;     ///< running processes on it with a cap
  unsigned processes = 0;  ///< running processes on it
};

/// The rows of state `st`, in the daemon's order.
std::vector<ProcRow> process_rows(const nlohmann::ordered_json& st);
/// The GPUs of state `st`, with their processes' caps added up.
std::vector<GpuRow> gpu_rows(const nlohmann::ordered_json& st);

/// Sorts by `key`: bytes largest first, names A to Z, pids smallest first; `reversed` turns
/// that round. Rows without a cap follow those with one either way (sorting by cap is for
/// finding the capped ones). Ties go by pid, then GPU.
void sort_rows(std::vector<ProcRow>& rows, SortKey key, bool reversed);

/// Used bytes per row, one sample per refresh, newest last, at most kSamples each.
class History {
 public:
  static constexpr std::size_t kSamples = 60;
  /// One sample for each row; rows no longer in `rows` are forgotten.
  void record(const std::vector<ProcRow>& rows);
  /// The samples of row `key`, oldest first (empty when unknown).
  const std::deque<uint64_t>& samples(const std::string& key) const;
  /// Rows of `rows` with no samples yet besides the one record() took: those seed() may fill.
  std::vector<std::string> unseeded(const std::vector<ProcRow>& rows) const;
  /// Fill those rows' samples from the daemon's history (`get_history`, range hour: points
  /// in unix seconds, kept only when a value changed): one sample per `interval_s` up to
  /// `now_s`, the newest kSamples, before the sample record() took.
  void seed(const std::vector<ProcRow>& rows, const nlohmann::ordered_json& history, double interval_s);

 private:
  std::map<std::string, std::deque<uint64_t>> samples_;
};

/// The newest `width` samples as a sparkline, right-aligned (spaces where there is no sample
/// yet): ▁ for 0, ▂ to █ up to the largest sample shown; `_.,-=+*#` with `utf8` false.
std::string sparkline(const std::deque<uint64_t>& samples, std::size_t width, bool utf8);

/// A GPU's bar, `width` columns between brackets: used bytes filled (█, or #), the rest ░ (or
/// .), and where the caps of its processes add up to, a │ (or |) when that is within the total.
std::vector<Span> gpu_bar(const GpuRow& g, std::size_t width, bool utf8);

/// What a frame shows besides the state.
struct ViewOptions {
  SortKey sort = SortKey::used;
  bool reversed = false;
  bool utf8 = true;
  bool interactive = true;  ///< the selection and the key help are shown (false: --once)
  double interval_s = 1;    ///< the refresh interval, which the sparkline's title states
  std::string selected;     ///< key of the selected row
  std::string status;       ///< a warning for the title line ("no daemon ..."); empty: none
  bool unfold = false;      ///< the detail view lists every frame of a call site (the `f` key)
};

/// The list view: a title line, one bar per GPU, the process rows (sorted as `rows` are,
/// scrolled so that the selected one shows), and with `interactive` each row's sparkline and
/// the key help at the bottom. `width` 0: lines are not cut; `height` 0: every row is shown. `*first` is the
/// first row shown: kept between frames so that the list scrolls only when it must.
std::vector<Line> list_frame(const nlohmann::ordered_json& st, const std::vector<ProcRow>& rows,
                             const History& history, const ViewOptions& view, std::size_t width, std::size_t height,
                             std::size_t* first);

/// What the detail view has asked the daemon about one process.
struct Detail {
  uint64_t pid = 0;
  std::string start;  ///< the process's created_ns, to tell it from a later process of the same pid
  std::optional<nlohmann::ordered_json> events;    ///< get_events' reply
  std::string events_error;                        ///< why there is none
  std::optional<nlohmann::ordered_json> snapshot;  ///< get_snapshot's JSON body
  std::string snapshot_error;                      ///< why there is none (a refusal, ...)
};

/// The top call sites of a snapshot (get_snapshot's JSON), largest live bytes first, at most
/// `n`, one line of text each: bytes, allocations and the site's label (cuw/frames.hpp: "fn
/// (file.cpp:12) < caller (model.cpp:40) (+11)"), or one line saying why there are none.
/// `width` (0: none): a longer line has its head cut, keeping the frames that tell it apart.
/// With `unfold`, a site's line has its head, and every other frame follows on a line of its
/// own with its class, in the order `cuwarden snapshot --full` lists them (frames::unfold):
/// the frames inner to the head, an "outward:" line where there are any, then its callers,
/// "<" marking those that tell it apart; a longer line has its paths cut to base names, then
/// its end cut. `room` (0: none): the most lines; frames are cut from the outer end of the
/// site with the most lines until they fit, never one that tells a site apart, each run of
/// cut frames shown as one line "(+N frames)".
std::vector<std::string> top_sites(const nlohmann::ordered_json& snapshot, std::size_t n, std::size_t width = 0,
                                   bool unfold = false, std::size_t room = 0);

/// The detail view of process `d.pid`: its GPUs' counters and sparklines (rows of it in
/// `rows`), its top call sites (with `view.unfold` every frame of each, as many as leave a
/// few events in `height`), and its last events, newest at the bottom, as many as fit.
std::vector<Line> detail_frame(const nlohmann::ordered_json& st, const std::vector<ProcRow>& rows,
                               const History& history, const Detail& d, const ViewOptions& view, std::size_t width,
                               std::size_t height);

}  // namespace cuw::cli::top
