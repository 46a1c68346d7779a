// cuwarden daemon views: suspend and resume as JSON (see suspend_json.hpp).
#include "views/suspend_json.hpp"

#include <stdexcept>

#include "cuw/job.hpp"

namespace cuw::daemon {

namespace {
bool suspend_gives(const nlohmann::json& body, const char* key) { return body.contains(key) && !body[key].is_null(); }
}  // namespace

SuspendRequest parse_suspend_request(const nlohmann::json& body, SuspendRequest::Action action) {
  SuspendRequest r;
  r.action = action;
  if (suspend_gives(body, "pid")) {
    const uint64_t pid = body["pid"].get<uint64_t>();
    if (pid == 0 || pid > 0x7fffffffULL) throw std::invalid_argument("\"pid\" must be a process id");
    r.pid = static_cast<uint32_t>(pid);
    if (suspend_gives(body, "user")) throw std::invalid_argument("\"user\" goes with \"job\" only");
  } else {
    r.job = true;
    r.job_name = body["job"].get<std::string>();
    std::string why;
    if (!job::valid_job_name(r.job_name, &why)) throw std::invalid_argument("\"job\": " + why);
    if (suspend_gives(body, "user")) {
      const auto& u = body["user"];
      if (u.is_number_unsigned() && u.get<uint64_t>() <= 0xffffffffULL) r.user_uid = u.get<uint32_t>();
      else if (u.is_string()) r.user_name = u.get<std::string>();
      else throw std::invalid_argument("\"user\" must be a user name or a uid");
    }
  }
  if (suspend_gives(body, "gpu")) {
    if (action != SuspendRequest::Action::resume) throw std::invalid_argument("\"gpu\" goes with resume");
    const auto& g = body["gpu"];
    if (g.is_number_unsigned() && g.get<uint64_t>() < 64) r.gpu = std::to_string(g.get<uint64_t>());
    else if (g.is_string() && !g.get<std::string>().empty() && g.get<std::string>().size() <= 64) r.gpu = g.get<std::string>();
    else throw std::invalid_argument("\"gpu\" must be a GPU index or UUID");
  }
  if (suspend_gives(body, "timeout_ms")) {
    const uint64_t t = body["timeout_ms"].get<uint64_t>();
    if (t == 0 || t > 600'000) throw std::invalid_argument("\"timeout_ms\" must be 1..600000");
    r.timeout_ms = static_cast<uint32_t>(t);
  }
  return r;
}

nlohmann::ordered_json suspend_reply_json(const SuspendResult& r) {
  nlohmann::ordered_json procs = nlohmann::ordered_json::array();
  for (const SuspendTarget& t : r.processes) {
    procs.push_back({{"pid", t.pid},
                     {"process_name", t.process_name},
                     {"user", t.user},
                     {"host_bytes", r.action == SuspendRequest::Action::suspend ? t.device_bytes : t.host_bytes},
                     {"device_bytes", t.device_bytes},
                     {"seconds", t.seconds}});
    if (!t.pairs.empty()) {
      procs.back()["from_gpu"] = {{"index", t.from_index}, {"uuid", t.from_uuid}};
      procs.back()["to_gpu"] = {{"index", t.to_index}, {"uuid", t.to_uuid}};
    }
  }
  return {{"action", r.action == SuspendRequest::Action::suspend ? "suspend" : "resume"},
          {"target", r.job ? "job" : "pid"},
          {"job", r.job ? nlohmann::ordered_json(r.job_name) : nlohmann::ordered_json(nullptr)},
          {"processes", std::move(procs)}};
}

nlohmann::json suspend_error_json(const SuspendResult& r) {
  if (r.outcome == SuspendResult::Outcome::refused) return {{"error", "refused: " + r.reason}, {"refused", true}};
  return {{"error", r.reason}};
}

}  // namespace cuw::daemon
