// cuwarden fuzz target: cuw::proto::recv_message, the framing every client of the socket
// (the CLI) and the blocking test helpers use, on arbitrary bytes from the peer.
// Invariants: a message is returned only with the right magic and version and a body of
// exactly header.length <= kMaxBody bytes; arbitrary bytes never crash or hang it.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>

#include "cuw/protocol.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;  // stays inside the socket buffer: one write, no thread
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) std::abort();
  int sndbuf = 256 * 1024;
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
  size_t off = 0;
  while (off < size) {
    const ssize_t w = write(sv[0], data + off, size - off);
    if (w <= 0) break;
    off += static_cast<size_t>(w);
  }
  shutdown(sv[0], SHUT_WR);
  std::string why;
  for (int i = 0; i < 1024; ++i) {
    auto m = cuw::proto::recv_message(sv[1], 0, &why);
    if (!m) break;
    if (m->header.magic != cuw::proto::kMagic || m->header.version != cuw::proto::kVersion ||
        m->header.length > cuw::proto::kMaxBody || m->body.size() != m->header.length)
      std::abort();
  }
  close(sv[0]);
  close(sv[1]);
  return 0;
}
