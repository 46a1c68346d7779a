// cuwarden daemon transport: a socket request, checked and dispatched through the table
// of commands (see handler.hpp).
#include "transports/handler.hpp"

#include <algorithm>

#include "commands/table.hpp"

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

bool slow_command(uint16_t command) noexcept {
  const CommandRow* row = find_command_row(command);
  return row && row->slow;
}

Server::Reply handle_request(const Backend& backend, const Peer& peer, uint16_t command, const std::string& body) {
  using cuw::proto::Command;
  using nlohmann::json;
  auto error = [](const std::string& what) {
    return Server::Reply{static_cast<uint16_t>(Command::error), json{{"error", what}}.dump()};
  };
  // Requests are small objects: refuse deep nesting before parsing (parser recursion).
  if (std::count(body.begin(), body.end(), '[') + std::count(body.begin(), body.end(), '{') > 64)
    return error("bad request: too deeply nested");
  json req = body.empty() ? json::object() : json::parse(body, nullptr, false);
  if (req.is_discarded()) return error("bad request: body is not JSON");
  const proto::CommandInfo* info = proto::find_command(command);
  const CommandRow* row = find_command_row(command);
  if (!info || !row || (info->privileged && !backend.set_limit))
    return error("unknown command " + std::to_string(command));
  if (const std::string why = check_request(*info, req); !why.empty()) return error("bad request: " + why);
  if (!info->privileged && backend.refresh) backend.refresh();
  const Answer a = row->socket(backend, peer, req);
  if (a.status == 200) return Server::Reply{static_cast<uint16_t>(command | proto::kReplyBit), a.body};
  if (!a.body.empty()) return Server::Reply{static_cast<uint16_t>(Command::error), a.body};
  if (a.refused)
    return Server::Reply{static_cast<uint16_t>(Command::error), json{{"error", a.error}, {"refused", true}}.dump()};
  return error(a.error);
}

Server::Reply handle_request(Registry& reg, const Peer& peer, uint16_t command, const std::string& body,
                             const SymbolizeOptions* symbolize) {
  if (command != static_cast<uint16_t>(proto::Command::set_limit)) reg.publish();
  Backend b;
  b.store = &reg.store();
  b.set_limit = [&reg](const Peer& p, const LimitRequest& req) { return reg.set_limit_and_publish(p, req); };
  b.symbolize = symbolize;
  // A history of this one sample, as the daemon's loop would have taken at a scan.
  SeriesStore series;
  if (command == static_cast<uint16_t>(proto::Command::get_history)) series.record(*reg.store().load());
  b.series = &series;
  return handle_request(b, peer, command, body);
}

}  // namespace cuw::daemon
