// cuwarden interposer: the wire of IPC of pooled memory (ipc_wire.hpp): the listener's
// address, its peer's credentials, messages and descriptors sent and received by a deadline.
#include "backends/ipc_wire.hpp"

#include <poll.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "backends/ipc.hpp"

namespace cuw::backends::ipc {

namespace detail {

namespace {


/// Waits until `sock` is readable (`events` POLLIN) or writable (POLLOUT), at most `ms`.
bool wait_for(int sock, short events, int ms) {
  pollfd pf{sock, events, 0};
  for (;;) {
    const int k = poll(&pf, 1, ms);
    if (k < 0 && errno == EINTR) continue;
    return k > 0 && (pf.revents & events);
  }
}

}  // namespace

uint64_t mono_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000 + static_cast<uint64_t>(ts.tv_nsec) / 1000000;
}

/// Milliseconds left until `deadline` (mono_ms), at least 0.
int left_ms(uint64_t deadline) {
  const uint64_t now = mono_ms();
  return now >= deadline ? 0 : static_cast<int>(deadline - now);
}

/// The listener's abstract socket address: the user, the exporter's pid and its nonce (no
/// other user's process can hold the name first: its names carry its own uid and the
/// credentials are checked; a reused pid gets another nonce).
socklen_t address(sockaddr_un* a, uint64_t pid, uint64_t nonce) {
  std::memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  const int n = std::snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "cuwarden-ipc-%u-%llu-%016llx",
                              static_cast<unsigned>(geteuid()), static_cast<unsigned long long>(pid),
                              static_cast<unsigned long long>(nonce));
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + static_cast<size_t>(n));
}

/// Whether the process at the other end of `sock` is this user's, or root's.
bool trusted_peer(int sock) {
  ucred cred{};
  socklen_t len = sizeof cred;
  return getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && (cred.uid == geteuid() || cred.uid == 0);
}

bool write_all(int fd, const void* data, size_t n, uint64_t deadline) {
  const char* p = static_cast<const char*>(data);
  while (n) {
    if (!wait_for(fd, POLLOUT, left_ms(deadline))) return false;
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* data, size_t n, uint64_t deadline) {
  char* p = static_cast<char*>(data);
  while (n) {
    if (!wait_for(fd, POLLIN, left_ms(deadline))) return false;
    const ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

/// Sends `count` (1..kChunk) descriptors with their count as the message.
bool send_fds(int sock, const int* fds, uint32_t count, uint64_t deadline) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kChunk)] = {};
  iovec iov{&count, sizeof count};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = CMSG_SPACE(sizeof(int) * count);
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * count);
  std::memcpy(CMSG_DATA(c), fds, sizeof(int) * count);
  for (;;) {
    if (!wait_for(sock, POLLOUT, left_ms(deadline))) return false;
    const ssize_t w = sendmsg(sock, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    return w == static_cast<ssize_t>(sizeof count);
  }
}

/// Receives one message of send_fds: the descriptors into fds (at most kChunk), their count,
/// or -1 (nothing within the deadline, or a malformed message: whatever came is closed).
int recv_fds(int sock, int* fds, uint64_t deadline) {
  if (!wait_for(sock, POLLIN, left_ms(deadline))) return -1;
  uint32_t count = 0;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kChunk)] = {};
  iovec iov{&count, sizeof count};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  ssize_t r;
  do r = recvmsg(sock, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  while (r < 0 && errno == EINTR);
  int got = 0;
  if (r > 0) {
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const int n = static_cast<int>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      for (int i = 0; i < n; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        if (got < kChunk) fds[got++] = fd;
        else ::close(fd);
      }
    }
  }
  if (r != static_cast<ssize_t>(sizeof count) || (m.msg_flags & MSG_CTRUNC) || count != static_cast<uint32_t>(got)) {
    for (int i = 0; i < got; ++i) ::close(fds[i]);
    return -1;
  }
  return got;
}

void fork_safe() {
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork(
        [] {
          exporter_lock();
          importer_lock();
        },
        [] {
          importer_unlock();
          exporter_unlock();
        },
        [] {
          exporter_forget();
          importer_forget();
          importer_unlock();
          exporter_unlock();
        });
  });
}

}  // namespace detail


bool is_ours(const CUipcMemHandle& h) noexcept {
  uint64_t magic;
  std::memcpy(&magic, &h, sizeof magic);
  return magic == detail::kMagic;
}

}  // namespace cuw::backends::ipc
