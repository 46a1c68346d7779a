// cuwarden interposer core: asking the daemon for room (see room.hpp).
#include "core/room.hpp"

#include <cinttypes>
#include <exception>
#include <string>

#include "base/fast_clock.hpp"
#include "base/log.hpp"
#include "base/work_epoch.hpp"
#include "cuw/paths.hpp"
#include "cuw/protocol.hpp"

namespace cuw::core {

namespace {

/// The thread's last driver out-of-memory: which request, and when (CLOCK_REALTIME ns).
struct LastFailure {
  int ordinal = -1;
  uint64_t bytes = 0;
  uint64_t ns = 0;
};
constinit thread_local LastFailure t_last __attribute__((tls_model("initial-exec")));

/// The driver's refusal in the thread's current allocation, until retry_after_room() reads it.
struct DriverOom {
  int ordinal = -1;
  uint64_t bytes = 0;
  bool gave_back = false;
  bool set = false;
};
constinit thread_local DriverOom t_note __attribute__((tls_model("initial-exec")));

/// The policy's wait when no daemon has written it yet.
constexpr uint32_t kDefaultRoomWaitMs = 30'000;
/// Beyond the policy's wait: the daemon's answer on its way back.
constexpr uint32_t kAnswerSlackMs = 2'000;

}  // namespace

CUW_COLD void note_driver_oom(int ordinal, uint64_t bytes, bool gave_back) noexcept {
  t_note = {ordinal, bytes, gave_back, true};
}

CUW_COLD bool retry_after_room(Tracker& t, uint64_t bytes) noexcept {
  const DriverOom n = t_note;
  t_note = {};
  // A cap's refusal leaves no note; one left by another call (of another size) is not ours.
  return n.set && n.bytes == bytes && room_granted(t, n.ordinal, bytes, n.gave_back);
}

CUW_COLD bool room_granted(Tracker& t, int ordinal, uint64_t bytes, bool pool_gave_back) noexcept {
  if (bytes == 0 || ordinal < 0) return false;
  const uint64_t now = fast_clock::realtime_ns_slow();
  const bool repeat = t_last.ordinal == ordinal && t_last.bytes == bytes && now - t_last.ns <= kRoomRepeatWindowNs;
  if (!repeat && !pool_gave_back) {
    t_last = {ordinal, bytes, now};
    return false;
  }
  t_last = {};  // one ask per repeat: the retry's own failure starts over
  // A capture in progress: the allocation belongs to a graph being built, and a wait of
  // seconds inside it would stall whoever captures; its failure stands.
  if (work::capturing()) return false;
  const Config& c = t.config();
  if (c.run_dir.empty()) return false;
  try {
    const uint32_t said = t.header().room_wait_ms.load(std::memory_order_relaxed);
    const uint32_t wait_ms = (said ? said : kDefaultRoomWaitMs) + kAnswerSlackMs;
    const std::string sock = paths::socket_path_for(c.socket.c_str(), c.run_dir.c_str());
    const std::string body = "{\"device\":" + std::to_string(ordinal) + ",\"bytes\":" + std::to_string(bytes) + "}";
    log::info("cuwarden: device %d is out of memory for %" PRIu64 " bytes; asking the daemon for room (waiting up to %u ms)",
              ordinal, bytes, wait_ms);
    std::string why;
    const auto reply = proto::request(sock, proto::Command::room, body, static_cast<int>(wait_ms), &why);
    if (!reply) {
      log::info("cuwarden: no room from the daemon: %s", why.c_str());
      return false;
    }
    const bool granted = reply->header.command == (static_cast<uint16_t>(proto::Command::room) | proto::kReplyBit) &&
                         reply->body.find("\"granted\":true") != std::string::npos;
    log::info("cuwarden: the daemon's answer for room on device %d: %s", ordinal, reply->body.substr(0, 300).c_str());
    return granted;
  } catch (const std::exception&) {  // out of host memory for a string: the failure stands
    return false;
  }
}

}  // namespace cuw::core
