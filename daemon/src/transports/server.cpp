// cuwarden daemon: non-blocking unix-socket server (see server.hpp).
#include "transports/server.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "base/util.hpp"
#include "cuw/job.hpp"
#include "cuw/paths.hpp"
#include "cuw/protocol.hpp"

namespace cuw::daemon {

namespace {

bool make_addr(const std::string& path, sockaddr_un* addr, std::string* error) {
  *addr = {};
  addr->sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr->sun_path) {
    *error = "socket path too long (max " + std::to_string(sizeof addr->sun_path - 1) + " bytes): " + path;
    return false;
  }
  std::memcpy(addr->sun_path, path.c_str(), path.size() + 1);
  return true;
}

std::string error_body(const std::string& what) { return nlohmann::json{{"error", what}}.dump(); }

}  // namespace

/// The pool: threads that run slow requests, a queue in, a queue out and an eventfd that
/// wakes the socket's thread when something came out.
struct Server::Pool {
  struct Job {
    uint64_t conn = 0;
    uint32_t uid = 0, seq = 0;
    Peer peer;
    uint16_t command = 0;
    std::string body;
    std::shared_ptr<bool> gone;
  };
  struct Done {
    uint64_t conn = 0;
    uint32_t uid = 0, seq = 0;
    bool dropped = false;
    Reply reply;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Job> jobs;
  std::deque<Done> done;
  bool stop = false;
  int wake_fd = -1;
  std::vector<std::thread> threads;

  void work(const Handler& handler) {
    for (;;) {
      Job job;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stop || !jobs.empty(); });
        if (jobs.empty()) return;
        job = std::move(jobs.front());
        jobs.pop_front();
        if (*job.gone) {  // its client gave up while it waited: not run at all
          done.push_back(Done{job.conn, job.uid, job.seq, true, Reply{job.command, {}}});
          wake();
          continue;
        }
      }
      Reply r;
      try {
        r = handler(job.peer, job.command, job.body);
      } catch (const std::exception& e) {
        r = {static_cast<uint16_t>(proto::Command::error), error_body(std::string("internal error: ") + e.what())};
      }
      std::lock_guard lock(mu);
      done.push_back(Done{job.conn, job.uid, job.seq, false, std::move(r)});
      wake();
    }
  }
  void wake() {
    const uint64_t one = 1;
    (void)!::write(wake_fd, &one, sizeof one);
  }
};

namespace {
constexpr uint32_t kUnknownUid = 0xffffffffU;  ///< a peer without credentials: one more "user"
}  // namespace

Server::Server(Handler handler, SlowTest slow) : Server(std::move(handler), std::move(slow), PoolLimits{}) {}

Server::Server(Handler handler, SlowTest slow, PoolLimits pool)
    : handler_(std::move(handler)), slow_(std::move(slow)), limits_(pool) {
  if (!slow_) return;
  pool_ = std::make_unique<Pool>();
  pool_->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (pool_->wake_fd < 0) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
  for (std::size_t i = 0; i < std::max<std::size_t>(limits_.threads, 1); ++i)
    pool_->threads.emplace_back([this] { pool_->work(handler_); });
}

Server::~Server() {
  shutdown();
  if (!pool_) return;
  {
    std::lock_guard lock(pool_->mu);
    pool_->stop = true;
    for (Pool::Job& j : pool_->jobs) *j.gone = true;  // not started: not worth starting now
  }
  pool_->cv.notify_all();
  for (std::thread& t : pool_->threads) t.join();
  ::close(pool_->wake_fd);
}

std::unique_ptr<Server> Server::for_previous_release(const std::string& run_dir, const std::string& socket_path,
                                                     const std::string& version) {
  const std::string path = run_dir + "/" + paths::kSocketName;
  if (path == socket_path) return nullptr;
  const std::string msg = "this cuwarden client is from an earlier release: cuwardend " + version + " answers at " +
                          socket_path + ", not at " + path + ". Use the cuwarden installed with it, or pass --socket " +
                          socket_path;
  auto s = std::make_unique<Server>([msg](const Peer&, uint16_t, const std::string&) {
    return Reply{static_cast<uint16_t>(proto::Command::error), nlohmann::json{{"error", msg}}.dump()};
  });
  std::string why;
  if (!s->listen(path, &why)) {
    spdlog::info("not answering the previous release's clients at {}: {}", path, why);
    return nullptr;
  }
  return s;
}

