// cuwarden daemon view: set_limit's request and reply JSON (see limit_json.hpp).
#include "views/limit_json.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <string_view>

#include "base/util.hpp"
#include "cuw/job.hpp"
#include "cuw/protocol.hpp"
#include "cuw/ring.hpp"

namespace cuw::daemon {

using json = nlohmann::ordered_json;

namespace {

static_assert(ring::kMaxDevices == 16, "protocol.hpp's \"device\" error names the ordinals 0..15");
static_assert(job::kNoLimit == ring::kNoLimit, "the reply writes both kinds of cap with one null");

/// The error text of set_limit's key `name` in the command table: one text per key, whether
/// its type or its range is wrong.
[[noreturn]] void bad_key(std::string_view name) {
  for (const proto::RequestKey& k : proto::kSetLimitKeys)
    if (k.name == name) throw std::invalid_argument(std::string(k.error));
  throw std::logic_error("set_limit has no key " + std::string(name));
}

[[noreturn]] void bad_pair(std::string_view first) {
  for (const proto::OneOf& o : proto::kSetLimitOneOf)
    if (o.first == first) throw std::invalid_argument(std::string(o.error));
  throw std::logic_error("set_limit has no pair of " + std::string(first));
}

bool limit_has(const nlohmann::json& body, const char* key) { return body.contains(key); }
bool limit_gives(const nlohmann::json& body, const char* key) { return body.contains(key) && !body[key].is_null(); }

/// A non-negative integer, or nullopt for any other value.
std::optional<uint64_t> uint_of(const nlohmann::json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  return std::nullopt;
}

LimitAsk parse_ask(const nlohmann::json& body) {
  LimitAsk a;
  if (limit_has(body, "bytes") == limit_has(body, "share")) bad_pair("bytes");
  if (limit_has(body, "bytes")) {
    const auto& b = body["bytes"];
    if (b.is_null()) {
      a.remove = true;
    } else {
      const auto n = uint_of(b);
      if (!n) bad_key("bytes");
      a.bytes = *n;
      if (a.bytes == ring::kNoLimit) a.remove = true;  // the wire value of "none"
    }
  } else {
    const auto& s = body["share"];
    if (!s.is_number() || !std::isfinite(s.get<double>()) || s.get<double>() <= 0 || s.get<double>() > 1)
      bad_key("share");
    a.share = true;
    a.fraction = s.get<double>();
  }
  return a;
}

json limit_cap_json(uint64_t v) { return v == ring::kNoLimit ? json(nullptr) : json(v); }

}  // namespace

LimitRequest parse_limit_request(const nlohmann::json& body) {
  if (!body.is_object()) throw std::invalid_argument("request body must be a JSON object");
  if (limit_has(body, "pid") == limit_has(body, "job")) bad_pair("pid");
  LimitRequest r;
  if (limit_has(body, "pid")) {
    r.target = LimitRequest::Target::pid;
    const auto pid = uint_of(body["pid"]);
    if (!pid || *pid == 0 || *pid > 0x7fffffff) bad_key("pid");
    r.pid = static_cast<uint32_t>(*pid);
    if (limit_has(body, "user")) throw std::invalid_argument("\"user\" goes with \"job\" only");
    if (limit_gives(body, "device")) {
      const auto d = uint_of(body["device"]);
      if (!d || *d >= ring::kMaxDevices) bad_key("device");
      r.device = static_cast<uint32_t>(*d);
    }
    r.ask = parse_ask(body);
    return r;
  }
  r.target = LimitRequest::Target::job;
  if (!body["job"].is_string()) bad_key("job");
  r.job = body["job"].get<std::string>();
  std::string why;
  if (!job::valid_job_name(r.job, &why)) throw std::invalid_argument("bad job name: " + why);
  if (limit_gives(body, "device"))
    throw std::invalid_argument("\"device\" goes with \"pid\": a job's cap is one size for every GPU it uses");
  if (limit_has(body, "share")) throw std::invalid_argument("a job's cap is one size for all its GPUs: give \"bytes\"");
  r.ask = parse_ask(body);
  if (limit_gives(body, "user")) {
    const auto& u = body["user"];
    if (const auto uid = uint_of(u); uid && *uid <= 0xffffffffULL) r.user_uid = static_cast<uint32_t>(*uid);
    else if (u.is_string()) r.user_name = u.get<std::string>();
    else bad_key("user");
  }
  return r;
}

json limit_reply_json(const LimitResult& r) {
  if (r.target == LimitRequest::Target::pid) {
    json changes = json::array();
    for (const auto& c : r.changes)
      changes.push_back({{"device", c.device},
                         {"uuid", format_uuid(c.uuid)},
                         {"old_limit", limit_cap_json(c.old_limit)},
                         {"new_limit", limit_cap_json(c.new_limit)},
                         {"used_bytes", c.used_bytes}});
    return {{"target", "pid"},     {"pid", r.pid}, {"process_name", r.process_name},
            {"uid", r.uid},        {"user", r.user}, {"changes", std::move(changes)}};
  }
  json gpus = json::array();
  for (const auto& g : r.gpus)
    gpus.push_back({{"uuid", format_uuid(g.uuid)}, {"used_bytes", g.used_bytes}, {"new_limit_bytes", limit_cap_json(r.new_limit)}});
  return {{"target", "job"},
          {"job", r.job},
          {"uid", r.uid},
          {"user", r.user},
          {"members", r.members},
          {"old_limit", limit_cap_json(r.old_limit)},
          {"new_limit", limit_cap_json(r.new_limit)},
          {"gpus", std::move(gpus)}};
}

nlohmann::json limit_error_json(const LimitResult& r) {
  if (r.outcome == LimitResult::Outcome::refused)
    return nlohmann::json{{"error", "refused: " + r.reason}, {"refused", true}};
  return nlohmann::json{{"error", r.reason}};
}

}  // namespace cuw::daemon
