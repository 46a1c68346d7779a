// cuwarden CLI: `cuwarden top`'s call-site panel (see top_view.hpp top_sites): a site's
// printed form on one line, or, unfolded, every frame as `cuwarden snapshot --full` lists
// them, cut to the room the detail view has.
#include <algorithm>
#include <fmt/format.h>
#include <regex>
#include <utility>

#include "cuw/frames.hpp"
#include "cuw/size.hpp"
#include "json_access.hpp"
#include "top_view.hpp"

namespace cuw::cli::top {

using json = nlohmann::ordered_json;

namespace {

/// One frame of a snapshot's call site: "function (file:line)", or the module and offset.
std::string frame_text(const json& f) {
  std::string fn = printable(jstr(f, "function"));
  const std::string file = printable(jstr(f, "file"));
  const std::string module = printable(jstr(f, "module"));
  const auto base = [](const std::string& p) { return p.substr(p.find_last_of('/') + 1); };
  if (fn.empty()) fn = "??";
  if (!file.empty()) return fmt::format("{} ({}:{})", fn, base(file), jnum(f, "line"));
  if (!module.empty()) return fmt::format("{} ({}+{:#x})", fn, base(module), jnum(f, "offset"));
  return fn;
}

/// `s` with each "(/a/b/file.py:12)" as "(file.py:12)": what a narrow view gives up first.
std::string base_names(const std::string& s) {
  static const std::regex kPathedLine(R"(\([^()]*/([^/()]+:\d+)\))");
  return std::regex_replace(s, kPathedLine, "($1)");
}

/// `s` in at most `width` columns (0: any): paths by base names first, then its end cut.
std::string fit_width(std::string s, std::size_t width) {
  if (!width || columns(s) <= width) return s;
  s = base_names(s);
  if (columns(s) <= width) return s;
  std::string out;
  for (const Span& sp : clip(Line{{Span{s, Style::normal}}}, width).spans) out += sp.text;
  return out;
}

/// A line of a site's unfolded listing below its head.
struct Entry {
  std::string text;
  bool keep = false;  ///< never cut: a frame that tells the site apart, the "outward:" line
  bool shown = true;
};

struct Site {
  uint64_t bytes = 0, count = 0;
  std::string where;            ///< the one-line form
  std::string head;             ///< unfolded: the head (empty: the site does not unfold)
  std::vector<Entry> entries;   ///< unfolded: every other frame (frames::unfold)

