// cuwarden golden tests: what the daemon and the CLI print for one fixed state, byte for byte.
//
// The daemon side: a real cuwardend reads rings and a job segment the test writes with fixed
// counters (and the simulated NVML); its state, events and limit replies, with what differs
// from run to run (pids, clocks, the user, the run directory) replaced by fixed values, must
// equal the files in tests/integration/golden/. The CLI side: a stand-in daemon serves those
// same files, and every command's output (the table, CSV, JSON, events, limit) must equal its
// golden file. A change of output is then a deliberate edit of a golden file, seen in review.
//
// To rewrite the files after an intended change: CUWT_UPDATE_GOLDEN=1 ctest -R golden.
#include <catch2/catch.hpp>

#include <pwd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "cuw/job.hpp"
#include "daemon_test_support.hpp"

using namespace cuwt;

namespace {

using ojson = nlohmann::ordered_json;

const bool kUpdate = [] {
  const char* u = std::getenv("CUWT_UPDATE_GOLDEN");
  return u && *u && std::string(u) != "0";
}();

std::string golden_path(const std::string& name) { return std::string(CUWT_GOLDEN_DIR) + "/" + name; }

/// Compare `actual` with the golden file `name` (or rewrite it under CUWT_UPDATE_GOLDEN).
/// On a difference, names the first line that differs.
void check_golden(const std::string& name, const std::string& actual) {
  const std::string path = golden_path(name);
  if (kUpdate) {
    std::ofstream(path, std::ios::binary) << actual;
    WARN("rewrote " << path);
    return;
  }
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string expected = ss.str();
  if (expected == actual) {
    SUCCEED(name);
    return;
  }
  std::istringstream e(expected), a(actual);
  std::string le, la;
  int line = 0;
  while (true) {
    ++line;
    const bool ge = static_cast<bool>(std::getline(e, le)), ga = static_cast<bool>(std::getline(a, la));
    if (!ge && !ga) break;
    if (!ge || !ga || le != la) {
      FAIL(name << " differs at line " << line << "\n  golden: " << (ge ? le : "<end>") << "\n  actual: "
                << (ga ? la : "<end>") << "\n(CUWT_UPDATE_GOLDEN=1 rewrites " << path << " after an intended change)");
    }
  }
  FAIL(name << ": same lines, different bytes (a final newline?)");
}

std::string read_golden(const std::string& name) {
  std::ifstream in(golden_path(name), std::ios::binary);
  if (!in.good()) throw std::runtime_error("no golden file " + golden_path(name));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string user_name() {
  passwd* pw = getpwuid(getuid());
  return pw ? pw->pw_name : std::to_string(getuid());
}

/// What differs between runs, and what it becomes in the golden files.
struct Normalizer {
  std::map<uint64_t, uint64_t> pids;  ///< real pid -> fixed pid
  std::string run_dir;
  uint64_t uid = getuid();
  std::string user = user_name();

  uint64_t pid(uint64_t p) const {
    auto it = pids.find(p);
    return it == pids.end() ? p : it->second;
  }

  std::string text(std::string s) const {
    for (std::size_t at; !run_dir.empty() && (at = s.find(run_dir)) != std::string::npos;)
      s.replace(at, run_dir.size(), "/run/cuwarden");
    // Ring files name their pid and start time; limit records say "pid N".
    static const std::regex pid_text(R"((ring-|pid )(\d+)(-\d+\.cwr)?)");
    std::smatch m;
    std::string out;
    auto begin = s.cbegin();
    while (std::regex_search(begin, s.cend(), m, pid_text)) {
      out.append(begin, m[0].first);
      out += m[1].str() + std::to_string(pid(std::stoull(m[2].str()))) + (m[3].matched ? "-0.cwr" : "");
      begin = m[0].second;
    }
    out.append(begin, s.cend());
    // Limit records name a job "job USER/NAME".
    const std::string job_user = "job " + user + "/";
    for (std::size_t at; (at = out.find(job_user)) != std::string::npos;) out.replace(at, job_user.size(), "job alice/");
    // Job files name their user's uid.
    const std::string job_file = "/job-" + std::to_string(uid) + "-";
    for (std::size_t at; (at = out.find(job_file)) != std::string::npos;) out.replace(at, job_file.size(), "/job-1000-");
    return out;
  }

  void apply(ojson& j, const std::string& key = "") const {
    static const std::set<std::string> clocks = {"time_ns",     "created_ns", "exited_ns", "consumer_heartbeat_ns",
                                                 "joined_ns",   "at_ns",      "when_ns",   "heartbeat_ns"};
    if (j.is_object()) {
      for (auto& [k, v] : j.items()) apply(v, k);
      return;
    }
    if (j.is_array()) {
      for (auto& v : j) apply(v, key);
      return;
    }
    if (j.is_number_unsigned() || j.is_number_integer()) {
      const uint64_t v = j.get<uint64_t>();
      if (clocks.count(key)) j = v ? 1700000000000000000ULL : 0;
      else if (key == "pid" || key == "tid" || key == "by_pid" || key == "members") j = pid(v);
      else if ((key == "uid" || key == "by_uid") && v == uid) j = 1000;
      else if (key == "start_time") j = 0;
      return;
    }
    if (j.is_string()) {
      std::string s = j.get<std::string>();
      if (key == "hostname") s = "gpu-node-1";
      else if ((key == "user" || key == "by") && s == user) s = "alice";
      else s = text(s);
      j = s;
    }
  }

  /// Normalize, then order by the fixed pids (the daemon lists rings by file name, which
  /// sorts real pids as text).
  ojson state(ojson st) const {
    apply(st);
    auto by_pid = [](const ojson& a, const ojson& b) { return a.value("pid", 0) < b.value("pid", 0); };
    if (st.contains("processes")) std::sort(st["processes"].begin(), st["processes"].end(), by_pid);
    for (auto& j : st["jobs"])
      if (j.contains("members")) std::sort(j["members"].begin(), j["members"].end(), by_pid);
    return st;
  }
};

std::string dump(const ojson& j) { return j.dump(2) + "\n"; }

ojson request(const std::string& socket, cuw::proto::Command cmd, const ojson& body) {
  std::string why;
  auto m = cuw::proto::request(socket, cmd, body.dump(), 10000, &why);
  if (!m) throw std::runtime_error("request failed: " + why);
  return ojson::parse(m->body);
}

/// A stand-in daemon on a unix socket: answers get_state, get_events and set_limit with
/// fixed bodies (set_limit: the job reply for a job request, else the pid reply).
class StandIn {
 public:
  StandIn(std::string path, std::string state, std::string events, std::string limit_pid, std::string limit_job)
      : path_(std::move(path)),
        state_(std::move(state)),
        events_(std::move(events)),
        limit_pid_(std::move(limit_pid)),
        limit_job_(std::move(limit_job)) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path_.c_str());
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 16) != 0)
      throw std::runtime_error("stand-in daemon: cannot listen at " + path_);
    thread_ = std::thread([this] { serve(); });
  }
  ~StandIn() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  StandIn(const StandIn&) = delete;
  StandIn& operator=(const StandIn&) = delete;

 private:
  void serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      if (auto m = cuw::proto::recv_message(c, 2000)) {
        using cuw::proto::Command;
        const auto cmd = static_cast<Command>(m->header.command);
        std::string body = "{}";
        if (cmd == Command::get_state) body = state_;
        else if (cmd == Command::get_events) body = events_;
        else if (cmd == Command::set_limit) body = json::parse(m->body).contains("job") ? limit_job_ : limit_pid_;
        cuw::proto::send_message(c, static_cast<Command>(m->header.command | cuw::proto::kReplyBit), m->header.seq,
                                 body, 2000);
      }
      ::close(c);
    }
  }

  std::string path_, state_, events_, limit_pid_, limit_job_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

