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
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "client.hpp"
#include "commands.hpp"
#include "cuw/options.hpp"
#include "cuw/paths.hpp"
#include "cuw/ring.hpp"
#include "cuw/size.hpp"

namespace cuw::cli {

namespace {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

/// How long the processes a try's command started may outlive it before fit stops them:
/// the rings are read only once every process of the try is gone.
constexpr auto kDescendantGrace = std::chrono::seconds(5);
/// How much of a try's standard error is kept, and how many of its last lines are shown
/// when it fails.
constexpr std::size_t kTailKeep = 32 * 1024;
constexpr std::size_t kTailLines = 20;
/// The wait status of a try fit could not start: as if it exited with 127, as a shell says.
constexpr int kCouldNotStart = 127 << 8;

volatile sig_atomic_t g_signal = 0;        // the last SIGINT/SIGTERM/SIGHUP fit received
volatile sig_atomic_t g_signal_count = 0;  // how many

void on_signal(int sig) {
  g_signal = sig;
  g_signal_count = g_signal_count + 1;
}

/// Caught only so that a child's exit wakes fit's poll() at once (with SA_RESTART, nothing
/// else in fit sees EINTR; poll() always does).
void on_child(int) {}

int usage_error(const std::string& msg) {
  std::fprintf(stderr, "cuwarden fit: %s\n", msg.c_str());
  return kExitUsage;
}

/// --try NAME=LO..HI.
struct Range {
  std::string name;
  uint64_t lo = 0, hi = 0;
};

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

/// `arg` with every `{NAME}` replaced by `value`.
std::string substitute(const std::string& arg, const std::string& placeholder, const std::string& value) {
  std::string out;
  std::size_t at = 0;
  for (std::size_t p = arg.find(placeholder); p != std::string::npos; p = arg.find(placeholder, at)) {
    out.append(arg, at, p - at).append(value);
    at = p + placeholder.size();
  }
  return out.append(arg, at, std::string::npos);
}

std::string uuid_text(const std::array<uint8_t, 16>& u) {
  return fmt::format(
      "GPU-{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}", u[0],
      u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

/// One GPU as the try's rings describe it, merged over the try's processes.
struct Device {
  std::array<uint8_t, 16> uuid{};
  int ordinal = -1;  ///< CUDA ordinal in the first process that used it
  std::string name;
  uint64_t peak = 0;                ///< the highest peak of any one process, bytes
  uint64_t limit = ring::kNoLimit;  ///< the cap a process had on it, bytes
  uint64_t refusals = 0, driver_errors = 0;
};

enum class Outcome { fits, too_big, failed };

const char* outcome_key(Outcome o) {
  switch (o) {
    case Outcome::fits: return "fits";
    case Outcome::too_big: return "does_not_fit";
    case Outcome::failed: return "failed";
  }
  return "failed";
}

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

/// "exit status 3" or "killed by signal 11 (Segmentation fault)".
std::string status_text(int st) {
  if (WIFEXITED(st)) return fmt::format("exit status {}", WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return fmt::format("killed by signal {} ({})", WTERMSIG(st), strsignal(WTERMSIG(st)));
  return "ended";
}

/// A private run directory with a listening socket where a daemon's would be, so that the
/// interposer leaves its ring in place at exit. Connections are accepted and closed at
/// once (the interposer only connects to see that someone listens); nothing is sent.
class RunDir {
 public:
  RunDir() = default;
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;
  ~RunDir() {
    if (fd_ >= 0) ::close(fd_);
    if (path_.empty()) return;
    clear(true);
    ::rmdir(path_.c_str());
  }

  /// Makes the directory under $TMPDIR (or /tmp, where a socket's path must fit in
  /// sockaddr_un) and listens. False with *err on failure.
  bool open(std::string* err) {
    std::string base = "/tmp";
    if (const char* t = std::getenv("TMPDIR"); t && *t == '/') base = paths::run_dir_from(t);
    const std::size_t room = sizeof(sockaddr_un{}.sun_path) - 1;
    const std::string leaf = "/cuwarden-fit-XXXXXX";
    const std::string sock_leaf = std::string("/") + paths::kRunDirSocketDir + "/" + paths::kSocketName;
    if (base.size() + leaf.size() + sock_leaf.size() > room) base = "/tmp";
    std::string tmpl = base + leaf;
    if (!::mkdtemp(tmpl.data())) {
      *err = "cannot make a directory in " + base + ": " + std::strerror(errno);
      return false;
    }
    path_ = tmpl;
    // Where the tries' interposer looks for a daemon (paths::socket_path_for with this run
    // directory): one listening keeps each try's ring for read_rings.
    const std::string sock = path_ + sock_leaf;
    if (::mkdir((path_ + "/" + paths::kRunDirSocketDir).c_str(), 0755) != 0) {
      *err = "cannot make " + path_ + "/" + paths::kRunDirSocketDir + ": " + std::strerror(errno);
      return false;
    }
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, sock.c_str(), sock.size() + 1);
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd_, 128) != 0) {
      *err = "cannot listen on " + sock + ": " + std::strerror(errno);
      return false;
    }
    return true;
  }

  const std::string& path() const { return path_; }
  int listen_fd() const { return fd_; }

  /// Accepts and closes every pending connection. Never blocks.
  void accept_all() const {
    for (int c; (c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC)) >= 0;) ::close(c);
  }