  /// Lines the site takes: its own, each shown entry, one for each run of cut ones.
  std::size_t lines() const {
    std::size_t n = 1;
    bool run = false;
    for (const Entry& e : entries) {
      if (e.shown || !run) ++n;
      run = !e.shown;
    }
    return n;
  }
  /// The last shown entry that may be cut; entries.size() when none.
  std::size_t cuttable() const {
    for (std::size_t i = entries.size(); i-- > 0;)
      if (entries[i].shown && !entries[i].keep) return i;
    return entries.size();
  }
};

/// Site `s` of a snapshot unfolded, from the presenter's parts in the JSON (label_head,
/// head_frame, label_via, each frame's text and class) through frames::unfold, so that the
/// frames come in the order `cuwarden snapshot --full` lists them. A daemon without those
/// parts: nothing (the site keeps its one line).
void unfold_site(const json& s, Site* out) {
  const auto hf = s.find("head_frame");
  if (hf == s.end() || !hf->is_number_integer() || hf->get<long>() < 0 || !s.contains("label_head")) return;
  std::vector<frames::Frame> fs;
  for (const json& f : jarr(s, "frames")) {
    frames::Frame p;
    p.python = f.value("python", false);
    if (!frames::class_from_name(jstr(f, "class"), &p.cls)) p.cls = frames::Class::user;
    p.text = printable(jstr(f, "text"));
    if (p.text.empty()) p.text = frame_text(f);
    p.where = printable(frames::where_of(p.python, jstr(f, p.python ? "file" : "module")));
    fs.push_back(std::move(p));
  }
  frames::Label l;
  l.head_frame = hf->get<long>();
  for (const json& v : jarr(s, "label_via")) l.via.push_back(frames::Via{jnum(v, "frame"), 0, {}});
  bool outward = false, inner = false;
  for (const frames::Unfolded& u : frames::unfold(fs, l)) {
    using Role = frames::Unfolded::Role;
    if (u.role == Role::head) continue;
    // The inner frames come first; where there are any, a line says where the outward ones
    // start (the head's callers), as --full does.
    if (u.role != Role::inner && inner && !outward) out->entries.push_back({"  outward:", true});
    inner |= u.role == Role::inner;
    outward |= u.role != Role::inner;
    out->entries.push_back({fmt::format("{}{}  [{}]", u.role == Role::via ? "< " : "  ", fs[u.frame].text,
                                        frames::class_name(fs[u.frame].cls)),
                            u.role == Role::via});
  }
  out->head = printable(jstr(s, "label_head"));
}

/// Cuts frames until `sites` take at most `room` lines: from the site with the most lines
/// (the lower one on a tie), its outermost frame left, never one that tells it apart.
void cut_to(std::vector<Site>& sites, std::size_t room) {
  const auto total = [&] {
    std::size_t n = 0;
    for (const Site& s : sites) n += s.lines();
    return n;
  };
  while (total() > room) {
    Site* most = nullptr;
    for (Site& s : sites)
      if (s.cuttable() < s.entries.size() && (!most || s.lines() >= most->lines())) most = &s;
    if (!most) return;
    most->entries[most->cuttable()].shown = false;
  }
}

}  // namespace

std::vector<std::string> top_sites(const json& snap, std::size_t n, std::size_t width, bool unfold,
                                   std::size_t room) {
  if (snap.contains("exact") && snap["exact"].is_boolean() && !snap["exact"].get<bool>())
    return {"The live allocations could not be read: counters and events only."};
  std::vector<Site> sites;
  for (const json& s : jarr(snap, "sites")) {
    if (!jnum(s, "live_bytes")) continue;
    // The daemon's printed form (cuw/frames.hpp): the innermost user frame, then the frames
    // that tell the site from others with the same one. A daemon without it: the innermost
    // Python frame, else the innermost native one.
    std::string where = printable(jstr(s, "label"));
    if (where.empty())
      for (bool python : {true, false})
        for (const json& f : jarr(s, "frames"))
          if (where.empty() && f.value("python", false) == python) where = frame_text(f);
    Site site{jnum(s, "live_bytes"), jnum(s, "live_allocations"), where.empty() ? "(frames unknown)" : where, {}, {}};
    if (unfold) unfold_site(s, &site);
    sites.push_back(std::move(site));
  }
  uint64_t bytes = 0, count = 0;  // live device memory no call site was recorded for
  for (const json& a : jarr(snap, "allocations"))
    if (jnum(a, "site") == 0 && jstr(a, "kind") != "host") bytes += jnum(a, "bytes"), ++count;
  if (count)
    sites.push_back({bytes, count,
                     jnum(snap, "callsite_frames") ? "(no call site captured)"
                                                   : "(call sites off: cuwarden run --callsites 16 records them)",
                     {}, {}});
  std::stable_sort(sites.begin(), sites.end(), [](const Site& a, const Site& b) { return a.bytes > b.bytes; });
  if (sites.size() > n) sites.resize(n);
  if (room) cut_to(sites, room);
  std::vector<std::string> out;
  for (const Site& site : sites) {
    const std::string lead =
        fmt::format("{:>11}  {:>14}  ", format_bytes(site.bytes), plural(site.count, "allocation", "allocations"));
    if (!site.head.empty()) {
      // Unfolded: the head on the site's line, the other frames under it, a "<" before those
      // that tell it apart; frames cut for room as one "(+N frames)" line per run.
      out.push_back(fit_width(lead + site.head, width));
      const std::string indent(lead.size() - 2, ' ');
      for (std::size_t i = 0; i < site.entries.size(); ++i) {
        if (site.entries[i].shown) {
          out.push_back(fit_width(indent + site.entries[i].text, width));
          continue;
        }
        std::size_t run = 0;
        while (i + run < site.entries.size() && !site.entries[i + run].shown) ++run;
        out.push_back(fit_width(indent + fmt::format("  (+{})", plural(run, "frame", "frames")), width));
        i += run - 1;
      }
      continue;
    }
    std::string where = site.where;
    // Too wide: files by their base names first, then the head is cut, never the frames
    // after it that tell the site apart.
    const std::size_t cols = width > lead.size() ? width - lead.size() : 0;
    if (width && where.size() > cols) where = base_names(where);
    const std::size_t via = where.find(" < ");
    if (width && where.size() > cols && via != std::string::npos && where.size() - via + 3 < cols) {
      const std::size_t keep = cols - (where.size() - via) - 2;
      std::size_t cut = keep;
      while (cut > 0 && (static_cast<unsigned char>(where[cut]) & 0xc0) == 0x80) --cut;  // not inside a UTF-8 sequence
      where = where.substr(0, cut) + ".." + where.substr(via);
    }
    out.push_back(lead + where);
  }
  if (sites.empty()) out.push_back("(no live device allocation)");
  return out;
}

}  // namespace cuw::cli::top
