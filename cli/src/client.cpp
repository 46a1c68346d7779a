// cuwarden CLI: one request to the daemon (see client.hpp).
#include "client.hpp"

#include <cstdio>

namespace cuw::cli {

std::optional<nlohmann::ordered_json> ask(const std::string& socket, proto::Command cmd, const nlohmann::ordered_json& body,
                                          AskError* error, int timeout_ms) {
  std::string why;
  auto reply = proto::request(socket, cmd, body.dump(), timeout_ms, &why);
  // Every failure's text is made once: printed, or handed back to a caller that draws it.
  const auto fail = [error](const std::string& msg, bool quiet_too) {
    if (error) error->message = msg;
    if (!error || !(error->quiet || quiet_too)) std::fprintf(stderr, "cuwarden: %s\n", msg.c_str());
    return std::nullopt;
  };
  if (!reply) {
    // Connected and asked, but no reply: a daemon runs there and did not answer in time,
    // which "no daemon is running" would misreport (and the request may still be applied).
    if (why.rfind("timed out", 0) == 0 || why == "connection closed" || why == "could not send the request")
      return fail("the daemon at " + socket + " accepted the request but did not answer (timed out: " + why +
                      "); it may be busy or stuck",
                  false);
    if (error) error->no_daemon = true;
    return fail("no daemon is running (no answer at " + socket + ": " + why + "). Start it with: cuwardend &",
                error && error->quiet_no_daemon);
  }
  auto j = nlohmann::ordered_json::parse(reply->body, nullptr, false);
  if (reply->header.command == static_cast<uint16_t>(proto::Command::error)) {
    const std::string msg = j.is_object() && j.contains("error") && j["error"].is_string()
                                ? j["error"].get<std::string>()
                                : reply->body;
    const bool refused = j.is_object() && j.value("refused", false);
    if (error) error->refused = refused;
    return fail(refused ? msg : "the daemon refused the request: " + msg, false);  // refused: "refused: ..."
  }
  if (j.is_discarded() || !j.is_object())
    return fail("the daemon at " + socket + " sent a reply that is not a JSON object", false);
  return j;
}

}  // namespace cuw::cli
