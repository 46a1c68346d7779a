// cuwarden integration tests for the `cuwarden` CLI: the table, --json, CSV queries,
// events, `run`, and the plain message when no daemon answers or one answers too late.
#include <catch2/catch.hpp>

#include <algorithm>
#include <csignal>
#include <future>

#include "daemon_test_support.hpp"

using namespace cuwt;

namespace {

CmdResult cli(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv = {CUWT_CLI};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_cmd(argv, env, 10000);
}

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

/// A daemon with two fake processes: one capped on GPU 0, one uncapped on GPUs 0 and 1.
struct Scene {
  TempDir dir;
  Child a, b;
  std::unique_ptr<FakeRing> ra, rb;
  std::unique_ptr<Daemon> d;
  Scene() {
    ::mkdir((dir / "run").c_str(), 0755);
    ra = std::make_unique<FakeRing>(dir / "run", a.pid, a.start_time(), 1024, "train_resnet50_with_a_long_name");
    auto& da = ra->device(0, 0xa0);
    da.used.store(4096 * kMiB);
    da.peak.store(5000 * kMiB);
    da.limit.store(8192 * kMiB);
    da.live_allocations.store(12);
    da.refusals.store(3);
    rb = std::make_unique<FakeRing>(dir / "run", b.pid, b.start_time(), 1024, "python3", "etl");
    rb->device(0, 0xa0).used.store(1024 * kMiB);
    rb->device(1, 0xb0).used.store(2048 * kMiB);
    ra->push(cuw::ring::EventKind::alloc, cuw::ring::Api::cuMemAlloc, 0, 4096 * kMiB, 0x7f0000000000, 4096 * kMiB);
    d = std::make_unique<Daemon>(dir);
    REQUIRE(wait_until([&] {
      auto st = d->state();
      return st["processes"].size() == 2 && st["events_seq"] == 1;
    }));
  }
};

}  // namespace

TEST_CASE("cli.no_daemon_prints_a_plain_message_and_exits_1") {
  TempDir dir;
  const std::string sock = dir / "nobody.sock";
  CmdResult r = cli({"--socket", sock});
  CHECK(r.status == 1);
  CHECK(r.out.empty());
  CHECK(contains(r.err, "cuwarden: no daemon is running (no answer at " + sock + ": "));
  CHECK(contains(r.err, "Start it with: cuwardend &"));
  // The default socket comes from CUWARDEN_RUN_DIR.
  CmdResult r2 = cli({"--json"}, {"CUWARDEN_RUN_DIR=" + dir.path});
  CHECK(r2.status == 1);
  CHECK(contains(r2.err, dir.path + "/daemon/cuwardend.sock"));
  CmdResult r3 = cli({"events", "--socket", sock});
  CHECK(r3.status == 1);
  CHECK(contains(r3.err, "no daemon is running"));
}

TEST_CASE("cli.a_daemon_that_does_not_answer_in_time_is_timed_out_not_missing") {
  // A daemon that runs but is stuck (here stopped): the kernel still accepts the connection
  // and the request, and no reply comes. "No daemon is running" would send the user to
  // start a second one, and a limit said to have failed may still be applied later.
  TempDir dir;
  Daemon d(dir);
  Child c;
  REQUIRE(::kill(d.pid, SIGSTOP) == 0);
  struct Resume {
    pid_t pid;
    ~Resume() { ::kill(pid, SIGCONT); }
  } resume{d.pid};
  // Both at once: each waits out the CLI's 10 s before it gives up.
  auto status = std::async(std::launch::async, [&] { return run_cmd({CUWT_CLI, "--socket", d.socket}, {}, 30000); });
  auto limit = std::async(std::launch::async, [&] {
    return run_cmd({CUWT_CLI, "--socket", d.socket, "limit", std::to_string(c.pid), "1G"}, {}, 30000);
  });
  for (CmdResult r : {status.get(), limit.get()}) {
    INFO(r.err);
    CHECK(r.status == 1);
    CHECK(contains(r.err, "cuwarden: the daemon at " + d.socket + " accepted the request but did not answer (timed out"));
    CHECK_FALSE(contains(r.err, "no daemon is running"));
  }
}

