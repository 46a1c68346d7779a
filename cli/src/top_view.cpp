// cuwarden CLI: `cuwarden top`'s rows, history, sparklines, bars and frames (see top_view.hpp).
#include "top_view.hpp"

#include <algorithm>
#include <fmt/format.h>
#include <tuple>
#include <utility>

#include "cuw/size.hpp"
#include "cuw/text.hpp"
#include "events.hpp"
#include "fields.hpp"
#include "json_access.hpp"

namespace cuw::cli::top {

using json = nlohmann::ordered_json;

std::string Line::plain() const {
  std::string s;
  for (const Span& sp : spans) s += sp.text;
  s.erase(s.find_last_not_of(' ') + 1);
  return s;
}

std::string printable(std::string_view s) { return cuw::printable(s); }

std::size_t columns(std::string_view s) {
  std::size_t n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

namespace {

/// The first `width` columns of `s`, never splitting a UTF-8 sequence.
std::string take_columns(const std::string& s, std::size_t width) {
  std::size_t n = 0, i = 0;
  for (; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xc0) != 0x80) {
      if (n == width) break;
      ++n;
    }
  }
  return s.substr(0, i);
}

/// `s` padded with spaces to `width` columns (longer text is kept).
std::string pad(std::string s, std::size_t width) {
  const std::size_t w = columns(s);
  if (w < width) s.append(width - w, ' ');
  return s;
}

/// A Line of one span.
Line line(std::string text, Style style = Style::normal) { return Line{{Span{std::move(text), style}}}; }

/// `l` padded to `width` columns with its last span's style (a highlighted row spans the screen).
Line fill(Line l, std::size_t width) {
  std::size_t w = 0;
  for (const Span& s : l.spans) w += columns(s.text);
  if (w < width && !l.spans.empty()) l.spans.back().text.append(width - w, ' ');
  return l;
}

}  // namespace

