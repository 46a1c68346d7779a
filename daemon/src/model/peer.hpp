// cuwarden daemon model: who asked for a change, as the transport that carried the request
// vouches for it. The model decides privileges from this and nothing else.
#pragma once

#include <cstdint>

#include "cuw/paths.hpp"

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
  /// Inode of the peer's pid namespace (0: unknown), and whether it is the daemon's own. A
  /// peer from another pid namespace (a container's root included) is never root to the
  /// daemon, and acts only on processes of its own namespace, which it numbers its own way.
  uint64_t pidns = 0;
  bool same_pidns = true;
  bool root() const noexcept { return known && uid == 0 && same_pidns; }
};

/// Whether `peer`, naming pid `asked` in its own pid namespace, means the process the daemon
/// numbers `host_pid`: the same number where the peer shares the daemon's namespace; else a
/// process of the peer's namespace whose number there is `asked`. Reads /proc for a peer of
/// another namespace only.
inline bool peer_means(const Peer& peer, uint32_t asked, uint32_t host_pid) {
  if (peer.same_pidns) return asked == host_pid;
  return peer.pidns != 0 && paths::pid_namespace(host_pid) == peer.pidns && paths::innermost_pid(host_pid) == asked;
}

/// Whether `peer` may act on (see the call sites of, change the cap of) process `host_pid` of
/// user `uid`: root of the daemon's namespace, or the owner from the process's own namespace.
inline bool peer_owns(const Peer& peer, uint32_t uid, uint32_t host_pid) {
  if (peer.root()) return true;
  if (!peer.known || peer.uid != uid) return false;
  return peer.same_pidns || (peer.pidns != 0 && paths::pid_namespace(host_pid) == peer.pidns);
}

}  // namespace cuw::daemon
