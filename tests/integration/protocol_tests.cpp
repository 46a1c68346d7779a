// cuwarden integration tests: the protocol's command table (cuw/protocol.hpp) and the
// daemon's dispatcher agree. Every command of the table, walked row by row, is accepted in
// its smallest valid form and refused, with the row's own error text, for each key of a
// wrong type and for each one_of pair left out or doubled. A row added to the table is
// covered here with no change to this file.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "commands/table.hpp"
#include "daemon_test_support.hpp"
#include "model/fault_guard.hpp"
#include "model/registry.hpp"
#include "transports/handler.hpp"

using namespace cuwt;
namespace proto = cuw::proto;

namespace {

/// A value of `type` (a RequestKey::type), chosen so that the request it is put into can be
/// carried out: `pid` names the test's own interposed process, sizes are 1 GiB.
json valid_value(const proto::RequestKey& k, uint32_t pid) {
  const std::string_view t = k.type;
  if (t.find("uint") != std::string_view::npos) {
    if (k.name == "pid") return pid;
    if (k.name == "device") return 0;
    if (k.name == "bytes") return 1ULL << 30;
    return 1;
  }
  if (t.find("number") != std::string_view::npos) return 0.5;
  if (t.find("string") != std::string_view::npos) return "train";
  return nullptr;
}

/// Values of every JSON type that `type` does not take.
std::vector<json> wrong_values(std::string_view type) {
  std::vector<json> out;
  for (const json& v : {json(true), json("x"), json(-1), json(1.5), json(nullptr), json::array(), json::object()})
    if (!cuw::daemon::fits_type(type, v)) out.push_back(v);
  return out;
}

const proto::OneOf* pair_of(const proto::CommandInfo& c, std::string_view key) {
  for (const proto::OneOf& o : c.one_of)
    if (o.first == key || o.second == key) return &o;
  return nullptr;
}

/// The smallest request the row allows: every required key and the first of each pair.
json minimal_request(const proto::CommandInfo& c, uint32_t pid) {
  json body = json::object();
  for (const proto::RequestKey& k : c.keys) {
    const proto::OneOf* o = pair_of(c, k.name);
    if (k.required || (o && o->first == k.name)) body[std::string(k.name)] = valid_value(k, pid);
  }
  return body;
}

/// `path`, made a directory.
std::string made_dir(const std::string& path) {
  REQUIRE(::mkdir(path.c_str(), 0700) == 0);
  return path;
}

/// A registry over a run directory holding one fake interposed process that uses device 0.
struct Fixture {
  Fixture() {
    cuw::daemon::install_fault_guard();
    r.device(0, 0x30).limit.store(ring::kNoLimit);
    o.run_dir = run;
    o.unlink_exited = false;
    reg = std::make_unique<cuw::daemon::Registry>(o, ::open(run.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC), nullptr);
    reg->scan();
    peer.known = true;
    peer.uid = ::geteuid();
    peer.gid = ::getegid();
    peer.pid = ::getpid();
  }
  /// The reply to `body` sent as `c`: is it an error, and its body.
  std::pair<bool, json> ask(const proto::CommandInfo& c, const json& body) {
    const auto reply = cuw::daemon::handle_request(*reg, peer, static_cast<uint16_t>(c.command), body.dump());
    const bool is_error = reply.command == static_cast<uint16_t>(proto::Command::error);
    if (!is_error) CHECK(reply.command == (static_cast<uint16_t>(c.command) | proto::kReplyBit));
    return {is_error, json::parse(reply.body)};
  }

  TempDir dir;
  std::string run = made_dir(dir / "run");
  Child child;
  FakeRing r{run, static_cast<uint32_t>(child.pid), child.start_time()};
  cuw::daemon::RegistryOptions o;
  std::unique_ptr<cuw::daemon::Registry> reg;
  cuw::daemon::Peer peer;
};

}  // namespace