CmdResult cli(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {CUWT_CLI};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_cmd(argv, {"TZ=UTC"}, 10000);
}

/// Every field --query-compute-apps knows, in its documented order.
const char* kAllQueryFields =
    "pid,process_name,name,used_memory,used_gpu_memory,gpu_uuid,gpu_name,gpu_bus_id,timestamp,limit,peak_memory,"
    "reserved_memory,in_use_memory,cached_memory,allocations,job,user,ooms,fragmentation,driver_used_memory,"
    "outside_cap_memory,context_memory,cap_scope";

}  // namespace

TEST_CASE("golden.daemon_state_events_and_limit_replies") {
  TempDir dir;
  ::chmod(dir.path.c_str(), 0755);
  ::mkdir((dir / "run").c_str(), 01777);
  Child a, b, c;
  const pid_t c_pid = c.pid;
  Normalizer norm;
  norm.run_dir = dir / "run";
  norm.pids = {{static_cast<uint64_t>(a.pid), 4101}, {static_cast<uint64_t>(b.pid), 4102},
               {static_cast<uint64_t>(c.pid), 4103}, {static_cast<uint64_t>(getpid()), 4100}};

  // a: capped, pool off, one GPU, with refusals and a driver error.
  FakeRing ra(dir / "run", a.pid, a.start_time(), 1024, "train_resnet50_with_a_long_name");
  {
    auto& d = ra.device(0, 0xa0);
    d.used.store(4096 * kMiB);
    d.peak.store(5000 * kMiB);
    d.limit.store(8192 * kMiB);
    d.reserved.store(4096 * kMiB);
    d.live_allocations.store(12);
    d.alloc_count.store(40);
    d.free_count.store(28);
    d.refusals.store(3);
    d.driver_errors.store(1);
    d.host_bytes.store(64 * kMiB);
  }
  // b: the cache backend, process cap scope, two GPUs, a member of job "etl".
  FakeRing rb(dir / "run", b.pid, b.start_time(), 1024, "python3", "etl", "cache");
  rb.h->cap_scope = static_cast<uint32_t>(ring::CapScope::process);
  {
    auto& d0 = rb.device(0, 0xa0);
    d0.used.store(1024 * kMiB);
    d0.peak.store(1536 * kMiB);
    d0.reserved.store(1024 * kMiB);
    d0.cached.store(256 * kMiB);
    d0.pool_hits.store(7);
    d0.pool_waits.store(2);
    d0.context_bytes.store(300 * kMiB);
    d0.live_allocations.store(5);
    d0.alloc_count.store(9);
    d0.free_count.store(4);
    auto& d1 = rb.device(1, 0xb0);
    d1.used.store(2048 * kMiB);
    d1.peak.store(2048 * kMiB);
    d1.reserved.store(2048 * kMiB);
    d1.live_allocations.store(1);
    d1.alloc_count.store(1);
  }
  // c: exits before the daemon looks; it held 512 MiB at exit.
  FakeRing rc(dir / "run", c.pid, c.start_time(), 1024, "old_job");
  rc.device(0, 0xa0).used.store(512 * kMiB);
  rc.h->devices[0].peak.store(512 * kMiB);
  c.kill_and_reap();
  // A file the daemon refuses, listed under problems.
  std::ofstream(dir / "run/ring-bogus.cwr") << "not a ring";

  // Job "etl": b has joined with a 3 GiB cap and holds 1 GiB on GPU 0.
  std::string err;
  std::unique_ptr<cuw::job::Segment> seg(cuw::job::Segment::open(dir / "run", getuid(), "etl", true, &err));
  REQUIRE(seg);
  const int slot = seg->join(static_cast<uint32_t>(b.pid), b.start_time(), 3072 * kMiB, 1);
  REQUIRE(slot >= 0);
  uint8_t uuid0[16];
  for (int i = 0; i < 16; ++i) uuid0[i] = static_cast<uint8_t>(0xa0 + i);
  const int g = seg->gpu_index(uuid0, 143771ULL * kMiB);
  REQUIRE(g >= 0);
  seg->force_charge(slot, g, 1024 * kMiB);

  // a's events, drained before b's, so that the numbering does not depend on the pids.
  ra.push(ring::EventKind::alloc, ring::Api::cuMemAlloc, 0, 4096 * kMiB, 0x7f0000000000, 4096 * kMiB);
  ra.push(ring::EventKind::refuse, ring::Api::cuMemAlloc, 0, 8192 * kMiB, 0, 4096 * kMiB);

  // The simulated NVML: two H200s, and the driver's figure for a and b.
  setenv("CUWARDEN_FAKE_DEVICES", "2", 1);
  setenv("CUWARDEN_FAKE_MEMORY", "143771M", 1);
  setenv("CUWARDEN_FAKE_NAME", "NVIDIA H200", 1);
  setenv("CUWARDEN_FAKE_UUIDS", (uuid_for(0xa0) + "," + uuid_for(0xb0)).c_str(), 1);
  setenv("CUWARDEN_FAKE_NVML_PROCESSES",
         (std::to_string(a.pid) + "=" + std::to_string(4608 * kMiB) + "," + std::to_string(b.pid) + "=" +
          std::to_string(1332 * kMiB))
             .c_str(),
         1);
  const std::string saved_ld = getenv("LD_LIBRARY_PATH") ? getenv("LD_LIBRARY_PATH") : "";
  setenv("LD_LIBRARY_PATH", (std::string(CUWT_FAKECUDA_DIR) + (saved_ld.empty() ? "" : ":" + saved_ld)).c_str(), 1);
  Daemon d(dir, {}, true, /*nvml=*/true);
  for (const char* v : {"CUWARDEN_FAKE_DEVICES", "CUWARDEN_FAKE_MEMORY", "CUWARDEN_FAKE_NAME", "CUWARDEN_FAKE_UUIDS",
                        "CUWARDEN_FAKE_NVML_PROCESSES"})
    unsetenv(v);
  if (saved_ld.empty()) unsetenv("LD_LIBRARY_PATH");
  else setenv("LD_LIBRARY_PATH", saved_ld.c_str(), 1);

  auto state = [&] { return request(d.socket, cuw::proto::Command::get_state, ojson::object()); };
  REQUIRE(wait_until([&] { return state()["events_seq"] == 2; }));
  rb.push(ring::EventKind::alloc, ring::Api::cuMemAllocAsync, 0, 512 * kMiB, 0x7e0000000000, 1024 * kMiB);
  rb.push(ring::EventKind::free, ring::Api::cuMemFreeAsync, 0, 512 * kMiB, 0x7e0000000000, 512 * kMiB);
  ojson last;
  const bool settled = wait_until([&] {
    ojson st = last = state();
    if (st["events_seq"] != 4 || st["jobs"].empty() || st["processes"].size() != 3 || st["problems"].empty())
      return false;
    for (const auto& p : st["processes"])
      if (p["pid"] == c_pid && p["state"] != "exited") return false;
    for (const auto& p : st["processes"])
      if (p["pid"] == a.pid && !p["devices"][0].value("driver_used_bytes", ojson()).is_number()) return false;
    return true;
  });
  INFO(last.dump(2));
  REQUIRE(settled);

  // Lowering one's own caps needs no privilege: a's cap on GPU 0, then the job's.
  const ojson lp = request(d.socket, cuw::proto::Command::set_limit, {{"pid", a.pid}, {"bytes", 6144 * kMiB}});
  const ojson lj = request(d.socket, cuw::proto::Command::set_limit, {{"job", "etl"}, {"bytes", 2048 * kMiB}});
  REQUIRE(wait_until([&] { return state()["limit_changes"].size() == 2; }));

  check_golden("state.json", dump(norm.state(state())));
  ojson ev = request(d.socket, cuw::proto::Command::get_events, ojson::object());
  norm.apply(ev);
  check_golden("events.json", dump(ev));
  ojson lpn = lp, ljn = lj;
  norm.apply(lpn);
  norm.apply(ljn);
  check_golden("limit-pid.json", dump(lpn));
  check_golden("limit-job.json", dump(ljn));
}

