// cuwarden daemon transport: request dispatch through the command table (see handler.hpp).
#include "transports/handler.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <exception>

#include "model/snapshots.hpp"
#include "views/events_json.hpp"
#include "views/limit_json.hpp"
#include "views/oom_json.hpp"
#include "views/history_json.hpp"
#include "views/snapshot_views.hpp"
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

namespace {

std::string base64(const std::string& in) {
  static constexpr char k[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = uint32_t(uint8_t(in[i])) << 16 | uint32_t(uint8_t(in[i + 1])) << 8 | uint8_t(in[i + 2]);
    out += {k[v >> 18], k[(v >> 12) & 63], k[(v >> 6) & 63], k[v & 63]};
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    out += {k[v >> 18], k[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == in.size()) {
    const uint32_t v = uint32_t(uint8_t(in[i])) << 16 | uint32_t(uint8_t(in[i + 1])) << 8;
    out += {k[v >> 18], k[(v >> 12) & 63], k[(v >> 6) & 63], '='};
  }
  return out;
}

/// Whether `peer` may see the call sites and allocations of process `pid` of user `uid`: its
/// owner and root only (a snapshot shows code paths, module addresses, file names).
bool may_see(const Peer& peer, uint32_t uid, uint32_t pid) { return peer_owns(peer, uid, pid); }

/// The reports of `pid` (all when none) that `peer` may see, newest first.
std::vector<std::shared_ptr<const OomReport>> reports_of(const State& st, std::optional<uint32_t> pid,
                                                         const Peer& peer) {
  std::vector<std::shared_ptr<const OomReport>> v;
  for (auto it = st.ooms.rbegin(); it != st.ooms.rend(); ++it)
    if ((!pid || peer_means(peer, *pid, (*it)->pid)) && may_see(peer, (*it)->uid, (*it)->pid)) v.push_back(*it);
  return v;
}

}  // namespace

bool slow_command(uint16_t command) noexcept {
  return command == static_cast<uint16_t>(proto::Command::get_snapshot) ||
         command == static_cast<uint16_t>(proto::Command::get_ooms);
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
    case Command::get_snapshot: {
      const auto st = backend.store->load();
      const auto pid = req["pid"].get<uint64_t>();
      const std::string format = req.contains("format") && req["format"].is_string() ? req["format"].get<std::string>()
                                                                                      : "text";
      if (!proto::is_snapshot_format(format))
        return error("bad request: \"format\" must be text, json, pytorch, perfetto or summary");
      TakenSnapshot taken;
      if (req.contains("oom") && !req["oom"].is_null()) {
        const auto n = req["oom"].get<uint64_t>();
        const auto reps = reports_of(*st, static_cast<uint32_t>(pid), peer);
        if (n >= reps.size())
          return error("no out-of-memory report " + std::to_string(n) + " for pid " + std::to_string(pid));
        taken = reps[n]->snapshot;
      } else {
        const ProcessState* p = nullptr;
        for (const ProcessState& ps : st->processes)
          if (peer_means(peer, pid, ps.pid) && (!p || (p->exited && !ps.exited))) p = &ps;
        if (!p) return error("no such process: " + std::to_string(pid));
        if (!may_see(peer, p->uid, p->pid))
          return Server::Reply{static_cast<uint16_t>(Command::error),
                               json{{"error", "refused: pid " + std::to_string(pid) +
                                                  " is another user's process (its owner or root may take its snapshot)"},
                                    {"refused", true}}
                                   .dump()};
        taken = take_snapshot(ProcessIdentity{ring_dir(st->run_dir, *p), p->pid, p->uid, p->start_time, p->user,
                                              p->exited, p->ns_pid},
                              p->header, p->history.get());
      }
      if (backend.symbolize) symbolize(taken, *backend.symbolize);
      TextOptions opts;
      if (req.contains("leaks") && req["leaks"].is_number() && req["leaks"].get<uint64_t>() != 0) {
        if (format != "text" && format != "json") return error("bad request: --leaks takes the text or json format");
        std::vector<Snapshot> window;
        for (const ProcessState& ps : st->processes)
          if (ps.pid == pid && ps.start_time == taken.start_time && ps.samples)  // not a pid's earlier owner
            for (const auto& sample : *ps.samples) window.push_back(*sample);
        window.push_back(taken.snap);
        nlohmann::ordered_json j;
        j["pid"] = pid;
        j["format"] = format;
        j["exact"] = taken.snap.exact;
        j["encoding"] = "utf-8";
        j["body"] = format == "json" ? leaks_json(window).dump(1) : leaks_text(window, opts);
        return reply(j);
      }
      if (req.contains("top") && req["top"].is_number()) opts.top = req["top"].get<uint64_t>();
      nlohmann::ordered_json j;
      j["pid"] = pid;
      j["format"] = format;
      j["exact"] = taken.snap.exact;
      if (!taken.live_error.empty()) j["why_not_exact"] = taken.live_error;
      if (!taken.symbols_note.empty()) j["symbols_note"] = taken.symbols_note;
      if (format == "pytorch") {
        j["encoding"] = "base64";
        j["body"] = base64(snapshot_pytorch(taken.snap));
      } else {
        j["encoding"] = "utf-8";
        j["body"] = format == "text"       ? snapshot_text(taken.snap, opts)
                    : format == "json"     ? snapshot_json(taken.snap).dump(1)
                    : format == "perfetto" ? snapshot_perfetto(taken.snap)
                                           : summary_text(taken.snap);
      }
      return reply(j);
    }
    case Command::get_history: {
      if (!backend.series) return error("no history (a daemon without one)");
      std::optional<uint32_t> pid;
      if (req.contains("pid") && !req["pid"].is_null()) {
        const auto v = req["pid"].get<uint64_t>();
        if (v == 0 || v > 0x7fffffffULL) return error("bad request: \"pid\" must be a process id");
        pid = static_cast<uint32_t>(v);
      }
      bool day = false;
      if (req.contains("range") && req["range"].is_string()) {
        const std::string r = req["range"].get<std::string>();
        if (r != "hour" && r != "day") return error("bad request: \"range\" must be hour or day");
        day = r == "day";
      }
      const auto h = backend.series->copy(day, pid);
      if (!h) return error("no such process: " + std::to_string(*pid));
      return reply(pid ? process_history_json(*h) : history_json(*h));
    }
    case Command::get_ooms: {
      const auto st = backend.store->load();
      std::optional<uint32_t> pid;
      if (req.contains("pid") && !req["pid"].is_null()) pid = static_cast<uint32_t>(req["pid"].get<uint64_t>());
      const auto reps = reports_of(*st, pid, peer);
      nlohmann::ordered_json list = nlohmann::ordered_json::array();
      std::map<uint32_t, std::size_t> index;  // per pid, newest first
      std::vector<nlohmann::ordered_json> rows;
      for (const auto& r : reps) {
        TakenSnapshot named = r->snapshot;
        if (backend.symbolize) symbolize(named, *backend.symbolize);
        rows.push_back(oom_json(*r, named.snap, index[r->pid]++));
      }
      for (auto it = rows.rbegin(); it != rows.rend(); ++it) list.push_back(std::move(*it));  // oldest first
      nlohmann::ordered_json j;
      j["reports"] = std::move(list);
      return reply(j);
    }
    case Command::error:
      break;
  }
  return error("unknown command " + std::to_string(command));
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
