// cuwarden daemon commands: answers and how each transport words them (see answer.hpp).
#include "commands/answer.hpp"

namespace cuw::daemon {

namespace {

/// HTTP's words for a query parameter out of range (docs/http.md).
struct HttpParamError {
  std::string_view key, text;
};
constexpr HttpParamError kHttpParamErrors[] = {
    {"format", "format must be json, text, pytorch, perfetto, summary or folded"},
    {"range", "range must be hour or day"},
    {"top", "top must be a number from 1 to 100000"},
    {"by", "by must be user or native"},
    {"pid", "pid must be a process id"},
};

}  // namespace

Answer json_answer(const nlohmann::ordered_json& j, Via via) {
  Answer a;
  a.body = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);  // ring text may be any bytes
  if (via == Via::http) a.body += '\n';
  return a;
}

Answer failure(int status, std::string what) {
  Answer a;
  a.status = status;
  a.error = std::move(what);
  return a;
}

Answer bad_value(Via via, proto::Command command, std::string_view key) {
  if (via == Via::http) {
    for (const HttpParamError& e : kHttpParamErrors)
      if (e.key == key) return failure(400, std::string(e.text));
    return failure(400, std::string(key) + " is out of range");
  }
  if (const proto::CommandInfo* info = proto::find_command(static_cast<uint16_t>(command)))
    for (const proto::RequestKey& k : info->keys)
      if (k.name == key) return failure(400, "bad request: " + std::string(k.error));
  return failure(400, "bad request: \"" + std::string(key) + "\" is out of range");
}

}  // namespace cuw::daemon
