// cuwarden daemon commands: get_snapshot and get_ooms, the commands that take a process's
// snapshot and name its frames (see handlers.hpp).
#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "commands/handlers.hpp"
#include "model/snapshots.hpp"
#include "views/oom_json.hpp"
#include "views/snapshot_views.hpp"

namespace cuw::daemon {

namespace {

using ojson = nlohmann::ordered_json;

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

/// The largest `top` a page may ask for over HTTP.
constexpr uint64_t kMaxHttpTop = 100000;

/// Whether `who` may see the call sites and allocations of process `pid` of user `uid`: its
/// owner and root only (a snapshot shows code paths, module addresses, file names). Null:
/// the transport allowed every process.
bool may_see(const Peer* who, uint32_t uid, uint32_t pid) { return !who || peer_owns(*who, uid, pid); }

/// Whether `who` (null: a caller of the daemon's namespace) means process `host_pid` by `pid`.
bool means(const Peer* who, uint64_t pid, uint32_t host_pid) {
  return who ? peer_means(*who, static_cast<uint32_t>(pid), host_pid) : pid == host_pid;
}

/// The process `who` means by `pid`: the running one when a pid has an exited one too.
const ProcessState* find_process(const State& st, const Peer* who, uint64_t pid) {
  const ProcessState* p = nullptr;
  for (const ProcessState& ps : st.processes)
    if (means(who, pid, ps.pid) && (!p || (p->exited && !ps.exited))) p = &ps;
  return p;
}

/// The reports of `pid` (all when none) that `who` may see, newest first.
std::vector<std::shared_ptr<const OomReport>> reports_of(const State& st, std::optional<uint32_t> pid, const Peer* who) {
  std::vector<std::shared_ptr<const OomReport>> v;
  for (auto it = st.ooms.rbegin(); it != st.ooms.rend(); ++it)
    if ((!pid || means(who, *pid, (*it)->pid)) && may_see(who, (*it)->uid, (*it)->pid)) v.push_back(*it);
  return v;
}

/// The socket's reply: an envelope naming the format, the body in it (base64 for the pickle).
/// The frame classes: the daemon's (built-in and the site's), else the built-in ones.
const frames::Rules* rules_of(const Backend& b) { return b.symbolize ? &b.symbolize->frames : nullptr; }

TextOptions text_options(const Backend& b, const SnapshotArgs& args) {
  TextOptions opts;
  if (args.top) opts.top = *args.top;
  opts.full = args.full;
  opts.rules = rules_of(b);
  return opts;
}

Answer socket_view(const Backend& b, const TakenSnapshot& taken, uint64_t pid, const std::string& format,
                   const SnapshotArgs& args) {
  const TextOptions opts = text_options(b, args);
  ojson j;
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
                : format == "json"     ? snapshot_json(taken.snap, opts.rules).dump(1)
                : format == "perfetto" ? snapshot_perfetto(taken.snap)
                : format == "folded"   ? snapshot_folded(taken.snap, opts.rules)
                                       : summary_text(taken.snap);
  }
  return json_answer(j, Via::socket);
}

/// HTTP's reply: the format's own bytes and media type; JSON with `top` is the page's view
/// (the largest call sites and allocations, no trace).
Answer http_view(const Backend& b, const TakenSnapshot& taken, uint64_t pid, const std::string& format,
                 const SnapshotArgs& args) {
  Answer a;
  const TextOptions opts = text_options(b, args);
  a.headers.emplace_back("X-Cuwarden-Exact", taken.snap.exact ? "1" : "0");
  if (format == "json") {
    auto j = snapshot_json(taken.snap, opts.rules);
    if (!taken.live_error.empty()) j["why_not_exact"] = taken.live_error;
    if (!taken.symbols_note.empty()) j["symbols_note"] = taken.symbols_note;
    if (args.top) {
      const uint64_t top = *args.top;
      auto largest = [&](const char* key, const char* by) {
        auto& arr = j[key];
        std::stable_sort(arr.begin(), arr.end(), [by](const auto& x, const auto& y) { return x[by] > y[by]; });
        if (arr.size() > top) arr.erase(arr.begin() + static_cast<std::ptrdiff_t>(top), arr.end());
      };
      largest("sites", "live_bytes");
      largest("allocations", "bytes");
      j.erase("trace");
    }
    a.body = json_answer(j, Via::http).body;
  } else if (format == "pytorch") {
    a.body = snapshot_pytorch(taken.snap);
    a.content_type = "application/octet-stream";
    a.headers.emplace_back("Content-Disposition", "attachment; filename=\"snapshot-" + std::to_string(pid) + ".pickle\"");
  } else if (format == "perfetto") {
    a.body = snapshot_perfetto(taken.snap);
  } else if (format == "folded") {
    a.body = snapshot_folded(taken.snap, opts.rules);
    a.content_type = "text/plain; charset=utf-8";
  } else {
    a.body = format == "text" ? snapshot_text(taken.snap, opts) : summary_text(taken.snap);
    a.content_type = "text/plain; charset=utf-8";
  }
  return a;
}

/// The call sites that only grew over the process's samples and `taken`, in `format`.
Answer leaks_view(const Backend& b, const State& st, const TakenSnapshot& taken,
                  const std::map<uint32_t, uint32_t>& merged, uint64_t pid, const std::string& format,
                  const SnapshotArgs& args, Via via) {
  if (format != "text" && format != "json") return failure(400, "bad request: --leaks takes the text or json format");
  std::vector<Snapshot> window;
  for (const ProcessState& ps : st.processes)
    if (ps.pid == pid && ps.start_time == taken.start_time && ps.samples)  // not a pid's earlier owner
      for (const auto& sample : *ps.samples) {
        window.push_back(*sample);
        remap_sites(window.back(), merged);
      }
  window.push_back(taken.snap);
  const TextOptions opts = text_options(b, args);
  LeakOptions leak;
  if (args.leak_warmup_s) leak.warmup_ns = std::min<uint64_t>(*args.leak_warmup_s, UINT64_MAX / 1'000'000'000ULL) * 1'000'000'000ULL;
  ojson j;
  j["pid"] = pid;
  j["format"] = format;
  j["exact"] = taken.snap.exact;
  j["encoding"] = "utf-8";
  j["body"] = format == "json" ? leaks_json(window, opts.rules, leak).dump(1) : leaks_text(window, opts, leak);
  return json_answer(j, via);
}

/// The call sites whose live bytes changed between the process's sample of `args.since_s`
/// seconds ago (the newest at or before then, else the oldest kept) and `taken`.
Answer since_view(const Backend& b, const State& st, const TakenSnapshot& taken,
                  const std::map<uint32_t, uint32_t>& merged, uint64_t pid, const std::string& format,
                  const SnapshotArgs& args, Via via) {
  if (format != "text" && format != "json") return failure(400, "bad request: --since takes the text or json format");
  std::shared_ptr<const Snapshot> then;
  const uint64_t back_ns = *args.since_s * 1'000'000'000ULL;
  const uint64_t at = taken.snap.time_ns > back_ns ? taken.snap.time_ns - back_ns : 0;
  for (const ProcessState& ps : st.processes)
    if (ps.pid == pid && ps.start_time == taken.start_time && ps.samples)  // not a pid's earlier owner
      for (const auto& sample : *ps.samples)
        if (!then || sample->time_ns <= at) then = sample;  // oldest first: the last at or before `at`
  if (then && then->time_ns > at)  // none that old: the oldest kept
    for (const ProcessState& ps : st.processes)
      if (ps.pid == pid && ps.start_time == taken.start_time && ps.samples && !ps.samples->empty())
        then = ps.samples->front();
  if (!then) return failure(404, "no sample of pid " + std::to_string(pid) + " yet (the daemon samples each process's live "
                                 "memory every --leak-sample seconds)");
  Snapshot was = *then;
  remap_sites(was, merged);
  const TextOptions opts = text_options(b, args);
  ojson j;
  j["pid"] = pid;
  j["format"] = format;
  j["exact"] = taken.snap.exact;
  j["encoding"] = "utf-8";
  j["body"] = format == "json" ? since_json(was, taken.snap, opts.rules).dump(1) : since_text(was, taken.snap, opts);
  return json_answer(j, via);
}

}  // namespace

Answer get_snapshot(const Backend& b, const Peer* who, const SnapshotArgs& args, Via via) {
  const std::string format = args.format ? *args.format : via == Via::socket ? "text" : "json";
  if (!proto::is_snapshot_format(format)) return bad_value(via, proto::Command::get_snapshot, "format");
  if (via == Via::http && args.top && (*args.top == 0 || *args.top > kMaxHttpTop))
    return bad_value(via, proto::Command::get_snapshot, "top");
  if (args.by && *args.by != "user" && *args.by != "native") return bad_value(via, proto::Command::get_snapshot, "by");
  if (args.since_s && args.leaks) return bad_value(via, proto::Command::get_snapshot, "since");  // two views: one
  const auto st = b.store->load();
  const uint64_t pid = args.pid;
  TakenSnapshot taken;
  if (args.oom) {
    const auto reps = reports_of(*st, static_cast<uint32_t>(pid), who);
    if (*args.oom >= reps.size())
      return failure(404, "no out-of-memory report " + std::to_string(*args.oom) + " for pid " + std::to_string(pid));
    taken = reps[*args.oom]->snapshot;
  } else {
    const ProcessState* p = find_process(*st, who, pid);
    if (!p) return failure(404, "no such process: " + std::to_string(pid));
    if (!may_see(who, p->uid, p->pid)) {
      Answer a = failure(403, "refused: pid " + std::to_string(pid) +
                                  " is another user's process (its owner or root may take its snapshot)");
      a.refused = true;
      return a;
    }
    taken = take_snapshot(
        ProcessIdentity{ring_dir(st->run_dir, *p), p->pid, p->uid, p->start_time, p->user, p->exited, p->ns_pid},
        p->header, p->history.get());
  }
  if (b.symbolize) symbolize(taken, *b.symbolize);
  // Grouped by what the user sees, once the frames are named; the samples the leak and
  // since views compare with are renamed the same way.
  std::map<uint32_t, uint32_t> merged;
  if (!args.by || *args.by == "user") merged = merge_sites_by_user_frames(taken.snap, rules_of(b));
  if (args.since_s) return since_view(b, *st, taken, merged, pid, format, args, via);
  if (args.leaks) return leaks_view(b, *st, taken, merged, pid, format, args, via);
  return via == Via::socket ? socket_view(b, taken, pid, format, args) : http_view(b, taken, pid, format, args);
}

Answer get_ooms(const Backend& b, const Peer& peer, std::optional<uint32_t> pid) {
  const auto st = b.store->load();
  const auto reps = reports_of(*st, pid, &peer);
  ojson list = ojson::array();
  std::map<uint32_t, std::size_t> index;  // per pid, newest first
  std::vector<ojson> rows;
  for (const auto& r : reps) {
    TakenSnapshot named = r->snapshot;
    if (b.symbolize) symbolize(named, *b.symbolize);
    const auto merged = merge_sites_by_user_frames(named.snap, rules_of(b));
    // The report's own copy of the refusal names its site too: renamed as the merge did.
    OomReport head;
    head.pid = r->pid;
    head.uid = r->uid;
    head.start_time = r->start_time;
    head.process_name = r->process_name;
    head.user = r->user;
    head.event = r->event;
    if (auto it = merged.find(head.event.e.site); it != merged.end()) head.event.e.site = it->second;
    rows.push_back(oom_json(head, named.snap, index[r->pid]++, 3, rules_of(b)));
  }
  for (auto it = rows.rbegin(); it != rows.rend(); ++it) list.push_back(std::move(*it));  // oldest first
  ojson j;
  j["reports"] = std::move(list);
  return json_answer(j, Via::socket);
}

}  // namespace cuw::daemon
