// cuwarden fuzz target: the daemon's socket server (daemon/src/transports/server.cpp: incremental
// framing of untrusted bytes) and request handling (handler.cpp -> Registry), as cuwardend
// wires them. One Server listens in a scratch run directory holding one valid ring with
// events; each input is what one client connection sends before closing its write side.
// Every input is also handed straight to handle_request (bytes 0-1 = command, rest = body).
// Invariants: no crash; every byte the server sends back is well-framed; no connection
// outlives the input.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_daemon_support.hpp"
#include "transports/handler.hpp"
#include "model/registry.hpp"
#include "transports/server.hpp"

using namespace cuw;

namespace {

struct World {
  std::unique_ptr<daemon::Registry> reg;
  std::unique_ptr<daemon::Server> server;
  std::string sock;
};

World& world() {
  static World* w = [] {
    auto* nw = new World;
    nw->reg = fuzz::registry_with_one_ring();
    nw->server = std::make_unique<daemon::Server>(
        [r = nw->reg.get()](const daemon::Peer& peer, uint16_t cmd, const std::string& body) {
          return daemon::handle_request(*r, peer, cmd, body);
        });
    nw->sock = fuzz::scratch_dir() + "/cuwardend.sock";
    std::string err;
    if (!nw->server->listen(nw->sock, &err)) std::abort();
    return nw;
  }();
  return *w;
}

// Checks the replies are a sequence of whole, valid frames (the last may be cut short only
// if the server closed on us, which it never does mid-reply).
void check_frames(const std::string& out) {
  size_t off = 0;
  while (off + sizeof(proto::Header) <= out.size()) {
    proto::Header h;
    std::memcpy(&h, out.data() + off, sizeof h);
    if (h.magic != proto::kMagic || h.version != proto::kVersion || h.length > proto::kMaxBody) std::abort();
    off += sizeof h + h.length;
  }
  if (off != out.size()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;
  World& w = world();
  if (size >= 2) {
    uint16_t cmd;
    std::memcpy(&cmd, data, 2);
    // Both sides of the authorization rules: an unprivileged peer that owns nothing here
    // (inputs of odd length) and root (even), whose set_limit requests reach the ring.
    daemon::Peer peer;
    peer.known = true;
    peer.uid = (size & 1) ? 65534 : 0;
    peer.gid = peer.uid;
    peer.pid = 1;
    (void)daemon::handle_request(*w.reg, peer, cmd, std::string(reinterpret_cast<const char*>(data + 2), size - 2));
  }

  const int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, w.sock.c_str(), w.sock.size() + 1);
  if (c < 0 || connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) std::abort();
  size_t sent = 0;
  bool closed_write = false;
  std::string out;
  std::vector<pollfd> fds;
  for (int round = 0; round < 200; ++round) {
    while (sent < size) {
      const ssize_t n = send(c, data + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    if (sent == size && !closed_write) {
      shutdown(c, SHUT_WR);
      closed_write = true;
    }
    fds.clear();
    w.server->collect(fds);
    if (poll(fds.data(), fds.size(), 0) > 0) w.server->dispatch(fds, 0);
    char buf[65536];
    bool eof = false;
    for (;;) {
      const ssize_t n = recv(c, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        out.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) eof = true;
      break;
    }
    if (eof && w.server->connection_count() == 0) break;
  }
  close(c);
  w.server->expire(~0ull);  // nothing may outlive the input
  if (w.server->connection_count() != 0) std::abort();
  check_frames(out);
  return 0;
}