TEST_CASE("cli.json_is_the_daemon_state") {
  Scene s;
  CmdResult r = cli({"--socket", s.d->socket, "--json"});
  REQUIRE(r.status == 0);
  json j = json::parse(r.out);
  json st = s.d->state();
  // Apart from the clocks, the same document.
  for (json* x : {&j, &st}) {
    x->erase("time_ns");
    for (auto& p : (*x)["processes"]) p.erase("consumer_heartbeat_ns");
  }
  CHECK(j == st);
  CHECK(j["processes"].size() == 2);
  CHECK(contains(r.out, "\n  \"version\": \"0.1.0\""));  // pretty-printed
}

TEST_CASE("cli.table_shows_gpus_and_processes") {
  Scene s;
  CmdResult r = cli({"--socket", s.d->socket});
  REQUIRE(r.status == 0);
  INFO(r.out);
  CHECK(contains(r.out, "cuwarden 0.1.0"));
  CHECK(contains(r.out, "NVIDIA H200"));
  CHECK(contains(r.out, uuid_for(0xa0).substr(0, 12)));
  CHECK(contains(r.out, "5120MiB / 143771MiB"));  // GPU 0: 4096 + 1024 tracked
  CHECK(contains(r.out, "Processes:"));
  CHECK(contains(r.out, std::to_string(s.a.pid)));
  CHECK(contains(r.out, std::to_string(s.b.pid)));
  CHECK(contains(r.out, "4096MiB"));
  CHECK(contains(r.out, "8192MiB"));
  CHECK(contains(r.out, "train_resnet50_with_a..."));  // truncated to 24 columns
  CHECK(contains(r.out, "python3"));
  // One row per process per device: b has two.
  std::size_t rows = 0;
  for (std::size_t p = r.out.find(" python3 "); p != std::string::npos; p = r.out.find(" python3 ", p + 1)) ++rows;
  CHECK(rows == 2);
  // Every line of a box has the same width.
  std::size_t width = 0;
  std::size_t pos = 0;
  while (pos < r.out.size()) {
    std::size_t nl = r.out.find('\n', pos);
    std::string line = r.out.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.empty() || (line[0] != '|' && line[0] != '+')) continue;
    if (!width) width = line.size();
    CHECK(line.size() == width);
  }

  // Exited processes are marked, and hold nothing: the driver freed their memory at exit,
  // whatever their counters said last (kept as used_at_exit_bytes).
  auto& da = s.ra->h->devices[0];
  da.reserved.store(4096 * kMiB);
  da.cached.store(512 * kMiB);
  da.host_bytes.store(64 * kMiB);
  REQUIRE(wait_until([&] { return s.d->process(s.ra->h->pid)["devices"][0]["cached_bytes"] == 512 * kMiB; }));
  s.a.kill_and_reap();
  REQUIRE(wait_until([&] { return s.d->process(s.ra->h->pid)["state"] == "exited"; }));
  CmdResult r2 = cli({"--socket", s.d->socket});
  CHECK(contains(r2.out, "exited"));
  CHECK(contains(r2.out, "1024MiB / 143771MiB"));  // the exited process no longer counts
  const json gone = s.d->process(s.ra->h->pid);
  CHECK(gone["devices"][0]["used_bytes"] == 0);
  CHECK(gone["devices"][0]["reserved_bytes"] == 0);  // as its history says
  CHECK(gone["devices"][0]["cached_bytes"] == 0);
  CHECK(gone["devices"][0]["host_bytes"] == 0);
  CHECK(gone["devices"][0]["used_at_exit_bytes"] == 4096 * kMiB);
  CHECK(gone["devices"][0]["peak_bytes"] == 5000 * kMiB);
  CHECK_FALSE(contains(r2.out, "4096MiB"));
}