TEST_CASE("golden.cli_prints_the_same_for_the_same_state") {
  if (kUpdate) {
    WARN("the CLI's golden files are rewritten from the daemon's; run again to compare");
  }
  TempDir dir;
  StandIn daemon(dir / "d.sock", read_golden("state.json"), read_golden("events.json"), read_golden("limit-pid.json"),
                 read_golden("limit-job.json"));
  const std::string sock = dir / "d.sock";
  auto out = [&](const std::vector<std::string>& args) {
    std::vector<std::string> a = {"--socket", sock};
    a.insert(a.end(), args.begin(), args.end());
    CmdResult r = cli(a);
    INFO(r.err);
    REQUIRE(r.status == 0);
    return r.out;
  };
  check_golden("cli-table.txt", out({}));
  check_golden("cli-table-gpu1.txt", out({"-i", "1"}));
  check_golden("cli-query.csv", out({std::string("--query-compute-apps=") + kAllQueryFields, "--format=csv"}));
  check_golden("cli-query-nounits.csv",
               out({"--query-compute-apps=pid,used_memory,limit,ooms,cap_scope", "--format=csv,noheader,nounits"}));
  check_golden("cli-status.json", out({"--json"}));
  check_golden("cli-query.json", out({"--query-compute-apps=pid,used_memory,limit,ooms,gpu_uuid,cap_scope", "--format=json"}));
  check_golden("cli-query-fields.txt", out({"--help-query-compute-apps"}));
  check_golden("cli-events.txt", out({"events"}));
  check_golden("cli-events.jsonl", out({"events", "--json"}));
  check_golden("cli-limit-pid.txt", out({"limit", "4101", "6G"}));
  check_golden("cli-limit-job.txt", out({"limit", "job:etl", "2G"}));
  check_golden("cli-limit-pid.json", out({"limit", "4101", "6G", "--json"}));
}

