// cuwarden interposer: what the exporter and the importer of pooled memory share (ipc.hpp):
// our handle, the messages on the listener's socket, the socket's reads and writes, and the
// fork handling of both sides' state.
#pragma once

#include <cuda.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cstddef>
#include <cstdint>

namespace cuw::backends::ipc::detail {

constexpr uint64_t kMagic = 0x31637069777563ULL;  // "cuwipc1"
constexpr int kChunk = 64;                         // descriptors per message (SCM_MAX_FD is 253)

/// Our handle, in CUipcMemHandle's 64 bytes.
struct Handle {
  uint64_t magic;
  uint64_t pid;    ///< the exporter (its socket's name)
  uint64_t nonce;  ///< the exporter's listener (its socket's name): a reused pid answers no handle of another
  uint64_t ptr;    ///< the block, in the exporter
  uint64_t bytes;  ///< its requested size
  uint64_t reserved[3];
};
static_assert(sizeof(Handle) == sizeof(CUipcMemHandle));

/// What an importer asks the listener: the block its handle names.
struct Request {
  uint64_t magic;
  uint64_t nonce;
  uint64_t ptr;
  uint64_t bytes;
};

/// The listener's answer: what maps the block (then, for granules, their descriptors).
struct Reply {
  uint64_t nonce;  ///< the listener's, echoed
  int32_t status;  ///< CUresult
  uint32_t how;    ///< ipc_span::kind
  uint64_t bytes;  ///< the span
  uint64_t offset;
  uint64_t granule_bytes;
  CUipcMemHandle legacy;
};

/// CLOCK_MONOTONIC in milliseconds: the deadlines below are in it.
uint64_t mono_ms();

/// Milliseconds left until `deadline` (mono_ms), at least 0.
int left_ms(uint64_t deadline);

/// The listener's abstract socket address: the user, the exporter's pid and its nonce (no
/// other user's process can hold the name first: its names carry its own uid and the
/// credentials are checked; a reused pid gets another nonce).
socklen_t address(sockaddr_un* a, uint64_t pid, uint64_t nonce);

/// Whether the process at the other end of `sock` is this user's, or root's.
bool trusted_peer(int sock);

/// Writes (reads) all `n` bytes before `deadline` (mono_ms); false if the peer closes, fails or
/// is too slow. Non-blocking sends and receives, waited for with poll().
bool write_all(int fd, const void* data, size_t n, uint64_t deadline);
bool read_all(int fd, void* data, size_t n, uint64_t deadline);

/// Sends `count` (1..kChunk) descriptors with their count as the message.
bool send_fds(int sock, const int* fds, uint32_t count, uint64_t deadline);

/// Receives one message of send_fds: the descriptors into fds (at most kChunk), their count,
/// or -1 (nothing within the deadline, or a malformed message: whatever came is closed).
int recv_fds(int sock, int* fds, uint64_t deadline);

/// Registers, once per process, the fork handlers of both sides: their locks are held across
/// a fork; the child has neither the listener thread nor the parent's contexts, so it starts
/// afresh (a listener of its own at its first export; no imports). Called by every entry
/// point that makes state (make_handle, open). Thread-safe.
void fork_safe();

/// The exporter's part of fork_safe() (ipc_export.cpp): its lock taken, given back, and in
/// the child, its listener and exports forgotten (the lock still held).
void exporter_lock();
void exporter_unlock();
void exporter_forget();
/// The importer's part (ipc_import.cpp): both its locks, and in the child, its imports
/// forgotten (the locks still held).
void importer_lock();
void importer_unlock();
void importer_forget();

}  // namespace cuw::backends::ipc::detail