TEST_CASE("cli.query_compute_apps_speaks_nvidia_smi_csv") {
  Scene s;
  CmdResult r = cli({"--socket", s.d->socket, "--query-compute-apps=pid,process_name,used_memory,limit,ooms,gpu_uuid",
                     "--format=csv"});
  REQUIRE(r.status == 0);
  INFO(r.out);
  CHECK(r.out.rfind("pid, process_name, used_gpu_memory [MiB], limit [MiB], ooms, gpu_uuid\n", 0) == 0);
  CHECK(contains(r.out, std::to_string(s.a.pid) + ", train_resnet50_with_a_long_name, 4096 MiB, 8192 MiB, 3, " +
                            uuid_for(0xa0) + "\n"));
  CHECK(contains(r.out, std::to_string(s.b.pid) + ", python3, 2048 MiB, [N/A], 0, " + uuid_for(0xb0) + "\n"));

  CmdResult n = cli({"--socket", s.d->socket, "--query-compute-apps=pid,used_gpu_memory", "--format=csv,noheader,nounits"});
  REQUIRE(n.status == 0);
  CHECK(contains(n.out, std::to_string(s.a.pid) + ", 4096\n"));
  CHECK(!contains(n.out, "pid"));

  CmdResult g = cli({"--socket", s.d->socket, "--query-compute-apps=pid", "--format=csv,noheader", "-i", "1"});
  CHECK(g.out == std::to_string(s.b.pid) + "\n");

  CmdResult bad = cli({"--socket", s.d->socket, "--query-compute-apps=pid,bogus", "--format=csv"});
  CHECK(bad.status == 2);
  CHECK(contains(bad.err, "Field \"bogus\" is not a valid field to query."));
  CmdResult nofmt = cli({"--socket", s.d->socket, "--query-compute-apps=pid"});
  CHECK(nofmt.status == 2);
}