TEST_CASE("daemon.protocol_table_rows_are_what_the_dispatcher_checks") {
  Fixture f;
  const auto pid = static_cast<uint32_t>(f.child.pid);
  const std::set<std::string_view> known_types = {"uint", "number", "string", "null"};
  for (const proto::CommandInfo& c : proto::kCommands) {
    if (c.command == proto::Command::error) continue;
    INFO("command " << c.name);
    CHECK(proto::find_command(static_cast<uint16_t>(c.command)) == &c);
    for (const proto::RequestKey& k : c.keys) {
      std::string_view t = k.type;
      while (!t.empty()) {
        const auto bar = t.find('|');
        CHECK(known_types.count(t.substr(0, bar)) == 1);
        t = bar == std::string_view::npos ? std::string_view() : t.substr(bar + 1);
      }
      CHECK(!k.error.empty());
    }
    for (const proto::OneOf& o : c.one_of) {
      bool first = false, second = false;
      for (const proto::RequestKey& k : c.keys) {
        first = first || k.name == o.first;
        second = second || k.name == o.second;
      }
      CHECK((first && second));
    }

    // The smallest valid request is carried out; so is one with a key the table does not
    // know (a newer client's optional key).
    // Suspend and resume need the driver's checkpoint API, which this dispatcher has none of:
    // they get as far as saying so.
    const bool needs_driver = c.command == proto::Command::suspend || c.command == proto::Command::resume;
    const json minimal = minimal_request(c, pid);
    INFO("minimal request " << minimal.dump());
    auto [err, body] = f.ask(c, minimal);
    INFO("reply " << body.dump());
    CHECK(err == needs_driver);
    if (needs_driver) CHECK(body["error"].get<std::string>().find("no checkpoint driver") != std::string::npos);
    json extra = minimal;
    extra["a_key_from_a_newer_client"] = json::array({1, "x"});
    std::tie(err, body) = f.ask(c, extra);
    CHECK(err == needs_driver);

    if (c.keys.empty() && c.one_of.empty()) {
      // A command that reads nothing takes any body.
      std::tie(err, body) = f.ask(c, json::array({1}));
      CHECK(!err);
      continue;
    }
    std::tie(err, body) = f.ask(c, json::array({minimal}));
    CHECK(err);
    CHECK(body["error"] == "bad request: request body must be a JSON object");

    // Each key with a value of every type it does not take: the row's error for that key.
    for (const proto::RequestKey& k : c.keys) {
      for (const json& wrong : wrong_values(k.type)) {
        json req = minimal;
        if (const proto::OneOf* o = pair_of(c, k.name)) {  // the key stands in for its pair
          req.erase(std::string(o->first));
          req.erase(std::string(o->second));
        }
        req[std::string(k.name)] = wrong;
        INFO("request " << req.dump());
        std::tie(err, body) = f.ask(c, req);
        CHECK(err);
        CHECK(body["error"] == "bad request: " + std::string(k.error));
      }
      if (k.required) {
        json req = minimal;
        req.erase(std::string(k.name));
        std::tie(err, body) = f.ask(c, req);
        CHECK(err);
        CHECK(body["error"] == "bad request: " + std::string(k.error));
      }
    }
    // Each pair, with neither key or both: the pair's error.
    for (const proto::OneOf& o : c.one_of) {
      json neither = minimal, both = minimal;
      neither.erase(std::string(o.first));
      neither.erase(std::string(o.second));
      for (const proto::RequestKey& k : c.keys)
        if (k.name == o.first || k.name == o.second) both[std::string(k.name)] = valid_value(k, pid);
      for (const json& req : {neither, both}) {
        INFO("request " << req.dump());
        std::tie(err, body) = f.ask(c, req);
        CHECK(err);
        CHECK(body["error"] == "bad request: " + std::string(o.error));
      }
    }
  }
}

