// cuwarden CLI: what `cuwarden fit` says of its tries (fit.hpp): a line per try, the answer as
// a sentence or one JSON document, and the plot as SVG.
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <string_view>
#include <tuple>

#include "client.hpp"
#include "cuw/size.hpp"
#include "fit.hpp"

namespace cuw::cli::fit {

namespace {

/// How many of a failed try's last lines of standard error are shown.
constexpr std::size_t kTailLines = 20;

std::string uuid_text(const std::array<uint8_t, 16>& u) {
  return fmt::format(
      "GPU-{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}", u[0],
      u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

/// "exit status 3" or "killed by signal 11 (Segmentation fault)".
std::string status_text(int st) {
  if (WIFEXITED(st)) return fmt::format("exit status {}", WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return fmt::format("killed by signal {} ({})", WTERMSIG(st), strsignal(WTERMSIG(st)));
  return "ended";
}

/// "peak GPU 0 99.18 MiB", or why there is none, for a sentence.
std::string peak_clause(const Try& t) { return (t.devices.empty() ? "" : "peak ") + peaks_text(t); }

/// The last kTailLines lines of `tail`, each indented and cut at 400 characters; of a line
/// redrawn with carriage returns (a progress bar), what was drawn last.
std::string tail_lines(const std::string& tail) {
  std::vector<std::string_view> lines;
  for (std::string_view rest(tail); !rest.empty();) {
    const std::size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    while (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (const std::size_t cr = line.rfind('\r'); cr != std::string_view::npos) line.remove_prefix(cr + 1);
    lines.push_back(line);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  const std::size_t from = lines.size() > kTailLines ? lines.size() - kTailLines : 0;
  std::string out = from ? "    ...\n" : "";
  for (std::size_t i = from; i < lines.size(); ++i) out += "    " + std::string(lines[i].substr(0, 400)) + "\n";
  return out;
}

// ------------------------------------------------------------------------------ the plot

std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // Control characters are not allowed in XML 1.0 text.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n') out += c;
    }
  }
  return out;
}

/// 1, 2 or 5 times a power of ten: the smallest at least `x` (> 0).
double nice_step(double x) {
  const double p = std::pow(10.0, std::floor(std::log10(x)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * p >= x * (1 - 1e-9)) return m * p;
  return 10 * p;
}

/// The plot as SVG: peak memory (per GPU: one point per try and GPU, its shape the GPU's,
/// its colour the outcome) against the value tried, the caps as dashed lines, the answer
/// as a dotted one. Hand-written: no dependency for one chart.
std::string render_svg(const Search& s, const std::vector<Try>& tries, std::optional<uint64_t> answer) {
  constexpr double W = 760, H = 460, L = 86, R = 24, T = 58, B = 58;
  const double pw = W - L - R, ph = H - T - B;
  // GPUs in order of first appearance over all tries, so that a GPU keeps its shape.
  std::vector<std::array<uint8_t, 16>> gpus;
  std::vector<int> gpu_ordinals;
  std::vector<std::pair<uint64_t, std::string>> caps;  // bytes, the GPUs it is the cap of ("GPU 0, GPU 1")
  uint64_t ymax = 0;
  double xmin = static_cast<double>(s.range.hi), xmax = static_cast<double>(s.range.lo);
  for (const Try& t : tries) {
    xmin = std::min(xmin, static_cast<double>(t.value));
    xmax = std::max(xmax, static_cast<double>(t.value));
    for (const Device& d : t.devices) {
      if (std::find(gpus.begin(), gpus.end(), d.uuid) == gpus.end()) {
        gpus.push_back(d.uuid);
        gpu_ordinals.push_back(d.ordinal);
      }
      ymax = std::max(ymax, d.peak);
      if (d.limit == ring::kNoLimit) continue;
      const std::string gpu = fmt::format("GPU {}", d.ordinal);
      const auto c = std::find_if(caps.begin(), caps.end(), [&](const auto& x) { return x.first == d.limit; });
      if (c == caps.end()) {
        caps.push_back({d.limit, gpu});
        ymax = std::max(ymax, d.limit);
      } else if (c->second.find(gpu) == std::string::npos) {
        c->second += ", " + gpu;
      }
    }
  }
  if (caps.empty()) {  // no try reached the GPU: the cap as typed, when it is one size
    std::string e;
    if (auto spec = parse_limit(s.o.limit, &e); spec && spec->per_device.empty() && spec->all && !spec->all->percent) {
      caps.push_back({spec->all->bytes, ""});
      ymax = std::max(ymax, spec->all->bytes);
    }
  }
  if (xmin > xmax) xmin = xmax = static_cast<double>(s.range.lo);
  if (xmin == xmax) {
    xmin = std::max(0.0, xmin - 1);
    xmax = xmax + 1;
  }
  // The y axis in the binary unit that reads best for its top.
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  double top = std::max<double>(static_cast<double>(ymax) * 1.08, 1.0);
  while (unit < 4 && top >= 1024.0 * std::pow(1024.0, unit)) ++unit;
  const double scale = std::pow(1024.0, unit);
  const double ystep = nice_step(top / scale / 6);
  const double ytop = std::ceil(top / scale / ystep) * ystep * scale;
  const double pad = (xmax - xmin) * 0.04;
  const double x0 = xmin - pad, x1 = xmax + pad;
  const auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * pw; };
  const auto py = [&](double y) { return T + ph - y / ytop * ph; };

  std::string o;
  o += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o += fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n",
      W, H);
  o += fmt::format("<title>cuwarden fit: peak memory by {}</title>\n", xml_escape(s.range.name));
  o += "<style>.fits{fill:#2a9d3f}.does_not_fit{fill:#d1495b}.failed{fill:#8a8a8a}"
       ".grid{stroke:#e4e4e4}.axis{stroke:#333}.cap{stroke:#d1495b;stroke-dasharray:7 4}"
       ".answer{stroke:#2a9d3f;stroke-dasharray:2 3}.note{fill:#555}</style>\n";
  o += fmt::format("<rect width=\"{}\" height=\"{}\" fill=\"white\"/>\n", W, H);
  o += fmt::format("<text x=\"{}\" y=\"20\" font-size=\"15\">Peak GPU memory by {} under --limit {}</text>\n", L,
                   xml_escape(s.range.name), xml_escape(s.o.limit));
  std::string cmd;
  for (const std::string& a : s.o.command) cmd += (cmd.empty() ? "" : " ") + a;
  if (cmd.size() > 110) cmd = cmd.substr(0, 107) + "...";
  o += fmt::format("<text class=\"note\" x=\"{}\" y=\"38\">{}</text>\n", L, xml_escape(cmd));

  // Grid and tick labels.
  for (double y = 0; y <= ytop * (1 + 1e-9); y += ystep * scale) {
    o += fmt::format("<line class=\"grid\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\"/>\n", L, py(y),
                     L + pw, py(y));
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{:g} {}</text>\n", L - 6, py(y) + 4,
                     y / scale, kUnits[unit]);
  }
  const double xstep = std::max(1.0, nice_step((xmax - xmin) / 7));
  for (double x = std::ceil(xmin / xstep) * xstep; x <= xmax; x += xstep) {
    o += fmt::format("<line class=\"grid\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\"/>\n", px(x), T,
                     px(x), T + ph);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{:.0f}</text>\n", px(x), T + ph + 18, x);
  }
  o += fmt::format("<line class=\"axis\" x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\"/>\n", L, T, T + ph);
  o += fmt::format("<line class=\"axis\" x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\"/>\n", L, T + ph, L + pw);
  o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", L + pw / 2, H - 14,
                   xml_escape(s.range.name));
  o += fmt::format(
      "<text x=\"16\" y=\"{0:.1f}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {0:.1f})\">peak memory</text>\n",
      T + ph / 2);