TEST_CASE("cli.list_gpus_and_query_gpu_speak_nvidia_smi") {
  Scene s;
  CmdResult l = cli({"--socket", s.d->socket, "-L"});
  INFO(l.out << l.err);
  REQUIRE(l.status == 0);
  CHECK(l.out == "GPU 0: NVIDIA H200 (UUID: " + uuid_for(0xa0) + ")\nGPU 1: NVIDIA H200 (UUID: " + uuid_for(0xb0) + ")\n");

  CmdResult r = cli({"--socket", s.d->socket,
                     "--query-gpu=index,uuid,name,pci.bus_id,memory.total,memory.used,memory.free,memory.reserved,count,"
                     "driver_version",
                     "--format=csv"});
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out == "index, uuid, name, pci.bus_id, memory.total [MiB], memory.used [MiB], memory.free [MiB], "
                 "memory.reserved [MiB], count, driver_version\n"
                 "0, " + uuid_for(0xa0) + ", NVIDIA H200, [N/A], 143771 MiB, 5120 MiB, 138651 MiB, [N/A], 2, [N/A]\n"
                 "1, " + uuid_for(0xb0) + ", NVIDIA H200, [N/A], 143771 MiB, 2048 MiB, 141723 MiB, [N/A], 2, [N/A]\n");
  // -i, noheader and nounits as for --query-compute-apps.
  r = cli({"--socket", s.d->socket, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits", "-i", "1"});
  CHECK(r.out == "1, 2048\n");
  r = cli({"--socket", s.d->socket, "--query-gpu=timestamp", "--format=csv,noheader"});
  CHECK(r.out.size() == 2 * std::string("2026/12/05 23:27:21.123\n").size());
  // nvidia-smi's wording for a field it does not know.
  r = cli({"--socket", s.d->socket, "--query-gpu=index,temperature.gpu", "--format=csv"});
  CHECK(r.status == 2);
  CHECK(r.err == "Field \"temperature.gpu\" is not a valid field to query.\n");
  CHECK(contains(cli({"--help-query-gpu"}).out, "\"memory.free\""));
  // Looping: the header once.
  r = run_cmd({CUWT_CLI, "--socket", s.d->socket, "--query-gpu=index", "--format=csv", "-lms", "200"}, {}, 1100);
  std::size_t headers = 0, rows = 0;
  for (std::size_t pos = 0, nl; (nl = r.out.find('\n', pos)) != std::string::npos; pos = nl + 1)
    (r.out.compare(pos, nl - pos, "index") == 0 ? headers : rows) += 1;
  CHECK(headers == 1);
  CHECK(rows >= 2);  // a round at least (two GPUs); more on an idle machine, under one header
}

TEST_CASE("cli.events_prints_what_the_daemon_collected") {
  Scene s;
  CmdResult r = cli({"events", "--socket", s.d->socket});
  REQUIRE(r.status == 0);
  INFO(r.out);
  CHECK(contains(r.out, "TIME"));
  CHECK(contains(r.out, "cuMemAlloc"));
  CHECK(contains(r.out, "4.00 GiB"));
  CHECK(contains(r.out, "0x7f0000000000"));
  CmdResult j = cli({"--socket", s.d->socket, "events", "--json", "--pid", std::to_string(s.a.pid)});
  REQUIRE(j.status == 0);
  json e = json::parse(j.out.substr(0, j.out.find('\n')));
  CHECK(e["pid"] == s.a.pid);
  CHECK(e["kind"] == "alloc");
  CHECK(e["bytes"] == 4096 * kMiB);
  CmdResult none = cli({"--socket", s.d->socket, "events", "--json", "--pid", std::to_string(s.b.pid)});
  CHECK(none.status == 0);
  CHECK(none.out.empty());
}

TEST_CASE("cli.run_sets_the_environment_and_preloads_the_interposer") {
  const std::string lib = CUWT_PRELOAD;
  CmdResult r = cli({"run", "--lib", lib, "--limit", "0=8G,1=4G", "--job", "etl", "--job-limit", "20G", "--pool",
                     "cache", "--callsites", "0", "--cap-scope", "process", "--", "/bin/sh", "-c",
                     "echo L=$CUWARDEN_LIMIT J=$CUWARDEN_JOB JL=$CUWARDEN_JOB_LIMIT P=$CUWARDEN_POOL "
                     "C=$CUWARDEN_CALLSITES S=$CUWARDEN_CAP_SCOPE; echo PRE=$LD_PRELOAD; exit 7"},
                    {"LD_PRELOAD=" + lib + ":/lib/x86_64-linux-gnu/libm.so.6"});
  INFO(r.err);
  CHECK(r.status == 7);  // the command's own exit code: exec, no wrapper process
  CHECK(contains(r.out, "L=0=8G,1=4G J=etl JL=20G P=cache C=0 S=process\n"));
  // Ours first, the existing entry kept, no duplicate of ours.
  CHECK(contains(r.out, "PRE=" + lib + ":/lib/x86_64-linux-gnu/libm.so.6\n"));

  // Without "--", and with CUWARDEN_LIB.
  CmdResult r2 = cli({"run", "/bin/sh", "-c", "echo PRE=$LD_PRELOAD"}, {"CUWARDEN_LIB=" + lib, "LD_PRELOAD="});
  CHECK(r2.status == 0);
  CHECK(r2.out == "PRE=" + lib + "\n");
}

TEST_CASE("cli.run_rejects_bad_input_before_exec") {
  const std::string lib = CUWT_PRELOAD;
  auto run = [&](std::vector<std::string> args) {
    std::vector<std::string> a = {"run", "--lib", lib};
    a.insert(a.end(), args.begin(), args.end());
    return cli(a);
  };
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--limit", "8Q", "--", "true"},
           {"--limit", "-1G", "--", "true"},
           {"--job-limit", "8G", "--", "true"},
           {"--job", "etl", "--job-limit", "lots", "--", "true"},
           {"--job", "etl", "--job-limit", "50%", "--", "true"},
           {"--job", "bad/name", "--", "true"},
           {"--pool", "magic", "--", "true"},
           {"--cap-scope", "context", "--", "true"},
           {"--callsites", "65", "--", "true"},
           {"--limit", "8G"},
           {"--limit", "75", "--", "true"},  // 75 bytes: a mistyped unit
           {"--limit", "0", "--", "true"},
           {"--job", "etl", "--job-limit", "100", "--", "true"},
       }) {
    CmdResult r = run(args);
    INFO(args[0] << " " << args[1] << ": " << r.err);
    CHECK(r.status == 2);
    CHECK(contains(r.err, "cuwarden run: "));
  }
  // A library path the dynamic loader would split (the program would run uncapped).
  {
    TempDir dir;
    const std::string odd = dir / "my tools";
    ::mkdir(odd.c_str(), 0755);
    const std::string copy = odd + "/libcuwarden.so";
    REQUIRE(std::system(("cp '" + lib + "' '" + copy + "'").c_str()) == 0);
    CmdResult r = cli({"run", "--lib", copy, "--", "true"});
    CHECK(r.status == 1);
    CHECK(contains(r.err, "cannot preload a path with a space or a colon"));
  }
  // Call sites: 0..64 frames, anything else refused before the command runs.
  CHECK(run({"--callsites", "8", "--", "true"}).status == 0);
  for (const char* bad : {"65", "-1"}) {
    CmdResult r = run({"--callsites", bad, "--", "true"});
    INFO(bad << ": " << r.err);
    CHECK(r.status == 2);
    CHECK(contains(r.err, "--callsites"));
  }
  CmdResult fast = run({"--pool", "fast", "--", "true"});
  CHECK(fast.status == 2);
  CHECK(contains(fast.err, "bad --pool 'fast': use off, cache or vmm"));
  CmdResult tiny = run({"--limit", "75", "--", "true"});
  CHECK(contains(tiny.err, "smaller than any real allocation: give a unit (75G, 75MiB) or a share (75%)"));
  CmdResult nf = run({"--", "/no/such/program"});
  CHECK(nf.status == 127);
  CHECK(contains(nf.err, "/no/such/program: command not found"));
  CmdResult nolib = cli({"run", "--lib", "/no/such/lib.so", "--", "true"});
  CHECK(nolib.status == 1);
  CHECK(contains(nolib.err, "cannot find libcuwarden.so"));
}

