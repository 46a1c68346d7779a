// cuwarden daemon commands: get_state, get_events, get_history, set_limit and /metrics (see
// handlers.hpp).
#include <exception>
#include <stdexcept>

#include "commands/handlers.hpp"
#include "views/events_json.hpp"
#include "views/history_json.hpp"
#include "views/limit_json.hpp"
#include "views/metrics_text.hpp"
#include "views/state_json.hpp"

namespace cuw::daemon {

Answer get_state(const Backend& b, Via via) { return json_answer(state_json(*b.store->load()), via); }

Answer get_events(const Backend& b, const nlohmann::json& request) {
  try {
    return json_answer(events_json(*b.store->load(), request), Via::socket);
  } catch (const std::exception& e) {
    return failure(400, std::string("bad request: ") + e.what());
  }
}

Answer get_history(const Backend& b, const HistoryArgs& args, Via via) {
  if (!b.series) return failure(404, "no history (a daemon without one)");
  std::optional<uint32_t> pid;
  if (args.pid) {
    if (*args.pid == 0 || *args.pid > 0x7fffffffULL) return bad_value(via, proto::Command::get_history, "pid");
    pid = static_cast<uint32_t>(*args.pid);
  }
  if (args.range && *args.range != "hour" && *args.range != "day")
    return bad_value(via, proto::Command::get_history, "range");
  const auto h = b.series->copy(args.range == "day", pid);
  if (!h) return failure(404, "no such process: " + std::to_string(*pid));
  return json_answer(pid ? process_history_json(*h) : history_json(*h), via);
}

Answer set_limit(const Backend& b, const Peer& peer, const nlohmann::json& request) {
  LimitRequest lr;
  try {
    lr = parse_limit_request(request);
  } catch (const std::invalid_argument& e) {
    return failure(400, std::string("bad request: ") + e.what());
  }
  try {
    const LimitResult r = b.set_limit(peer, lr);
    if (r.outcome == LimitResult::Outcome::changed) return json_answer(limit_reply_json(r), Via::socket);
    Answer a = failure(403, "");
    a.body = limit_error_json(r).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return a;
  } catch (const std::exception& e) {
    return failure(400, e.what());
  }
}

Answer metrics(const Backend& b) {
  Answer a;
  a.content_type = "text/plain; version=0.0.4; charset=utf-8";
  a.body = metrics_text(*b.store->load());
  return a;
}

}  // namespace cuw::daemon
