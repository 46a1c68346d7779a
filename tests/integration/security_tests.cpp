// cuwarden integration tests: what a user can make the root daemon do with the files they
// write. A victim's process (a `sleep` running as cuwarden-test-victim, its ring and live
// segment written here and handed to that user, as its interposer would have made them) names
// modules chosen by the test; the daemon runs as root. Checked: symbolization never reads a
// file the process's owner cannot read, never opens a link's target past its owner's rights,
// a FIFO or a device; a worker that hangs is killed at its deadline; limits and state are
// answered while a snapshot's worker is stopped; one user's rings naming made-up GPUs leave
// another user's GPU and its history in place.
// Root only (ctest label `root`): each test prints "SKIPPED: ..." and returns otherwise.
#include <dlfcn.h>
#include <elf.h>
#include <pwd.h>
#include <sys/inotify.h>
#include <sys/sysmacros.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <fstream>
#include <optional>

#include "core/live_segment.hpp"
#include "cuw/live.hpp"
#include "daemon_test_support.hpp"

extern "C" __attribute__((noinline, used)) int cuwt_security_marker_function(int x) {
  asm volatile("" ::: "memory");
  return x * 3 + 1;
}

namespace {

using namespace cuwt;
using namespace std::chrono;

#define REQUIRE_ROOT()                                                                 \
  do {                                                                                 \
    if (geteuid() != 0) {                                                              \
      std::puts("SKIPPED: needs root (a second user, root-only files, a root daemon)"); \
      return;                                                                          \
    }                                                                                  \
  } while (0)

struct User {
  uid_t uid;
  gid_t gid;
};

User test_user(const char* name) {
  if (getpwnam(name) == nullptr)
    (void)run_cmd({access("/usr/sbin/useradd", X_OK) == 0 ? "/usr/sbin/useradd" : "useradd", "--system",
                   "--no-create-home", "--shell", "/usr/sbin/nologin", name});
  const passwd* pw = getpwnam(name);
  if (pw == nullptr) throw std::runtime_error(std::string("cannot create user ") + name);
  return {pw->pw_uid, pw->pw_gid};
}

/// Offset of cuwt_security_marker_function in this program's file (its address less the
/// load base: the file's own address of it, as a module's pc - bias is).
uint64_t marker_offset() {
  Dl_info info{};
  REQUIRE(dladdr(reinterpret_cast<void*>(&cuwt_security_marker_function), &info) != 0);
  return reinterpret_cast<uintptr_t>(&cuwt_security_marker_function) - reinterpret_cast<uintptr_t>(info.dli_fbase);
}

/// [start, end) of `path`'s .text, from its section headers.
std::pair<uint64_t, uint64_t> text_of(const std::string& path) {
  const std::string f = slurp(path);
  REQUIRE(f.size() > sizeof(Elf64_Ehdr));
  Elf64_Ehdr eh;
  std::memcpy(&eh, f.data(), sizeof eh);
  REQUIRE(eh.e_shoff + uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr) <= f.size());
  auto sh = [&](unsigned i) {
    Elf64_Shdr s;
    std::memcpy(&s, f.data() + eh.e_shoff + i * sizeof(Elf64_Shdr), sizeof s);
    return s;
  };
  const Elf64_Shdr names = sh(eh.e_shstrndx);
  for (unsigned i = 0; i < eh.e_shnum; ++i) {
    const Elf64_Shdr s = sh(i);
    if (std::strcmp(f.data() + names.sh_offset + s.sh_name, ".text") == 0) return {s.sh_addr, s.sh_addr + s.sh_size};
  }
  FAIL("no .text in " << path);
  return {0, 0};
}

void copy_file(const std::string& from, const std::string& to, mode_t mode) {
  std::ofstream(to, std::ios::binary) << slurp(from);
  REQUIRE(::chmod(to.c_str(), mode) == 0);
}

constexpr uint64_t kBias = 0x500000000000ULL;  ///< where each fake module "was loaded", 4 GiB apart

