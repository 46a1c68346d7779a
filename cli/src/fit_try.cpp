// cuwarden CLI: one try of `cuwarden fit` (fit.hpp): the command run through `cuwarden run`
// in its own process group with a private run directory, signals passed on, processes it left
// stopped, and the rings its processes kept read for the peaks and the refusals.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <fstream>

#include "cuw/paths.hpp"
#include "fit.hpp"

namespace cuw::cli::fit {

namespace {

using Clock = std::chrono::steady_clock;

/// How much of a try's standard error is kept.
constexpr std::size_t kTailKeep = 32 * 1024;
/// The wait status of a try fit could not start: as if it exited with 127, as a shell says.
constexpr int kCouldNotStart = 127 << 8;

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

}  // namespace

RunDir::~RunDir() {
  if (fd_ >= 0) ::close(fd_);
  if (path_.empty()) return;
  clear(true);
  ::rmdir(path_.c_str());
}

bool RunDir::open(std::string* err) {
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

void RunDir::accept_all() const {
  for (int c; (c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC)) >= 0;) ::close(c);
}

void RunDir::clear(bool all) const {
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

}  // namespace cuw::cli::fit
