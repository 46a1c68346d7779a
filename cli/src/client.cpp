// cuwarden CLI: one request to the daemon (see client.hpp).
#include "client.hpp"

#include <cstdio>

namespace cuw::cli {

std::optional<nlohmann::ordered_json> ask(const std::string& socket, proto::Command cmd, const nlohmann::ordered_json& body,
                                          AskError* error) {
  std::string why;
  auto reply = proto::request(socket, cmd, body.dump(), 10000, &why);
  if (!reply) {
    if (error) error->no_daemon = true;
    if (!error || !error->quiet_no_daemon)
      std::fprintf(stderr, "cuwarden: no daemon is running (no answer at %s: %s). Start it with: cuwardend &\n",
                   socket.c_str(), why.c_str());
    return std::nullopt;
  }
  auto j = nlohmann::ordered_json::parse(reply->body, nullptr, false);
  if (reply->header.command == static_cast<uint16_t>(proto::Command::error)) {
    const std::string msg = j.is_object() && j.contains("error") && j["error"].is_string()
                                ? j["error"].get<std::string>()
                                : reply->body;
    const bool refused = j.is_object() && j.value("refused", false);
    if (error) error->refused = refused;
    if (refused) std::fprintf(stderr, "cuwarden: %s\n", msg.c_str());  // "refused: ..."
    else std::fprintf(stderr, "cuwarden: the daemon refused the request: %s\n", msg.c_str());
    return std::nullopt;
  }
  if (j.is_discarded() || !j.is_object()) {
    std::fprintf(stderr, "cuwarden: the daemon at %s sent a reply that is not a JSON object\n", socket.c_str());
    return std::nullopt;
  }
  return j;
}

}  // namespace cuw::cli