  // One line per cap; its GPUs named when the caps differ between GPUs.
  for (const auto& [c, gpu_names] : caps) {
    const double y = py(static_cast<double>(c));
    o +=
        fmt::format("<line class=\"cap\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\"/>\n", L, y, L + pw, y);
    const std::string label = "cap " + format_bytes(c) + (caps.size() > 1 ? " (" + gpu_names + ")" : "");
    o += fmt::format("<text class=\"note\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", L + pw - 4,
                     y - 5, xml_escape(label));
  }
  if (answer) {
    const double ax = px(static_cast<double>(*answer));
    o += fmt::format("<line class=\"answer\" x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\"/>\n", ax, T,
                     T + ph);
    o += fmt::format("<text class=\"note\" x=\"{:.1f}\" y=\"{:.1f}\">{}={}</text>\n", ax + 4, T + 12,
                     xml_escape(s.range.name), *answer);
  }

  // The points: a circle for the first GPU, a square for the second, a diamond after.
  o += "<g>\n";
  for (const Try& t : tries) {
    for (const Device& d : t.devices) {
      const auto g = static_cast<std::size_t>(std::find(gpus.begin(), gpus.end(), d.uuid) - gpus.begin());
      const double cx = px(static_cast<double>(t.value)), cy = py(static_cast<double>(d.peak));
      const std::string title = xml_escape(fmt::format("{}={}: {}, peak {} on GPU {}", s.range.name, t.value,
                                                       result_text(t), format_bytes(d.peak), d.ordinal));
      const char* cls = outcome_key(t.outcome);
      if (g == 0)
        o +=
            fmt::format("<circle class=\"point {}\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4.5\"><title>{}</title></circle>\n",
                        cls, cx, cy, title);
      else if (g == 1)
        o += fmt::format(
            "<rect class=\"point {}\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"8\" height=\"8\"><title>{}</title></rect>\n",
            cls, cx - 4, cy - 4, title);
      else
        o += fmt::format(
            "<polygon class=\"point {}\" points=\"{:.1f},{:.1f} {:.1f},{:.1f} {:.1f},{:.1f} {:.1f},{:.1f}\">"
            "<title>{}</title></polygon>\n",
            cls, cx, cy - 5.5, cx + 5.5, cy, cx, cy + 5.5, cx - 5.5, cy, title);
    }
    if (t.devices.empty()) {  // nothing on a GPU: a hollow mark on the axis, so every try shows
      const std::string title =
          xml_escape(fmt::format("{}={}: {}, {}", s.range.name, t.value, result_text(t), peaks_text(t)));
      o += fmt::format(
          "<circle class=\"point {}\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4.5\" fill-opacity=\"0.25\"><title>{}</title>"
          "</circle>\n",
          outcome_key(t.outcome), px(static_cast<double>(t.value)), py(0), title);
    }
  }
  o += "</g>\n";

