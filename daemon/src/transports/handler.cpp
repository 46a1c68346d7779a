// cuwarden daemon transport: request dispatch through the command table (see handler.hpp).
#include "transports/handler.hpp"

#include <algorithm>
#include <exception>

#include "cuw/protocol.hpp"
#include "views/events_json.hpp"
#include "views/state_json.hpp"

namespace cuw::daemon {

Server::Reply handle_request(const Backend& backend, const Peer& peer, uint16_t command, const std::string& body) {
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
  const proto::CommandInfo* info = proto::find_command(command);
  if (!info || (info->privileged && !backend.set_limit)) return error("unknown command " + std::to_string(command));
  if (!info->privileged && backend.refresh) backend.refresh();
  switch (info->command) {
    case Command::get_state:
      return reply(state_json(*backend.store->load()));
    case Command::get_events:
      try {
        return reply(events_json(*backend.store->load(), req));
      } catch (const std::exception& e) {
        return error(std::string("bad request: ") + e.what());
      }
    case Command::set_limit:
      try {
        return reply(backend.set_limit(peer, req));
      } catch (const Refused& e) {
        return Server::Reply{static_cast<uint16_t>(Command::error),
                             json{{"error", std::string("refused: ") + e.what()}, {"refused", true}}.dump()};
      } catch (const std::invalid_argument& e) {
        return error(std::string("bad request: ") + e.what());
      } catch (const std::exception& e) {
        return error(e.what());
      }
    case Command::error:
      break;
  }
  return error("unknown command " + std::to_string(command));
}

Server::Reply handle_request(Registry& reg, const Peer& peer, uint16_t command, const std::string& body) {
  if (command != static_cast<uint16_t>(proto::Command::set_limit)) reg.publish();
  Backend b;
  b.store = &reg.store();
  b.set_limit = [&reg](const Peer& p, const nlohmann::json& req) {
    // Published whatever the outcome: a refusal is in the limit log too.
    try {
      auto r = reg.set_limit(p, req);
      reg.publish();
      return r;
    } catch (...) {
      reg.publish();
      throw;
    }
  };
  return handle_request(b, peer, command, body);
}

}  // namespace cuw::daemon