/// A victim's interposed process as the daemon sees it: a process of that user, its ring
/// and a live segment whose modules and call sites the test chooses.
struct VictimProcess {
  User victim = test_user("cuwarden-test-victim");
  Child proc;
  uint64_t start = 0;
  std::unique_ptr<FakeRing> ring;
  cuw::core::LiveSegment seg;
  int modules = 0;
  uint32_t sites = 0;

  explicit VictimProcess(const std::string& run)
      : proc({"setpriv", "--reuid=" + std::to_string(test_user("cuwarden-test-victim").uid),
              "--regid=" + std::to_string(test_user("cuwarden-test-victim").gid), "--clear-groups", "sleep", "300"}) {
    REQUIRE(wait_until([&] { return slurp("/proc/" + std::to_string(proc.pid) + "/comm") == "sleep\n"; }));
    start = proc.start_time();
    ring = std::make_unique<FakeRing>(run, static_cast<uint32_t>(proc.pid), start, FakeRing::Owner{victim.uid, victim.gid});
    ring->device(0, 0x20).limit.store(ring::kNoLimit);
    REQUIRE(seg.open(run, static_cast<uint32_t>(proc.pid), victim.uid, start, now_ns(), 64, false));
    REQUIRE(::chown(seg.path().c_str(), victim.uid, victim.gid) == 0);
  }
  /// Module `path` loaded at the next kBias slot: returns its bias.
  uint64_t module(const std::string& path, uint64_t size = 1ULL << 32) {
    const uint64_t bias = kBias + (uint64_t{static_cast<unsigned>(modules++)} << 32);
    const std::size_t padded = (path.size() + 7) & ~std::size_t{7};
    std::vector<unsigned char> rec(sizeof(cuw::live::ModuleRecord) + padded, 0);
    cuw::live::ModuleRecord head{};
    head.size = static_cast<uint32_t>(rec.size());
    head.path_len = static_cast<uint32_t>(path.size());
    head.start = bias;
    head.end = bias + size;
    head.bias = bias;
    std::memcpy(rec.data(), &head, sizeof head);
    std::memcpy(rec.data() + sizeof head, path.data(), path.size());
    REQUIRE(seg.append(cuw::live::Log::modules, rec.data(), rec.size()));
    return bias;
  }
  void site(const std::vector<uint64_t>& pcs) {
    std::vector<uint64_t> rec(2 + pcs.size());
    cuw::live::SiteRecord head{static_cast<uint32_t>(8 * rec.size()), ++sites, static_cast<uint16_t>(pcs.size()), 0, 0};
    std::memcpy(rec.data(), &head, sizeof head);
    std::memcpy(rec.data() + 2, pcs.data(), 8 * pcs.size());
    REQUIRE(seg.append(cuw::live::Log::sites, rec.data(), 8 * rec.size()));
  }
};

json snapshot(const Daemon& d, uint32_t pid, int timeout_ms = 120000) {
  std::string why;
  const auto m = cuw::proto::request(d.socket, cuw::proto::Command::get_snapshot,
                                     json{{"pid", pid}, {"format", "json"}}.dump(), timeout_ms, &why);
  if (!m) throw std::runtime_error("get_snapshot: " + why);
  const json reply = json::parse(m->body);
  if (!reply.contains("body")) throw std::runtime_error("get_snapshot: " + m->body);
  json doc = json::parse(reply["body"].get<std::string>());
  if (reply.contains("symbols_note")) doc["symbols_note"] = reply["symbols_note"];
  return doc;
}

/// The frames of the snapshot, by module path: the functions named there ("" when none).
std::multimap<std::string, std::string> functions_by_module(const json& doc) {
  std::multimap<std::string, std::string> out;
  for (const auto& s : doc["sites"])
    for (const auto& f : s["frames"])
      out.emplace(f.value("module", ""), f.value("function", ""));
  return out;
}

bool names(const std::multimap<std::string, std::string>& m, const std::string& module, const std::string& fn) {
  const auto [a, b] = m.equal_range(module);
  for (auto it = a; it != b; ++it)
    if (it->second.find(fn) != std::string::npos) return true;
  return false;
}