  /// Removes what the try's processes left (rings, job files); the socket stays unless `all`.
  void clear(bool all) const {
    DIR* d = ::opendir(path_.c_str());
    if (!d) return;
    const int dfd = ::dirfd(d);
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name == "." || name == ".." || (!all && name == paths::kRunDirSocketDir)) continue;
      if (name == paths::kRunDirSocketDir) ::unlinkat(dfd, (name + "/" + paths::kSocketName).c_str(), 0);
      if (::unlinkat(dfd, name.c_str(), 0) != 0 && errno == EISDIR) ::unlinkat(dfd, name.c_str(), AT_REMOVEDIR);
    }
    ::closedir(d);
  }

 private:
  std::string path_;
  int fd_ = -1;
};

/// Reads every ring in `dir` into `t`: per GPU the highest peak of one process, the cap,
/// refusals and the driver's failed allocations summed. Rings are untrusted input: mapped
/// read-only, validated, every count bounded.
void read_rings(const std::string& dir, Try& t) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  while (const dirent* e = ::readdir(d)) {
    uint32_t pid = 0;
    uint64_t start = 0;
    if (!paths::parse_ring_file_name(e->d_name, &pid, &start)) continue;
    const int fd = ::openat(::dirfd(d), e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st {};
    void* base = MAP_FAILED;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0)
      base = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (base == MAP_FAILED) continue;
    const auto size = static_cast<uint64_t>(st.st_size);
    if (ring::validate(base, size) == ring::Invalid::none) {
      const auto* h = static_cast<const ring::RingHeader*>(base);
      ++t.processes;
      const uint32_t n = std::min(h->device_count.load(std::memory_order_acquire), ring::kMaxDevices);
      for (uint32_t i = 0; i < n; ++i) {
        const ring::DeviceSlot& s = h->devices[i];
        if (s.present.load(std::memory_order_acquire) != 1) continue;
        std::array<uint8_t, 16> uuid{};
        std::memcpy(uuid.data(), s.uuid, uuid.size());
        auto it = std::find_if(t.devices.begin(), t.devices.end(), [&](const Device& x) { return x.uuid == uuid; });
        if (it == t.devices.end()) {
          Device nd;
          nd.uuid = uuid;
          nd.ordinal = static_cast<int>(i);
          nd.name.assign(s.name, strnlen(s.name, sizeof s.name));
          t.devices.push_back(nd);
          it = t.devices.end() - 1;
        }
        it->peak = std::max(it->peak, s.peak.load(std::memory_order_relaxed));
        const uint64_t lim = s.limit.load(std::memory_order_relaxed);
        if (lim != ring::kNoLimit && (it->limit == ring::kNoLimit || lim < it->limit)) it->limit = lim;
        it->refusals += s.refusals.load(std::memory_order_relaxed);
        it->driver_errors += s.driver_errors.load(std::memory_order_relaxed);
      }
    }
    ::munmap(base, size);
  }
  ::closedir(d);
  for (const Device& dv : t.devices) {
    t.refusals += dv.refusals;
    t.driver_errors += dv.driver_errors;
  }
}