std::string plural(uint64_t n, const char* one, const char* many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

Line clip(const Line& l, std::size_t width) {
  Line out;
  std::size_t used = 0;
  for (const Span& s : l.spans) {
    if (used >= width) break;
    const std::size_t w = columns(s.text);
    if (used + w <= width) {
      out.spans.push_back(s);
      used += w;
    } else {
      out.spans.push_back({take_columns(s.text, width - used), s.style});
      used = width;
    }
  }
  return out;
}

std::string_view sort_name(SortKey k) {
  switch (k) {
    case SortKey::used: return "used";
    case SortKey::peak: return "peak";
    case SortKey::cap: return "cap";
    case SortKey::name: return "name";
    case SortKey::pid: return "pid";
  }
  return "";
}

SortKey next_sort(SortKey k) {
  const std::size_t n = std::size(kSortKeys);
  for (std::size_t i = 0; i < n; ++i)
    if (kSortKeys[i] == k) return kSortKeys[(i + 1) % n];
  return SortKey::used;
}

std::string_view sort_order(SortKey k, bool reversed) {
  switch (k) {
    case SortKey::name: return reversed ? "Z to A" : "A to Z";
    case SortKey::pid: return reversed ? "largest first" : "smallest first";
    default: return reversed ? "smallest first" : "largest first";
  }
}

std::vector<ProcRow> process_rows(const json& st) {
  using counters::Id;
  std::vector<ProcRow> rows;
  // A job member without a cap of its own is held by its job's, per GPU: that one is its cap.
  std::map<uint64_t, uint64_t> job_cap;
  for (const json& job : jarr(st, "jobs"))
    if (job.contains("limit_bytes") && job["limit_bytes"].is_number_unsigned())
      for (const json& m : jarr(job, "members")) job_cap[jnum(m, "pid")] = job["limit_bytes"].get<uint64_t>();
  for (const json& p : jarr(st, "processes")) {
    ProcRow base;
    base.pid = jnum(p, "pid");
    base.user = printable(jstr(p, "user"));
    base.name = printable(jstr(p, "process_name"));
    base.job = printable(jstr(p, "job"));
    base.state = printable(jstr(p, "state"));
    base.process = p;
    const std::string start = std::to_string(jnum(p, "created_ns"));
    const json& devs = jarr(p, "devices");
    if (devs.empty()) {
      base.key = fmt::format("{}:{}:", base.pid, start);
      rows.push_back(std::move(base));
      continue;
    }
    for (const json& d : devs) {
      ProcRow r = base;
      r.key = fmt::format("{}:{}:{}", r.pid, start, jstr(d, "uuid"));
      if (d.contains("gpu_index") && d["gpu_index"].is_number_unsigned()) r.gpu = d["gpu_index"].get<uint64_t>();
      r.used = jnum(d, json_key(Id::used));
      r.peak = jnum(d, json_key(Id::peak));
      auto cap = d.find(json_key(Id::limit));
      if (cap != d.end() && cap->is_number_unsigned()) r.cap = cap->get<uint64_t>();
      else if (auto j = job_cap.find(r.pid); j != job_cap.end()) r.cap = j->second, r.job_cap = true;
      r.device = d;
      rows.push_back(std::move(r));
    }
  }
  return rows;
}

std::vector<GpuRow> gpu_rows(const json& st) {
  using counters::Id;
  std::vector<GpuRow> out;
  for (const json& g : jarr(st, "gpus")) {
    GpuRow r;
    r.index = jnum(g, "index");
    r.name = printable(jstr(g, "name"));
    r.used = jnum(g, "used_bytes");
    r.total = jnum(g, "memory_total_bytes");
    const std::string uuid = jstr(g, "uuid");
    for (const json& p : jarr(st, "processes")) {
      if (jstr(p, "state") != "running") continue;
      for (const json& d : jarr(p, "devices")) {
        if (jstr(d, "uuid") != uuid) continue;
        ++r.processes;
        auto cap = d.find(json_key(Id::limit));
        if (cap != d.end() && cap->is_number_unsigned()) {
          r.caps += cap->get<uint64_t>();
          ++r.capped;
        }
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

void sort_rows(std::vector<ProcRow>& rows, SortKey key, bool reversed) {
  const auto tie = [](const ProcRow& a, const ProcRow& b) {
    return std::tuple(a.pid, a.gpu.value_or(~0ULL)) < std::tuple(b.pid, b.gpu.value_or(~0ULL));
  };
  std::stable_sort(rows.begin(), rows.end(), [&](const ProcRow& a, const ProcRow& b) {
    if (key == SortKey::cap && a.cap.has_value() != b.cap.has_value()) return a.cap.has_value();
    // "before": a comes before b in the key's own order; reversed swaps the two.
    int order = 0;  // <0: a first, >0: b first
    switch (key) {
      case SortKey::used: order = a.used > b.used ? -1 : a.used < b.used ? 1 : 0; break;
      case SortKey::peak: order = a.peak > b.peak ? -1 : a.peak < b.peak ? 1 : 0; break;
      case SortKey::cap: {
        const uint64_t x = a.cap.value_or(0), y = b.cap.value_or(0);
        order = x > y ? -1 : x < y ? 1 : 0;
        break;
      }
      case SortKey::name: order = a.name.compare(b.name); break;
      case SortKey::pid: order = a.pid < b.pid ? -1 : a.pid > b.pid ? 1 : 0; break;
    }
    if (order != 0) return reversed ? order > 0 : order < 0;
    return tie(a, b);
  });
}

void History::record(const std::vector<ProcRow>& rows) {
  std::map<std::string, std::deque<uint64_t>> next;
  for (const ProcRow& r : rows) {
    auto it = samples_.find(r.key);
    std::deque<uint64_t> s = it != samples_.end() ? std::move(it->second) : std::deque<uint64_t>();
    s.push_back(r.used);
    while (s.size() > kSamples) s.pop_front();
    next[r.key] = std::move(s);
  }
  samples_ = std::move(next);
}

std::vector<std::string> History::unseeded(const std::vector<ProcRow>& rows) const {
  std::vector<std::string> out;
  for (const ProcRow& r : rows) {
    auto it = samples_.find(r.key);
    if (it != samples_.end() && it->second.size() == 1 && !r.device.is_null()) out.push_back(r.key);
  }
  return out;
}

void History::seed(const std::vector<ProcRow>& rows, const json& history, double interval_s) {
  const double step = interval_s > 0 ? interval_s : 1;
  const double now_s = static_cast<double>(jnum(history, "time_ns")) / 1e9;
  for (const ProcRow& r : rows) {
    auto it = samples_.find(r.key);
    if (it == samples_.end() || it->second.size() != 1 || r.device.is_null()) continue;
    for (const json& p : jarr(history, "processes")) {
      if (jnum(p, "pid") != r.pid || jnum(p, "start_time") != jnum(r.process, "start_time")) continue;
      for (const json& d : jarr(p, "devices")) {
        if (jstr(d, "uuid") != jstr(r.device, "uuid")) continue;
        const json& t = jarr(d, "t");
        const json& used = jarr(d, "used_bytes");
        if (t.empty() || t.size() != used.size()) continue;
        // The value at each earlier refresh: that of the last point at or before it (the
        // daemon keeps a point only when a value changes).
        std::deque<uint64_t> s;
        for (std::size_t k = kSamples - 1; k >= 1; --k) {
          const double when = now_s - static_cast<double>(k) * step;
          std::size_t i = 0;
          while (i < t.size() && t[i].is_number() && t[i].get<double>() <= when) ++i;
          if (i == 0) continue;  // before the process's first point
          s.push_back(used[i - 1].is_number_unsigned() ? used[i - 1].get<uint64_t>() : 0);
        }
        s.push_back(it->second.back());
        it->second = std::move(s);
      }
    }
  }
}

const std::deque<uint64_t>& History::samples(const std::string& key) const {
  static const std::deque<uint64_t> none;
  auto it = samples_.find(key);
  return it != samples_.end() ? it->second : none;
}

std::string sparkline(const std::deque<uint64_t>& samples, std::size_t width, bool utf8) {
  static constexpr const char* kBlocks[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  static constexpr char kAscii[] = "_.,-=+*#";
  const std::size_t n = std::min(width, samples.size());
  const auto first = samples.end() - static_cast<std::ptrdiff_t>(n);
  uint64_t top = 0;
  for (auto it = first; it != samples.end(); ++it) top = std::max(top, *it);
  std::string s(width - n, ' ');
  for (auto it = first; it != samples.end(); ++it) {
    // 0 is the lowest block; anything above it one of the other seven, the largest the full one.
    // (7v - 1) / top < 7 for v <= top, so the levels above 0 are 1..7.
    const std::size_t l =
        *it == 0 ? 0 : 1 + static_cast<std::size_t>((static_cast<long double>(*it) * 7 - 1) / static_cast<long double>(top));
    if (utf8) s += kBlocks[l];
    else s += kAscii[l];
  }
  return s;
}

std::vector<Span> gpu_bar(const GpuRow& g, std::size_t width, bool utf8) {
  const auto at = [&](uint64_t bytes) {
    if (g.total == 0) return std::size_t{0};
    return static_cast<std::size_t>(std::min<long double>(width, static_cast<long double>(bytes) * width / g.total));
  };
  std::size_t used = at(g.used);
  if (g.used > 0 && used == 0) used = 1;  // something is used: show it
  const bool high = g.total && static_cast<long double>(g.used) >= 0.9L * g.total;
  std::optional<std::size_t> cap;
  if (g.capped && g.caps <= g.total) cap = std::min(at(g.caps), width ? width - 1 : 0);
  std::vector<Span> spans = {{"[", Style::normal}};
  std::string fill_used, fill_free;
  for (std::size_t i = 0; i < width; ++i) {
    if (cap && i == *cap) {
      if (!fill_used.empty()) spans.push_back({std::exchange(fill_used, ""), high ? Style::bar_high : Style::bar_used});
      if (!fill_free.empty()) spans.push_back({std::exchange(fill_free, ""), Style::dim});
      spans.push_back({utf8 ? "│" : "|", Style::bar_cap});
    } else if (i < used) {
      fill_used += utf8 ? "█" : "#";
    } else {
      if (!fill_used.empty()) spans.push_back({std::exchange(fill_used, ""), high ? Style::bar_high : Style::bar_used});
      fill_free += utf8 ? "░" : ".";
    }
  }
  if (!fill_used.empty()) spans.push_back({fill_used, high ? Style::bar_high : Style::bar_used});
  if (!fill_free.empty()) spans.push_back({fill_free, Style::dim});
  spans.push_back({"]", Style::normal});
  return spans;
}

namespace {

constexpr std::size_t kBarWidth = 40;

/// The process table's columns: fixed widths, the counters' titles from the counter list.
/// On a screen narrower than they need (`width`; 0: any), the names give way first (Job,
/// absent when no row has one, then Name, User, Job), so that the figures, Cap and State
/// stay on an 80-column terminal.
Table row_table(SortKey key, bool reversed, bool utf8, std::size_t width, bool any_job) {
  using counters::Id;
  const std::string mark = reversed == (key == SortKey::name || key == SortKey::pid) ? (utf8 ? "▼" : "v")
                                                                                      : (utf8 ? "▲" : "^");
  const auto title = [&](std::string name, SortKey k) { return key == k ? name + mark : name; };
  Table t;
  t.columns = {{"GPU", false, true, 0, 3},
               {title("PID", SortKey::pid), false, true, 0, 8},
               {"User", false, false, 8, 8},
               {title("Name", SortKey::name), false, false, 18, 18},
               {"Job", false, false, 10, 10},
               {title(column_title(Id::used), SortKey::used), false, true, 0, 11, true},
               {title(column_title(Id::peak), SortKey::peak), false, true, 0, 11, true},
               {title(column_title(Id::limit), SortKey::cap), false, true, 0, 11, true},
               {"State", false, false, 0, 7}};
  const auto total = [&] {
    std::size_t w = 0;
    for (const Column& c : t.columns) w += c.width + 1;
    return w;
  };
  if (width && total() > width && !any_job) t.columns.erase(t.columns.begin() + 4);
  for (auto [col, least] : {std::pair{3, 8}, std::pair{2, 6}, std::pair{4, 6}}) {
    if (!width || total() <= width || (col == 4 && !any_job)) continue;
    Column& c = t.columns[static_cast<std::size_t>(col)];
    const std::size_t cut = std::min(total() - width, c.width - static_cast<std::size_t>(least));
    c.width -= cut;
    c.max_width = c.width;
  }
  return t;
}

std::vector<Cell> row_cells(const ProcRow& r, bool job_column) {
  std::vector<Cell> cells = {r.gpu ? Cell::num(*r.gpu) : Cell::none(),
                             Cell::num(r.pid),
                             Cell::str(r.user),
                             Cell::str(r.name),
                             r.job.empty() ? Cell::none() : Cell::str(r.job),
                             r.device.is_null() ? Cell::none() : Cell::bytes(r.used),
                             r.device.is_null() ? Cell::none() : Cell::bytes(r.peak),
                             r.cap ? Cell::bytes(*r.cap) : Cell::none(),
                             Cell::str(r.state)};
  if (!job_column) cells.erase(cells.begin() + 4);
  return cells;
}

/// The sparkline column's title: the time its samples cover.
std::string history_title(double interval_s) {
  return fmt::format("Used, last {:g} s", interval_s * static_cast<double>(History::kSamples));
}

Line title_line(const json& st, const std::string& what, const ViewOptions& view) {
  Line l = line(fmt::format("cuwarden top  {}  host {}  {}", local_time(jnum(st, "time_ns"), "%H:%M:%S", false),
                            printable(jstr(st, "hostname", "?")), what),
                Style::title);
  if (!view.status.empty()) l.spans.push_back({"  " + view.status, Style::warn});
  return l;
}

}  // namespace

std::vector<Line> list_frame(const json& st, const std::vector<ProcRow>& rows, const History& history,
                             const ViewOptions& view, std::size_t width, std::size_t height, std::size_t* first) {
  std::vector<Line> out;
  const auto gpus = gpu_rows(st);
  std::size_t running = 0;
  for (const json& p : jarr(st, "processes")) running += jstr(p, "state") == "running";
  out.push_back(title_line(st,
                           fmt::format("daemon {}  {} running  every {:g} s", printable(jstr(st, "version", "?")),
                                       plural(running, "process", "processes"), view.interval_s),
                           view));
  // The bar gives way on a narrow screen, so that the figures after it stay in view.
  const std::size_t figures = 28 + 2 + 33;  // "GPU 0  NAME ", the bar's brackets, " USED / TOTAL  PCT%"
  const std::size_t bar =
      width ? std::clamp<std::size_t>(width > figures ? width - figures : 0, 10, kBarWidth) : kBarWidth;
  for (const GpuRow& g : gpus) {
    Line l = line(fmt::format("GPU {:<2} {} ", g.index, pad(truncate(g.name, 20), 20)));
    for (Span& s : gpu_bar(g, bar, view.utf8)) l.spans.push_back(std::move(s));
    std::string text =
        fmt::format(" {:>11} / {:<11} {:5.1f}%", format_bytes(g.used), format_bytes(g.total),
                    g.total ? 100.0 * static_cast<double>(g.used) / static_cast<double>(g.total) : 0.0);
    if (g.capped)
      text += fmt::format("  caps {} ({} of {})", format_bytes(g.caps), g.capped,
                          plural(g.processes, "process", "processes"));
    else
      text += g.processes ? "  no caps" : "";
    l.spans.push_back({text, Style::normal});
    out.push_back(std::move(l));
  }
  if (gpus.empty()) out.push_back(line("No GPU seen yet (no interposed process has used CUDA)", Style::dim));
  out.push_back(Line{});

  bool any_job = false;
  for (const ProcRow& r : rows) any_job = any_job || !r.job.empty();
  const Table t = row_table(view.sort, view.reversed, view.utf8, width, any_job);
  const bool job_column = t.columns.size() == 9;
  const std::string head = render_line(t, nullptr);
  // Each row's fixed columns take the header's width; the sparkline gets what is left of the
  // screen, up to one column per sample.
  const std::size_t fixed = [&] {
    std::size_t w = 0;
    for (const Column& c : t.columns) w += c.width + 1;
    return w;
  }();
  // One frame (--once) has one sample per row: no sparkline.
  std::size_t spark = view.interactive ? History::kSamples : 0;
  if (width && spark) spark = width > fixed + 8 ? std::min(spark, width - fixed) : 0;
  Line header = line(spark ? pad(head, fixed) + history_title(view.interval_s) : head, Style::header);
  out.push_back(view.interactive ? fill(std::move(header), width) : std::move(header));

  const std::size_t footer = view.interactive ? 1 : 0;
  const std::size_t area =
      height ? (height > out.size() + footer ? height - out.size() - footer : 0) : rows.size();
  std::size_t sel = 0;
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i].key == view.selected) sel = i;
  std::size_t top = first ? *first : 0;
  if (area) {
    if (sel < top) top = sel;
    if (sel >= top + area) top = sel - area + 1;
  }
  top = std::min(top, rows.size() > area ? rows.size() - area : 0);
  if (first) *first = top;
  if (rows.empty()) out.push_back(line("No interposed processes found", Style::dim));
  for (std::size_t i = top; i < rows.size() && i < top + area; ++i) {
    const ProcRow& r = rows[i];
    const std::vector<Cell> cells = row_cells(r, job_column);
    std::string text = render_line(t, &cells);
    if (spark) text = pad(text, fixed) + sparkline(history.samples(r.key), spark, view.utf8);
    const bool selected = view.interactive && i == sel;
    Line l = line(text, selected ? Style::selected : r.state == "running" ? Style::normal : Style::dim);
    out.push_back(selected ? fill(std::move(l), width) : std::move(l));
  }
  if (view.interactive) {
    while (height && out.size() + 1 < height) out.push_back(Line{});
    const std::string shown = rows.size() > area ? fmt::format(" ({} of {} shown)", area, rows.size()) : "";
    std::string keys = fmt::format("Sort: {}, {}{}   s: next  u/p/c/n/P: used/peak/cap/name/pid  r: reverse   "
                                   "{}/j/k: select  Enter: details  q: quit",
                                   sort_name(view.sort), sort_order(view.sort, view.reversed), shown,
                                   view.utf8 ? "↑↓" : "arrows");
    // Narrow: the keys alone (the header's mark says the sort), so that q: quit stays seen.
    if (width && columns(keys) > width)
      keys = fmt::format("s/u/p/c/n/P: sort  r: reverse  {}: select  Enter: details  q: quit{}",
                         view.utf8 ? "↑↓" : "j/k", shown);
    out.push_back(fill(line(keys, Style::header), width));
  }
  return out;
}

std::vector<Line> detail_frame(const json& st, const std::vector<ProcRow>& rows, const History& history,
                               const Detail& d, const ViewOptions& view, std::size_t width, std::size_t height) {
  using counters::Id;
  std::vector<const ProcRow*> mine;
  for (const ProcRow& r : rows)
    if (r.pid == d.pid && std::to_string(jnum(r.process, "created_ns")) == d.start) mine.push_back(&r);
  std::vector<Line> out;
  if (mine.empty()) {
    out.push_back(title_line(st, fmt::format("pid {}", d.pid), view));
    out.push_back(line(fmt::format("pid {} is no longer known to the daemon; its last events are below.", d.pid),
                       Style::warn));
  } else {
    const ProcRow& r = *mine.front();
    out.push_back(title_line(st,
                             fmt::format("pid {}  {}  user {}  job {}  pool {}  {}", r.pid, r.name, r.user,
                                         r.job.empty() ? "-" : r.job, printable(jstr(r.process, "pool", "off")),
                                         r.state),
                             view));
    out.push_back(line("command: " + printable(jstr(r.process, "cmdline"))));
  }
  out.push_back(Line{});

  // The process's GPUs: what the table shows of them, and the counters beside.
  Table t;
  t.columns = {{"GPU", false, true, 0, 3}, {"Name", false, false, 20, 20}};
  const Id shown[] = {Id::used, Id::peak, Id::limit, Id::reserved, Id::live_allocations, Id::refusals};
  for (Id id : shown) t.columns.push_back({column_title(id), false, true, 0, 11, true});
  out.push_back(line(render_line(t, nullptr), Style::header));
  for (const ProcRow* r : mine) {
    if (r->device.is_null()) continue;
    std::vector<Cell> cells = {r->gpu ? Cell::num(*r->gpu) : Cell::none(), Cell::str(printable(jstr(r->device, "name")))};
    for (Id id : shown) cells.push_back(jcell(r->device, json_key(id), cell_kind(id)));
    out.push_back(line(render_line(t, &cells)));
  }
  for (const ProcRow* r : mine) {
    if (r->device.is_null()) continue;
    const auto& s = history.samples(r->key);
    const uint64_t lo = s.empty() ? 0 : *std::min_element(s.begin(), s.end());
    const uint64_t hi = s.empty() ? 0 : *std::max_element(s.begin(), s.end());
    out.push_back(line(fmt::format("GPU {} {}: {}  {} .. {}", r->gpu.value_or(0), history_title(view.interval_s),
                                   sparkline(s, History::kSamples, view.utf8), format_bytes(lo), format_bytes(hi))));
  }
  out.push_back(Line{});

  out.push_back(line(view.unfold ? "Top call sites (live bytes), every frame:" : "Top call sites (live bytes):",
                     Style::title));
  // Unfolded, the sites take what is left but a blank line, the events' title, header and
  // kEventsKept events, and the key line.
  constexpr std::size_t kEventsKept = 3;
  const std::size_t below = 3 + kEventsKept + (view.interactive ? 1 : 0);
  const std::size_t site_room =
      height ? std::max<std::size_t>(height > out.size() + below ? height - out.size() - below : 0, 5) : 0;
  if (d.snapshot)
    for (const std::string& s : top_sites(*d.snapshot, 5, width > 2 ? width - 2 : 0, view.unfold, site_room))
      out.push_back(line("  " + s));
  else
    out.push_back(line("  " + (d.snapshot_error.empty() ? std::string("(asking the daemon)") : d.snapshot_error),
                       Style::warn));
  out.push_back(Line{});

  out.push_back(line("Recent events:", Style::title));
  const Table et = events_table();
  if (!d.events) {
    out.push_back(line("  " + (d.events_error.empty() ? std::string("(asking the daemon)") : d.events_error),
                       Style::warn));
  } else {
    out.push_back(line(render_line(et, nullptr), Style::header));
    const json& evs = jarr(*d.events, "events");
    const std::size_t room = height ? (height > out.size() + 1 ? height - out.size() - 1 : 0) : evs.size();
    if (evs.empty()) out.push_back(line("  (none kept)", Style::dim));
    for (std::size_t i = evs.size() > room ? evs.size() - room : 0; i < evs.size(); ++i) {
      const std::vector<Cell> cells = event_row(evs[i]);
      out.push_back(line(render_line(et, &cells)));
    }
  }
  if (view.interactive) {
    while (height && out.size() + 1 < height) out.push_back(Line{});
    out.push_back(fill(line(fmt::format("Esc/Backspace: back to the list  f: {} call sites  q: quit",
                                        view.unfold ? "fold" : "unfold"),
                            Style::header),
                       width));
  }
  if (height && out.size() > height) {  // a short screen: the key help stays, the oldest lines shown go
    Line last = out.back();
    out.resize(height - 1);
    out.push_back(std::move(last));
  }
  return out;
}

}  // namespace cuw::cli::top