  // Legend: outcomes, then GPUs when there are several.
  double lx = L + pw - 250;
  const double ly = 48;
  const std::tuple<const char*, const char*, double> outcomes[] = {
      {"fits", "fits", 60}, {"does_not_fit", "does not fit", 110}, {"failed", "failed", 0}};
  for (const auto& [cls, label, width] : outcomes) {
    o += fmt::format("<circle class=\"{}\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4.5\"/>", cls, lx, ly - 4);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n", lx + 8, ly, label);
    lx += width;
  }
  if (gpus.size() > 1) {
    std::string names;
    for (std::size_t g = 0; g < gpus.size(); ++g)
      names += fmt::format("{}GPU {} {}", g ? ", " : "", gpu_ordinals[g],
                           g == 0   ? "circle"
                           : g == 1 ? "square"
                                    : "diamond");
    o += fmt::format("<text class=\"note\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", L + pw, T - 24,
                     xml_escape(names));
  }
  o += "</svg>\n";
  return o;
}

json try_json(const Try& t) {
  json j;
  j["value"] = t.value;
  j["outcome"] = outcome_key(t.outcome);
  j["exit_status"] = WIFEXITED(t.wait_status) ? json(WEXITSTATUS(t.wait_status)) : json();
  j["signal"] = WIFSIGNALED(t.wait_status) ? json(WTERMSIG(t.wait_status)) : json();
  j["refusals"] = t.refusals;
  j["driver_errors"] = t.driver_errors;
  j["processes"] = t.processes;
  j["seconds"] = std::round(t.seconds * 1000) / 1000;
  json devs = json::array();
  for (const Device& d : t.devices)
    devs.push_back({{"ordinal", d.ordinal},
                    {"uuid", uuid_text(d.uuid)},
                    {"name", d.name},
                    {"peak_bytes", d.peak},
                    {"limit_bytes", d.limit == ring::kNoLimit ? json() : json(d.limit)}});
  j["devices"] = devs;
  return j;
}

}  // namespace

const char* outcome_key(Outcome o) {
  switch (o) {
    case Outcome::fits: return "fits";
    case Outcome::too_big: return "does_not_fit";
    case Outcome::failed: return "failed";
  }
  return "failed";
}

/// "GPU 0 99.18 MiB, GPU 1 12.00 MiB", or why there is none.
std::string peaks_text(const Try& t) {
  if (t.devices.empty()) return t.processes ? "no GPU memory allocated" : "no CUDA use seen";
  std::string s;
  for (const Device& d : t.devices)
    s += fmt::format("{}GPU {} {}", s.empty() ? "" : ", ", d.ordinal, format_bytes(d.peak));
  return s;
}

std::string result_text(const Try& t) {
  const uint64_t n = t.refusals, dn = t.driver_errors;
  switch (t.outcome) {
    case Outcome::fits: return n ? fmt::format("fits ({} refusal{} survived)", n, n == 1 ? "" : "s") : "fits";
    case Outcome::too_big:
      if (n) return fmt::format("does not fit ({} refusal{})", n, n == 1 ? "" : "s");
      return fmt::format("does not fit (driver: {} failed allocation{})", dn, dn == 1 ? "" : "s");
    case Outcome::failed: return "failed (" + status_text(t.wait_status) + ")";
  }
  return "";
}

