// cuwarden CLI: `cuwarden fit`'s parts (fit.cpp: the search; fit_try.cpp: one try run and its
// rings read; fit_report.cpp: what is said of the tries, as lines, JSON and an SVG plot).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "cuw/ring.hpp"

namespace cuw::cli::fit {

using json = nlohmann::ordered_json;

/// How long the processes a try's command started may outlive it before fit stops them:
/// the rings are read only once every process of the try is gone.
constexpr auto kDescendantGrace = std::chrono::seconds(5);

/// The last SIGINT/SIGTERM/SIGHUP fit received, and how many (set by fit.cpp's handler; a
/// try passes each on to its processes).
extern volatile sig_atomic_t g_signal;
extern volatile sig_atomic_t g_signal_count;

/// --try NAME=LO..HI.
struct Range {
  std::string name;
  uint64_t lo = 0, hi = 0;
};

/// One GPU as the try's rings describe it, merged over the try's processes.
struct Device {
  std::array<uint8_t, 16> uuid{};
  int ordinal = -1;  ///< CUDA ordinal in the first process that used it
  std::string name;
  uint64_t peak = 0;                ///< the highest peak of any one process, bytes
  uint64_t limit = ring::kNoLimit;  ///< the cap a process had on it, bytes
  uint64_t refusals = 0, driver_errors = 0;
};

/// A try's outcome: the command exited 0; it failed after a refusal (by the cap or the
/// driver); it failed otherwise.
enum class Outcome { fits, too_big, failed };

/// One try: one value, the command run once.
struct Try {
  uint64_t value = 0;
  Outcome outcome = Outcome::failed;
  int wait_status = 0;
  std::vector<Device> devices;  ///< by first appearance
  int processes = 0;            ///< rings read: processes that used CUDA
  uint64_t refusals = 0, driver_errors = 0;
  int stopped = 0;  ///< processes left running after the command, stopped by fit
  double seconds = 0;
  std::string tail;          ///< the end of its standard error
  bool interrupted = false;  ///< fit received a signal during it

  uint64_t max_peak() const {
    uint64_t m = 0;
    for (const Device& d : devices) m = std::max(m, d.peak);
    return m;
  }
};

/// A private run directory with a listening socket where a daemon's would be, so that the
/// interposer leaves its ring in place at exit. Connections are accepted and closed at
/// once (the interposer only connects to see that someone listens); nothing is sent.
class RunDir {
 public:
  RunDir() = default;
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;
  ~RunDir();

  /// Makes the directory under $TMPDIR (or /tmp, where a socket's path must fit in
  /// sockaddr_un) and listens. False with *err on failure.
  bool open(std::string* err);

  const std::string& path() const { return path_; }
  int listen_fd() const { return fd_; }

  /// Accepts and closes every pending connection. Never blocks.
  void accept_all() const;

  /// Removes what the try's processes left (rings, job files); the socket stays unless `all`.
  void clear(bool all) const;

 private:
  std::string path_;
  int fd_ = -1;
};

/// What stays the same across tries.
struct Search {
  const FitOptions& o;
  Range range;
  RunDir dir;
  std::string placeholder;  ///< "{NAME}"
  std::string self;         ///< this executable, which runs each try as `cuwarden run`
};

/// Runs the command once with `value`, waits for it and every process it started, and
/// reads what their rings say (fit_try.cpp).
Try run_try(Search& s, uint64_t value);

/// How a search ended.
enum class Result { found, all_fit, none_fit, failed, interrupted };

/// Where a search ended: `lo` fits and `hi` does not (when found); `stop` is the try that
/// stopped it (failed, interrupted).
struct Ending {
  Result result = Result::found;
  uint64_t lo = 0, hi = 0;
  std::optional<std::size_t> stop;
};

/// "fits", "does_not_fit" or "failed": the outcome's key in JSON and its class in the plot.
const char* outcome_key(Outcome o);
/// "GPU 0 99.18 MiB, GPU 1 12.00 MiB", or why there is none.
std::string peaks_text(const Try& t);
/// "fits (2 refusals survived)", "does not fit (1 refusal)", "failed (exit status 3)".
std::string result_text(const Try& t);

/// The search's answer said (a line, or JSON with --json), the plot written (--plot); the
/// exit status cmd_fit returns (fit_report.cpp).
int report(const Search& s, const std::vector<Try>& tries, const Ending& e);

}  // namespace cuw::cli::fit