TEST_CASE("daemon.protocol_set_limit_range_errors_say_what_the_table_says") {
  Fixture f;
  const proto::CommandInfo& c = *proto::find_command(static_cast<uint16_t>(proto::Command::set_limit));
  auto error_of = [&](std::string_view key) {
    for (const proto::RequestKey& k : c.keys)
      if (k.name == key) return "bad request: " + std::string(k.error);
    return std::string("(no key)");
  };
  const auto pid = static_cast<uint32_t>(f.child.pid);
  const struct {
    json body;
    std::string_view key;
  } cases[] = {
      {{{"pid", 0}, {"bytes", 1}}, "pid"},
      {{{"pid", 0x80000000u}, {"bytes", 1}}, "pid"},
      {{{"pid", pid}, {"bytes", 1}, {"device", ring::kMaxDevices}}, "device"},
      {{{"pid", pid}, {"share", 0}}, "share"},
      {{{"pid", pid}, {"share", 1.5}}, "share"},
      {{{"job", "train"}, {"bytes", 1}, {"user", 1ULL << 33}}, "user"},
  };
  for (const auto& k : cases) {
    INFO("request " << k.body.dump());
    auto [err, body] = f.ask(c, k.body);
    CHECK(err);
    CHECK(body["error"] == error_of(k.key));
  }
}

TEST_CASE("daemon.protocol_routes_match_by_segment_whatever_their_order") {
  using cuw::daemon::Answer;
  using cuw::daemon::Route;
  using cuw::daemon::match_route;
  const auto none = [](const cuw::daemon::Backend&, const cuw::daemon::RouteRequest&) { return Answer{}; };
  // The generic process route first: it must not catch the paths of the specific ones.
  const Route table[] = {
      {"/api/v1/processes/{pid}", false, false, none},
      {"/api/v1/processes/{pid}/history", false, false, none},
      {"/api/v1/processes/{pid}/snapshot", true, true, none},
      {"/api/v1/processes/{pid}/{pid}", false, false, none},  // never chosen over a literal
      {"/api/v1/processes/{pid}/5", false, false, none},
      {"/api/v1/history", false, false, none},
  };
  const auto route_of = [&](std::string_view path) {
    const auto m = match_route(table, path);
    return m.route ? m.route->path : std::string_view("none");
  };
  CHECK(route_of("/api/v1/processes/5/history") == "/api/v1/processes/{pid}/history");
  CHECK(match_route(table, "/api/v1/processes/5/history").pid == 5u);
  CHECK(route_of("/api/v1/processes/77/snapshot") == "/api/v1/processes/{pid}/snapshot");
  CHECK(match_route(table, "/api/v1/processes/77/snapshot").pid == 77u);
  CHECK(route_of("/api/v1/processes/5") == "/api/v1/processes/{pid}");
  CHECK(match_route(table, "/api/v1/processes/5").pid == 5u);
  CHECK(route_of("/api/v1/processes/5/5") == "/api/v1/processes/{pid}/5");
  CHECK(route_of("/api/v1/history") == "/api/v1/history");
  // Not a process id: the route's shape, no pid (the transport answers 404).
  CHECK(route_of("/api/v1/processes/x/history") == "/api/v1/processes/{pid}/history");
  CHECK_FALSE(match_route(table, "/api/v1/processes/x/history").pid);
  CHECK_FALSE(match_route(table, "/api/v1/processes//history").pid);
  // "{pid}" is one segment, and a path matches the whole shape.
  CHECK(route_of("/api/v1/processes/5/6/history") == "none");
  CHECK(route_of("/api/v1/processes/5/history/") == "none");
  CHECK(route_of("/api/v1/history/x") == "none");
  CHECK(route_of("/api/v1") == "none");
  CHECK(route_of("") == "none");

  // The daemon's own table, in either order of its rows, answers the same.
  const auto real = cuw::daemon::routes();
  std::vector<Route> reversed(real.rbegin(), real.rend());
  for (const std::string_view path : {"/metrics", "/api/v1/state", "/api/v1/history", "/api/v1/processes/9/history",
                                      "/api/v1/processes/9/snapshot", "/api/v1/processes/9", "/api/v1/nothing"}) {
    INFO(path);
    const auto a = match_route(path), b = match_route(reversed, path);
    CHECK((a.route ? a.route->path : "") == (b.route ? b.route->path : ""));
    CHECK(a.pid == b.pid);
  }
}
