// cuwarden daemon transport: the HTTP server (see http_server.hpp).
#include "transports/http_server.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <set>
#include <stdexcept>
#include <system_error>

#include "base/util.hpp"

namespace cuw::daemon {

namespace {

std::string error_json(const std::string& what) {
  return nlohmann::json{{"error", what}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

HttpResponse error_response(int status, const std::string& what) {
  HttpResponse r;
  r.status = status;
  r.body = error_json(what);
  return r;
}

}  // namespace

const char* http_reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 421: return "Misdirected Request";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

HttpServer::HttpServer(Handler handler, SlowTest slow, StreamSource source, Limits limits)
    : handler_(std::move(handler)), slow_(std::move(slow)), source_(std::move(source)), lim_(limits) {
  shared_->handler = handler_;
}

HttpServer::WorkerShared::~WorkerShared() {
  if (wake_fd >= 0) ::close(wake_fd);
}

HttpServer::~HttpServer() {
  // Workers that finished are joined; one still running (blocked in a file that never
  // answers) is detached: it holds the shared state, and the daemon is exiting.
  std::set<uint64_t> finished;
  {
    std::lock_guard<std::mutex> g(shared_->mu);
    for (const Done& d : shared_->done) finished.insert(d.id);
  }
  for (auto& [id, t] : workers_) {
    if (!t.joinable()) continue;
    if (finished.count(id)) t.join();
    else t.detach();
  }
  for (auto& [id, c] : conns_)
    if (c.fd >= 0) ::close(c.fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

bool HttpServer::listen(const std::string& address, std::string* error) {
  const std::size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) {
    *error = "--http " + address + ": expected HOST:PORT (e.g. 127.0.0.1:9477)";
    return false;
  }
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty()) {
    *error = "--http " + address + ": give the address to listen on (127.0.0.1 for this machine only, 0.0.0.0 for every "
             "interface)";
    return false;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV | (host == "localhost" ? 0 : AI_NUMERICHOST);
  addrinfo* res = nullptr;
  const int gai = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (gai != 0) {
    *error = "--http " + address + ": " + gai_strerror(gai);
    return false;
  }
  std::string last = "no address";
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last = std::strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, 512) != 0) {
      last = std::strerror(errno);
      ::close(fd);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
    if (ss.ss_family == AF_INET) {
      const auto* sin = reinterpret_cast<const sockaddr_in*>(&ss);
      port_ = ntohs(sin->sin_port);
      loopback_ = (ntohl(sin->sin_addr.s_addr) >> 24) == 127;
    } else {
      const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(&ss);
      port_ = ntohs(sin6->sin6_port);
      loopback_ = IN6_IS_ADDR_LOOPBACK(&sin6->sin6_addr);
    }
    listen_fd_ = fd;
    break;
  }
  freeaddrinfo(res);
  if (listen_fd_ < 0) {
    *error = "--http " + address + ": cannot listen: " + last;
    return false;
  }
  shared_->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (shared_->wake_fd < 0) {
    *error = std::string("eventfd: ") + std::strerror(errno);
    return false;
  }
  return true;
}

void HttpServer::close_conn(Conn& c) {
  if (c.fd >= 0) ::close(c.fd);
  c.fd = -1;
  if (c.phase == Phase::streaming) streams_.fetch_sub(1, std::memory_order_relaxed);
  c.dead = true;
}

void HttpServer::accept_all(uint64_t now) {
  for (;;) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno == EMFILE || errno == ENFILE) {
        // The listening socket stays readable until a descriptor frees: rest it a tick
        // rather than spin.
        accept_paused_until_ = now + lim_.tick_ns;
        spdlog::warn("HTTP accept: {}; pausing new connections", std::strerror(errno));
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNABORTED) {
        spdlog::warn("HTTP accept: {}", std::strerror(errno));
      }
      return;
    }
    if (conns_.size() >= lim_.max_connections) {
      // Make room by closing the longest idle kept-alive connection; with none idle, the
      // new client is told why it is turned away.
      Conn* oldest = nullptr;
      for (auto& [id, c] : conns_)
        if (!c.dead && c.idle && (!oldest || c.deadline < oldest->deadline)) oldest = &c;
      // No idle one: the connection that has spent longest on an unfinished head, if a
      // second at least (a client that sends slowly on purpose loses its slot first).
      if (!oldest)
        for (auto& [id, c] : conns_)
          if (!c.dead && c.phase == Phase::reading && !c.idle && now - c.since >= 1'000'000'000ULL &&
              (!oldest || c.since < oldest->since))
            oldest = &c;
      if (oldest) {
        close_conn(*oldest);
      } else {
        const std::string body = error_json("too many connections (the daemon serves " +
                                            std::to_string(lim_.max_connections) + " at once); try again");
        const std::string reply = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: " +
                                  std::to_string(body.size()) + "\r\nConnection: close\r\nRetry-After: 1\r\n\r\n" + body;
        (void)!::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        ::close(fd);
        continue;
      }
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Conn c;
    c.fd = fd;
    c.since = now;
    c.deadline = now + lim_.head_timeout_ns;
    conns_.emplace(next_id_++, std::move(c));
  }
}