TEST_CASE("golden.cli_lists_processes_by_pid_as_numbers") {
  // The daemon lists rings by file name, where pid 17912 comes before 6867: the table and the
  // query show them in pid order.
  ojson st = ojson::parse(read_golden("state.json"));
  st["processes"][0]["pid"] = 17912;
  st["processes"][1]["pid"] = 6867;
  st["processes"][2]["pid"] = 7701;
  TempDir dir;
  StandIn daemon(dir / "d.sock", st.dump(), read_golden("events.json"), read_golden("limit-pid.json"),
                 read_golden("limit-job.json"));
  CmdResult r = cli({"--socket", dir / "d.sock", "--query-compute-apps=pid", "--format=csv,noheader"});
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  std::vector<std::string> pids;
  for (std::size_t pos = 0, nl; (nl = r.out.find('\n', pos)) != std::string::npos; pos = nl + 1) {
    const std::string p = r.out.substr(pos, nl - pos);
    if (pids.empty() || pids.back() != p) pids.push_back(p);
  }
  CHECK(pids == std::vector<std::string>{"6867", "17912"});  // the query lists running ones; 7701 exited
  r = cli({"--socket", dir / "d.sock"});
  const std::size_t a = r.out.find(" 6867 "), b = r.out.find(" 7701 "), c = r.out.find(" 17912 ");
  CHECK(a < b);
  CHECK(b < c);
  CHECK(c != std::string::npos);
}