/// This process's children now (orphans of a try reparent here: fit is a subreaper).
std::vector<pid_t> own_children() {
  std::vector<pid_t> out;
  std::ifstream f(fmt::format("/proc/self/task/{}/children", ::getpid()));
  for (long p; f >> p;) out.push_back(static_cast<pid_t>(p));
  return out;
}

/// What stays the same across tries.
struct Search {
  const FitOptions& o;
  Range range;
  RunDir dir;
  std::string placeholder;  ///< "{NAME}"
  std::string self;         ///< this executable, which runs each try as `cuwarden run`
};

/// Runs the command once with `value`, waits for it and every process it started, and
/// reads what their rings say.
Try run_try(Search& s, uint64_t value) {
  Try t;
  t.value = value;
  const std::string v = std::to_string(value);
  std::vector<std::string> args = {"cuwarden", "run", "--limit", s.o.limit};
  const std::pair<const char*, const std::string*> passed[] = {
      {"--pool", &s.o.pool}, {"--cap-scope", &s.o.cap_scope}, {"--lib", &s.o.lib}};
  for (const auto& [flag, val] : passed)
    if (!val->empty()) args.insert(args.end(), {flag, *val});
  args.push_back("--");
  for (const std::string& a : s.o.command) args.push_back(substitute(a, s.placeholder, v));
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  const auto started = Clock::now();
  int err_pipe[2];
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    t.tail = fmt::format("cuwarden fit: pipe: {}\n", std::strerror(errno));
    t.wait_status = kCouldNotStart;
    return t;
  }
  const bool pass_through = s.o.show_output;
  const pid_t pid = ::fork();
  if (pid < 0) {
    t.tail = fmt::format("cuwarden fit: fork: {}\n", std::strerror(errno));
    t.wait_status = kCouldNotStart;
    ::close(err_pipe[0]);
    ::close(err_pipe[1]);
    return t;
  }
  if (pid == 0) {
    // Its own process group, so that fit can stop everything a try started (fit forwards
    // the signals it receives to the group). Standard input: nothing (a search cannot
    // answer questions); standard output: ours to stderr, or nowhere, so that fit's own
    // output (--json) stays clean.
    ::setpgid(0, 0);
    const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    ::dup2(null, 0);
    ::dup2(pass_through ? 2 : null, 1);
    ::dup2(err_pipe[1], 2);
    ::execv(s.self.c_str(), argv.data());
    dprintf(2, "cuwarden fit: cannot run %s: %s\n", s.self.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: whichever runs first, the group exists before a signal goes to it
  ::close(err_pipe[1]);
  int rd = err_pipe[0];
  ::fcntl(rd, F_SETFL, O_NONBLOCK);

  const auto read_err = [&] {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(rd, buf, sizeof buf);
      if (n > 0) {
        if (pass_through) (void)!::write(2, buf, static_cast<size_t>(n));
        t.tail.append(buf, static_cast<size_t>(n));
        if (t.tail.size() > 2 * kTailKeep) t.tail.erase(0, t.tail.size() - kTailKeep);
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        ::close(rd);
        rd = -1;
      }
      return;
    }
  };

  bool done = false;
  int forwarded = 0;
  Clock::time_point deadline{};
  for (;;) {
    pollfd fds[2] = {{s.dir.listen_fd(), POLLIN, 0}, {rd, POLLIN, 0}};
    ::poll(fds, 2, 100);
    if (fds[0].revents & POLLIN) s.dir.accept_all();
    if (rd >= 0 && (fds[1].revents & (POLLIN | POLLHUP | POLLERR))) read_err();
    // Signals reach fit alone (the try has its own group): pass each on to the whole try.
    // A third one stops it for good.
    if (g_signal_count > forwarded) {
      forwarded = g_signal_count;
      t.interrupted = true;
      const int sig = forwarded >= 3 ? SIGKILL : g_signal;
      ::kill(-pid, sig);
      for (pid_t c : own_children()) ::kill(c, sig);
    }
    int st = 0;
    pid_t w;
    while ((w = ::waitpid(-1, &st, WNOHANG)) > 0)
      if (w == pid) {
        t.wait_status = st;
        done = true;
        // Interrupted: what is left goes at once, the user is waiting.
        deadline = Clock::now() + (t.interrupted ? std::chrono::seconds(1) : kDescendantGrace);
      }
    if (w < 0 && errno == ECHILD) break;  // the command and every process it started are gone
    if (done && Clock::now() > deadline) {
      // Processes the command left running would keep the GPU memory and their rings open.
      std::vector<pid_t> left = own_children();
      t.stopped = std::max(t.stopped, static_cast<int>(left.size()));
      ::kill(-pid, SIGKILL);
      for (pid_t c : left) ::kill(c, SIGKILL);
      deadline = Clock::now() + std::chrono::seconds(1);
    }
  }
  if (rd >= 0) read_err();
  if (rd >= 0) ::close(rd);
  s.dir.accept_all();
  t.seconds = std::chrono::duration<double>(Clock::now() - started).count();

  read_rings(s.dir.path(), t);
  s.dir.clear(false);
  const bool exited_ok = WIFEXITED(t.wait_status) && WEXITSTATUS(t.wait_status) == 0;
  if (exited_ok) t.outcome = Outcome::fits;
  else if (t.refusals + t.driver_errors > 0) t.outcome = Outcome::too_big;
  else t.outcome = Outcome::failed;
  return t;
}