void HttpServer::respond(Conn& c, const HttpResponse& r, bool head_only, bool keep_alive, uint64_t now) {
  HttpResponse refused;
  const HttpResponse* resp = &r;
  // A client that shut its side gets the replies to what it sent; the last one closes.
  keep_alive = keep_alive && !(c.peer_closed && c.in.empty());
  if (r.stream && streams_.load(std::memory_order_relaxed) >= lim_.max_streams) {
    refused = error_response(503, "too many event-stream clients (the daemon serves " + std::to_string(lim_.max_streams) +
                                      " at once); try again later");
    resp = &refused;
  } else if (!head_only && r.body.size() > 4096) {
    // Clients that read slowly, many at once, would each hold a reply in the daemon's
    // memory: past the bound (one reply alone always goes) a large reply is refused until
    // they take what they were sent.
    std::size_t unsent = 0;
    for (const auto& [id, o] : conns_)
      if (!o.dead) unsent += o.out.size() - o.out_off;
    if (unsent > 0 && unsent + r.body.size() > lim_.max_unsent) {
      refused = error_response(503, "busy: " + std::to_string(unsent) + " bytes of replies wait for slow clients; try again");
      refused.headers.emplace_back("Retry-After", "1");
      resp = &refused;
    }
  }
  std::string head = "HTTP/1.1 " + std::to_string(resp->status) + " " + http_reason(resp->status) + "\r\n";
  head += "Content-Type: " + resp->content_type + "\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n";
  for (const auto& [k, v] : resp->headers) head += k + ": " + v + "\r\n";
  if (resp->stream && !head_only) {
    head += "Connection: keep-alive\r\nX-Accel-Buffering: no\r\n\r\n";
    c.out = std::move(head);
    c.out_off = 0;
    c.phase = Phase::streaming;
    c.cursor = resp->cursor;
    c.last_write_ns = now;
    c.keep_alive = false;
    streams_.fetch_add(1, std::memory_order_relaxed);
    c.out += ": stream open\n\n";
    c.out += source_(c.cursor, now);
    return;
  }
  head += "Content-Length: " + std::to_string(resp->body.size()) + "\r\n";
  head += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  c.out = std::move(head);
  if (!head_only) c.out += resp->body;
  c.out_off = 0;
  c.phase = Phase::writing;
  c.keep_alive = keep_alive;
  c.deadline = now + lim_.write_timeout_ns;
}