TEST_CASE("cli.loop_prints_the_csv_header_once_and_json_one_document_per_line") {
  Scene s;
  // -lms as nvidia-smi spells it; killed after about five rounds.
  CmdResult r = run_cmd({CUWT_CLI, "--socket", s.d->socket, "--query-compute-apps=pid,used_memory", "--format=csv", "-lms", "200"},
              {}, 1100);
  INFO(r.out << r.err);
  CHECK(r.status == -1);  // still looping when killed
  std::size_t headers = 0, rows = 0;
  for (std::size_t pos = 0; pos < r.out.size();) {
    const std::size_t nl = r.out.find('\n', pos);
    const std::string line = r.out.substr(pos, nl - pos);
    pos = nl + 1;
    if (line == "pid, used_gpu_memory [MiB]") ++headers;
    else if (!line.empty()) ++rows;
  }
  CHECK(headers == 1);
  CHECK(rows >= 2 * 3);  // three rows a round (a on GPU 0, b on GPUs 0 and 1), two rounds at least

  CmdResult j = run_cmd({CUWT_CLI, "--socket", s.d->socket, "--json", "--loop-ms", "200"}, {}, 1100);
  std::size_t docs = 0;
  for (std::size_t pos = 0; pos < j.out.size();) {
    const std::size_t nl = j.out.find('\n', pos);
    const std::string line = j.out.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.empty()) continue;
    INFO(line.substr(0, 200));
    json doc = json::parse(line, nullptr, false);
    CHECK(doc.is_object());
    CHECK(doc["processes"].size() == 2);
    ++docs;
  }
  CHECK(docs >= 2);
  CmdResult both = cli({"--socket", s.d->socket, "-l", "1", "-lms", "200"});
  CHECK(both.status == 2);
  // nounits drops the unit from the values, not from the header (as nvidia-smi).
  CmdResult n = cli({"--socket", s.d->socket, "--query-compute-apps=pid,used_memory", "--format=csv,nounits"});
  CHECK(n.out.rfind("pid, used_gpu_memory [MiB]\n", 0) == 0);
  CHECK(contains(n.out, std::to_string(s.a.pid) + ", 4096\n"));
}

