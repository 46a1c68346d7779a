// cuwarden: framing of the daemon's unix-socket protocol (see protocol.hpp).
#include "cuw/protocol.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "cuw/paths.hpp"

namespace cuw::proto {

namespace {

bool wait_fd(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  for (;;) {
    int r = ::poll(&p, 1, timeout_ms);
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

bool write_all(int fd, const void* data, size_t n, int timeout_ms) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_fd(fd, POLLOUT, timeout_ms)) return false;
      continue;
    }
    return false;
  }
  return true;
}

// 1 = ok, 0 = EOF before any byte, -1 = error/timeout/short.
int read_all(int fd, void* data, size_t n, int timeout_ms) {
  char* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::recv(fd, p + got, n - got, MSG_DONTWAIT);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return got == 0 ? 0 : -1;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_fd(fd, POLLIN, timeout_ms)) return -1;
      continue;
    }
    return -1;
  }
  return 1;
}

}  // namespace

bool send_message(int fd, Command cmd, uint32_t seq, const std::string& body, int timeout_ms) noexcept {
  if (body.size() > kMaxReplyBody) return false;
  Header h{kMagic, kVersion, static_cast<uint16_t>(cmd), seq, static_cast<uint32_t>(body.size())};
  if (!write_all(fd, &h, sizeof h, timeout_ms)) return false;
  return body.empty() || write_all(fd, body.data(), body.size(), timeout_ms);
}

std::optional<Message> recv_message(int fd, int timeout_ms, std::string* why, uint32_t max_body) {
  Message m;
  int r = read_all(fd, &m.header, sizeof m.header, timeout_ms);
  if (r <= 0) {
    if (why) *why = r == 0 ? "connection closed" : "timed out or short header";
    return std::nullopt;
  }
  if (m.header.magic != kMagic) {
    if (why) *why = "bad magic";
    return std::nullopt;
  }
  if (m.header.version != kVersion) {
    if (why) *why = "unsupported protocol version " + std::to_string(m.header.version);
    return std::nullopt;
  }
  if (m.header.length > max_body) {
    if (why) *why = "message body too large (" + std::to_string(m.header.length) + " bytes)";
    return std::nullopt;
  }
  m.body.resize(m.header.length);
  if (m.header.length && read_all(fd, m.body.data(), m.header.length, timeout_ms) != 1) {
    if (why) *why = "timed out or short body";
    return std::nullopt;
  }
  return m;
}

std::optional<Message> request(const std::string& socket_path, Command cmd, const std::string& body, int timeout_ms,
                               std::string* why) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof addr.sun_path) {
    if (why) *why = "socket path too long: " + socket_path;
    return std::nullopt;
  }
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    if (why) *why = std::string("socket(): ") + std::strerror(errno);
    return std::nullopt;
  }
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (why) *why = std::string(std::strerror(errno));
    ::close(fd);
    return std::nullopt;
  }
  // Nothing is sent to a server that may be another user's impostor: it would read the
  // request and could answer anything (paths.hpp).
  if (!paths::trusted_socket_dir(socket_path, why) || !paths::trusted_peer(fd, why)) {
    ::close(fd);
    return std::nullopt;
  }
  std::optional<Message> reply;
  if (!send_message(fd, cmd, 1, body, timeout_ms)) {
    if (why) *why = "could not send the request";
  } else {
    reply = recv_message(fd, timeout_ms, why, kMaxReplyBody);
  }
  ::close(fd);
  return reply;
}

}  // namespace cuw::proto