bool Server::listen(const std::string& path, std::string* error) {
  sockaddr_un addr;
  if (!make_addr(path, &addr, error)) return false;
  struct stat st{};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      *error = path + " exists and is not a socket; not touching it";
      return false;
    }
    const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe < 0) {
      *error = std::string("socket(): ") + std::strerror(errno);
      return false;
    }
    const int rc = connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    const int e = errno;
    ucred peer{};
    socklen_t len = sizeof peer;
    const bool known = rc == 0 && getsockopt(probe, SOL_SOCKET, SO_PEERCRED, &peer, &len) == 0;
    close(probe);
    if (rc == 0 && known && peer.uid != geteuid()) {
      // Another user's program on our socket's name: an impostor, not a daemon of ours. Root
      // takes the name back; any other daemon user cannot, and says who holds it.
      if (geteuid() != 0) {
        *error = path + " is served by uid " + std::to_string(peer.uid) + " (pid " + std::to_string(peer.pid) +
                 "), not this daemon's user; remove it or give another --socket";
        return false;
      }
      spdlog::warn("{} was served by uid {} (pid {}), not a daemon: removing it", path, peer.uid, peer.pid);
    } else if (rc == 0) {
      *error = "another cuwardend is already running (it answers at " + path + ")";
      return false;
    } else if (e != ECONNREFUSED) {
      *error = "cannot probe existing socket " + path + ": " + std::strerror(e);
      return false;
    } else {
      spdlog::info("removing stale socket {}", path);
    }
    unlink(path.c_str());
  }
  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) {
    *error = std::string("socket(): ") + std::strerror(errno);
    return false;
  }
  // Every user may query; privileged commands check peer credentials. The mode is set by
  // the umask at bind() time, not by chmod(path) afterwards, which would follow a symlink
  // put in the socket's place in between.
  const mode_t old_umask = umask(0111);
  const int bound = bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  const int bind_errno = errno;
  umask(old_umask);
  if (bound != 0) {
    *error = "bind " + path + ": " + std::strerror(bind_errno);
    close(listen_fd_);
    listen_fd_ = -1;
    return false;
  }
  path_ = path;
  if (lstat(path.c_str(), &st) == 0) {
    dev_ = st.st_dev;
    ino_ = st.st_ino;
  }
  if (::listen(listen_fd_, 64) != 0) {
    *error = "listen: " + std::string(std::strerror(errno));
    shutdown();
    return false;
  }
  return true;
}

void Server::collect(std::vector<pollfd>& fds) const {
  fds.push_back({listen_fd_, POLLIN, 0});
  fds.push_back({pool_ ? pool_->wake_fd : -1, POLLIN, 0});
  for (const Conn& c : conns_) {
    short ev = 0;
    if (c.working) {  // only a hang-up is of interest (always reported)
      fds.push_back({c.fd, 0, 0});
      continue;
    }
    if (c.out.empty() && !c.close_after_write) ev |= POLLIN;  // one request at a time
    if (!c.out.empty()) ev |= POLLOUT;
    fds.push_back({c.fd, ev, 0});
  }
}

void Server::dispatch(const std::vector<pollfd>& fds, std::size_t first) {
  if (first >= fds.size()) return;
  const bool can_accept = fds[first].revents & POLLIN;
  const bool pool_done = first + 1 < fds.size() && (fds[first + 1].revents & POLLIN);
  // Connections are matched by position: collect() appended them in conns_ order, after the
  // listening socket and the pool's eventfd.
  const std::size_t at = first + 2;
  for (std::size_t i = 0; i < conns_.size() && at + i < fds.size(); ++i) {
    Conn& c = conns_[i];
    const short re = fds[at + i].revents;
    if (fds[at + i].fd != c.fd) continue;
    if (c.working) {
      if (re & (POLLHUP | POLLERR | POLLNVAL)) {  // its request, if still queued, is dropped
        c.dead = true;
        std::lock_guard lock(pool_->mu);
        *c.gone = true;  // now, before any reply this round sends
      }
      continue;
    }
    if (re & POLLOUT) on_writable(c);
    if (!c.dead && (re & (POLLIN | POLLHUP | POLLERR))) on_readable(c);
    if (!c.dead && (re & (POLLERR | POLLNVAL))) c.dead = true;
    if (!c.dead && c.out.empty() && !c.close_after_write && !c.in.empty()) process(c);
  }
  if (pool_done) collect_done();
  for (Conn& c : conns_)
    if (c.dead) forget(c);
  conns_.erase(std::remove_if(conns_.begin(), conns_.end(), [](const Conn& c) { return c.dead; }), conns_.end());
  if (can_accept) accept_all();
}

