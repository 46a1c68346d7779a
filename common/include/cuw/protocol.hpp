// cuwarden: the daemon's unix-socket protocol, shared by cuwardend and the cuwarden CLI.
//
// Every message, request or reply, is a fixed 16-byte header followed by `length` bytes of
// UTF-8 JSON (possibly 0 bytes). The reader validates magic, version and length before
// reading the body, and never reads a body larger than kMaxBody. Replies carry the
// request's command with kReplyBit set, or Command::error with {"error": "..."}.
//
//   request  get_state    body: {}                              reply: state JSON (see daemon/)
//   request  get_events   body: {"pid":P?, "after":SEQ?, "max":N?}  reply: {"events":[...], "next":SEQ}
//   request  set_limit    body: {"pid":P, "bytes":N|null, "device":D?}  or  {"pid":P, "share":F, "device":D?}
//                               or {"job":NAME, "user":NAME|UID?, "bytes":N|null}
//            bytes: the new cap (null or 2^64-1: none); share: 0 < F <= 1 of each device's
//            memory (pids only); device: CUDA ordinal as the process sees it (default:
//            every device it uses); user: the job's owner (default: the caller).
//            Authorized by the connection's peer credentials (SO_PEERCRED): root may do
//            anything; others may only lower caps of their own processes and jobs.
//            reply pid: {"target":"pid","pid","process_name","uid","user",
//                        "changes":[{"device","uuid","old_limit","new_limit","used_bytes"}]}
//            reply job: {"target":"job","job","uid","user","members":[pid...],"old_limit",
//                        "new_limit","gpus":[{"uuid","used_bytes","new_limit_bytes"}]}
//            refusal:   Command::error {"error":"refused: <why>","refused":true}
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace cuw::proto {

inline constexpr uint32_t kMagic = 0x50575543;  // "CUWP"
inline constexpr uint16_t kVersion = 1;
inline constexpr uint32_t kMaxBody = 16u << 20;  // 16 MiB
inline constexpr uint16_t kReplyBit = 0x8000;

enum class Command : uint16_t {
  get_state = 1,
  get_events = 2,
  set_limit = 3,
  error = 0xffff,
};

struct Header {
  uint32_t magic;
  uint16_t version;
  uint16_t command;
  uint32_t seq;
  uint32_t length;  ///< body bytes that follow, <= kMaxBody
};
static_assert(sizeof(Header) == 16);

/// Default socket path: $CUWARDEN_RUN_DIR/cuwardend.sock (see paths.hpp).

/// Write header + body to a connected stream socket, retrying on EINTR and short writes.
/// Returns false on any error (the peer went away). Blocking; `timeout_ms` bounds each poll.
bool send_message(int fd, Command cmd, uint32_t seq, const std::string& body, int timeout_ms) noexcept;

/// Result of reading one message.
struct Message {
  Header header{};
  std::string body;
};

/// Read exactly one message. Returns nullopt on EOF, timeout, bad magic/version, or a body
/// over kMaxBody; *why (if given) says which, for logs.
std::optional<Message> recv_message(int fd, int timeout_ms, std::string* why = nullptr);

/// Client helper: connect to `socket_path`, send one request and wait for the reply.
/// Returns nullopt and sets *why on failure ("no daemon at PATH: ...").
std::optional<Message> request(const std::string& socket_path, Command cmd, const std::string& body,
                               int timeout_ms, std::string* why);

}  // namespace cuw::proto