void HttpServer::try_parse(uint64_t id, Conn& c, uint64_t now) {
  HttpRequest req;
  std::size_t consumed = 0;
  int status = 0;
  std::string why;
  const HttpParse p = parse_http_request(c.in, &req, &consumed, &status, &why);
  if (p == HttpParse::incomplete) {
    if (c.in.size() > lim_.max_head)
      respond(c, error_response(431, "request head larger than " + std::to_string(lim_.max_head) + " bytes"), false,
              false, now);
    return;
  }
  if (p == HttpParse::bad) {
    respond(c, error_response(status, why), false, false, now);
    return;
  }
  if (consumed > lim_.max_head) {
    respond(c, error_response(431, "request head larger than " + std::to_string(lim_.max_head) + " bytes"), false, false,
            now);
    return;
  }
  c.in.erase(0, consumed);
  c.idle = false;
  const bool head_only = req.method == "HEAD";
  if (!host_allowed(req.host, lim_.host_names)) {
    respond(c, error_response(421, "Host '" + req.host + "' is not served here (give it to cuwardend --http-host)"),
            head_only, false, now);
    return;
  }
  if (req.method != "GET" && !head_only) {
    HttpResponse r = error_response(405, "only GET and HEAD: the HTTP interface is read only (caps change with "
                                         "`cuwarden limit`, over the unix socket)");
    r.headers.emplace_back("Allow", "GET, HEAD");
    respond(c, r, false, false, now);
    return;
  }
  if (slow_ && slow_(req)) {
    if (workers_busy_ >= lim_.max_workers) {
      respond(c, error_response(503, "busy: " + std::to_string(lim_.max_workers) + " slow requests (snapshots) are "
                                     "being answered; try again"),
              head_only, req.keep_alive, now);
      return;
    }
    const bool keep = req.keep_alive;
    try {
      workers_[id] = std::thread([shared = shared_, id, head_only, keep, req] {
        Done d{id, head_only, keep, {}};
        try {
          d.response = shared->handler(req);
        } catch (const std::exception& e) {
          d.response = error_response(500, e.what());
        } catch (...) {
          d.response = error_response(500, "internal error");
        }
        {
          std::lock_guard<std::mutex> g(shared->mu);
          shared->done.push_back(std::move(d));
        }
        const uint64_t one = 1;
        (void)!::write(shared->wake_fd, &one, sizeof one);
      });
    } catch (const std::system_error&) {  // no thread to be had: say so, keep serving
      workers_.erase(id);
      respond(c, error_response(503, "busy: cannot start a worker; try again"), head_only, keep, now);
      return;
    }
    ++workers_busy_;
    c.phase = Phase::working;
    c.deadline = UINT64_MAX;
    return;
  }
  HttpResponse r;
  try {
    r = handler_(req);
  } catch (const std::exception& e) {
    r = error_response(500, e.what());
  } catch (...) {
    r = error_response(500, "internal error");
  }
  respond(c, r, head_only, req.keep_alive, now);
}

void HttpServer::on_readable(uint64_t id, Conn& c, uint64_t now) {
  char buf[16384];
  for (;;) {
    const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
    if (n > 0) {
      // A stream's client has nothing to ask: what it sends is dropped (nothing is kept).
      // Otherwise bytes are kept, also while a reply is being written or worked on (a
      // pipelined request, answered in turn), up to what a 431 needs; past that the
      // connection is not polled for reading until its reply is out (run()).
      if (c.phase != Phase::streaming) {
        c.in.append(buf, static_cast<std::size_t>(n));
        if (c.phase == Phase::reading && c.idle) {
          c.idle = false;
          c.since = now;
          c.deadline = now + lim_.head_timeout_ns;
        }
        if (c.in.size() > lim_.max_head + sizeof buf) break;
      }
      continue;
    }
    if (n == 0) {
      // The client shut its side. A request it sent still gets its reply (then the
      // connection closes); with nothing to answer it closes now.
      c.peer_closed = true;
      if (c.phase == Phase::streaming || (c.phase == Phase::reading && c.in.empty())) {
        close_conn(c);
        return;
      }
      break;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      close_conn(c);
      return;
    }
    break;
  }
  if (c.phase == Phase::reading) {
    try_parse(id, c, now);
    // Shut and no whole request in what it sent: nothing more can come.
    if (!c.dead && c.peer_closed && c.phase == Phase::reading) close_conn(c);
  }
}

void HttpServer::on_writable(Conn& c, uint64_t now) {
  while (c.out_off < c.out.size()) {
    const ssize_t n = ::send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_off += static_cast<std::size_t>(n);
      c.last_write_ns = now;
      if (c.phase == Phase::writing) c.deadline = now + lim_.write_timeout_ns;  // slow is fine, stalled is not
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    close_conn(c);
    return;
  }
  c.out.clear();
  c.out_off = 0;
  if (c.phase == Phase::streaming) {
    c.last_write_ns = now;
    return;
  }
  if (c.phase != Phase::writing) return;
  if (!c.keep_alive || (c.peer_closed && c.in.empty())) {
    close_conn(c);
    return;
  }
  c.phase = Phase::reading;
  c.idle = c.in.empty();
  c.reparse = !c.idle;
  c.since = now;
  c.deadline = now + (c.idle ? lim_.idle_timeout_ns : lim_.head_timeout_ns);
}

void HttpServer::collect_done(uint64_t now) {
  uint64_t v;
  (void)!::read(shared_->wake_fd, &v, sizeof v);
  std::deque<Done> done;
  {
    std::lock_guard<std::mutex> g(shared_->mu);
    done.swap(shared_->done);
  }
  for (Done& d : done) {
    if (auto w = workers_.find(d.id); w != workers_.end()) {
      w->second.join();
      workers_.erase(w);
    }
    --workers_busy_;
    auto it = conns_.find(d.id);
    if (it == conns_.end() || it->second.dead) continue;  // the client left meanwhile
    respond(it->second, d.response, d.head_only, d.keep_alive, now);
    on_writable(it->second, now);
  }
}

