// cuwarden CLI: `cuwarden fit` — the largest value of one parameter (a batch size, a
// sequence length) with which a command fits under a cap, found by bisection.
//
// Each try runs the command through `cuwarden run` (this executable), so that a try gets
// exactly the environment and preload a user's `cuwarden run` sets up. CUWARDEN_RUN_DIR
// names a private directory in which fit listens on the socket a daemon would use: the
// interposer keeps its ring file at exit when a daemon listens (core/tracker.cpp,
// Tracker::on_exit), so once the try's processes are gone fit reads every ring there for
// the peak per device and the refusals. No daemon is needed, and a running one sees nothing
// of the tries.
//
// Here: the arguments checked and the bisection; fit_try.cpp runs each try, fit_report.cpp
// says what they found (fit.hpp).
#include <limits.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "client.hpp"
#include "commands.hpp"
#include "cuw/options.hpp"
#include "cuw/size.hpp"
#include "fit.hpp"

namespace cuw::cli {

namespace fit {

volatile sig_atomic_t g_signal = 0;        // the last SIGINT/SIGTERM/SIGHUP fit received
volatile sig_atomic_t g_signal_count = 0;  // how many

}  // namespace fit

using namespace fit;

namespace {

void on_signal(int sig) {
  g_signal = sig;
  g_signal_count = g_signal_count + 1;
}

/// Caught only so that a child's exit wakes fit's poll() at once (with SA_RESTART, nothing
/// else in fit sees EINTR; poll() always does).
void on_child(int) {}

int fit_usage_error(const std::string& msg) {
  std::fprintf(stderr, "cuwarden fit: %s\n", msg.c_str());
  return kExitUsage;
}

bool parse_uint(std::string_view s, uint64_t* out) {
  if (s.empty()) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

std::optional<Range> parse_range(const std::string& spec, std::string* err) {
  const std::size_t eq = spec.find('=');
  const std::size_t dots = eq == std::string::npos ? std::string::npos : spec.find("..", eq);
  if (dots == std::string::npos) {
    *err = "use NAME=LO..HI, as in BATCH=1..4096";
    return std::nullopt;
  }
  Range r;
  r.name = spec.substr(0, eq);
  const bool name_ok = !r.name.empty() && !std::isdigit(static_cast<unsigned char>(r.name[0])) &&
                       std::all_of(r.name.begin(), r.name.end(),
                                   [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
  if (!name_ok) {
    *err = "the name must be letters, digits and _, not starting with a digit (BATCH=1..4096)";
    return std::nullopt;
  }
  const std::string_view lo(spec.data() + eq + 1, dots - eq - 1), hi(spec.data() + dots + 2, spec.size() - dots - 2);
  if (!parse_uint(lo, &r.lo) || !parse_uint(hi, &r.hi)) {
    *err = "LO and HI must be whole numbers, 0 or more";
    return std::nullopt;
  }
  if (r.lo > r.hi) {
    *err = "LO must not be above HI";
    return std::nullopt;
  }
  return r;
}

}  // namespace

int cmd_fit(const FitOptions& o) {
  std::string err;
  if (!parse_limit(o.limit, &err)) return fit_usage_error("bad --limit '" + o.limit + "': " + err);
  using options::Id;
  if (!o.pool.empty() && !options::is_literal(Id::CUWARDEN_POOL, o.pool))
    return fit_usage_error("bad --pool '" + o.pool + "' (see cuwarden run --help)");
  if (!o.cap_scope.empty() && !options::is_literal(Id::CUWARDEN_CAP_SCOPE, o.cap_scope))
    return fit_usage_error("bad --cap-scope '" + o.cap_scope + "' (see cuwarden run --help)");
  const auto range = parse_range(o.try_spec, &err);
  if (!range) return fit_usage_error("bad --try '" + o.try_spec + "': " + err);
  if (o.command.empty()) return fit_usage_error("no command given (cuwarden fit [options] -- CMD ... {NAME} ...)");
  const std::string placeholder = "{" + range->name + "}";
  if (std::none_of(o.command.begin(), o.command.end(),
                   [&](const std::string& a) { return a.find(placeholder) != std::string::npos; }))
    return fit_usage_error("the command never mentions " + placeholder + ", so every try would be the same");

  // The path, not /proc/self/exe itself: under a tool that loads us (valgrind) the link
  // names the tool, which readlink() is told about and exec is not.
  char self[PATH_MAX];
  const ssize_t self_len = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (self_len <= 0) {
    std::fprintf(stderr, "cuwarden fit: cannot find this executable (/proc/self/exe): %s\n", std::strerror(errno));
    return kExitFailure;
  }
  Search s{o, *range, {}, placeholder, std::string(self, static_cast<std::size_t>(self_len))};
  if (!s.dir.open(&err)) {
    std::fprintf(stderr, "cuwarden fit: %s\n", err.c_str());
    return kExitFailure;
  }
  setenv(options::get(Id::CUWARDEN_RUN_DIR).variable, s.dir.path().c_str(), 1);
  // Orphans of a try (a launcher's workers whose parent exited) become fit's children, so
  // that fit knows when every process of a try is gone, and can stop them if they stay.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;  // poll() still wakes up: it is never restarted
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  sa.sa_handler = on_child;
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  ::sigaction(SIGCHLD, &sa, nullptr);

  const Range& r = s.range;
  const int vw = static_cast<int>(std::max(r.name.size(), std::to_string(r.hi).size()));
  if (!o.json) {
    std::printf("Largest %s in %llu..%llu that fits under --limit %s%s%s:\n", r.name.c_str(),
                static_cast<unsigned long long>(r.lo), static_cast<unsigned long long>(r.hi), o.limit.c_str(),
                o.pool.empty() ? "" : " --pool ", o.pool.c_str());
    std::printf("  %*s  %-30s %9s  %s\n", vw, r.name.c_str(), "result", "time", "peak memory");
    std::fflush(stdout);
  }
  std::vector<Try> tries;
  bool warned_no_cuda = false;
  const auto attempt = [&](uint64_t value) -> const Try& {
    tries.push_back(run_try(s, value));
    const Try& t = tries.back();
    if (!o.json) {
      std::printf("  %*llu  %-30s %7.2f s  %s\n", vw, static_cast<unsigned long long>(value), result_text(t).c_str(),
                  t.seconds, peaks_text(t).c_str());
      std::fflush(stdout);
    }
    if (t.stopped)
      std::fprintf(stderr,
                   "cuwarden fit: %s=%llu: stopped %d process(es) still running %lld s after the command exited\n",
                   r.name.c_str(), static_cast<unsigned long long>(value), t.stopped,
                   static_cast<long long>(kDescendantGrace.count()));
    if (t.outcome == Outcome::fits && t.processes == 0 && !warned_no_cuda) {
      warned_no_cuda = true;
      std::fprintf(stderr,
                   "cuwarden fit: %s=%llu used no CUDA that cuwarden saw: is it a CUDA program, and can "
                   "libcuwarden.so be preloaded into it (not into a static or setuid binary)?\n",
                   r.name.c_str(), static_cast<unsigned long long>(value));
    }
    return t;
  };

  // LO first (a broken command shows at once, on the cheapest try), then HI, then halves:
  // from then on `lo` fits and `hi` does not.
  Result result = Result::found;
  uint64_t lo = r.lo, hi = r.hi;
  std::optional<std::size_t> stop;  // index of the try that stopped the search
  tries.reserve(2 + 64);            // at most 64 halvings of a 64-bit range
  const auto step = [&](uint64_t value) -> std::optional<Outcome> {
    if (g_signal_count) {
      result = Result::interrupted;
      return std::nullopt;
    }
    const Try& t = attempt(value);
    if (t.interrupted || g_signal_count || t.outcome == Outcome::failed) {
      result = t.outcome == Outcome::failed && !t.interrupted && !g_signal_count ? Result::failed : Result::interrupted;
      stop = tries.size() - 1;
      return std::nullopt;
    }
    return t.outcome;
  };
  if (const auto first = step(r.lo)) {
    if (*first == Outcome::too_big) {
      result = Result::none_fit;
    } else if (r.lo == r.hi) {
      result = Result::all_fit;
    } else if (const auto top = step(r.hi)) {
      if (*top == Outcome::fits) {
        result = Result::all_fit;
        lo = r.hi;
      } else {
        while (hi - lo > 1) {
          const uint64_t mid = lo + (hi - lo) / 2;
          const auto got = step(mid);
          if (!got) break;
          (*got == Outcome::fits ? lo : hi) = mid;
        }
      }
    }
  }
  return report(s, tries, Ending{result, lo, hi, stop});
}

}  // namespace cuw::cli