bool any_named(const std::multimap<std::string, std::string>& m, const std::string& module) {
  const auto [a, b] = m.equal_range(module);
  for (auto it = a; it != b; ++it)
    if (!it->second.empty()) return true;
  return false;
}

/// The daemon's symbolization workers running now: children of `daemon` started with
/// --symbolize-worker.
std::vector<pid_t> find_workers(pid_t daemon) {
  std::vector<pid_t> found;
  DIR* d = opendir("/proc");
  if (d == nullptr) return found;
  while (dirent* e = readdir(d)) {
    const pid_t p = static_cast<pid_t>(std::atoi(e->d_name));
    if (p <= 0) continue;
    const std::string stat = slurp("/proc/" + std::to_string(p) + "/stat");
    const std::size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    int ppid = 0;
    char state = 0;
    if (std::sscanf(stat.c_str() + paren + 1, " %c %d", &state, &ppid) != 2 || ppid != daemon) continue;
    if (slurp("/proc/" + std::to_string(p) + "/cmdline").find("--symbolize-worker") != std::string::npos)
      found.push_back(p);
  }
  closedir(d);
  return found;
}

/// One of them, or -1.
pid_t find_worker(pid_t daemon) {
  const auto w = find_workers(daemon);
  return w.empty() ? -1 : w.front();
}

/// A TempDir every user may traverse (mkdtemp makes it 0700).
struct OpenTempDir : TempDir {
  OpenTempDir() { ::chmod(path.c_str(), 0755); }
};

/// A victim process whose one module is this program (DWARF, Catch2 inside), and 20,000 distinct pcs in
/// its .text (64 frames a site): seconds of libdw work.
std::string heavy_module(VictimProcess& v, const OpenTempDir& dir) {
  const std::string exe = dir / "big.bin";
  copy_file("/proc/self/exe", exe, 0644);
  const auto [lo, hi] = text_of(exe);
  const uint64_t bias = v.module(exe);
  std::vector<uint64_t> pcs;
  for (uint64_t i = 0; i < 20000; ++i) {
    pcs.push_back(bias + lo + (i * 7) % (hi - lo));
    if (pcs.size() == 64) {
      v.site(pcs);
      pcs.clear();
    }
  }
  if (!pcs.empty()) v.site(pcs);
  return exe;
}

}  // namespace

TEST_CASE("symbolize.root_only_module_of_another_user_resolves_to_nothing") {
  REQUIRE_ROOT();
  OpenTempDir dir;
  Daemon d(dir);
  VictimProcess v(d.run_dir);
  // The same program twice: in a root-only directory (the victim cannot read it), and in one
  // everybody can read (the control: the test would see a name).
  const std::string secret_dir = dir / "rootonly";
  REQUIRE(::mkdir(secret_dir.c_str(), 0700) == 0);
  const std::string secret = secret_dir + "/secret.so", open = dir / "open.so";
  copy_file("/proc/self/exe", secret, 0644);
  copy_file("/proc/self/exe", open, 0644);
  const uint64_t off = marker_offset() + 1;  // a return address just past the function's first byte
  v.site({v.module(secret) + off, v.module(open) + off});
  REQUIRE(wait_until([&] { return !d.process(static_cast<uint32_t>(v.proc.pid)).is_null(); }, 10000));

  const auto by = functions_by_module(snapshot(d, static_cast<uint32_t>(v.proc.pid)));
  CHECK(names(by, open, "cuwt_security_marker_function"));
  CHECK(by.count(secret) == 1);
  CHECK_FALSE(any_named(by, secret));
}

