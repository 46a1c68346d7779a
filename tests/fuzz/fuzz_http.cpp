// cuwarden fuzz target: the daemon's HTTP request path, as cuwardend wires it: the head
// parser (daemon/src/transports/http_request.cpp), the routes (http_routes.cpp: every path,
// query and Last-Event-ID against a Registry with one valid ring, snapshots on), the event
// stream's feed, and the server (http_server.cpp) fed the input over a loopback connection.
// Invariants: no crash; every reply the server sends starts with a status line whose code is
// one the server uses; a reply's Content-Length matches what follows when the server closes.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "fuzz_daemon_support.hpp"
#include "model/registry.hpp"
#include "model/series.hpp"
#include "transports/http_request.hpp"
#include "transports/http_routes.hpp"
#include "transports/http_server.hpp"

using namespace cuw;

namespace {

struct World {
  std::unique_ptr<daemon::Registry> reg;
  daemon::SeriesStore series;
  std::unique_ptr<daemon::HttpApi> api;
  std::unique_ptr<daemon::HttpServer> server;
  int stop_fd = -1;
  std::thread thread;
};

World& world() {
  static World* w = [] {
    auto* nw = new World;
    nw->reg = fuzz::registry_with_one_ring();
    nw->reg->publish();
    nw->series.record(*nw->reg->store().load());
    daemon::HttpApiOptions ho;
    ho.web_root = fuzz::scratch_dir();  // holds the ring: a file the static route may serve
    ho.snapshots = true;
    nw->api = std::make_unique<daemon::HttpApi>(&nw->reg->store(), &nw->series, nullptr, ho);
    daemon::HttpServer::Limits lim;
    lim.tick_ns = 1'000'000;
    auto* api = nw->api.get();
    nw->server = std::make_unique<daemon::HttpServer>(
        [api](const daemon::HttpRequest& r) { return api->handle(r); }, &daemon::HttpApi::slow,
        [api](daemon::StreamCursor& c, uint64_t now) { return api->feed(c, now); }, lim);
    std::string err;
    if (!nw->server->listen("127.0.0.1:0", &err)) std::abort();
    nw->stop_fd = eventfd(0, EFD_CLOEXEC);
    nw->thread = std::thread([nw] { nw->server->run(nw->stop_fd); });
    nw->thread.detach();  // runs for the fuzzer's life
    return nw;
  }();
  return *w;
}

/// Each reply in `out` is "HTTP/1.1 NNN ..." with a code the server sends; a reply with a
/// Content-Length has that many bytes after its head, or none (the answer to a HEAD).
void check_replies(const std::string& out) {
  std::size_t off = 0;
  std::size_t head_only = std::string::npos;  // where the next reply starts if the last had no body (HEAD)
  while (off < out.size()) {
    if (out.compare(off, 9, "HTTP/1.1 ") != 0) {
      if (head_only == std::string::npos || out.compare(head_only, 9, "HTTP/1.1 ") != 0) std::abort();
      off = head_only;
    }
    const int code = std::atoi(out.c_str() + off + 9);
    if (std::string(daemon::http_reason(code)) == "Unknown") std::abort();
    const std::size_t head_end = out.find("\r\n\r\n", off);
    if (head_end == std::string::npos) return;
    const std::string head = out.substr(off, head_end - off);
    const std::size_t cl = head.find("Content-Length: ");
    if (cl == std::string::npos) return;  // an event stream: runs to the end
    const std::size_t len = std::strtoull(head.c_str() + cl + 16, nullptr, 10);
    head_only = head_end + 4;
    off = head_end + 4 + len;
    if (off > out.size()) return;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 32 * 1024) return 0;
  World& w = world();
  const std::string in(reinterpret_cast<const char*>(data), size);

  // Straight through the parser and the routes (and a stream's first feed).
  daemon::HttpRequest req;
  std::size_t consumed = 0;
  int status = 0;
  std::string why;
  if (daemon::parse_http_request(in, &req, &consumed, &status, &why) == daemon::HttpParse::ok) {
    if (consumed > size) std::abort();
    daemon::HttpResponse r = w.api->handle(req);
    if (r.stream) {
      daemon::HttpApi feeder(&w.reg->store(), &w.series, nullptr, {});
      (void)feeder.feed(r.cursor, 1);
    }
  }

  // Over a connection: send it all, close the write side, read until the server closes.
  const int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  // From another loopback address each time: the client shuts its side first, so its end
  // waits in TIME_WAIT for a minute whatever SO_LINGER says, and one source address has
  // about 28 K ports (at 4,000 inputs a second connect() failed with EADDRNOTAVAIL).
  static uint32_t next_source = 0;
  sockaddr_in src{};
  src.sin_family = AF_INET;
  src.sin_addr.s_addr = htonl(0x7f010000u | (1 + next_source++ % 65000));
  auto harness_failed = [](const char* what) {
    std::fprintf(stderr, "fuzz_http harness: %s: %s\n", what, std::strerror(errno));
    std::abort();
  };
  if (c < 0) harness_failed("socket");
  if (bind(c, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0) harness_failed("bind");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(w.server->port());
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    // libFuzzer's timer signal can interrupt a connect the server is slow to accept: the
    // connection goes on; wait for it.
    if (errno != EINTR) harness_failed("connect");
    pollfd p{c, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof err;
    if (poll(&p, 1, 10000) != 1 || getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      errno = err;
      harness_failed("connect (after EINTR)");
    }
  }
  timeval tv{1, 0};
  setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::size_t sent = 0;
  while (sent < size) {
    const ssize_t n = send(c, data + sent, size - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<std::size_t>(n);
  }
  shutdown(c, SHUT_WR);
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = recv(c, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > (8u << 20)) break;
  }
  close(c);
  check_replies(out);
  return 0;
}