void Server::accept_all() {
  for (int i = 0; i < 64; ++i) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or a transient error (EMFILE...): try again next round
    if (conns_.size() >= kMaxConnections) {
      // Make room by closing the connection that has waited longest for a request: a client
      // flooding us with idle connections must not lock out one that asks something at once.
      auto victim = conns_.end();
      for (auto it = conns_.begin(); it != conns_.end(); ++it)
        if (it->out.empty() && !it->close_after_write && !it->working &&
          (victim == conns_.end() || it->deadline < victim->deadline))
          victim = it;
      if (++evictions_ % 1000 == 1)
        spdlog::warn("too many client connections ({}); {} ({} so far)", conns_.size(),
                     victim == conns_.end() ? "refusing a new one" : "closing the longest idle one", evictions_);
      if (victim == conns_.end()) {
        close(fd);
        continue;
      }
      forget(*victim);
      conns_.erase(victim);
    }
    Conn c;
    c.id = next_id_++;
    c.fd = fd;
    ucred cred{};
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && len == sizeof cred) {
      c.peer.known = true;
      c.peer.uid = cred.uid;
      c.peer.gid = cred.gid;
      c.peer.pid = cred.pid;
      // The kernel numbers a peer of another namespace in ours (0 when it cannot be seen).
      c.peer.pidns = cred.pid > 0 ? paths::pid_namespace(static_cast<uint32_t>(cred.pid)) : 0;
      c.peer.same_pidns = c.peer.pidns != 0 && c.peer.pidns == job::self_pidns();
    }
    c.deadline = mono_ns() + kRequestTimeoutNs;
    conns_.push_back(std::move(c));
  }
}

void Server::on_readable(Conn& c) {
  char buf[16384];
  for (int round = 0; round < 8; ++round) {
    const ssize_t n = recv(c.fd, buf, sizeof buf, 0);
    if (n > 0) {
      c.in.append(buf, static_cast<std::size_t>(n));
      if (c.in.size() > 4 * std::size_t{kMaxRequestBody}) {
        c.dead = true;  // floods us without reading replies
        return;
      }
      process(c);
      if (c.dead || !c.out.empty() || c.close_after_write || c.working) return;
      continue;
    }
    if (n == 0) {
      c.dead = true;  // client closed (possibly mid-request: nothing to answer)
      return;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) c.dead = true;
    return;
  }
}

void Server::process(Conn& c) {
  if (c.in.size() < sizeof(proto::Header)) return;
  proto::Header h;
  std::memcpy(&h, c.in.data(), sizeof h);
  if (h.magic != proto::kMagic || h.version != proto::kVersion) {
    spdlog::debug("client sent a bad header (magic {:#x}, version {}); closing", h.magic, h.version);
    if (h.magic == proto::kMagic)
      queue(c, static_cast<uint16_t>(proto::Command::error), h.seq,
            error_body("unsupported protocol version " + std::to_string(h.version)));
    c.close_after_write = true;
    c.in.clear();
    if (c.out.empty()) c.dead = true;
    return;
  }
  if (h.length > kMaxRequestBody) {
    queue(c, static_cast<uint16_t>(proto::Command::error), h.seq,
          error_body("request body too large (" + std::to_string(h.length) + " bytes)"));
    c.close_after_write = true;
    c.in.clear();
    return;
  }
  if (c.in.size() < sizeof h + h.length) return;
  const std::string body = c.in.substr(sizeof h, h.length);
  c.in.erase(0, sizeof h + h.length);
  if (pool_ && slow_(h.command)) {
    const uint32_t uid = c.peer.known ? c.peer.uid : kUnknownUid;
    std::size_t& mine = in_flight_by_uid_[uid];
    if (mine >= limits_.per_uid || in_flight_ >= limits_.in_flight) {
      if (mine == 0) in_flight_by_uid_.erase(uid);
      queue(c, static_cast<uint16_t>(proto::Command::error), h.seq,
            error_body("busy: at most " + std::to_string(limits_.per_uid) +
                       " snapshot or report requests of one user run at once (and " +
                       std::to_string(limits_.in_flight) + " in all); try again when one has finished"));
      return;
    }
    ++mine;
    ++in_flight_;
    c.working = true;
    c.gone = std::make_shared<bool>(false);
    {
      std::lock_guard lock(pool_->mu);
      pool_->jobs.push_back(Pool::Job{c.id, uid, h.seq, c.peer, h.command, body, c.gone});
    }
    pool_->cv.notify_one();
    return;
  }
  Reply r;
  try {
    r = handler_(c.peer, h.command, body);
  } catch (const std::exception& e) {
    r = {static_cast<uint16_t>(proto::Command::error), error_body(std::string("internal error: ") + e.what())};
  }
  queue(c, r.command, h.seq, r.body);
}