int report(const Search& s, const std::vector<Try>& tries, const Ending& e) {
  const FitOptions& o = s.o;
  const Range& r = s.range;
  const Result result = e.result;
  const uint64_t lo = e.lo, hi = e.hi;
  const std::optional<std::size_t>& stop = e.stop;
  const auto find = [&](uint64_t v) -> const Try& {
    for (const Try& t : tries)
      if (t.value == v) return t;
    return tries.front();  // not reached: every value named below was tried
  };
  const bool have_answer = result == Result::found || result == Result::all_fit;
  std::optional<uint64_t> answer;
  if (have_answer) answer = lo;
  // A failure or an interruption after LO fitted still leaves the largest value known to fit.
  std::optional<uint64_t> best_known;
  for (const Try& t : tries)
    if (t.outcome == Outcome::fits && (!best_known || t.value > *best_known)) best_known = t.value;

  std::string message;
  const std::string nm = r.name;
  switch (result) {
    case Result::found:
      message = fmt::format("{}={} is the largest that fits ({}); {}={} does not fit.", nm, lo, peak_clause(find(lo)),
                            nm, hi);
      break;
    case Result::all_fit:
      message = fmt::format("{}={}, the top of the range, fits ({}): a larger value may fit too (raise HI).", nm, lo,
                            peak_clause(find(lo)));
      break;
    case Result::none_fit:
      message = fmt::format("Nothing in {}..{} fits: even {}={} does not fit under --limit {} ({}).", r.lo, r.hi, nm,
                            r.lo, o.limit, peak_clause(find(r.lo)));
      break;
    case Result::failed: {
      const Try& t = tries[*stop];
      message = fmt::format("{}={} failed ({}) with no refusal by the cap, so the search stops here.", nm, t.value,
                            status_text(t.wait_status));
      if (best_known) message += fmt::format(" {}={} fits.", nm, *best_known);
      if (t.tail.empty()) message += " It wrote nothing to standard error.";
      else message += " The end of its standard error:\n" + tail_lines(t.tail);
      break;
    }
    case Result::interrupted:
      message = fmt::format("interrupted by signal {} ({})", static_cast<int>(g_signal), strsignal(g_signal));
      if (stop) message += fmt::format(" during {}={}", nm, tries[*stop].value);
      message += ".";
      if (best_known) message += fmt::format(" {}={} fits.", nm, *best_known);
      break;
  }

  if (!o.plot.empty()) {
    std::ofstream f(o.plot, std::ios::binary | std::ios::trunc);
    f << render_svg(s, tries, answer);
    f.close();
    if (!f) {
      std::fprintf(stderr, "cuwarden fit: cannot write %s: %s\n", o.plot.c_str(), std::strerror(errno));
      return kExitFailure;
    }
  }

  static constexpr const char* kResultKeys[] = {"found", "all_fit", "none_fit", "failed", "interrupted"};
  if (o.json) {
    json j;
    j["name"] = r.name;
    j["lo"] = r.lo;
    j["hi"] = r.hi;
    j["limit"] = o.limit;
    j["pool"] = o.pool.empty() ? json() : json(o.pool);
    j["command"] = o.command;
    j["result"] = kResultKeys[static_cast<int>(result)];
    j["answer"] = answer ? json(*answer) : json();
    j["largest_fitting"] = best_known ? json(*best_known) : json();
    j["smallest_too_big"] = result == Result::found ? json(hi) : result == Result::none_fit ? json(r.lo) : json();
    j["message"] = message;
    j["tries"] = json::array();
    for (const Try& t : tries) j["tries"].push_back(try_json(t));
    if (result == Result::failed) {
      const std::string& tail = tries[*stop].tail;
      j["stderr_tail"] = tail.size() > 4096 ? tail.substr(tail.size() - 4096) : tail;
    }
    // What a program wrote may not be UTF-8: such bytes become U+FFFD rather than an exception.
    std::printf("%s\n", j.dump(2, ' ', false, json::error_handler_t::replace).c_str());
  } else if (result == Result::failed || result == Result::interrupted) {
    std::fprintf(stderr, "cuwarden fit: %s%s", message.c_str(), message.back() == '\n' ? "" : "\n");
  } else {
    std::printf("%s\n", message.c_str());
  }
  std::fflush(stdout);

  switch (result) {
    case Result::found:
    case Result::all_fit: return kExitOk;
    case Result::none_fit: return kExitNothingFits;
    case Result::failed: return kExitFailure;
    case Result::interrupted: return 128 + g_signal;
  }
  return kExitFailure;
}

}  // namespace cuw::cli::fit
