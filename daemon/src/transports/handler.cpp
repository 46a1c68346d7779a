// cuwarden daemon transport: request dispatch through the command table (see handler.hpp).
#include "transports/handler.hpp"

#include <algorithm>
#include <exception>

#include "views/events_json.hpp"
#include "views/limit_json.hpp"
#include "views/state_json.hpp"

namespace cuw::daemon {

bool fits_type(std::string_view type, const nlohmann::json& v) {
  while (!type.empty()) {
    const std::size_t bar = type.find('|');
    const std::string_view t = type.substr(0, bar);
    if ((t == "uint" && (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0))) ||
        (t == "number" && v.is_number()) || (t == "string" && v.is_string()) || (t == "null" && v.is_null()))
      return true;
    type = bar == std::string_view::npos ? std::string_view() : type.substr(bar + 1);
  }
  return false;
}

std::string check_request(const proto::CommandInfo& info, const nlohmann::json& body) {
  if (info.keys.empty() && info.one_of.empty()) return "";
  if (!body.is_object()) return "request body must be a JSON object";
  for (const proto::OneOf& o : info.one_of) {
    if (body.contains(o.first) == body.contains(o.second)) return std::string(o.error);
  }
  for (const proto::RequestKey& k : info.keys) {
    const auto it = body.find(k.name);
    if (it == body.end() ? k.required : !fits_type(k.type, *it)) return std::string(k.error);
  }
  return "";
}

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
  if (const std::string why = check_request(*info, req); !why.empty()) return error("bad request: " + why);
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
    case Command::set_limit: {
      LimitRequest lr;
      try {
        lr = parse_limit_request(req);
      } catch (const std::invalid_argument& e) {
        return error(std::string("bad request: ") + e.what());
      }
      try {
        const LimitResult r = backend.set_limit(peer, lr);
        if (r.outcome == LimitResult::Outcome::changed) return reply(limit_reply_json(r));
        return Server::Reply{static_cast<uint16_t>(Command::error),
                             limit_error_json(r).dump(-1, ' ', false, json::error_handler_t::replace)};
      } catch (const std::exception& e) {
        return error(e.what());
      }
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
  b.set_limit = [&reg](const Peer& p, const LimitRequest& req) { return reg.set_limit_and_publish(p, req); };
  return handle_request(b, peer, command, body);
}

}  // namespace cuw::daemon
