// cuwardend: the cuwarden daemon. Finds the rings of interposed processes in the run
// directory, drains their events, notices exits, and answers the CLI on a unix socket.
//
// Two threads. The loop thread owns the model: one poll loop over signals (signalfd),
// directory changes (inotify), writes other threads ask for (LoopQueue), and two timers —
// drain every few ms, rescan (then publish a State and sample the history) every second.
// With --http, a third thread serves HTTP from the published States and the history (it
// never waits for the loop). The socket thread serves the unix socket (snapshots and
// reports on its small pool of threads): a query has the loop publish a State (one shared by
// the queries that waited for it together) and builds and sends its reply from it, so no
// client, slow or not, holds up draining; set_limit goes through the LoopQueue, run by the
// model on the loop thread. Snapshot frames are named in a worker process (cuwardend
// --symbolize-worker), and out-of-memory reports are named and saved to the state directory
// on a keeper thread.
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <cstring>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sstream>
#include <string>
#include <thread>

#include "base/loop_queue.hpp"
#include "base/util.hpp"
#include "cuw/paths.hpp"
#include "cuw/protocol.hpp"
#include "model/checkpoint_driver.hpp"
#include "model/fault_guard.hpp"
#include "model/frame_rules.hpp"
#include "model/nvml.hpp"
#include "model/oom_store.hpp"
#include "model/policy.hpp"
#include "model/registry.hpp"
#include "model/series.hpp"
#include "model/room_keeper.hpp"
#include "model/suspender.hpp"
#include "model/symbolize_worker.hpp"
#include "transports/handler.hpp"
#include "transports/http_routes.hpp"
#include "transports/http_server.hpp"
#include "transports/server.hpp"

namespace {

using cuw::daemon::mono_ns;

constexpr uint64_t kMs = 1'000'000;

struct Options {
  std::string socket;
  std::string run_dir;
  std::string pods_dir;  ///< --pods-dir: a name in the run directory (or its path there)
  std::string http;
  std::vector<std::string> http_hosts;
  std::string web_root;
  bool http_snapshots = false;
  std::string config;
  bool check_config = false;
  std::string log_level = "info";
  bool foreground = false;
  bool no_nvml = false;
  unsigned drain_interval_ms = 10;
  unsigned scan_interval_ms = 1000;
  double exited_linger_s = 60;
  std::size_t history = 10000;
  unsigned leak_sample_s = 30;  ///< how often live memory is sampled by call site (snapshot --leaks)
  double symbolize_timeout_s = 5;  ///< a symbolization worker is killed past it
  std::string frames_file;         ///< the site's frame classes (empty: the default, if present)
  std::string state_dir;           ///< out-of-memory reports across restarts ("": see kDefaultStateDir)
};

/// Where a daemon on the default run directory keeps its out-of-memory reports (the unit's
/// StateDirectory=). A daemon given another run directory (a test's, a user's own) keeps
/// them on disk only with --state-dir: it must not mix its reports with the system's.
constexpr const char* kDefaultStateDir = "/var/lib/cuwarden";

/// Takes the run directory's lock (flock on the directory itself: no file is left behind),
/// held for the daemon's life; the kernel drops it when the daemon dies, however it dies.
/// False when another process holds it; *holder is then its pid, found in /proc/locks by the
/// directory's inode (empty if not found).
bool lock_run_dir(int dirfd, std::string* holder) {
  if (flock(dirfd, LOCK_EX | LOCK_NB) == 0) return true;
  struct stat st {};
  if (fstat(dirfd, &st) != 0) return false;
  // "1: FLOCK  ADVISORY  WRITE 12345 00:1f:4242 0 EOF": pid, then major:minor:inode.
  const std::string inode = ":" + std::to_string(st.st_ino) + " ";
  std::FILE* f = std::fopen("/proc/locks", "re");
  if (!f) return false;
  char line[256];
  while (std::fgets(line, sizeof line, f)) {
    const std::string l(line);
    if (l.find("FLOCK") == std::string::npos || l.find(inode) == std::string::npos) continue;
    std::istringstream words(l);
    std::string w, pid;
    for (int i = 0; i < 5 && words >> w; ++i) pid = w;  // the fifth word
    if (!pid.empty() && pid.find_first_not_of("0123456789") == std::string::npos) *holder = pid;
  }
  std::fclose(f);
  return false;
}

/// Create the run directory if missing, sticky and world-writable like /tmp: every user's
/// interposed processes create their rings there. An existing one must be a real directory
/// (not a symlink), root's or the daemon's user's, and, if anyone may write to it, sticky:
/// otherwise another user could rename or delete other users' rings and the socket.
bool ensure_run_dir(const std::string& dir) {
  struct stat st{};
  if (lstat(dir.c_str(), &st) != 0) {
    if (mkdir(dir.c_str(), 01777) != 0 && errno != EEXIST) {
      spdlog::error("cannot create run directory {}: {}", dir, std::strerror(errno));
      return false;
    }
    if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      spdlog::error("run directory {} was replaced while being created", dir);
      return false;
    }
    if (st.st_uid == geteuid()) {
      chmod(dir.c_str(), 01777);  // mkdir's mode went through the umask
      spdlog::info("created run directory {}", dir);
    }
    return true;
  }
  if (S_ISLNK(st.st_mode)) {
    spdlog::error("run directory {} is a symbolic link; refusing to follow it", dir);
    return false;
  }
  if (!S_ISDIR(st.st_mode)) {
    spdlog::error("run directory {} exists and is not a directory", dir);
    return false;
  }
  if ((st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX)) {
    spdlog::error("run directory {} is world-writable but not sticky (chmod +t it): any user could "
                  "replace other users' rings",
                  dir);
    return false;
  }
  if (st.st_uid != 0 && st.st_uid != geteuid()) {
    spdlog::error("run directory {} belongs to uid {}, who may delete or replace any ring and the socket in it; "
                  "not using it: let root (or the daemon's user) create it, e.g. with systemd-tmpfiles",
                  dir, st.st_uid);
    return false;
  }
  return true;
}

