// Unit tests for the daemon's HTTP pieces: the request parser (transports/http_request.cpp),
// the history series (model/series.hpp), label escaping (views/metrics_text.cpp), and the
// server itself (transports/http_server.cpp) on loopback with small limits: hostile clients
// (slow, oversized, too many) never keep an ordinary client from its answer.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "base/util.hpp"
#include "model/gpus.hpp"
#include "model/series.hpp"
#include "transports/http_request.hpp"
#include "transports/http_server.hpp"
#include "views/metrics_text.hpp"

using namespace cuw::daemon;

namespace {

struct Parsed {
  HttpParse result;
  HttpRequest req;
  std::size_t consumed = 0;
  int status = 0;
  std::string why;
};

Parsed parse(std::string_view in) {
  Parsed p;
  p.result = parse_http_request(in, &p.req, &p.consumed, &p.status, &p.why);
  return p;
}

}  // namespace

TEST_CASE("http: a GET with a query and headers parses and its query is decoded", "[http]") {
  const std::string in =
      "GET /api/v1/processes/42/history?range=day&x=a%20b+c HTTP/1.1\r\nHost: x\r\nLast-Event-ID: 17\r\n\r\nGET /";
  const Parsed p = parse(in);
  REQUIRE(p.result == HttpParse::ok);
  CHECK(p.req.method == "GET");
  CHECK(p.req.path == "/api/v1/processes/42/history");
  CHECK(p.req.query.at("range") == "day");
  CHECK(p.req.query.at("x") == "a b c");
  CHECK(p.req.last_event_id == "17");
  CHECK(p.req.keep_alive);
  CHECK(p.consumed == in.size() - 5);  // the next request's bytes are left
}

TEST_CASE("http: an unfinished head asks for more and bare LF line ends are accepted", "[http]") {
  CHECK(parse("GET / HTTP/1.1\r\nHost: x\r\n").result == HttpParse::incomplete);
  CHECK(parse("").result == HttpParse::incomplete);
  const Parsed p = parse("GET /metrics HTTP/1.0\nConnection: keep-alive\n\n");
  REQUIRE(p.result == HttpParse::ok);
  CHECK(p.req.path == "/metrics");
  CHECK(p.req.keep_alive);  // HTTP/1.0 keeps the connection only when asked
  CHECK_FALSE(parse("GET / HTTP/1.0\r\n\r\n").req.keep_alive);
  CHECK_FALSE(parse("GET / HTTP/1.1\r\nConnection: close\r\n\r\n").req.keep_alive);
}