TEST_CASE("cli.gpu_filter_names_a_known_gpu_and_filters_json_too") {
  Scene s;
  CmdResult r = cli({"--socket", s.d->socket, "-i", "7"});
  CHECK(r.status == 1);
  CHECK(contains(r.err, "no GPU '7' (GPUs: 0, 1)"));
  CmdResult q = cli({"--socket", s.d->socket, "--query-compute-apps=pid", "--format=csv", "-i", "0,7"});
  CHECK(q.status == 1);
  CmdResult j = cli({"--socket", s.d->socket, "--json", "-i", "1"});
  REQUIRE(j.status == 0);
  json st = json::parse(j.out);
  REQUIRE(st["gpus"].size() == 1);
  CHECK(st["gpus"][0]["index"] == 1);
  REQUIRE(st["processes"].size() == 1);  // a has nothing on GPU 1
  CHECK(st["processes"][0]["pid"] == s.b.pid);
  REQUIRE(st["processes"][0]["devices"].size() == 1);
  CHECK(st["processes"][0]["devices"][0]["gpu_index"] == 1);
  CmdResult u = cli({"--socket", s.d->socket, "--json", "-i", uuid_for(0xa0).substr(0, 12)});
  REQUIRE(u.status == 0);
  CHECK(json::parse(u.out)["gpus"][0]["index"] == 0);
}

TEST_CASE("cli.events_of_an_unknown_process_say_so") {
  Scene s;
  CmdResult r = cli({"events", "--socket", s.d->socket, "--pid", "99999"});
  CHECK(r.status == 1);
  CHECK(r.out.empty());
  CHECK(contains(r.err, "no process 99999 is known to the daemon"));
}

TEST_CASE("cli.events_follow_waits_for_a_restarted_daemon") {
  Scene s;
  TempDir io;
  const std::string out = io / "out", err = io / "err";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<std::string> argv = {CUWT_CLI, "events", "--follow", "--json", "--socket", s.d->socket};
  std::vector<char*> a;
  for (auto& x : argv) a.push_back(x.data());
  a.push_back(nullptr);
  pid_t pid = -1;
  REQUIRE(posix_spawn(&pid, a[0], &fa, nullptr, a.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&fa);
  auto lines = [&] {
    const std::string o = slurp(out);
    return static_cast<std::size_t>(std::count(o.begin(), o.end(), '\n'));
  };
  CHECK(wait_until([&] { return lines() == 1; }));  // the alloc the scene pushed
  s.d.reset();                                      // the daemon stops
  CHECK(wait_until([&] { return contains(slurp(err), "the daemon is gone; waiting for it to come back"); }));
  CHECK(::kill(pid, 0) == 0);  // still following
  s.d = std::make_unique<Daemon>(s.dir);
  REQUIRE(s.ra->push(cuw::ring::EventKind::free, cuw::ring::Api::cuMemFree, 0, 4096 * kMiB, 0x7f0000000000, 0));
  CHECK(wait_until([&] { return lines() == 2; }));
  CHECK(contains(slurp(err), "the daemon is back"));
  ::kill(pid, SIGTERM);
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st));
  const std::string o = slurp(out);
  CHECK(json::parse(o.substr(o.rfind('\n', o.size() - 2) + 1))["kind"] == "free");
}

TEST_CASE("cli.daemon_bad_flags_exit_2_like_the_cli") {
  for (const auto& args : std::vector<std::vector<std::string>>{{"--bogus"}, {"--drain-interval-ms", "0"},
                                                                 {"--log-level", "loud"}}) {
    std::vector<std::string> argv = {CUWT_DAEMON};
    argv.insert(argv.end(), args.begin(), args.end());
    CmdResult r = run_cmd(argv, {}, 5000);
    INFO(args[0] << ": " << r.err);
    CHECK(r.status == 2);
  }
  CHECK(run_cmd({CUWT_DAEMON, "--help"}, {}, 5000).status == 0);
  CHECK(run_cmd({CUWT_CLI, "--bogus"}, {}, 5000).status == 2);
  // A port the resolver would wrap (99999 serves 34463) or no port at all: refused with the
  // other bad arguments, before the daemon looks at its run directory.
  for (const char* bad : {"127.0.0.1:99999", "127.0.0.1:65536", "127.0.0.1:", "nonsense", "127.0.0.1:94x"}) {
    CmdResult r = run_cmd({CUWT_DAEMON, "--http", bad, "--run-dir", "/nonexistent/cuwt"}, {}, 5000);
    INFO(bad << ": " << r.err);
    CHECK(r.status == 2);
    CHECK(contains(r.err, "--http"));
    CHECK((contains(r.err, "is not a port number (0 to 65535)") || contains(r.err, "expected HOST:PORT")));
  }
}