/// Makes the socket's directory `dir` (paths::socket_path_for: /run/cuwarden, or daemon/ in a
/// run directory set), mode 0755, owned by the daemon's uid, so that no other user can bind
/// the socket's name while the daemon is stopped. One that is not a directory of ours (a link,
/// a file, another user's) is renamed aside by a root daemon and refused by any other.
bool ensure_socket_dir(const std::string& dir) {
  struct stat st {};
  if (lstat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode) && st.st_uid == geteuid()) {
      if (st.st_mode & (S_IWGRP | S_IWOTH)) chmod(dir.c_str(), 0755);
      return true;
    }
    const std::string what = S_ISLNK(st.st_mode)   ? "a symbolic link"
                             : !S_ISDIR(st.st_mode) ? "not a directory"
                                                    : "owned by uid " + std::to_string(st.st_uid);
    if (geteuid() != 0) {
      spdlog::error("socket directory {} is {}: not serving there (remove it, or give --socket)", dir, what);
      return false;
    }
    const std::string aside = dir + ".squatted-" + std::to_string(time(nullptr));
    if (rename(dir.c_str(), aside.c_str()) != 0) {
      spdlog::error("socket directory {} is {} and cannot be renamed aside: {}", dir, what, std::strerror(errno));
      return false;
    }
    spdlog::warn("socket directory {} was {}: renamed it to {}", dir, what, aside);
  }
  if (mkdir(dir.c_str(), 0755) != 0) {
    spdlog::error("cannot create socket directory {}: {}", dir, std::strerror(errno));
    return false;
  }
  chmod(dir.c_str(), 0755);  // mkdir's mode went through the umask
  return true;
}

/// <dir of this binary>/../share/cuwarden/web: the installed dashboard (/usr/bin ->
/// /usr/share/cuwarden/web), and the build tree's staged copy.
std::string default_web_root() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "/usr/share/cuwarden/web";
  std::string exe(buf, static_cast<std::size_t>(n));
  const std::size_t slash = exe.rfind('/');
  return exe.substr(0, slash) + "/../share/cuwarden/web";
}

