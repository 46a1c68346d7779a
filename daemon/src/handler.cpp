// cuwarden daemon: request dispatch (see handler.hpp).
#include "handler.hpp"

#include <algorithm>
#include <exception>
#include <nlohmann/json.hpp>

#include "cuw/protocol.hpp"

namespace cuw::daemon {

Server::Reply handle_request(Registry& reg, const Peer& peer, uint16_t command, const std::string& body) {
  using cuw::proto::Command;
  using nlohmann::json;
  auto reply = [&](const nlohmann::ordered_json& j) {
    return Server::Reply{static_cast<uint16_t>(command | cuw::proto::kReplyBit),
                         j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)};
  };
  auto error = [](const std::string& what) {
    return Server::Reply{static_cast<uint16_t>(Command::error), json{{"error", what}}.dump()};
  };
  // Requests are small objects: refuse deep nesting before parsing (parser recursion).
  if (std::count(body.begin(), body.end(), '[') + std::count(body.begin(), body.end(), '{') > 64)
    return error("bad request: too deeply nested");
  json req = body.empty() ? json::object() : json::parse(body, nullptr, false);
  if (req.is_discarded()) return error("bad request: body is not JSON");
  switch (static_cast<Command>(command)) {
    case Command::get_state:
      return reply(reg.state_json());
    case Command::get_events:
      try {
        return reply(reg.events_json(req));
      } catch (const std::exception& e) {
        return error(std::string("bad request: ") + e.what());
      }
    case Command::set_limit:
      try {
        return reply(reg.set_limit(peer, req));
      } catch (const Refused& e) {
        return Server::Reply{static_cast<uint16_t>(Command::error),
                             json{{"error", std::string("refused: ") + e.what()}, {"refused", true}}.dump()};
      } catch (const std::invalid_argument& e) {
        return error(std::string("bad request: ") + e.what());
      } catch (const std::exception& e) {
        return error(e.what());
      }
    default:
      return error("unknown command " + std::to_string(command));
  }
}

}  // namespace cuw::daemon
