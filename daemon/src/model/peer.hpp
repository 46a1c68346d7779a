// cuwarden daemon model: who asked for a change, as the transport that carried the request
// vouches for it. The model decides privileges from this and nothing else.
#pragma once

#include <cstdint>

namespace cuw::daemon {

/// Who is at the other end of a connection: SO_PEERCRED, taken once at accept() (the
/// kernel records the credentials of the process that called connect(); they cannot be
/// changed by what the client sends). `known` is false when the kernel would not say, and
/// such a peer is treated as unprivileged with no identity (uid kUnknownUid).
struct Peer {
  static constexpr uint32_t kUnknownUid = ~0u;
  bool known = false;
  uint32_t uid = kUnknownUid;
  uint32_t gid = kUnknownUid;
  int32_t pid = 0;
  bool root() const noexcept { return known && uid == 0; }
};

}  // namespace cuw::daemon
