// cuwarden daemon view: the event list from a published State (see events_json.hpp).
#include "views/events_json.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/util.hpp"

namespace cuw::daemon {

using json = nlohmann::ordered_json;

json events_json(const State& st, const nlohmann::json& request) {
  auto get_u64 = [&](const char* key, uint64_t fallback) -> uint64_t {
    auto it = request.find(key);
    if (it == request.end() || it->is_null()) return fallback;
    if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0))
      throw std::invalid_argument(std::string("\"") + key + "\" must be a non-negative integer");
    return it->get<uint64_t>();
  };
  if (!request.is_object()) throw std::invalid_argument("request body must be a JSON object");
  const uint64_t seq = st.events_seq;
  const bool has_pid = request.contains("pid") && !request["pid"].is_null();
  const uint64_t pid = get_u64("pid", 0);
  const bool has_after = request.contains("after") && !request["after"].is_null();
  uint64_t after = get_u64("after", 0);
  const uint64_t max = std::clamp<uint64_t>(get_u64("max", 1000), 1, 100000);
  if (after > seq) after = seq;  // a client that outlived a daemon restart resumes at "now"

  struct Ref {
    const StoredEvent* ev;
    uint32_t pid;
  };
  auto no_cap = [](uint64_t v) { return v == ring::kNoLimit ? json(nullptr) : json(v); };
  std::vector<Ref> refs;
  for (const ProcessState& p : st.processes) {
    if (has_pid && p.pid != pid) continue;
    p.history->for_each_after(after, [&](const StoredEvent& e) { refs.push_back({&e, p.pid}); });
  }
  std::sort(refs.begin(), refs.end(), [](const Ref& a, const Ref& b) { return a.ev->seq < b.ev->seq; });
  std::size_t begin = 0, end = refs.size();
  if (refs.size() > max) {
    if (has_after) end = max;
    else begin = refs.size() - max;
  }
  json events = json::array();
  for (std::size_t i = begin; i < end; ++i) {
    const ring::Event& e = refs[i].ev->e;
    events.push_back({
        {"seq", refs[i].ev->seq},
        {"pid", refs[i].pid},
        {"time_ns", e.time_ns},
        {"api", ring::api_name(e.api)},
        {"kind", ring::kind_name(e.kind)},
        {"device", e.device},
        {"bytes", e.bytes},
        {"address", e.address},
        {"used_after", e.used_after},
        {"tid", e.tid},
        {"result", e.result},
        {"aux", e.aux},
    });
    if (e.api == static_cast<uint16_t>(ring::Api::control)) {
      // A change the daemon made: who asked, and for a cap, the cap before and after (null =
      // none); a suspend or resume says how much went to the host and back in `bytes`.
      json& j = events.back();
      const uint32_t by = refs[i].ev->by_uid;
      if (e.kind == static_cast<uint8_t>(ring::EventKind::limit_change)) {
        j["new_limit"] = no_cap(e.bytes);
        j["old_limit"] = no_cap(e.aux);
      }
      const bool daemon = by == StoredEvent::kFromPolicy || by == StoredEvent::kFromTamper;
      j["by"] = by == StoredEvent::kFromPolicy   ? json("policy")
                : by == StoredEvent::kFromTamper ? json("tamper")
                                                 : json(user_name(by));
      j["by_uid"] = daemon ? json(nullptr) : json(by);
      j["by_pid"] = e.tid;
    }
  }
  const uint64_t next = end > begin ? refs[end - 1].ev->seq : (has_after ? after : seq);
  return {{"events", std::move(events)}, {"next", next}, {"latest", seq}};
}

}  // namespace cuw::daemon