TEST_CASE("http: malformed requests get their status and a reason", "[http]") {
  struct Case {
    const char* in;
    int status;
  } cases[] = {
      {"GET\r\n\r\n", 400},
      {"GET / HTTP/1.1 extra\r\n\r\n", 400},
      {"GET / HTTP/2.0\r\n\r\n", 505},
      {"GET / FTP/1.0\r\n\r\n", 400},
      {"GET relative HTTP/1.1\r\n\r\n", 400},
      {"GET /%zz HTTP/1.1\r\n\r\n", 400},
      {"GET /%00 HTTP/1.1\r\n\r\n", 400},
      {"GET /?a=%4 HTTP/1.1\r\n\r\n", 400},
      {"G(T / HTTP/1.1\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nno colon here\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n", 413},
      {"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 413},
      {"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400},
  };
  for (const Case& c : cases) {
    INFO(c.in);
    const Parsed p = parse(c.in);
    CHECK(p.result == HttpParse::bad);
    CHECK(p.status == c.status);
    CHECK_FALSE(p.why.empty());
  }
  CHECK(parse("GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n").result == HttpParse::ok);
  // A wrong request line is answered at once, not after the head's deadline.
  CHECK(parse("\x01\x02 garbage\n\x03").status == 400);
  CHECK(parse("GET / HTTP/1.1\r\nHost: x").result == HttpParse::incomplete);
  CHECK(parse("GET /" + std::string(kMaxRequestTarget, 'a') + " HTTP/1.1\r\n\r\n").status == 414);
}

TEST_CASE("http: only addresses, localhost and the names given are served as Host (no DNS rebinding)", "[http]") {
  const std::vector<std::string> names{"gpu7.example.org"};
  for (const char* ok : {"", "127.0.0.1", "127.0.0.1:9477", "10.1.2.3:80", "[::1]", "[::1]:9477", "localhost",
                         "LOCALHOST:9477", "gpu7.example.org", "GPU7.Example.Org:9477"})
    CHECK(cuw::daemon::host_allowed(ok, names));
  for (const char* bad : {"attacker.example", "attacker.example:9477", "127.0.0.1.nip.io", "localhost.attacker.example",
                          "[::1", "[not-an-address]:1", "gpu7.example.org.attacker.example"})
    CHECK_FALSE(cuw::daemon::host_allowed(bad, names));
  cuw::daemon::HttpRequest req;
  std::size_t consumed = 0;
  int status = 0;
  std::string why;
  REQUIRE(cuw::daemon::parse_http_request("GET / HTTP/1.1\r\nHost: attacker.example:9477\r\n\r\n", &req, &consumed,
                                          &status, &why) == cuw::daemon::HttpParse::ok);
  CHECK(req.host == "attacker.example:9477");
}

TEST_CASE("series: a point only when a value changes and the last sample before the change", "[http][series]") {
  Series<2> s;
  const std::array<bool, 2> max{true, false};
  for (uint32_t t = 1000; t < 1010; ++t) s.add(t, {5, 9}, max);
  auto pts = s.points(false);
  REQUIRE(pts.size() == 2);  // the first sample, and the latest (pending) one
  CHECK(pts[0].t == 1000);
  CHECK(pts[1].t == 1009);
  s.add(1010, {7, 9}, max);
  pts = s.points(false);
  REQUIRE(pts.size() == 3);  // 1000 (5), 1009 (5: the value held until the change), 1010 (7)
  CHECK(pts[1].v[0] == 5);
  CHECK(pts[2].t == 1010);
  CHECK(pts[2].v[0] == 7);
}

TEST_CASE("series: the hour keeps the value at its start and the day takes each minute's largest", "[http][series]") {
  Series<2> s;
  const std::array<bool, 2> max{true, false};
  s.add(60, {1, 0}, max);
  s.add(61, {50, 0}, max);
  s.add(62, {2, 0}, max);
  for (uint32_t t = 63; t < 60 + 3 * 3600; ++t) s.add(t, {3, 0}, max);
  const auto hour = s.points(false);
  REQUIRE(!hour.empty());
  CHECK(hour.back().t == 60 + 3 * 3600 - 1);
  CHECK(hour.back().t - hour.front().t == 3600);  // clamped to the range's start
  CHECK(hour.front().v[0] == 3);
  CHECK(hour.size() <= 3);  // idle for hours: the start, the pending sample
  const auto day = s.points(true);
  REQUIRE(day.size() >= 2);
  CHECK(day.front().t == 60);
  CHECK(day.front().v[0] == 50);  // the minute's peak, not its last sample
  CHECK(day.back().v[0] == 3);
  CHECK(s.bytes() < 10 * sizeof(Series<2>::Point));
}

TEST_CASE("series: a value that changes every second is bounded by the hour", "[http][series]") {
  Series<4> s;
  const std::array<bool, 4> max{true, true, false, false};
  for (uint32_t t = 1; t <= 7200; ++t) s.add(t, {t, t, t, t}, max);
  const auto hour = s.points(false);
  CHECK(hour.size() >= 3600);
  CHECK(hour.size() <= 3602);
  CHECK(s.points(true).size() == 121);  // 7200 s: minutes 0..120
}

TEST_CASE("series: a wall clock set back restarts the history instead of stopping it", "[http][series]") {
  SeriesStore store;
  State st;
  NvmlGpu g;
  g.uuid = "GPU-00000000-0000-0000-0000-000000000001";
  g.memory_total = 1000;
  st.gpus = {g};
  auto at = [&](uint64_t s, uint64_t used) {
    st.time_ns = s * 1'000'000'000ULL;
    st.gpus[0].memory_used = used;
    store.record(st);
  };
  at(10'000, 1);
  at(10'001, 2);
  at(10'001, 3);  // the same second again: ignored
  at(9'998, 4);   // 3 s back: jitter, ignored
  auto h = store.copy(false, std::nullopt);
  REQUIRE(h);
  REQUIRE(h->gpus.size() == 1);
  CHECK(h->gpus[0].points.back().t == 10'001);
  CHECK(h->gpus[0].points.back().v[1] == 2);
  at(6'400, 5);  // an hour back: the history starts again, and goes on from there
  at(6'401, 6);
  h = store.copy(false, std::nullopt);
  REQUIRE(h);
  REQUIRE(h->gpus.size() == 1);
  const auto& pts = h->gpus[0].points;
  REQUIRE(pts.size() == 2);
  CHECK(pts.front().t == 6'400);
  CHECK(pts.back().t == 6'401);
  CHECK(pts.back().v[1] == 6);
}

TEST_CASE("gpus: without NVML a GPU keeps the index it was first given", "[http][series]") {
  State st;
  ProcessState p;
  p.header.devices[0].present = true;
  for (uint8_t i = 0; i < 16; ++i) p.header.devices[0].uuid[i] = static_cast<uint8_t>(0xa0 + i);
  st.processes.push_back(p);
  auto rows = gpu_rows(st);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].index == 0);  // the first GPU seen
  // Another GPU was given 0 before (its processes have gone): this one does not take it.
  st.gpu_index_kept = {{"GPU-00000000-0000-0000-0000-000000000000", 0}};
  rows = gpu_rows(st);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].index == 1);
  st.gpu_index_kept[rows[0].uuid] = 3;  // its own index, from before
  rows = gpu_rows(st);
  CHECK(rows[0].index == 3);
}

TEST_CASE("metrics: label values are escaped", "[http]") {
  CHECK(escape_label("a\"b\\c\nd") == "a\\\"b\\\\c\\nd");
  CHECK(escape_label("plain") == "plain");
  CHECK(escape_label("caf\xc3\xa9") == "caf\xc3\xa9");                 // UTF-8 kept
  CHECK(escape_label("cut\xc3") == "cut\xef\xbf\xbd");                  // a character cut at the field's end
  CHECK(escape_label("\xff\xc0\x80x") == "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbdx");  // never UTF-8, overlong
}

TEST_CASE("metrics: a job named by the Slurm plugin or a pod manifest carries its id as a label", "[http]") {
  State st;
  st.hostname = "node1";
  auto proc = [&](uint32_t pid, const char* job) {
    ProcessState p;
    p.pid = pid;
    p.user = "alice";
    std::snprintf(p.header.job, sizeof p.header.job, "%s", job);
    p.header.devices[0].present = true;
    p.header.devices[0].used = 1;
    p.header.devices[0].limit = cuw::ring::kNoLimit;
    for (uint8_t i = 0; i < 16; ++i) p.header.devices[0].uuid[i] = i;
    st.processes.push_back(p);
  };
  proc(1, "slurm-4242");
  proc(2, "pod-train-7d9f");
  proc(3, "slurm-x1");  // not a Slurm job id
  proc(4, "");
  const std::string text = metrics_text(st);
  auto line_of = [&](const std::string& pid) {
    const std::string key = "cuwarden_process_memory_used_bytes{";
    for (std::size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) {
      const std::string line = text.substr(at, text.find('\n', at) - at);
      if (line.find("pid=\"" + pid + "\"") != std::string::npos) return line;
    }
    return std::string();
  };
  CHECK(line_of("1").find("cuwarden_job=\"slurm-4242\",slurm_job_id=\"4242\"") != std::string::npos);
  CHECK(line_of("2").find("cuwarden_job=\"pod-train-7d9f\",pod=\"train-7d9f\"") != std::string::npos);
  CHECK(line_of("3").find("slurm_job_id") == std::string::npos);
  CHECK(line_of("4").find("cuwarden_job=\"\"") != std::string::npos);
  CHECK(line_of("4").find("pod=") == std::string::npos);
  // The counters per job carry the same labels.
  CHECK(text.find("cuwarden_allocations_total{hostname=\"node1\",gpu=\"0\",uuid=\"GPU-00010203-0405-0607-0809-0a0b0c0d0e0f\","
                  "user=\"alice\",cuwarden_job=\"slurm-4242\",slurm_job_id=\"4242\"}") != std::string::npos);
}

namespace {

/// A server on 127.0.0.1:<free port> with small limits, answering "/slow" once the test
/// opens the gate (open_slow(); at once if it is already open) and every other path at once,
/// run on its own thread until the fixture goes. A gate, not a sleep: "the fast one is
/// answered while the slow one runs" then holds however slow the machine is.
struct TestServer {
  HttpServer server;
  int stop_fd = eventfd(0, EFD_CLOEXEC);
  std::thread thread;
  std::atomic<int> slow_started{0};
  std::atomic<bool> slow_open{false};
  explicit TestServer(HttpServer::Limits lim, bool slow_gate_open = true)
      : server(
            [this](const HttpRequest& r) {
              HttpResponse resp;
              if (r.path == "/slow") {
                ++slow_started;
                // Bounded, so that a test that fails before opening the gate still ends.
                const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
                while (!slow_open.load() && std::chrono::steady_clock::now() < until)
                  std::this_thread::sleep_for(std::chrono::milliseconds(1));
              }
              if (r.path == "/stream") resp.stream = true;
              resp.body = "{\"path\":\"" + r.path + "\"}";
              if (r.path == "/big") resp.body.append(32u << 20, ' ');
              return resp;
            },
            [](const HttpRequest& r) { return r.path == "/slow"; },
            [](StreamCursor& c, uint64_t) {
              if (c.last_seq >= 3) return std::string();
              ++c.last_seq;
              return "data: " + std::to_string(c.last_seq) + "\n\n";
            },
            lim) {
    slow_open = slow_gate_open;
    std::string err;
    REQUIRE(server.listen("127.0.0.1:0", &err));
    thread = std::thread([this] { server.run(stop_fd); });
  }
  void open_slow() { slow_open = true; }
  ~TestServer() {
    open_slow();
    const uint64_t one = 1;
    (void)!write(stop_fd, &one, sizeof one);
    thread.join();
    close(stop_fd);
  }
  /// A connected client socket, or -1. No Catch2 assertion here: threads call it, and
  /// Catch2 is not thread-safe.
  int connect_client() const {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(server.port());
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      if (fd >= 0) close(fd);
      return -1;
    }
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
  }
  /// Send `req` on a new connection and read until the server closes it (or 5 s pass); ""
  /// when it cannot connect.
  std::string exchange(const std::string& req) const {
    const int fd = connect_client();
    if (fd < 0) return "";
    (void)!send(fd, req.data(), req.size(), MSG_NOSIGNAL);
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<std::size_t>(n));
    close(fd);
    return out;
  }
};

HttpServer::Limits small_limits() {
  HttpServer::Limits l;
  l.max_connections = 8;
  l.max_streams = 2;
  l.max_head = 1024;
  l.head_timeout_ns = 1'500'000'000;
  l.idle_timeout_ns = 400'000'000;
  l.tick_ns = 20'000'000;
  l.max_workers = 1;
  return l;
}

}  // namespace

TEST_CASE("http server: answers and keeps alive and refuses what it does not serve", "[http][server]") {
  TestServer ts(small_limits());
  const std::string r = ts.exchange("GET /a HTTP/1.1\r\nConnection: close\r\n\r\n");
  CHECK(r.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(r.find("{\"path\":\"/a\"}") != std::string::npos);
  // Two pipelined requests on one connection: two answers, in order.
  const std::string two = ts.exchange("GET /one HTTP/1.1\r\n\r\nGET /two HTTP/1.1\r\nConnection: close\r\n\r\n");
  const auto one_at = two.find("/one"), two_at = two.find("/two");
  CHECK(one_at != std::string::npos);
  CHECK(two_at != std::string::npos);
  CHECK(one_at < two_at);
  CHECK(ts.exchange("POST /a HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0) == 0);
  CHECK(ts.exchange("GET /a HTTP/1.1\r\nX: " + std::string(2000, 'x') + "\r\n\r\n").rfind("HTTP/1.1 431", 0) == 0);
  const std::string head = ts.exchange("HEAD /a HTTP/1.1\r\nConnection: close\r\n\r\n");
  CHECK(head.rfind("HTTP/1.1 200", 0) == 0);
  CHECK(head.find("Content-Length: 13") != std::string::npos);
  CHECK(head.find("{\"path\"") == std::string::npos);  // no body for HEAD
}

/// Everything `fd` receives until the server closes it (or 5 s pass).
/// Everything `fd` receives until the server closes it or a receive times out; `closed`
/// says which.
std::string read_all(int fd, bool* closed = nullptr) {
  std::string out;
  char buf[65536];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<std::size_t>(n));
  if (closed) *closed = n == 0;
  return out;
}

/// Poll `pred` every millisecond until it holds (true) or 30 s pass (false): the bound is for
/// a condition that never comes, not for a slow one.
template <class F>
bool wait_for(F&& pred) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!pred())
    if (std::chrono::steady_clock::now() > until) return false;
    else std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return true;
}

TEST_CASE("http server: a client that shuts its side is answered, and requests sent during a reply are kept",
          "[http][server]") {
  HttpServer::Limits lim = small_limits();
  lim.idle_timeout_ns = 3600'000'000'000ULL;  // so that a close below cannot be the idle one
  TestServer ts(lim, /*slow_gate_open=*/false);
  // Request, then shutdown(SHUT_WR) at once: the reply comes, then the close.
  int fd = ts.connect_client();
  REQUIRE(fd >= 0);
  const timeval patient{60, 0};  // against a server that never closes, not a slow one
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &patient, sizeof patient);
  const std::string two = "GET /half HTTP/1.1\r\n\r\nGET /half2 HTTP/1.1\r\n\r\n";
  REQUIRE(send(fd, two.data(), two.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(two.size()));
  REQUIRE(shutdown(fd, SHUT_WR) == 0);
  bool closed = false;
  std::string r = read_all(fd, &closed);
  close(fd);
  CHECK(r.find("/half\"") != std::string::npos);
  CHECK(r.find("/half2\"") != std::string::npos);  // both pipelined requests
  // Closed once answered: the idle timeout is an hour. (Whether the last reply says
  // "Connection: close" depends on whether the end of input was read before it was made.)
  CHECK(closed);
  // A request sent while the one before is worked on (a slow one, on a worker) is answered next.
  fd = ts.connect_client();
  REQUIRE(fd >= 0);
  const std::string first = "GET /slow HTTP/1.1\r\n\r\n", second = "GET /next HTTP/1.1\r\nConnection: close\r\n\r\n";
  REQUIRE(send(fd, first.data(), first.size(), MSG_NOSIGNAL) > 0);
  REQUIRE(wait_for([&] { return ts.slow_started.load() == 1; }));
  REQUIRE(send(fd, second.data(), second.size(), MSG_NOSIGNAL) > 0);
  ts.open_slow();
  r = read_all(fd);
  close(fd);
  const auto slow_at = r.find("/slow\""), next_at = r.find("/next\"");
  CHECK(slow_at != std::string::npos);
  CHECK(next_at != std::string::npos);
  CHECK(slow_at < next_at);
}

TEST_CASE("http server: replies waiting for clients that do not read are bounded", "[http][server]") {
  HttpServer::Limits lim = small_limits();
  lim.max_unsent = 4u << 20;
  TestServer ts(lim);
  // A client asks for 32 MiB and reads none of it: what the kernel does not take waits.
  const int hog = ts.connect_client();
  REQUIRE(hog >= 0);
  const std::string big = "GET /big HTTP/1.1\r\n\r\n";
  REQUIRE(send(hog, big.data(), big.size(), MSG_NOSIGNAL) > 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // Another large reply would pass the bound: 503, at once. Small replies are still served.
  const std::string refused = ts.exchange("GET /big HTTP/1.1\r\nConnection: close\r\n\r\n");
  CHECK(refused.rfind("HTTP/1.1 503", 0) == 0);
  CHECK(refused.find("wait for slow clients") != std::string::npos);
  CHECK(ts.exchange("GET /small HTTP/1.1\r\nConnection: close\r\n\r\n").find("/small") != std::string::npos);
  // The hog reads it all after all: the whole reply arrives (a slow reader is not cut off).
  std::string got;
  char buf[65536];
  while (got.size() < (32u << 20)) {
    const ssize_t n = recv(hog, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<std::size_t>(n));
  }
  close(hog);
  CHECK(got.size() > (32u << 20));
}

TEST_CASE("http server: slow and silent and surplus clients do not keep others from an answer", "[http][server]") {
  TestServer ts(small_limits());
  // Six clients that send half a head and stop (slowloris), taking 6 of the 8 slots.
  std::vector<int> slow;
  for (int i = 0; i < 6; ++i) {
    slow.push_back(ts.connect_client());
    REQUIRE(slow.back() >= 0);
    (void)!send(slow.back(), "GET / HTTP/1.1\r\nX-", 18, MSG_NOSIGNAL);
  }
  CHECK(ts.exchange("GET /ok HTTP/1.1\r\nConnection: close\r\n\r\n").find("/ok") != std::string::npos);
  // Not after their deadline: they are all still connected (cut off 1.5 s after they began
  // their heads; an answer takes milliseconds).
  for (int fd : slow) {
    pollfd p{fd, POLLRDHUP, 0};
    CHECK(poll(&p, 1, 0) == 0);
  }
  // Past the cap, a new client is told why, at once.
  std::vector<int> more;
  for (int i = 0; i < 4; ++i) {
    more.push_back(ts.connect_client());
    REQUIRE(more.back() >= 0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const std::string refused = ts.exchange("GET /x HTTP/1.1\r\n\r\n");
  CHECK(refused.rfind("HTTP/1.1 503", 0) == 0);
  CHECK(refused.find("too many connections") != std::string::npos);
  // Once a slow client has spent a second on its head, a newcomer takes its slot.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  CHECK(ts.exchange("GET /late HTTP/1.1\r\nConnection: close\r\n\r\n").find("/late") != std::string::npos);
  char buf[512];
  CHECK(recv(slow[0], buf, sizeof buf, 0) == 0);  // the oldest one, closed
  // The others are cut off at the head deadline (408), which frees their slots.
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  const ssize_t n = recv(slow[5], buf, sizeof buf, 0);
  REQUIRE(n > 0);
  CHECK(std::string(buf, static_cast<std::size_t>(n)).rfind("HTTP/1.1 408", 0) == 0);
  CHECK(ts.exchange("GET /after HTTP/1.1\r\nConnection: close\r\n\r\n").find("/after") != std::string::npos);
  for (int fd : slow) close(fd);
  for (int fd : more) close(fd);
}

TEST_CASE("http server: a slow request runs beside the others and past the workers gets 503", "[http][server]") {
  TestServer ts(small_limits(), /*slow_gate_open=*/false);
  std::string slow_reply;
  std::thread t([&] { slow_reply = ts.exchange("GET /slow HTTP/1.1\r\nConnection: close\r\n\r\n"); });
  REQUIRE(wait_for([&] { return ts.slow_started.load() == 1; }));
  // The slow one cannot finish before the gate opens: the fast one is answered beside it.
  CHECK(ts.exchange("GET /fast HTTP/1.1\r\nConnection: close\r\n\r\n").find("/fast") != std::string::npos);
  // Its one worker busy, another slow request is told so at once.
  CHECK(ts.exchange("GET /slow HTTP/1.1\r\nConnection: close\r\n\r\n").rfind("HTTP/1.1 503", 0) == 0);
  CHECK(ts.slow_started.load() == 1);
  ts.open_slow();
  t.join();
  CHECK(slow_reply.find("/slow") != std::string::npos);
}

TEST_CASE("http server: event streams get what the source gives and past the cap get 503", "[http][server]") {
  TestServer ts(small_limits());
  const int a = ts.connect_client(), b = ts.connect_client();
  REQUIRE(a >= 0);
  REQUIRE(b >= 0);
  const std::string req = "GET /stream HTTP/1.1\r\n\r\n";
  (void)!send(a, req.data(), req.size(), MSG_NOSIGNAL);
  (void)!send(b, req.data(), req.size(), MSG_NOSIGNAL);
  std::string got;
  char buf[4096];
  while (got.find("data: 3") == std::string::npos) {
    const ssize_t n = recv(a, buf, sizeof buf, 0);
    REQUIRE(n > 0);
    got.append(buf, static_cast<std::size_t>(n));
  }
  CHECK(got.find("Content-Length") == std::string::npos);  // a stream has no length: it ends when the client goes
  CHECK(got.find("data: 1\n\ndata: 2\n\ndata: 3\n\n") != std::string::npos);
  const std::string third = ts.exchange("GET /stream HTTP/1.1\r\n\r\n");
  CHECK(third.rfind("HTTP/1.1 503", 0) == 0);
  CHECK(third.find("event-stream clients") != std::string::npos);
  close(a);
  close(b);
}
