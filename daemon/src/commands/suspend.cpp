// cuwarden daemon commands: suspend and resume (see handlers.hpp).
#include <exception>
#include <stdexcept>

#include "commands/handlers.hpp"
#include "views/suspend_json.hpp"

namespace cuw::daemon {

Answer suspend(const Backend& b, const Peer& peer, const nlohmann::json& request, SuspendRequest::Action action) {
  SuspendRequest req;
  try {
    req = parse_suspend_request(request, action);
  } catch (const std::invalid_argument& e) {
    return failure(400, std::string("bad request: ") + e.what());
  }
  if (!b.suspend) return failure(400, "this daemon does not suspend processes (no checkpoint driver)");
  try {
    const SuspendResult r = b.suspend(peer, req);
    if (r.outcome == SuspendResult::Outcome::done) return json_answer(suspend_reply_json(r), Via::socket);
    Answer a = failure(r.outcome == SuspendResult::Outcome::refused ? 403 : 400, "");
    a.body = suspend_error_json(r).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return a;
  } catch (const std::exception& e) {
    return failure(400, e.what());
  }
}

Answer room(const Backend& b, const Peer& peer, const nlohmann::json& request) {
  RoomRequest req;
  const uint64_t device = request["device"].get<uint64_t>(), bytes = request["bytes"].get<uint64_t>();
  if (device >= 16) return failure(400, "bad request: \"device\" must be a CUDA ordinal 0..15");
  if (bytes == 0 || bytes > (uint64_t{1} << 63)) return failure(400, "bad request: \"bytes\" must be a positive integer");
  req.device = static_cast<uint32_t>(device);
  req.bytes = bytes;
  RoomAnswer a;
  if (!b.room) {
    a.reason = "this daemon does not suspend processes (no checkpoint driver)";
  } else {
    try {
      a = b.room(peer, req);
    } catch (const std::exception& e) {
      a.reason = e.what();
    }
  }
  nlohmann::ordered_json j = {{"granted", a.granted},
                      {"reason", a.reason},
                      {"shortfall_bytes", a.shortfall},
                      {"suspended", a.suspended}};
  return json_answer(j, Via::socket);
}

}  // namespace cuw::daemon
