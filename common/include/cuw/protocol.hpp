// cuwarden: the daemon's unix-socket protocol, shared by cuwardend and the cuwarden CLI.
//
// Every message, request or reply, is a fixed 16-byte header followed by `length` bytes of
// UTF-8 JSON (possibly 0 bytes). The reader validates magic, version and length before
// reading the body, and never reads a body larger than kMaxBody. Replies carry the
// request's command with kReplyBit set, or Command::error with {"error": "..."}.
// The commands, their request keys, reply shapes and errors are in kCommands below.
//
// How to add a command:
//   1. a number in `Command` and one row in kCommands (keys with their types and errors,
//      one_of pairs, reply, errors, privileged): the dispatcher checks requests against it;
//   2. its handler in daemon/src/commands/ (reading the published State for a query, or
//      going through the model's loop thread for a change) and its row in the daemon's table
//      (commands/table.cpp), beside a route there when HTTP serves it too;
//   3. a test in tests/integration/daemon_tests.cpp, and its reply in the golden files if
//      the CLI prints it (tests/integration/protocol_tests.cpp walks the table by itself:
//      the smallest valid request, each key of a wrong type, each one_of pair).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace cuw::proto {

inline constexpr uint32_t kMagic = 0x50575543;  // "CUWP"
/// The header's version word. A reader refuses any other value, so a bump splits old
/// clients from new daemons: make one only when an old peer would misread a message.
///   Without a bump: a new command; a new optional request key (daemons ignore keys they
///   do not know, so old daemons do too); a new reply key appended after the existing ones;
///   a new error text; a larger limit.
///   With a bump: a removed or renamed key; a key whose type, unit or meaning changes; a
///   required request key added to an existing command; a changed or new header field; a
///   changed command number or kReplyBit.
inline constexpr uint16_t kVersion = 1;
inline constexpr uint32_t kMaxBody = 16u << 20;  // 16 MiB
/// Replies may be larger: a snapshot of a large process (the client reads up to this).
inline constexpr uint32_t kMaxReplyBody = 256u << 20;
inline constexpr uint16_t kReplyBit = 0x8000;