/// --http's syntax, checked with the other arguments (exit 2) before the daemon takes its run
/// directory: the resolver takes a port number modulo 65536, so 99999 would serve 34463.
/// Returns "" when good, else why not.
std::string http_address_check(const std::string& address) {
  const std::size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return "expected HOST:PORT (e.g. 127.0.0.1:9477), got '" + address + "'";
  const std::string port = address.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoul(port) > 65535)
    return "port '" + port + "' in '" + address + "' is not a port number (0 to 65535)";
  return "";
}

/// cuwardend --check-config: what the daemon would say of the policy at start, on stderr,
/// without starting it. 0 when it would start, 78 (EX_CONFIG, its exit then) when not.
int check_config(const std::string& path) {
  if (path.empty()) {
    std::fprintf(stderr, "cuwardend: --check-config checks the file given with --config FILE\n");
    return 2;
  }
  std::vector<std::string> errors, warnings;
  const bool ok = cuw::daemon::load_policy(path, &errors, &warnings).has_value();
  for (const auto& w : warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  for (const auto& e : errors) std::fprintf(stderr, "error: %s\n", e.c_str());
  if (!ok) {
    std::fprintf(stderr, "cuwardend: %s has errors; cuwardend would not start with it (exit 78)\n", path.c_str());
    return 78;
  }
  std::printf("%s: the policy is valid\n", path.c_str());
  return 0;
}

int run(const Options& o) {
  cuw::daemon::Registry* reg_ptr = nullptr;
  std::shared_ptr<const cuw::daemon::Policy> loaded;
  const std::string run_dir = o.run_dir.empty() ? cuw::paths::run_dir() : o.run_dir;
  const char* socket_env = secure_getenv(cuw::options::get(cuw::options::Id::CUWARDEN_SOCKET).variable);
  const bool socket_given = !o.socket.empty() || (socket_env && *socket_env);
  const std::string socket_path =
      cuw::paths::socket_path_for(o.socket.empty() ? socket_env : o.socket.c_str(), run_dir.c_str());
  // The policy file: refused at start-up when it has errors; on SIGHUP a bad file keeps the
  // old policy (and says why).
  auto load = [&](bool startup) -> bool {
    if (o.config.empty()) return true;
    std::vector<std::string> errors, warnings;
    auto pol = cuw::daemon::load_policy(o.config, &errors, &warnings);
    for (const auto& w : warnings) spdlog::warn("policy: {}", w);
    if (!pol) {
      for (const auto& e : errors) spdlog::error("policy: {}", e);
      if (startup) spdlog::error("policy file {} has errors; not starting", o.config);
      else spdlog::error("policy file {} has errors; keeping the policy loaded before", o.config);
      return false;
    }
    if (reg_ptr) reg_ptr->set_policy(std::make_shared<const cuw::daemon::Policy>(std::move(*pol)));
    else loaded = std::make_shared<const cuw::daemon::Policy>(std::move(*pol));
    spdlog::info("policy {} {}", o.config, startup ? "loaded" : "reloaded (applied to every process and job again)");
    return true;
  };
  if (!load(true)) return 78;  // EX_CONFIG, like the interposer's bad configuration

  if (!ensure_run_dir(run_dir)) return 1;
  if (!socket_given && !ensure_socket_dir(socket_path.substr(0, socket_path.rfind('/')))) return 1;
  const int dirfd = open(run_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dirfd < 0) {
    spdlog::error("cannot open run directory {}: {}", run_dir, std::strerror(errno));
    return 1;
  }
  // One daemon per run directory, whatever socket it serves: two would drain the same rings,
  // and each event would reach one of them only.
  std::string holder;
  if (!lock_run_dir(dirfd, &holder)) {
    spdlog::error("another cuwardend{} is already running on the run directory {}: not starting a second one (it "
                  "would take events from the first)",
                  holder.empty() ? "" : " (pid " + holder + ")", run_dir);
    return 1;
  }

  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGHUP);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  const int sigfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  signal(SIGPIPE, SIG_IGN);
  cuw::daemon::install_fault_guard();

  const int infd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  // Watching: a scan without an event since the last one need not list the directory.
  const bool watching = infd >= 0 && inotify_add_watch(infd, run_dir.c_str(), IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE |
                                                                                   IN_DELETE | IN_MOVED_FROM | IN_ATTRIB |
                                                                                   IN_ONLYDIR) >= 0;
  if (!watching)
    spdlog::warn("inotify on {} unavailable ({}); rescanning every {} ms only", run_dir, std::strerror(errno),
                 o.scan_interval_ms);

  // Empties the inotify queue; whether it held anything (a scan is then due).
  const auto take_events = [infd] {
    bool any = false;
    alignas(inotify_event) char buf[8192];
    while (infd >= 0 && read(infd, buf, sizeof buf) > 0) any = true;
    return any;
  };

  cuw::daemon::Nvml nvml(!o.no_nvml);
  spdlog::info("NVML {}", nvml.available() ? "loaded" : "not available (GPU index/name from the rings only)");
  // The driver's checkpoint API (cuwarden suspend/resume); cuInit now, as a restore needs.
  cuw::daemon::CheckpointDriver checkpoint(true);
  spdlog::info("checkpoint API {}", checkpoint.available() ? "found (suspend and resume)" : "not available: " + checkpoint.why_not());

  cuw::daemon::RegistryOptions ro;
  ro.run_dir = run_dir;
  // The pods' directory is one name in the run directory: opened there without following a
  // link, and each pod's ring path stays relative to the run directory.
  ro.pods_dir = o.pods_dir.rfind(run_dir + "/", 0) == 0 ? o.pods_dir.substr(run_dir.size() + 1) : o.pods_dir;
  if (!ro.pods_dir.empty() && (ro.pods_dir.find('/') != std::string::npos || ro.pods_dir[0] == '.')) {
    spdlog::error("--pods-dir {}: must be a directory directly in the run directory {}", o.pods_dir, run_dir);
    return 1;
  }
  ro.watch_fd = watching ? infd : -1;
  ro.history_per_process = std::max<std::size_t>(o.history, 1);
  ro.exited_linger_ns = static_cast<uint64_t>(std::max(0.0, o.exited_linger_s) * 1e9);
  ro.sample_every_ns = uint64_t{o.leak_sample_s} * 1'000'000'000ULL;
  cuw::daemon::Registry reg(ro, dirfd, &nvml);
  reg.set_policy(loaded);
  reg_ptr = &reg;

  // Out-of-memory reports and the event history from before this start, read back as
  // untrusted input.
  cuw::daemon::EventJournal journal;
  const std::string state_dir =
      !o.state_dir.empty() ? o.state_dir : run_dir == cuw::paths::kDefaultRunDir ? kDefaultStateDir : "";
  std::unique_ptr<cuw::daemon::OomStore> oom_store;
  if (!state_dir.empty()) {
    oom_store = std::make_unique<cuw::daemon::OomStore>(state_dir);
    std::string why;
    if (!oom_store->open(&why)) {
      if (!o.state_dir.empty()) {
        spdlog::error("--state-dir: {}", why);
        return 1;
      }
      spdlog::warn("{}; out-of-memory reports are kept in memory only", why);
      oom_store.reset();
    } else {
      std::vector<std::string> skipped;
      const auto reports = oom_store->load(&skipped);
      for (const std::string& s : skipped) spdlog::warn("not an out-of-memory report, skipped: {}", s);
      reg.restore_oom_reports(reports);
      std::size_t events = 0;
      if (journal.open(state_dir + "/events.journal", &why)) {
        uint64_t max_seq = 0;
        auto restored = journal.read_back(&max_seq);
        for (const auto& [key, v] : restored) events += v.size();
        reg.restore_history(std::move(restored), max_seq);
        reg.set_journal(&journal);
      } else {
        spdlog::warn("{}; the event history is kept in memory only", why);
      }
      spdlog::info("state directory {}: {} out-of-memory reports and {} events read back", state_dir, reports.size(),
                   events);
      reg.set_suspend_dir(state_dir + "/suspended");
    }
  } else {
    spdlog::info("no --state-dir: out-of-memory reports are kept in memory only");
  }

  cuw::daemon::SeriesStore series;
  cuw::daemon::LoopQueue writes;
  cuw::daemon::Backend backend;
  backend.store = &reg.store();
  cuw::daemon::SymbolizeOptions symbolize;  // names snapshot frames, in a worker process
  symbolize.deadline_ns = static_cast<uint64_t>(o.symbolize_timeout_s * 1e9);
  backend.symbolize = &symbolize;
  if (std::string why; !cuw::daemon::load_frame_rules(o.frames_file.empty() ? cuw::daemon::kDefaultFramesFile : o.frames_file,
                                                      !o.frames_file.empty(), &symbolize.frames, &why))
    throw std::runtime_error("--frames: " + why);
  backend.series = &series;
  // Ring headers are authoritative and a query promises them as they are now: the loop
  // publishes a State read after the query came. Queries waiting together share that
  // publish (SharedLoopCall): a burst of them, from the socket's lane and its pool at once,
  // costs the loop one publish, not one each. Building the reply and sending it stay on the
  // socket thread, or on its pool for snapshots and reports.
  // A ring created before the query (its inotify event still queued, or its header not yet
  // written when the event was handled) is looked at before the answer, so that a program
  // that has just run is in it.
  bool scan_now = false;  // an inotify event (or SIGHUP) asks for a scan; the loop's, and queries'
  cuw::daemon::SharedLoopCall query_publish(writes, [&reg, &take_events, &scan_now] {
    if (take_events() || scan_now || reg.retry_soon()) reg.scan();
    reg.publish();
  });
  backend.refresh = [&query_publish] { query_publish.call(); };
  backend.set_limit = [&](const cuw::daemon::Peer& peer, const cuw::daemon::LimitRequest& req) {
    return writes.call([&] { return reg.set_limit_and_publish(peer, req); });
  };
  // Suspend and resume on the server's pool too (a lock may wait its whole timeout); the
  // registry's checks and records on the loop.
  cuw::daemon::Suspender suspender(checkpoint, reg, [&writes](const std::function<void()>& f) { writes.call(f); });
  backend.suspend = [&](const cuw::daemon::Peer& peer, const cuw::daemon::SuspendRequest& req) {
    return suspender.run(peer, req);
  };
  // By policy: a room request on the pool as well; resumes on a thread of their own (below).
  cuw::daemon::RoomKeeper room_keeper(suspender, reg, [&writes](const std::function<void()>& f) { writes.call(f); });
  if (checkpoint.available())
    backend.room = [&](const cuw::daemon::Peer& peer, const cuw::daemon::RoomRequest& req) {
      return room_keeper.ask(peer, req);
    };
  // Snapshots and reports on the server's pool; limits and state at once, never behind them.
  cuw::daemon::Server server(
      [&](const cuw::daemon::Peer& peer, uint16_t cmd, const std::string& body) {
        return cuw::daemon::handle_request(backend, peer, cmd, body);
      },
      &cuw::daemon::slow_command);
  std::string err;
  if (!server.listen(socket_path, &err)) {
    spdlog::error("{}", err);
    return 1;
  }
  spdlog::info("cuwardend {} serving {} (run dir {})", CUWARDEN_VERSION, socket_path, run_dir);
  // The previous release's clients, told where the daemon is now (not when a socket was given).
  std::unique_ptr<cuw::daemon::Server> previous =
      socket_given ? nullptr : cuw::daemon::Server::for_previous_release(run_dir, socket_path, CUWARDEN_VERSION);

  // HTTP: bound before anything starts, so that a taken port stops the daemon at once.
  std::unique_ptr<cuw::daemon::HttpApi> http_api;
  std::unique_ptr<cuw::daemon::HttpServer> http;
  if (!o.http.empty()) {
    cuw::daemon::HttpApiOptions ho;
    ho.web_root = o.web_root.empty() ? default_web_root() : o.web_root;
    ho.snapshots = o.http_snapshots;
    http_api = std::make_unique<cuw::daemon::HttpApi>(&reg.store(), &series, &symbolize, ho);
    auto* api = http_api.get();
    cuw::daemon::HttpServer::Limits limits;
    limits.host_names = o.http_hosts;
    http = std::make_unique<cuw::daemon::HttpServer>(
        [api](const cuw::daemon::HttpRequest& r) { return api->handle(r); }, &cuw::daemon::HttpApi::slow,
        [api](cuw::daemon::StreamCursor& c, uint64_t now) { return api->feed(c, now); }, limits);
    if (!http->listen(o.http, &err)) {
      spdlog::error("{}", err);
      return 1;
    }
    spdlog::info("serving HTTP on {} (port {}): /metrics, /api/v1/..., the dashboard from {}", o.http, http->port(),
                 ho.web_root);
    if (!http->loopback())
      spdlog::warn("HTTP listens beyond this machine ({}): whoever reaches it reads every process's memory state{}",
                   o.http, o.http_snapshots ? " and snapshots (--http-snapshots)" : "");
    else if (o.http_snapshots)
      spdlog::warn("--http-snapshots: every local user may read every process's snapshot (its files and functions) over "
                   "HTTP");
  }

  const int stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (stop_fd < 0) {
    spdlog::error("eventfd: {}", std::strerror(errno));
    return 1;
  }
  // Reports are named (a worker) and saved (a disk) on the keeper's thread, never the loop's;
  // the named one then takes the taken one's place. The queue is closed before the keeper is
  // joined (a keeper waiting on it gives up). Set before the first scan, which may take
  // reports too.
  cuw::daemon::OomKeeper oom_keeper(
      oom_store.get(), &symbolize,
      [&writes, &reg](const std::shared_ptr<const cuw::daemon::OomReport>& taken,
                      std::shared_ptr<const cuw::daemon::OomReport> named) {
        try {
          writes.call([&] { reg.replace_oom_report(taken.get(), std::move(named)); });
        } catch (const std::exception&) {  // the daemon is stopping: the file is written already
        }
      });
  reg.set_oom_listener([&oom_keeper](const std::shared_ptr<const cuw::daemon::OomReport>& r) { oom_keeper.submit(r); });
  struct CloseWrites {  // however run() ends from here, the keeper never waits on a dead loop
    cuw::daemon::LoopQueue& q;
    ~CloseWrites() { q.close_queue(); }
  } close_writes{writes};
  reg.scan();
  reg.publish();
  series.record(*reg.store().load());
  std::thread http_thread;
  if (http)
    http_thread = std::thread([&] {
      ::pthread_setname_np(::pthread_self(), "cuwardend-http");  // (top -H, /proc/PID/task/*/comm)
      try {
        http->run(stop_fd);
      } catch (const std::exception& e) {
        spdlog::critical("HTTP thread: {}; stopping", e.what());
        ::kill(::getpid(), SIGTERM);
      }
    });
  std::thread socket_thread([&] {
    ::pthread_setname_np(::pthread_self(), "cuwardend-sock");
    try {
      cuw::daemon::serve_until(server, previous.get(), stop_fd);
    } catch (const std::exception& e) {
      // Not served, not drained either: stop the daemon the way a signal does.
      spdlog::critical("socket thread: {}; stopping", e.what());
      ::kill(::getpid(), SIGTERM);
    }
  });
  std::thread resume_thread;
  if (checkpoint.available()) resume_thread = std::thread([&] { room_keeper.resume_loop(stop_fd); });
  // However the loop ends (a signal, or an exception on its way to "fatal" in main), calls
  // still waiting fail ("the daemon is stopping") and the socket thread, which may be
  // blocked in one, is stopped and joined before what it uses goes.
  struct StopSocketThread {
    cuw::daemon::LoopQueue& writes;
    int stop_fd;
    std::thread& thread;
    std::thread& http_thread;
    std::thread& resume_thread;
    void stop() {
      if (!thread.joinable() && !http_thread.joinable() && !resume_thread.joinable()) return;
      writes.close_queue();
      const uint64_t one = 1;
      (void)!write(stop_fd, &one, sizeof one);
      if (thread.joinable()) thread.join();
      if (http_thread.joinable()) http_thread.join();
      if (resume_thread.joinable()) resume_thread.join();
    }
    ~StopSocketThread() { stop(); }
  } stop_socket_thread{writes, stop_fd, socket_thread, http_thread, resume_thread};
  // A State is built after every scan and write, and when a query asks for one: not per
  // drain, which would copy every ring's header a hundred times a second for no reader.
  uint64_t next_drain = mono_ns();
  uint64_t last_publish = mono_ns();
  uint64_t next_scan = mono_ns() + o.scan_interval_ms * kMs;
  // inotify wakes a scan at once, but no more often than this: a user who touches files in a
  // loop must not buy a scan and a publish per touch.
  constexpr uint64_t kMinEventScanNs = 20 * kMs;
  constexpr uint64_t kRetryScanNs = 10 * kMs;  // a ring being created: its header comes in a moment
  uint64_t last_scan = 0;
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({sigfd, POLLIN, 0});
    fds.push_back({infd, static_cast<short>(infd >= 0 ? POLLIN : 0), 0});
    fds.push_back({writes.fd(), POLLIN, 0});
    const uint64_t now = mono_ns();
    const uint64_t wake = std::min({next_drain, next_scan, scan_now ? last_scan + kMinEventScanNs : next_scan});
    const int timeout_ms = wake <= now ? 0 : static_cast<int>((wake - now + kMs - 1) / kMs);
    const int n = poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) {
      spdlog::error("poll: {}", std::strerror(errno));
      break;
    }
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo si{};
      if (read(sigfd, &si, sizeof si) == sizeof si) {
        if (si.ssi_signo == SIGHUP) {
          load(false);
          scan_now = true;
        } else {
          spdlog::info("signal {}: exiting", si.ssi_signo);
          break;
        }
      }
    }
    if ((fds[1].revents & POLLIN) && take_events()) scan_now = true;
    if (fds[2].revents & POLLIN) writes.run_pending();

    uint64_t t = mono_ns();
    if (t >= next_drain) {
      const uint64_t seq_before = reg.last_seq();
      // Adaptive: at once while a ring overflows one tick's budget, within a millisecond
      // while one is being written fast, else after the idle interval.
      switch (reg.drain_all()) {
        case cuw::daemon::Registry::DrainPace::again: next_drain = t; break;
        case cuw::daemon::Registry::DrainPace::soon: next_drain = t + std::min<uint64_t>(kMs, o.drain_interval_ms * kMs); break;
        case cuw::daemon::Registry::DrainPace::idle: next_drain = t + o.drain_interval_ms * kMs; break;
        case cuw::daemon::Registry::DrainPace::all_idle:
          next_drain = t + cuw::daemon::Registry::kIdleStride * o.drain_interval_ms * kMs;
          break;
      }
      // Event-stream clients see new events within a quarter second, not at the next scan.
      if (http && http->stream_count() > 0 && reg.last_seq() != seq_before && t - last_publish >= 250 * kMs) {
        reg.publish();
        last_publish = t;
      }
    }
    const bool periodic = t >= next_scan;
    if (periodic || (scan_now && t - last_scan >= kMinEventScanNs)) {
      reg.scan(scan_now || !watching, periodic || !watching);
      last_scan = t;
      reg.publish();
      series.record(*reg.store().load());
      last_publish = mono_ns();
      scan_now = false;
      next_scan = mono_ns() + (reg.retry_soon() ? kRetryScanNs : o.scan_interval_ms * kMs);
    }
  }
  stop_socket_thread.stop();
  close(stop_fd);
  server.shutdown();
  if (previous) previous->shutdown();
  // What the linger would have removed: no daemon is left to remove it later. A scan first
  // notices exits that came since the last one (those processes left their rings to us).
  reg.scan();
  if (const std::size_t n = reg.remove_exited()) spdlog::info("removed the rings of {} exited process(es)", n);
  if (infd >= 0) close(infd);
  if (sigfd >= 0) close(sigfd);
  spdlog::info("cuwardend stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The symbolization worker: nothing of the daemon's start-up (model/symbolize_worker.hpp).
  // _exit: its answer is written already, and a sanitizer's exit-time checks (LeakSanitizer
  // stops the process with ptrace) would fail under its seccomp filter.
  if (argc == 2 && std::strcmp(argv[1], cuw::daemon::kSymbolizeWorkerFlag) == 0)
    ::_exit(cuw::daemon::symbolize_worker_main());
  CLI::App app{"cuwardend: the cuwarden daemon (collects what interposed processes do; answers `cuwarden`)"};
  Options o;
  app.set_version_flag("--version", std::string("cuwardend ") + CUWARDEN_VERSION);
  app.add_option("--socket", o.socket,
                 "unix socket to serve (default: $CUWARDEN_SOCKET, else daemon/cuwardend.sock in a run directory "
                 "set, else /run/cuwarden/cuwardend.sock)");
  app.add_option("--run-dir", o.run_dir,
                 std::string("where rings live (default: $CUWARDEN_RUN_DIR or ") + cuw::paths::kDefaultRunDir + ")");
  app.add_option("--pods-dir", o.pods_dir,
                 "a directory in the run directory each of whose subdirectories is a pod's own run directory");
  app.add_option("--http", o.http,
                 "serve HTTP (read only) on HOST:PORT, e.g. 127.0.0.1:9477: /metrics, the JSON API, the dashboard")
      ->check(http_address_check, "HOST:PORT");
  app.add_option("--http-host", o.http_hosts,
                 "a host name HTTP answers to besides IP addresses and localhost (repeatable): a request naming any "
                 "other is refused (421), so that a web page cannot rebind its name to this machine");
  app.add_option("--web-root", o.web_root, "the dashboard's files (default: ../share/cuwarden/web beside the binary)");
  app.add_flag("--http-snapshots", o.http_snapshots,
               "serve snapshots (call sites: file and function names) over HTTP, to whoever can reach it");
  app.add_option("--config", o.config,
                 "policy file (TOML): default and maximum caps per user and group; reloaded on SIGHUP");
  app.add_flag("--foreground", o.foreground, "stay in the foreground (cuwardend always does; use systemd or &)");
  app.add_option("--log-level", o.log_level, "trace, debug, info, warn, error, critical, off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "warning", "error", "critical", "off"}));
  app.add_flag("--no-nvml", o.no_nvml, "do not load libnvidia-ml.so.1");
  app.add_option("--drain-interval-ms", o.drain_interval_ms, "how often rings are drained")
      ->check(CLI::Range(1u, 1000u));
  app.add_option("--scan-interval-ms", o.scan_interval_ms, "how often the run directory is rescanned")
      ->check(CLI::Range(10u, 60000u));
  app.add_option("--exited-linger", o.exited_linger_s, "seconds an exited process stays visible")
      ->check(CLI::Range(0.0, 86400.0));
  app.add_option("--history", o.history, "events kept per process")->check(CLI::Range(1, 10000000));
  app.add_option("--leak-sample", o.leak_sample_s,
                 "seconds between samples of each process's live memory by call site (cuwarden snapshot --leaks "
                 "looks at the last 20)")
      ->check(CLI::Range(1u, 3600u));
  app.add_option("--state-dir", o.state_dir,
                 std::string("where out-of-memory reports are kept across restarts (mode 0700; default: ") +
                     kDefaultStateDir + " with the default run directory, else in memory only)");
  app.add_option("--symbolize-timeout", o.symbolize_timeout_s,
                 "seconds a snapshot's frames may take to name; frames left are shown by module and offset")
      ->check(CLI::Range(0.1, 600.0));
  app.add_option("--frames", o.frames_file,
                 std::string("the site's frame classes (TOML [[rule]] path, class), before the built-in ones (default: ") +
                     cuw::daemon::kDefaultFramesFile + " when present)");
  app.add_flag("--check-config", o.check_config,
               "check the policy file given with --config, print what is wrong with it, and exit: 0 when it is "
               "good, 78 when the daemon would refuse it");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a bad flag 2, as `cuwarden` (CLI11's own codes are 100+).
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (o.check_config) return check_config(o.config);

  auto logger = spdlog::stderr_color_mt("cuwardend");
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(o.log_level == "warning" ? "warn" : o.log_level));
  // A pidfd per watched process (model/registry.cpp) beside the clients' sockets: the usual
  // soft limit of 1024 descriptors would be short with a few hundred processes.
  if (rlimit rl{}; getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    spdlog::critical("fatal: {}", e.what());
    return 1;
  }
}