TEST_CASE("cli.usage_errors_say_what_was_wrong_in_the_projects_words") {
  struct Case {
    std::vector<std::string> args;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {{"-l", "abc"}, "cuwarden: --loop takes a number from 0 to 86400, not 'abc'"},
           {{"frobnicate"}, "cuwarden: unknown command or argument 'frobnicate' (commands: run,"},
           {{"--query-compute-apps=", "--format=csv"}, "--query-compute-apps= names no field"},
           {{"limit", "123", "0=1G,1=2G"}, "is a cap per device"},
           {{"limit", "123", "0=1G,1=2G"}, "--device N"},
           {{"limit", "123", "18446744073709551615"}, "is the number that means no cap; to remove a cap, say none"},
           {{"limit", "123", "0G"}, "a cap of 0 B ('0G') is smaller than any real allocation; the smallest cap is 1 MiB"},
           {{"events", "--max", "0"}, "cuwarden events: --max takes a number from 1 to 100000, not '0'"},
       }) {
    CmdResult r = cli(c.args);
    INFO(c.args[0] << ": " << r.err);
    CHECK(r.status == 2);
    CHECK(contains(r.err, c.says));
    CHECK(!contains(r.err, "The following argument"));
    CHECK(!contains(r.err, "GG"));
  }
  // A pickle is not written to a terminal, daemon or not (script(1) gives the command one).
  if (::access("/usr/bin/script", X_OK) == 0) {
    CmdResult p = run_cmd({"/usr/bin/script", "-qec", std::string(CUWT_CLI) + " snapshot 1 --format pytorch --socket /nonexistent",
                           "/dev/null"},
                          {}, 10000);
    CHECK(contains(p.out, "the pytorch format is a pickle: write it with -o FILE.pickle"));
  }
}

TEST_CASE("cli.run_never_loosens_what_it_inherits") {
  const std::string lib = CUWT_PRELOAD;
  const std::string show = "echo L=$CUWARDEN_LIMIT O=$CUWARDEN_OUTER_LIMIT J=$CUWARDEN_JOB JL=$CUWARDEN_JOB_LIMIT "
                           "S=$CUWARDEN_CAP_SCOPE E=$CUWARDEN_ON_ERROR";
  auto run = [&](std::vector<std::string> flags, std::vector<std::string> env) {
    std::vector<std::string> a = {"run", "--lib", lib};
    a.insert(a.end(), flags.begin(), flags.end());
    for (const char* x : {"--", "/bin/sh", "-c"}) a.push_back(x);
    a.push_back(show);
    return cli(a, env);
  };
  // A higher --limit inside a lower one: both go to the interposer, which takes the lowest.
  CmdResult r = run({"--limit", "2G"}, {"CUWARDEN_LIMIT=1G"});
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(contains(r.out, "L=2G O=1G "));
  CHECK(contains(r.err, "cuwarden run: --limit 2G applies together with the inherited cap 1G: the lowest applies"));
  CHECK(contains(r.err, "(cuwarden run never loosens what it inherits)"));
  // Three deep: every cap is kept.
  r = run({"--limit", "4G"}, {"CUWARDEN_LIMIT=2G", "CUWARDEN_OUTER_LIMIT=1G"});
  CHECK(contains(r.out, "L=4G O=1G;2G "));
  // A lower one is simply lower: nothing to say.
  r = run({"--limit", "512M"}, {"CUWARDEN_LIMIT=1G"});
  CHECK(contains(r.out, "L=512M O=1G "));
  CHECK(r.err.empty());
  // A share against bytes: the device decides, so it is said too.
  r = run({"--limit", "0=50%"}, {"CUWARDEN_LIMIT=8G"});
  CHECK(contains(r.out, "L=0=50% O=8G "));
  CHECK(contains(r.err, "the lowest applies on each device"));
  // The job and its cap, the cap scope, and fail-closed.
  r = run({"--job", "mine", "--job-limit", "2G", "--cap-scope", "allocations"},
          {"CUWARDEN_JOB=site", "CUWARDEN_JOB_LIMIT=1G", "CUWARDEN_CAP_SCOPE=process"});
  CHECK(contains(r.out, "J=site JL=1G S=process "));
  CHECK(contains(r.err, "keeps the job 'site' it inherits (CUWARDEN_JOB), not --job mine"));
  CHECK(contains(r.err, "keeps the job cap 1G it inherits, not --job-limit 2G"));
  CHECK(contains(r.err, "keeps the cap scope 'process' it inherits (CUWARDEN_CAP_SCOPE), not --cap-scope allocations"));
  r = run({"--job-limit", "512M"}, {"CUWARDEN_JOB=site", "CUWARDEN_JOB_LIMIT=1G"});
  CHECK(contains(r.out, "J=site JL=512M "));
  r = run({}, {"CUWARDEN_LIMIT=1G", "CUWARDEN_ON_ERROR=open"});
  CHECK(contains(r.out, "E=fail"));
  CHECK(contains(r.err, "CUWARDEN_ON_ERROR=open would run without the caps it inherits"));
  // An inherited value that is not valid is not silently dropped.
  r = run({"--limit", "2G"}, {"CUWARDEN_LIMIT=lots"});
  CHECK(r.status == 2);
  CHECK(contains(r.err, "the inherited CUWARDEN_LIMIT='lots' is not valid"));
  CHECK(contains(cli({"run", "--help"}).out, "cuwarden run never loosens what it inherits"));
}