void HttpServer::feed_streams(uint64_t now) {
  for (auto& [id, c] : conns_) {
    if (c.dead || c.phase != Phase::streaming) continue;
    if (c.out_off < c.out.size() && now - c.last_write_ns >= lim_.write_timeout_ns) {
      close_conn(c);  // reads nothing at all: its slot goes back
      continue;
    }
    std::string more = source_(c.cursor, now);
    if (more.empty() && c.out.empty() && now - c.last_write_ns >= lim_.keepalive_comment_ns) more = ": keep-alive\n\n";
    if (more.empty()) continue;
    if (c.out.size() - c.out_off + more.size() > lim_.max_stream_backlog) {
      spdlog::info("HTTP event stream: a client fell {} bytes behind; dropping it", c.out.size() - c.out_off);
      close_conn(c);
      continue;
    }
    if (c.out_off > 0) {
      c.out.erase(0, c.out_off);
      c.out_off = 0;
    }
    c.out += more;
    on_writable(c, now);
  }
}

void HttpServer::run(int stop_fd) {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  for (;;) {
    fds.clear();
    ids.clear();
    fds.push_back({stop_fd, POLLIN, 0});
    fds.push_back({listen_fd_, static_cast<short>(mono_ns() >= accept_paused_until_ ? POLLIN : 0), 0});
    fds.push_back({shared_->wake_fd, POLLIN, 0});
    bool pending = false;  // a pipelined request to answer: do not sleep in poll
    for (auto& [id, c] : conns_) {
      pending = pending || c.reparse;
      // Not read: a client that shut its side (poll would report it readable for ever), or
      // one with a full head's worth waiting behind its reply.
      short ev = c.peer_closed || (c.phase != Phase::streaming && c.in.size() > lim_.max_head) ? 0 : POLLIN;
      if (c.out_off < c.out.size()) ev |= POLLOUT;
      fds.push_back({c.fd, ev, 0});
      ids.push_back(id);
    }
    // With no connection and accepting, nothing is due until a descriptor is readable: no
    // tick (its ten wake-ups a second were 6% of a daemon idle beside a thousand processes).
    const bool nothing_due = conns_.empty() && mono_ns() >= accept_paused_until_;
    const int n = ::poll(fds.data(), fds.size(),
                         pending ? 0 : nothing_due ? -1 : static_cast<int>(lim_.tick_ns / 1'000'000));
    if (n < 0 && errno != EINTR) throw std::runtime_error(std::string("HTTP poll: ") + std::strerror(errno));
    const uint64_t now = mono_ns();
    if (fds[0].revents & POLLIN) return;
    if (fds[2].revents & POLLIN) collect_done(now);
    for (std::size_t i = 3; i < fds.size(); ++i) {
      auto it = conns_.find(ids[i - 3]);
      if (it == conns_.end()) continue;
      Conn& c = it->second;
      if (c.dead) continue;
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) on_readable(it->first, c, now);
      if (!c.dead && (fds[i].revents & POLLOUT)) on_writable(c, now);
    }
    for (auto& [id, c] : conns_) {
      if (c.dead || !c.reparse) continue;
      c.reparse = false;
      if (c.phase == Phase::reading) try_parse(id, c, now);
      // Shut, and what is left is no whole request: nothing more can come.
      if (!c.dead && c.peer_closed && c.phase == Phase::reading) close_conn(c);
      if (!c.dead && c.out_off < c.out.size()) on_writable(c, now);
    }
    if (fds[1].revents & POLLIN) accept_all(now);
    if (now >= next_feed_) {
      feed_streams(now);
      next_feed_ = now + lim_.tick_ns;
    }
    for (auto it = conns_.begin(); it != conns_.end();) {
      Conn& c = it->second;
      if (!c.dead && c.phase != Phase::streaming && c.phase != Phase::working && now >= c.deadline) {
        // A head not sent in time gets a 408 when it began one; an idle connection just goes.
        if (c.phase == Phase::reading && !c.idle && !c.in.empty()) {
          const std::string body = error_json("request not received within the time allowed");
          const std::string reply = "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nContent-Length: " +
                                    std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
          (void)!::send(c.fd, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        close_conn(c);
      }
      // A connection whose worker still runs is kept (dead) until the worker's reply is
      // collected: the worker map is keyed by its id.
      if (c.dead && !workers_.count(it->first)) it = conns_.erase(it);
      else ++it;
    }
  }
}

}  // namespace cuw::daemon
