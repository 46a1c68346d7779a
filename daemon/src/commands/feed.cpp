// cuwarden daemon commands: the HTTP event stream's content (see feed.hpp).
#include "commands/feed.hpp"

#include <nlohmann/json.hpp>

#include "views/events_json.hpp"
#include "views/state_json.hpp"

namespace cuw::daemon {

namespace {

template <class J>
std::string feed_text(const J& j) {
  return j.dump(-1, ' ', false, J::error_handler_t::replace);  // ring text may be any bytes
}

}  // namespace

std::string EventFeed::next(StreamCursor& c, uint64_t mono_now) {
  const uint64_t gen = store_->generation();
  const auto st = store_->load();
  std::string out;
  if (st->events_seq > c.last_seq) {
    nlohmann::json req = {{"after", c.last_seq}, {"max", 10000}};
    if (c.pid) req["pid"] = *c.pid;
    const auto ev = events_json(*st, req);
    for (const auto& e : ev["events"]) {
      out += "id: " + std::to_string(e["seq"].get<uint64_t>()) + "\nevent: memory\ndata: ";
      out += feed_text(e);
      out += "\n\n";
    }
    c.last_seq = ev["next"].get<uint64_t>();
    if (c.pid && c.last_seq < st->events_seq && ev["events"].empty()) c.last_seq = st->events_seq;
  }
  if (c.state && gen != c.state_generation && (c.state_sent_ns == 0 || mono_now - c.state_sent_ns >= 1'000'000'000ULL)) {
    if (cached_generation_ != gen || cached_state_ != st) {
      cached_state_doc_ = feed_text(state_json(*st));
      cached_generation_ = gen;
      cached_state_ = st;
    }
    out += "event: state\ndata: " + cached_state_doc_ + "\n\n";
    c.state_generation = gen;
    c.state_sent_ns = mono_now;
  }
  return out;
}

}  // namespace cuw::daemon