void Server::queue(Conn& c, uint16_t command, uint32_t seq, const std::string& body) {
  std::string b = body;
  if (b.size() > proto::kMaxReplyBody) {
    command = static_cast<uint16_t>(proto::Command::error);
    b = error_body("reply too large");
  }
  proto::Header h{proto::kMagic, proto::kVersion, command, seq, static_cast<uint32_t>(b.size())};
  c.out.assign(reinterpret_cast<const char*>(&h), sizeof h);
  c.out += b;
  c.out_off = 0;
  c.deadline = mono_ns() + kReplyTimeoutNs;
  on_writable(c);  // most replies fit the socket buffer at once
}

void Server::collect_done() {
  uint64_t n = 0;
  (void)!::read(pool_->wake_fd, &n, sizeof n);
  std::deque<Pool::Done> done;
  {
    std::lock_guard lock(pool_->mu);
    done.swap(pool_->done);
  }
  for (Pool::Done& d : done) {
    --in_flight_;
    if (auto it = in_flight_by_uid_.find(d.uid); it != in_flight_by_uid_.end() && --it->second == 0)
      in_flight_by_uid_.erase(it);
    if (d.dropped) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      spdlog::debug("a request (command {}) was dropped unexecuted: its client had gone", d.reply.command);
      continue;
    }
    for (Conn& c : conns_)
      if (c.id == d.conn && c.working && !c.dead) {
        c.working = false;
        c.gone.reset();
        queue(c, d.reply.command, d.seq, d.reply.body);
        break;
      }
  }
}

void Server::forget(Conn& c) {
  if (c.working && pool_) {
    std::lock_guard lock(pool_->mu);
    *c.gone = true;
  }
  close(c.fd);
}

void Server::on_writable(Conn& c) {
  while (c.out_off < c.out.size()) {
    const ssize_t n = send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out_off += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    c.dead = true;
    return;
  }
  c.out.clear();
  c.out_off = 0;
  if (c.close_after_write) {
    c.dead = true;
    return;
  }
  c.deadline = mono_ns() + kRequestTimeoutNs;
  // A pipelined request already in `in` is handled by dispatch(), not here: no recursion.
}

void Server::expire(uint64_t mono_now) {
  for (Conn& c : conns_)
    if (!c.working && mono_now > c.deadline) {  // a pool request is bounded by its own deadline
      spdlog::debug("closing client connection fd {} (timed out)", c.fd);
      forget(c);
      c.dead = true;
    }
  conns_.erase(std::remove_if(conns_.begin(), conns_.end(), [](const Conn& c) { return c.dead; }), conns_.end());
}

void Server::shutdown() {
  for (Conn& c : conns_) forget(c);
  conns_.clear();
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    listen_fd_ = -1;
  }
  if (!path_.empty()) {
    struct stat st{};
    if (lstat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) unlink(path_.c_str());
    path_.clear();
  }
}

/// The socket thread's loop: serve `server` until `stop_fd` is readable. Throws what the
/// server throws (the caller stops the daemon).
void serve_until(Server& server, Server* previous, int stop_fd) {
  std::vector<pollfd> sfds;
  for (;;) {
    sfds.clear();
    sfds.push_back({stop_fd, POLLIN, 0});
    server.collect(sfds);
    const std::size_t previous_at = sfds.size();
    if (previous) previous->collect(sfds);
    // 100 ms: the granularity of the connection deadlines (seconds); with no connection
    // there is none to keep, and the thread sleeps until a client or the stop comes.
    const bool any = server.connection_count() || (previous && previous->connection_count());
    const int sn = poll(sfds.data(), sfds.size(), any ? 100 : -1);
    if (sn < 0 && errno != EINTR) throw std::runtime_error(std::string("poll: ") + std::strerror(errno));
    if (sfds[0].revents & POLLIN) return;
    if (sn > 0) {
      server.dispatch(sfds, 1);  // each reads its own entries, from where collect() put them
      if (previous) previous->dispatch(sfds, previous_at);
    }
    server.expire(mono_ns());
    if (previous) previous->expire(mono_ns());
  }
}

}  // namespace cuw::daemon