enum class Command : uint16_t {
  get_state = 1,
  get_events = 2,
  set_limit = 3,
  get_snapshot = 4,
  get_ooms = 5,
  get_history = 6,
  suspend = 7,
  resume = 8,
  room = 9,
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

/// One key of a request body.
struct RequestKey {
  std::string_view name;
  /// The JSON types it may hold, '|'-separated: "uint" (an integer >= 0), "number", "string",
  /// "null".
  std::string_view type;
  bool required;  ///< false: optional, or one of a pair in the command's `one_of`
  /// What a value of another type (or a required key left out) is told: the reply is
  /// {"error": "bad request: <error>"}. The daemon checks every key's type before it looks
  /// at the values, and its own range checks on a key say the same.
  std::string_view error;
};

/// Two keys of which a request carries exactly one (present with any value, null too).
struct OneOf {
  std::string_view first, second;
  std::string_view error;  ///< both or neither: {"error": "bad request: <error>"}
};

/// One row of the command table: what a command takes and gives back.
struct CommandInfo {
  Command command;
  std::string_view name;
  /// Changes state: authorized by the connection's peer credentials, so only a transport
  /// that has them (the unix socket) may carry it; read-only transports refuse it.
  bool privileged;
  std::span<const RequestKey> keys;  ///< keys the daemon reads; others are ignored
  std::span<const OneOf> one_of;     ///< pairs of keys, exactly one of each present
  /// Every constraint across keys, for people; the daemon checks `one_of` itself and the
  /// rest where it reads the values. A command with no keys and no `one_of` takes any body.
  std::string_view rule;
  std::string_view reply;            ///< reply body shape
  std::string_view errors;           ///< Command::error bodies it may send
};

inline constexpr RequestKey kGetEventsKeys[] = {
    // only this process's events
    {"pid", "uint|null", false, "\"pid\" must be a non-negative integer"},
    // events numbered above this; without it, the newest
    {"after", "uint|null", false, "\"after\" must be a non-negative integer"},
    // at most this many (default 1000, clamped to 1..100000)
    {"max", "uint|null", false, "\"max\" must be a non-negative integer"},
};
inline constexpr RequestKey kSetLimitKeys[] = {
    // the process (1..2^31-1), or
    {"pid", "uint", false, "\"pid\" must be a process id"},
    // the job (of "user", default the caller)
    {"job", "string", false, "\"job\" must be a job name"},
    // the new cap (null or 2^64-1: none), or
    {"bytes", "uint|null", false, "\"bytes\" must be a non-negative integer or null"},
    // 0 < F <= 1 of each device's memory (pids only)
    {"share", "number", false, "\"share\" must be a number in (0, 1]"},
    // CUDA ordinal as the process sees it, 0..ring::kMaxDevices-1 (pids only; default: all)
    {"device", "uint|null", false, "\"device\" must be a CUDA ordinal 0..15"},
    // the job's owner, a login name or a uid (jobs only; null or absent: the caller)
    {"user", "string|uint|null", false, "\"user\" must be a user name or a uid"},
};
inline constexpr OneOf kSetLimitOneOf[] = {
    {"pid", "job", "give exactly one of \"pid\" and \"job\""},
    {"bytes", "share", "give exactly one of \"bytes\" (a number, or null for no cap) and \"share\""},
};

/// get_snapshot's "format" values: the daemon's and the CLI's one list.
inline constexpr std::string_view kSnapshotFormats[] = {"text", "json", "pytorch", "perfetto", "summary", "folded"};
constexpr bool is_snapshot_format(std::string_view f) noexcept {
  for (std::string_view k : kSnapshotFormats)
    if (k == f) return true;
  return false;
}

inline constexpr RequestKey kGetSnapshotKeys[] = {
    // the process
    {"pid", "uint", true, "\"pid\" must be a process id"},
    // "text" (default), "json", "pytorch" (a pickle, base64 in the reply), "perfetto", "summary",
    // "folded" (flame graph stacks: "frame;frame;frame bytes" lines, root first)
    {"format", "string|null", false, "\"format\" must be text, json, pytorch, perfetto, summary or folded"},
    // call sites and allocations a text report lists (default 10)
    {"top", "uint|null", false, "\"top\" must be a non-negative integer"},
    // the snapshot of the process's out-of-memory report this many back (0: the newest), not now
    {"oom", "uint|null", false, "\"oom\" must be a non-negative integer"},
    // 1: the call sites whose live bytes grew over the daemon's last 3 samples (every 30 s; now
    // the last) after the warm-up, never falling, in the format (text or json), not the snapshot
    {"leaks", "uint|null", false, "\"leaks\" must be 0 or 1"},
    // seconds: the call sites whose live bytes changed since the daemon's sample of then (the
    // newest taken at or before it, else the oldest kept) and now, in the format (text or json)
    {"since", "uint|null", false, "\"since\" must be a number of seconds"},
    // with leaks: seconds after the process's first allocation whose samples are left out (default 60)
    {"leak_warmup", "uint|null", false, "\"leak_warmup\" must be a number of seconds"},
    // 1: text views list every frame of a call site (with its class), not only its printed form
    {"full", "uint|null", false, "\"full\" must be 0 or 1"},
    // "user" (default): call sites whose user frames are equal are one, their bytes added;
    // "native": one per native stack, as captured
    {"by", "string|null", false, "\"by\" must be user or native"},
};
inline constexpr RequestKey kGetOomsKeys[] = {
    // only this process's reports
    {"pid", "uint|null", false, "\"pid\" must be a non-negative integer"},
};

inline constexpr RequestKey kGetHistoryKeys[] = {
    // one process only (its running ring, else its newest)
    {"pid", "uint|null", false, "\"pid\" must be a process id"},
    // "hour" (default: a point a second) or "day" (a point a minute)
    {"range", "string|null", false, "\"range\" must be hour or day"},
};

inline constexpr RequestKey kSuspendKeys[] = {
    // the process (1..2^31-1), or
    {"pid", "uint", false, "\"pid\" must be a process id"},
    // the job (of "user", default the caller): every member, as a whole
    {"job", "string", false, "\"job\" must be a job name"},
    // the job's owner, a login name or a uid (jobs only; null or absent: the caller)
    {"user", "string|uint|null", false, "\"user\" must be a user name or a uid"},
    // how long each process's lock may wait for its work, in ms (1..600000; default 10000)
    {"timeout_ms", "uint|null", false, "\"timeout_ms\" must be 1..600000"},
};
inline constexpr RequestKey kResumeKeys[] = {
    {"pid", "uint", false, "\"pid\" must be a process id"},
    {"job", "string", false, "\"job\" must be a job name"},
    {"user", "string|uint|null", false, "\"user\" must be a user name or a uid"},
    // the GPU to restore onto (NVML index or UUID); absent: each process's own
    {"gpu", "string|uint|null", false, "\"gpu\" must be a GPU index or UUID"},
};
inline constexpr OneOf kSuspendOneOf[] = {
    {"pid", "job", "give exactly one of \"pid\" and \"job\""},
};

inline constexpr RequestKey kRoomKeys[] = {
    // the CUDA ordinal, as the asking process sees it, that could not serve the allocation
    {"device", "uint", true, "\"device\" must be a CUDA ordinal 0..15"},
    // the allocation's size in bytes (1..2^63)
    {"bytes", "uint", true, "\"bytes\" must be a positive integer"},
};

/// Every command, in number order. The daemon dispatches through this table: a number not
/// in it gets {"error":"unknown command N"}.
inline constexpr CommandInfo kCommands[] = {
    {Command::get_state, "get_state", false, {}, {}, "",
     "state JSON (daemon/src/views/state_json.cpp): version, hostname, time_ns, run_dir, nvml, events_seq, "
     "gpus[], processes[], jobs[], problems[], policy, limit_changes[]",
     "bad request: too deeply nested | bad request: body is not JSON"},
    {Command::get_events, "get_events", false, kGetEventsKeys, {}, "",
     R"({"events":[{seq,pid,time_ns,api,kind,device,bytes,address,used_after,tid,result,aux)"
     R"([,new_limit,old_limit,by,by_uid,by_pid for control events]}], "next":SEQ, "latest":SEQ})",
     "bad request: <why> (a key of the wrong type, a body that is not an object)"},
    {Command::set_limit, "set_limit", true, kSetLimitKeys, kSetLimitOneOf,
     "exactly one of pid and job; exactly one of bytes and share; device and share with pid only; user with job only",
     R"(pid: {"target":"pid","pid","process_name","uid","user","changes":[{"device","uuid","old_limit","new_limit",)"
     R"("used_bytes"}]}; job: {"target":"job","job","uid","user","members":[pid...],"old_limit","new_limit",)"
     R"("gpus":[{"uuid","used_bytes","new_limit_bytes"}]})",
     R"(refused: {"error":"refused: <why>","refused":true} (root may do anything; others may only lower )"
     R"(caps of their own processes and jobs, within the policy); bad request: <why>; <why> when it cannot be done)"},
    {Command::get_snapshot, "get_snapshot", false, kGetSnapshotKeys, {}, "",
     R"({"pid","format","encoding":"utf-8"|"base64","exact","body"} (body: the snapshot in that format, )"
     R"(daemon/src/views/snapshot_views.hpp))",
     R"(bad request: <why>; no such process: PID; no out-of-memory report N for pid PID)"},
    {Command::get_ooms, "get_ooms", false, kGetOomsKeys, {}, "",
     R"({"reports":[{pid,process_name,user,time_ns,kind,api,device,bytes,cap_bytes,used_after,result,asked_at,)"
     R"(exact,sites:[{live_bytes,live_allocations,frame}],index}]} oldest first)",
     "bad request: <why>"},
    {Command::get_history, "get_history", false, kGetHistoryKeys, {}, "",
     R"(the HTTP API's history document (docs/http.md): {range, interval_s, time_ns, processes:[{pid,start_time,)"
     R"(process_name,user,job,state,devices:[{ordinal,uuid,gpu_index,t[],used_bytes[],reserved_bytes[],)"
     R"(peak_bytes[],limit_bytes[]}],ooms[]}], jobs[], gpus[]}; with pid: that process's object with range, )"
     R"(interval_s and time_ns)",
     "bad request: <why>; no such process: PID; no history (a daemon without one)"},
    {Command::suspend, "suspend", true, kSuspendKeys, kSuspendOneOf, "exactly one of pid and job; user with job only",
     R"({"action":"suspend","target":"pid"|"job","job","processes":[{"pid","process_name","user","host_bytes",)"
     R"("device_bytes","seconds"}]})",
     R"(refused: {"error":"refused: <why>","refused":true} (the owner or root; nothing the driver cannot carry; )"
     R"(room on the host); <why> when it cannot be done (a lock that timed out: nothing suspended))"},
    {Command::resume, "resume", true, kResumeKeys, kSuspendOneOf, "exactly one of pid and job; user with job only",
     R"({"action":"resume","target":"pid"|"job","job","processes":[{"pid","process_name","user","host_bytes",)"
     R"("device_bytes","seconds"[,"from_gpu":{"index","uuid"},"to_gpu":{"index","uuid"}]}]} (with gpu: the )"
     R"(GPU each process moved from and to))",
     R"(refused: {"error":"refused: <why>","refused":true} (the owner or root; free device memory for its footprint )"
     R"(and a margin; with gpu: one GPU of the same chip); <why> when it cannot be done (an unknown gpu))"},
    {Command::room, "room", true, kRoomKeys, {}, "sent by the interposer of the asking process itself",
     R"({"granted":true|false,"reason","shortfall_bytes","suspended":[pid...]} (granted: processes were )"
     R"(suspended by policy, or the memory is free now: try the allocation once more))",
     "bad request: <why>"},
};

/// The row of command number `number`, or null when there is none.
constexpr const CommandInfo* find_command(uint16_t number) noexcept {
  for (const CommandInfo& c : kCommands)
    if (static_cast<uint16_t>(c.command) == number) return &c;
  return nullptr;
}

/// Write header + body (at most kMaxReplyBody) to a connected stream socket, retrying on EINTR and short writes.
/// Returns false on any error (the peer went away). Blocking; `timeout_ms` bounds each poll.
bool send_message(int fd, Command cmd, uint32_t seq, const std::string& body, int timeout_ms) noexcept;

/// Result of reading one message.
struct Message {
  Header header{};
  std::string body;
};

/// Read exactly one message. Returns nullopt on EOF, timeout, bad magic/version, or a body
/// over `max_body` (kMaxBody: a request; a client reading a reply passes kMaxReplyBody); *why
/// (if given) says which, for logs.
std::optional<Message> recv_message(int fd, int timeout_ms, std::string* why = nullptr, uint32_t max_body = kMaxBody);

/// Client helper: connect to `socket_path`, send one request and wait for the reply. Sends
/// nothing to a server it may not believe (paths::trusted_socket_dir, paths::trusted_peer).
/// Returns nullopt and sets *why on failure ("no daemon at PATH: ...").
std::optional<Message> request(const std::string& socket_path, Command cmd, const std::string& body,
                               int timeout_ms, std::string* why);

}  // namespace cuw::proto
