// cuwarden integration tests: fixtures shared by daemon_* and cli_* suites — temporary run
// directories, fake interposed processes (rings written with the common API), a cuwardend
// subprocess, and running a command with a timeout.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ftw.h>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuw/paths.hpp"
#include "cuw/protocol.hpp"
#include "cuw/ring.hpp"

extern char** environ;

namespace cuwt {

using nlohmann::json;
namespace ring = cuw::ring;

inline constexpr uint64_t kMiB = 1ULL << 20;

/// Poll `pred` every 20 ms until it holds (true) or `timeout_ms` passes (false). The bound is
/// for a condition that never comes (a hang or a bug), not for a slow one: a loaded machine
/// may take seconds where an idle one takes milliseconds, and a condition that holds returns
/// at once, so the default is generous.
template <class F>
bool wait_until(F&& pred, int timeout_ms = 30000) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

inline uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

/// mkdtemp'd directory, removed with its contents at the end. Short path: sockets need it.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/cuwt-XXXXXX";
    if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    path = tmpl;
  }
  ~TempDir() {
    nftw(path.c_str(), [](const char* p, const struct stat*, int, FTW*) { return ::remove(p); }, 16,
         FTW_DEPTH | FTW_PHYS);
  }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

/// A child process (default: a long sleep) whose pid a fake ring can claim.
struct Child {
  pid_t pid = -1;
  explicit Child(std::vector<std::string> argv = {"sleep", "300"}) {
    std::vector<char*> a;
    for (auto& s : argv) a.push_back(s.data());
    a.push_back(nullptr);
    if (posix_spawnp(&pid, a[0], nullptr, nullptr, a.data(), environ) != 0) throw std::runtime_error("spawn failed");
  }
  uint64_t start_time() const { return cuw::paths::process_start_time(static_cast<uint32_t>(pid)); }
  void kill_and_reap() {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = -1;
  }
  ~Child() { kill_and_reap(); }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
};

/// What an interposed process writes: a ring file in the run directory, made with the
/// common API, with counters set by the test.
struct FakeRing {
  std::string path;
  void* base = nullptr;
  uint64_t size = 0;
  uint32_t slot_count = 0;
  ring::RingHeader* h = nullptr;
  ring::EventSlot* slots = nullptr;

  FakeRing(const std::string& run_dir, uint32_t pid, uint64_t start_time, uint32_t slots_n = 1024,
           const char* comm = "fakeproc", const char* job = "", const char* pool = "off")
      : FakeRing(run_dir + "/" + cuw::paths::ring_file_name(pid, start_time), pid, start_time, slots_n, comm, job,
                 pool, true) {}

  /// Whose ring it is: its header's uid and the file's owner, both set before the ring
  /// appears under its name (a daemon scanning between the two would judge a root ring of
  /// another user's process, and look again only when the file changes).
  struct Owner {
    uid_t uid;
    gid_t gid;
  };
  FakeRing(const std::string& run_dir, uint32_t pid, uint64_t start_time, Owner owner, uint32_t slots_n = 1024,
           const char* comm = "fakeproc")
      : FakeRing(run_dir + "/" + cuw::paths::ring_file_name(pid, start_time), pid, start_time, slots_n, comm, "",
                 "off", true, owner) {}