TEST_CASE("symbolize.symlink_fifo_and_device_named_as_modules_are_never_opened") {
  REQUIRE_ROOT();
  OpenTempDir dir;
  Daemon d(dir);
  VictimProcess v(d.run_dir);
  const std::string secret_dir = dir / "rootonly";
  REQUIRE(::mkdir(secret_dir.c_str(), 0700) == 0);
  const std::string secret = secret_dir + "/secret.so", link = dir / "link.so", fifo = dir / "fifo.so",
                    device = dir / "device.so", open = dir / "open.so";
  copy_file("/proc/self/exe", secret, 0644);
  copy_file("/proc/self/exe", open, 0644);
  REQUIRE(::symlink(secret.c_str(), link.c_str()) == 0);
  REQUIRE(::lchown(link.c_str(), v.victim.uid, v.victim.gid) == 0);
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  REQUIRE(::chown(fifo.c_str(), v.victim.uid, v.victim.gid) == 0);
  REQUIRE(::mknod(device.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0);  // /dev/null's numbers
  // Any open of the FIFO or the device, by whomever, shows as IN_OPEN.
  const int in = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  REQUIRE(in >= 0);
  REQUIRE(inotify_add_watch(in, fifo.c_str(), IN_OPEN) >= 0);
  REQUIRE(inotify_add_watch(in, device.c_str(), IN_OPEN) >= 0);
  const uint64_t off = marker_offset() + 1;
  v.site({v.module(link) + off, v.module(fifo) + off, v.module(device) + off, v.module(open) + off});
  REQUIRE(wait_until([&] { return !d.process(static_cast<uint32_t>(v.proc.pid)).is_null(); }, 10000));

  const auto by = functions_by_module(snapshot(d, static_cast<uint32_t>(v.proc.pid)));
  CHECK(names(by, open, "cuwt_security_marker_function"));  // the control
  CHECK_FALSE(any_named(by, link));
  CHECK_FALSE(any_named(by, fifo));
  CHECK_FALSE(any_named(by, device));
  alignas(inotify_event) char buf[4096];
  const ssize_t n = ::read(in, buf, sizeof buf);
  CHECK(n <= 0);  // no IN_OPEN: neither was opened
  ::close(in);
}

TEST_CASE("symbolize.hung_worker_is_killed_at_its_deadline_and_frames_come_back_unnamed") {
  REQUIRE_ROOT();
  OpenTempDir dir;
  // 8 s: long enough for a worker on a loaded machine to reach its sandbox before the deadline.
  Daemon d(dir, {"--symbolize-timeout", "8"});
  VictimProcess v(d.run_dir);
  const std::string exe = heavy_module(v, dir);
  REQUIRE(wait_until([&] { return !d.process(static_cast<uint32_t>(v.proc.pid)).is_null(); }, 10000));

  std::atomic<bool> done{false};
  json doc;
  std::string error;
  const auto t0 = steady_clock::now();
  std::thread asker([&] {
    try {
      doc = snapshot(d, static_cast<uint32_t>(v.proc.pid), 60000);
    } catch (const std::exception& e) {
      error = e.what();
    }
    done = true;
  });
  pid_t worker = -1;
  wait_until([&] { return (worker = find_worker(d.pid)) > 0 || done; }, 20000);
  // Its sandbox, once it has taken it (before it opens a module): the victim's ids, no
  // capability at all, no new privileges, a seccomp filter, its limits.
  std::string status, limits;
  const std::string proc = "/proc/" + std::to_string(worker);
  const bool sandboxed = worker > 0 && wait_until(
                                           [&] {
                                             status = slurp(proc + "/status");
                                             return status.find("Seccomp:\t2") != std::string::npos;
                                           },
                                           20000);
  limits = slurp(proc + "/limits");
  if (worker > 0) ::kill(worker, SIGSTOP);  // hangs for good from here
  const auto stopped = steady_clock::now();
  // The deadline bounds the worker's life, not the daemon's answer that follows (20,000
  // unnamed frames, which a sanitized daemon on a loaded machine takes many seconds to
  // write): the hang lasts until the worker is killed (a zombie, or reaped).
  const bool killed = worker > 0 && wait_until(
                                        [&] {
                                          const std::string stat = slurp(proc + "/stat");
                                          const std::size_t paren = stat.rfind(')');
                                          return paren == std::string::npos || stat.compare(paren, 4, ") Z ") == 0;
                                        },
                                        60000);
  const double hung = duration<double>(steady_clock::now() - stopped).count();
  asker.join();
  INFO(status << limits);
  CHECK(sandboxed);
  const std::string u = std::to_string(v.victim.uid), g = std::to_string(v.victim.gid);
  CHECK(status.find("Uid:\t" + u + "\t" + u + "\t" + u + "\t" + u) != std::string::npos);
  CHECK(status.find("Gid:\t" + g + "\t" + g + "\t" + g + "\t" + g) != std::string::npos);
  CHECK(status.find("CapEff:\t0000000000000000") != std::string::npos);
  CHECK(status.find("CapPrm:\t0000000000000000") != std::string::npos);
  CHECK(status.find("CapBnd:\t0000000000000000") != std::string::npos);
  CHECK(status.find("NoNewPrivs:\t1") != std::string::npos);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // A sanitized worker keeps its address space: its shadow memory is terabytes of it.
  CHECK(limits.find("Max address space         1073741824") != std::string::npos);
#endif
  CHECK(limits.find("Max cpu time              9") != std::string::npos);
  const double took = duration<double>(steady_clock::now() - t0).count();
  std::printf("worker %d killed %.2f s after it hung (deadline 8 s from its start); snapshot answered after %.2f s\n",
              static_cast<int>(worker), hung, took);
  REQUIRE(worker > 0);
  REQUIRE(error.empty());
  // The deadline runs from the worker's start, which a loaded machine (or a sanitizer) may
  // delay by seconds before it hangs: what it bounds is the hang.
  CHECK(killed);
  CHECK(hung < 20);
  CHECK(doc.value("symbols_note", "").find("did not finish") != std::string::npos);
  const auto by = functions_by_module(doc);
  CHECK(by.count(exe) >= 20000);
  CHECK(::kill(worker, 0) != 0);  // killed and reaped
}

TEST_CASE("serve.limits_and_state_answered_while_a_snapshot_worker_is_stopped") {
  // ... and a third snapshot request of one user, while two run, is refused at once.
  REQUIRE_ROOT();
  OpenTempDir dir;
  Daemon d(dir, {"--symbolize-timeout", "60"});
  VictimProcess v(d.run_dir);
  heavy_module(v, dir);
  const auto pid = static_cast<uint32_t>(v.proc.pid);
  REQUIRE(wait_until([&] { return !d.process(pid).is_null(); }, 10000));

  std::atomic<bool> done{false};
  std::thread asker([&] {
    try {
      (void)snapshot(d, pid, 120000);
    } catch (const std::exception&) {
    }
    done = true;
  });
  pid_t worker = -1;
  wait_until([&] { return (worker = find_worker(d.pid)) > 0 || done; }, 5000);
  if (worker > 0) ::kill(worker, SIGSTOP);
  std::printf("symbolization worker %d %s\n", static_cast<int>(worker), worker > 0 ? "stopped" : "not found");
  int answered = 0;
  for (int i = 0; i < 20; ++i) {
    const bool limit = i % 2 == 0;
    const std::string body = limit ? json{{"pid", pid}, {"bytes", (512 + i) * kMiB}}.dump() : "{}";
    std::string why;
    const auto t0 = steady_clock::now();
    const auto m = cuw::proto::request(d.socket, limit ? cuw::proto::Command::set_limit : cuw::proto::Command::get_state,
                                       body, 2000, &why);
    const double ms = duration<double, std::milli>(steady_clock::now() - t0).count();
    std::printf("%-9s %2d: %7.1f ms %s\n", limit ? "set_limit" : "get_state", i, ms, m ? "answered" : why.c_str());
    if (m && m->header.command != static_cast<uint16_t>(cuw::proto::Command::error) && ms <= 2000) ++answered;
  }
  // A second snapshot of the same user runs (its own worker); a third is refused at once.
  std::thread second([&] {
    try {
      (void)snapshot(d, pid, 120000);
    } catch (const std::exception&) {
    }
  });
  const bool two = wait_until([&] { return find_workers(d.pid).size() == 2; }, 10000);
  std::string why;
  const auto third = cuw::proto::request(d.socket, cuw::proto::Command::get_snapshot,
                                         json{{"pid", pid}, {"format", "json"}}.dump(), 2000, &why);
  for (pid_t w : find_workers(d.pid)) ::kill(w, SIGKILL);
  asker.join();
  second.join();
  CHECK(answered == 20);
  CHECK(two);
  REQUIRE(third.has_value());
  CHECK(third->body.find("busy") != std::string::npos);
  CHECK(v.ring->h->devices[0].limit.load() == (512 + 18) * kMiB);  // the last one, applied
}

TEST_CASE("security.one_users_made_up_gpus_crowd_out_no_other_users_gpu_or_history") {
  // Without NVML a GPU is whatever rings name, and all users' rings together make at most 64
  // GPUs, of which those a running process named keep their index for good. One of the
  // attacker's programs names 16 made-up GPUs, then 16 others, 4 times (64 kept, had nothing
  // bounded one user's share); then 4 more of its programs name 16 each at once, before the
  // victim's process starts on its one GPU.
  REQUIRE_ROOT();
  OpenTempDir dir;
  Daemon d(dir);
  const User attacker = test_user("cuwarden-test-attacker");
  struct Spoof {
    std::unique_ptr<Child> proc;
    std::unique_ptr<FakeRing> ring;
    void name_gpus(uint8_t n) {
      for (uint8_t dev = 0; dev < ring::kMaxDevices; ++dev) {
        ring::DeviceSlot& slot = ring->device(dev, 0x80);
        slot.uuid[2] = n;
        slot.uuid[3] = dev;
        slot.used.store(kMiB);
      }
    }
  };
  const auto spoof = [&](uint8_t n) {
    Spoof s;
    s.proc = std::make_unique<Child>(std::vector<std::string>{"setpriv", "--reuid=" + std::to_string(attacker.uid),
                                                              "--regid=" + std::to_string(attacker.gid),
                                                              "--clear-groups", "sleep", "300"});
    const pid_t pid = s.proc->pid;
    REQUIRE(wait_until([&] { return slurp("/proc/" + std::to_string(pid) + "/comm") == "sleep\n"; }));
    s.ring = std::make_unique<FakeRing>(d.run_dir, static_cast<uint32_t>(pid), s.proc->start_time(),
                                        FakeRing::Owner{attacker.uid, attacker.gid}, 64, "spoof");
    s.name_gpus(n);
    return s;
  };
  const auto shown = [&](uint8_t n) {  // whether a GPU of set n is a row
    char prefix[16];
    std::snprintf(prefix, sizeof prefix, "GPU-8081%02x", n);
    const json st = d.state();
    for (const auto& g : st["gpus"])
      if (g["uuid"].get<std::string>().rfind(prefix, 0) == 0) return true;
    return false;
  };
  std::vector<Spoof> flood;
  flood.push_back(spoof(0));
  REQUIRE(wait_until([&] { return shown(0); }));
  for (uint8_t n = 1; n < 4; ++n) {
    flood[0].name_gpus(n);
    REQUIRE(wait_until([&] { return shown(n); }));
  }
  for (uint8_t n = 4; n < 8; ++n) flood.push_back(spoof(n));
  REQUIRE(wait_until([&] { return d.state()["processes"].size() == 5; }));

  Child mine;
  const auto my_pid = static_cast<uint32_t>(mine.pid);
  FakeRing real(d.run_dir, my_pid, mine.start_time(), 64, "trainer");
  real.device(0, 0x10).used.store(kMiB);
  json p;
  REQUIRE(wait_until([&] { return !(p = d.process(my_pid)).is_null(); }));
  // The victim's process is tracked, on its GPU, which is a row with its index.
  const json st = d.state();
  CHECK(p["devices"][0]["gpu_index"].is_number());
  const auto has_my_gpu = [](const json& gpus) {
    return std::any_of(gpus.begin(), gpus.end(), [](const json& g) { return g["uuid"] == uuid_for(0x10); });
  };
  CHECK(has_my_gpu(st["gpus"]));
  CHECK(st["gpus"].size() == 16 + 1);  // the attacker's share, and the victim's GPU
  // Its GPU has a history (sampled about once a second)...
  CHECK(wait_until([&] {
    std::string why;
    const auto h = cuw::proto::request(d.socket, cuw::proto::Command::get_history, "{}", 5000, &why);
    return h && has_my_gpu(json::parse(h->body)["gpus"]);
  }));
  // ... and keeps its place once the process has exited, as a GPU a running process used.
  mine.kill_and_reap();
  REQUIRE(wait_until([&] { return d.process(my_pid)["state"] == "exited"; }));
  CHECK(has_my_gpu(d.state()["gpus"]));
  // Said once for the attacker's uid, however many publishes see it over its limit (and at
  // most once by the history, which reaches it when it sampled more than 16 of its GPUs).
  const std::string log = slurp(d.log), uid = std::to_string(attacker.uid);
  const std::string said = "uid " + uid + " reached its limit of 16 GPUs that only its rings name (no NVML)";
  CHECK(log.find(said) != std::string::npos);
  CHECK(log.find(said) == log.rfind(said));
  const std::string history_said = "history: uid " + uid + " reached its limit";
  CHECK(log.find(history_said) == log.rfind(history_said));
  CHECK(log.find("uid 0 reached") == std::string::npos);
}

TEST_CASE("caps.a_cap_raised_past_the_slurm_jobs_ceiling_is_put_back") {
  REQUIRE_ROOT();
  constexpr uint64_t kGiB = 1ULL << 30;
  auto contains = [](const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; };
  // The Slurm plugin, as root, wrote the job's cap to a file the job's user cannot change;
  // the daemon holds the job's processes to it as to a policy's max_limit (here no policy).
  OpenTempDir dir;
  const std::string run = dir / "run";
  REQUIRE(::mkdir(run.c_str(), 0755) == 0);
  REQUIRE(::mkdir((run + "/ceilings").c_str(), 0755) == 0);
  const std::string file = run + "/ceilings/slurm-4244";
  std::ofstream(file) << "CUWARDEN_LIMIT=2G\n";
  REQUIRE(::chmod(file.c_str(), 0644) == 0);
  // Another job's file, written by its user: no ceiling, said once.
  const User victim = test_user("cuwarden-test-victim");
  const std::string forged = run + "/ceilings/slurm-4245";
  std::ofstream(forged) << "CUWARDEN_LIMIT=1G\n";
  REQUIRE(::chown(forged.c_str(), victim.uid, victim.gid) == 0);
  Child a, b;
  FakeRing ra(run, a.pid, a.start_time(), 1024, "fakeproc", "slurm-4244");
  FakeRing rb(run, b.pid, b.start_time(), 1024, "fakeproc", "slurm-4245");
  ra.device(0, 0xa0).limit.store(kGiB);
  rb.device(0, 0xa1).limit.store(4 * kGiB);
  Daemon d(dir);
  REQUIRE(wait_until([&] { return !d.process(a.pid).is_null() && !d.process(b.pid).is_null(); }));
  auto limit = [](FakeRing& r) { return r.h->devices[0].limit.load(); };
  auto logged = [&](const std::string& what) { return wait_until([&] { return contains(slurp(d.log), what); }, 30000); };
  CHECK(limit(ra) == kGiB);  // under the ceiling: kept
  ra.h->devices[0].limit.store(3 * kGiB);  // a child of the job raises it in its own ring
  CHECK(wait_until([&] { return limit(ra) == 2 * kGiB; }));
  ra.h->devices[0].limit.store(cuw::ring::kNoLimit);  // or removes it
  CHECK(wait_until([&] { return limit(ra) == 2 * kGiB; }));
  CHECK(wait_until([&] { return d.process(a.pid).value("tampers", 0) == 2; }));
  CHECK(logged("past the 2.00 GiB its Slurm job allows (" + file + "); put back"));

  CHECK(logged(forged + " belongs to uid " + std::to_string(victim.uid)));
  CHECK(logged(", not root; not a ceiling, ignored"));
  CHECK(limit(rb) == 4 * kGiB);
  CHECK(d.process(b.pid).value("tampers", 0) == 0);
}
