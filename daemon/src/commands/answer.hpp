// cuwarden daemon commands: what a handler answers, before a transport frames it.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuw/protocol.hpp"

namespace cuw::daemon {

/// The transport a request came by: the handlers answer both the same way, and word what
/// they say in each one's own terms (the socket's are the command table's texts, a JSON
/// envelope around a snapshot; HTTP's are its API's, a snapshot's bytes as the body).
enum class Via { socket, http };

/// One command's answer. The socket sends any status but 200 as Command::error; HTTP sends
/// the status.
struct Answer {
  int status = 200;  ///< 200 done, 400 a bad request, 403 not allowed, 404 no such thing
  /// 200: the reply body as sent. Otherwise, when not empty: the whole error body (set_limit's
  /// refusals carry more than a text).
  std::string body;
  std::string error;     ///< not 200 and no body: what the error says
  bool refused = false;  ///< refused by the authorization rules: the socket's body says so
  std::string content_type = "application/json";                 ///< HTTP only
  std::vector<std::pair<std::string, std::string>> headers;       ///< HTTP only: extra ones
};

/// A JSON document as the reply of `via`: invalid UTF-8 from a ring replaced, and HTTP's
/// bodies end with a newline. Pure.
Answer json_answer(const nlohmann::ordered_json& j, Via via);

/// An error with `status` that says `what`. Pure.
Answer failure(int status, std::string what);

/// The request's value of `key` for `command` is out of its range: 400, worded as `via`
/// words it (the socket: "bad request: " and the key's error of the command table; HTTP:
/// its route's text for the key). Pure.
Answer bad_value(Via via, proto::Command command, std::string_view key);

}  // namespace cuw::daemon