  FakeRing(const std::string& file, uint32_t pid, uint64_t start_time, uint32_t slots_n, const char* comm,
           const char* job, const char* pool, bool, Owner owner = {::getuid(), ::getgid()}) {
    path = file;
    slot_count = slots_n;
    size = ring::file_size(slots_n);
    // Written under a temporary name and renamed into place, as a careful producer would.
    const std::string tmp = file + ".tmp";
    int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error("open " + tmp + ": " + std::strerror(errno));
    if (ftruncate(fd, static_cast<off_t>(size)) != 0) throw std::runtime_error("ftruncate");
    base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (base == MAP_FAILED) throw std::runtime_error("mmap");
    h = static_cast<ring::RingHeader*>(base);
    slots = reinterpret_cast<ring::EventSlot*>(static_cast<char*>(base) + ring::kHeaderBytes);
    h->pid = pid;
    h->uid = owner.uid;
    h->start_time = start_time;
    h->created_ns = now_ns();
    std::snprintf(h->comm, sizeof h->comm, "%s", comm);
    std::snprintf(h->cmdline, sizeof h->cmdline, "%s --epochs 3", comm);
    std::snprintf(h->job, sizeof h->job, "%s", job);
    std::snprintf(h->pool, sizeof h->pool, "%s", pool);
    ring::init(*h, slots, slots_n);
    h->state.store(static_cast<uint32_t>(ring::ProcessState::running));
    if (::chown(tmp.c_str(), owner.uid, owner.gid) != 0) throw std::runtime_error("chown " + tmp);
    if (::rename(tmp.c_str(), file.c_str()) != 0) throw std::runtime_error("rename");
  }
  ~FakeRing() {
    if (base) munmap(base, size);
  }
  FakeRing(const FakeRing&) = delete;
  FakeRing& operator=(const FakeRing&) = delete;

  /// Fill device slot `ordinal`; uuid bytes are seed, seed+1, ...
  ring::DeviceSlot& device(int ordinal, uint8_t seed, const char* name = "NVIDIA H200",
                           uint64_t total = 143771ULL * kMiB) {
    ring::DeviceSlot& d = h->devices[ordinal];
    for (int i = 0; i < 16; ++i) d.uuid[i] = static_cast<uint8_t>(seed + i);
    std::snprintf(d.name, sizeof d.name, "%s", name);
    d.physical_total = total;
    d.present.store(1);
    if (h->device_count.load() < static_cast<uint32_t>(ordinal + 1)) h->device_count.store(ordinal + 1);
    return d;
  }

  bool push(ring::EventKind kind, ring::Api api, int device, uint64_t bytes, uint64_t address, uint64_t used_after) {
    ring::Event e;
    e.time_ns = now_ns();
    e.kind = static_cast<uint8_t>(kind);
    e.api = static_cast<uint16_t>(api);
    e.device = static_cast<int8_t>(device);
    e.bytes = bytes;
    e.address = address;
    e.used_after = used_after;
    e.tid = static_cast<uint32_t>(getpid());
    return ring::push(*h, slots, slot_count, e);
  }
};

/// UUID string the daemon should print for seed `s` (bytes s, s+1, ...).
inline std::string uuid_for(uint8_t s) {
  char buf[64];
  uint8_t b[16];
  for (int i = 0; i < 16; ++i) b[i] = static_cast<uint8_t>(s + i);
  std::snprintf(buf, sizeof buf, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return buf;
}

struct CmdResult {
  int status = -1;  ///< exit code, or 128+signal, or -1 on timeout
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::string s;
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    std::fclose(f);
  }
  return s;
}