TEST_CASE("cli.nested_run_keeps_the_outer_cap_on_the_simulated_driver") {
  TempDir dir;
  ::mkdir((dir / "run").c_str(), 0755);
  const std::string cli_path = CUWT_CLI, lib = CUWT_LIB, loop = CUWT_ALLOC_LOOP;
  const std::vector<std::string> env = {"LD_LIBRARY_PATH=" + std::string(CUWT_FAKECUDA_DIR), "CUWARDEN_FAKE_DEVICES=1",
                                        "CUWARDEN_FAKE_MEMORY=8G", "CUWARDEN_RUN_DIR=" + (dir / "run")};
  // 1500 MiB: above the outer cap, under the inner one; then 600 MiB fits.
  for (const std::string outer : {"1G", "12.5%"}) {
    CmdResult r = run_cmd({"/bin/sh", "-c",
                           "printf 'alloc 1500\\nalloc 600\\n' | " + cli_path + " run --lib " + lib + " --limit " + outer +
                               " -- " + cli_path + " run --lib " + lib + " --limit 2G -- " + loop},
                          env, 20000);
    INFO(outer << ": " << r.out << r.err);
    CHECK(r.status == 0);
    CHECK(contains(r.out, "\nrefused\nok\n"));
  }
}

TEST_CASE("cli.process_names_are_whole_where_the_kernel_cut_them") {
  TempDir dir;
  ::mkdir((dir / "run").c_str(), 0755);
  Child a, b;
  // The kernel keeps 15 characters of a name (comm); the command line has all of it.
  FakeRing ra(dir / "run", a.pid, a.start_time(), 1024, "train_resnet50_");
  std::snprintf(ra.h->cmdline, sizeof ra.h->cmdline, "/opt/models/train_resnet50_with_attention --epochs 3");
  ra.device(0, 0xa0).used.store(64 * kMiB);
  // A process that named itself (a data-loader worker) keeps its own name.
  FakeRing rb(dir / "run", b.pid, b.start_time(), 1024, "pt_data_worker");
  std::snprintf(rb.h->cmdline, sizeof rb.h->cmdline, "/usr/bin/python3 train.py");
  rb.device(0, 0xa0).used.store(64 * kMiB);
  Daemon d(dir);
  REQUIRE(wait_until([&] { return d.state()["processes"].size() == 2; }));
  CHECK(d.process(a.pid)["process_name"] == "train_resnet50_with_attention");
  CHECK(d.process(b.pid)["process_name"] == "pt_data_worker");
  CmdResult r = cli({"--socket", d.socket});
  CHECK(contains(r.out, "train_resnet50_with_a..."));  // the column's 24, not the kernel's 15
}