/// "GPU 0 99.18 MiB, GPU 1 12.00 MiB", or why there is none.
std::string peaks_text(const Try& t) {
  if (t.devices.empty()) return t.processes ? "no GPU memory allocated" : "no CUDA use seen";
  std::string s;
  for (const Device& d : t.devices)
    s += fmt::format("{}GPU {} {}", s.empty() ? "" : ", ", d.ordinal, format_bytes(d.peak));
  return s;
}

/// "peak GPU 0 99.18 MiB", or why there is none, for a sentence.
std::string peak_clause(const Try& t) { return (t.devices.empty() ? "" : "peak ") + peaks_text(t); }

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

int cmd_fit(const FitOptions& o) {
  std::string err;
  if (!parse_limit(o.limit, &err)) return usage_error("bad --limit '" + o.limit + "': " + err);
  using options::Id;
  if (!o.pool.empty() && !options::is_literal(Id::CUWARDEN_POOL, o.pool))
    return usage_error("bad --pool '" + o.pool + "' (see cuwarden run --help)");
  if (!o.cap_scope.empty() && !options::is_literal(Id::CUWARDEN_CAP_SCOPE, o.cap_scope))
    return usage_error("bad --cap-scope '" + o.cap_scope + "' (see cuwarden run --help)");
  const auto range = parse_range(o.try_spec, &err);
  if (!range) return usage_error("bad --try '" + o.try_spec + "': " + err);
  if (o.command.empty()) return usage_error("no command given (cuwarden fit [options] -- CMD ... {NAME} ...)");
  const std::string placeholder = "{" + range->name + "}";
  if (std::none_of(o.command.begin(), o.command.end(),
                   [&](const std::string& a) { return a.find(placeholder) != std::string::npos; }))
    return usage_error("the command never mentions " + placeholder + ", so every try would be the same");

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
  enum class Result { found, all_fit, none_fit, failed, interrupted } result = Result::found;
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

}  // namespace cuw::cli