/// Run argv with extra environment, stdout/stderr captured; killed after timeout_ms.
inline CmdResult run_cmd(const std::vector<std::string>& argv, const std::vector<std::string>& env_extra = {},
                         int timeout_ms = 10000) {
  TempDir io;
  const std::string out = io / "out", err = io / "err";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    bool overridden = false;
    for (const auto& x : env_extra)
      if (kv.substr(0, kv.find('=') + 1) == x.substr(0, x.find('=') + 1)) overridden = true;
    if (!overridden) env.push_back(kv);
  }
  for (const auto& x : env_extra) env.push_back(x);
  std::vector<char*> a, e;
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) a.push_back(s.data());
  a.push_back(nullptr);
  for (auto& s : env) e.push_back(s.data());
  e.push_back(nullptr);
  pid_t pid;
  CmdResult r;
  if (posix_spawn(&pid, a[0], &fa, nullptr, a.data(), e.data()) != 0) return r;
  posix_spawn_file_actions_destroy(&fa);
  int st = 0;
  bool done = wait_until([&] { return waitpid(pid, &st, WNOHANG) == pid; }, timeout_ms);
  if (!done) {
    ::kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    r.status = -1;
  } else {
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

/// cuwardend as a subprocess on a temporary run dir and socket; stopped with SIGTERM.
struct Daemon {
  std::string run_dir, socket, log;
  pid_t pid = -1;

  /// `nvml`: the daemon loads NVML (the simulated one, when this process's LD_LIBRARY_PATH
  /// points at it) instead of running with --no-nvml.
  explicit Daemon(const TempDir& dir, std::vector<std::string> extra = {}, bool wait = true, bool nvml = false)
      : run_dir(dir / "run"), socket(dir / "d.sock"), log(dir / "daemon.log") {
    std::vector<std::string> argv = {CUWT_DAEMON, "--run-dir", run_dir, "--socket", socket, "--log-level", "debug"};
    if (!nvml) argv.push_back("--no-nvml");
    for (auto& x : extra) argv.push_back(x);
    start(argv);
    if (wait && !wait_ready()) throw std::runtime_error("cuwardend did not start: " + slurp(log));
  }
  void start(std::vector<std::string> argv) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    std::vector<char*> a;
    for (auto& s : argv) a.push_back(s.data());
    a.push_back(nullptr);
    if (posix_spawn(&pid, a[0], &fa, nullptr, a.data(), environ) != 0) throw std::runtime_error("spawn cuwardend");
    posix_spawn_file_actions_destroy(&fa);
  }
  bool wait_ready() {
    return wait_until([&] {
      std::string why;
      return cuw::proto::request(socket, cuw::proto::Command::get_state, "{}", 10000, &why).has_value();
    });
  }
  bool alive() const { return pid > 0 && ::kill(pid, 0) == 0 && waitpid(pid, nullptr, WNOHANG) == 0; }
  /// SIGTERM, then wait (SIGKILL after 5 s). Returns the exit code, 128+signal if killed.
  int stop() {
    if (pid <= 0) return -1;
    ::kill(pid, SIGTERM);
    int st = 0;
    if (!wait_until([&] { return waitpid(pid, &st, WNOHANG) == pid; }, 5000)) {
      ::kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
    }
    pid = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  ~Daemon() { stop(); }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  json state() const {
    std::string why;
    // 10 s: against a daemon that stopped answering, not a slow one (as wait_until).
    auto m = cuw::proto::request(socket, cuw::proto::Command::get_state, "{}", 10000, &why);
    if (!m) throw std::runtime_error("get_state failed: " + why);
    return json::parse(m->body);
  }
  json events(const json& body) const {
    std::string why;
    auto m = cuw::proto::request(socket, cuw::proto::Command::get_events, body.dump(), 10000, &why);
    if (!m) throw std::runtime_error("get_events failed: " + why);
    return json::parse(m->body);
  }
  /// The process entry for `pid` in the state, or null.
  json process(uint32_t p) const {
    const json st = state();  // not `: state()["processes"]`: the temporary would die first
    for (const auto& x : st["processes"])
      if (x["pid"] == p) return x;
    return nullptr;
  }
};

/// A raw client connection to the daemon's socket (for garbage-sending tests).
inline int connect_raw(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// Wait up to timeout_ms for `fd` to be closed by the peer (recv returns 0 or an error).
/// Whether `fd` is still connected right now: the peer has not hung up, whether or not
/// unread bytes wait in front of its hang-up.
inline bool still_open(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) == 0 || !(p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

inline bool peer_closed(int fd, int timeout_ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  char buf[256];
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) > 0) {
      ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n <= 0) return true;
    }
  }
  return false;
}

/// The whole response to GET `path` on 127.0.0.1:`port`, status line, headers and body ("" when
/// nothing came back; waits at most 5 s for each read).
inline std::string http_get(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string got;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) got.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  return got;
}

/// Body of GET `path` on 127.0.0.1:`port` ("" when nothing came back).
inline std::string http_body(int port, const std::string& path) {
  const std::string got = http_get(port, path);
  const std::size_t at = got.find("\r\n\r\n");
  return at == std::string::npos ? std::string() : got.substr(at + 4);
}

/// Status line of GET `path` on 127.0.0.1:`port` ("" when nothing came back).
inline std::string http_status_line(int port, const std::string& path) {
  const std::string got = http_get(port, path);
  return got.substr(0, got.find("\r\n"));
}

}  // namespace cuwt
