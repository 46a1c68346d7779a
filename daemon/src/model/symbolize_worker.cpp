// cuwarden daemon model: the symbolization worker and the daemon's side of it
// (symbolize_worker.hpp).
#include "model/symbolize_worker.hpp"

#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <poll.h>
#include <pwd.h>
#include <seccomp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <vector>

#include "base/util.hpp"
#include "model/fault_guard.hpp"
#include "model/symbolizer.hpp"

extern char** environ;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CUW_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define CUW_SANITIZED 1
#endif
#endif

namespace cuw::daemon {

namespace {

constexpr std::size_t kMaxRequestBytes = 64u << 20;
constexpr std::size_t kMaxReplyBytes = 64u << 20;  ///< what the daemon reads back at most
constexpr std::size_t kMaxNameBytes = 4096;             ///< a name or file the daemon keeps, bytes
[[maybe_unused]] constexpr rlim_t kAddressSpace = rlim_t{1} << 30;  // unused under a sanitizer (below)

// ---- the worker ------------------------------------------------------------------------------

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "cuwardend symbolize worker: %s: %s\n", what, std::strerror(errno));
  std::fflush(stderr);
  _exit(70);
}

/// Take uid's rights and nothing else: its gid and groups from the user database (read
/// before anything the process wrote is touched), then the uid; every capability gone.
void drop_rights(uint32_t uid) {
  gid_t gid = 65534;  // no such user: the overflow group, no supplementary ones
  std::vector<gid_t> groups;
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr) {
    gid = pw.pw_gid;
    int n = 64;
    groups.resize(static_cast<std::size_t>(n));
    if (getgrouplist(pw.pw_name, gid, groups.data(), &n) < 0) {
      groups.resize(static_cast<std::size_t>(n));
      if (getgrouplist(pw.pw_name, gid, groups.data(), &n) < 0) n = 0;
    }
    groups.resize(static_cast<std::size_t>(n));
  }
  if (geteuid() == 0) {
    // The bounding set needs CAP_SETPCAP, which goes with the uid: dropped first.
    for (int c = 0; c <= CAP_LAST_CAP; ++c) (void)prctl(PR_CAPBSET_DROP, c, 0, 0, 0);
    if (setgroups(groups.size(), groups.data()) != 0) die("setgroups");
    if (setresgid(gid, gid, gid) != 0) die("setresgid");
    if (setresuid(uid, uid, uid) != 0) die("setresuid");
  } else if (geteuid() != uid) {
    errno = EPERM;
    die("a daemon that is not root symbolizes only its own user's processes");
  }
  uid_t r = 0, e = 0, s = 0;
  if (getresuid(&r, &e, &s) != 0 || r != uid || e != uid || s != uid) die("uid not taken");
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) die("PR_SET_NO_NEW_PRIVS");
  (void)prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  // A uid of 0 keeps its capabilities through setresuid: cleared explicitly.
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (syscall(SYS_capset, &hdr, data) != 0) die("capset");
}

void limit(int resource, rlim_t value) {
  const rlimit rl{value, value};
  if (setrlimit(resource, &rl) != 0) die("setrlimit");
}

/// Argument `n` compared by `op` (SCMP_A0..SCMP_A5 without their compound literals, which
/// clang's -Wpedantic refuses in C++): for SCMP_CMP_MASKED_EQ, `a` is the mask, `b` the value.
scmp_arg_cmp arg(unsigned n, scmp_compare op, scmp_datum_t a, scmp_datum_t b = 0) { return scmp_arg_cmp{n, op, a, b}; }

/// The calls libdw, the allocator and this loop make; anything else fails with EPERM.
void install_seccomp() {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ERRNO(EPERM));
  if (ctx == nullptr) die("seccomp_init");
  int rc = 0;
  for (int nr : {SCMP_SYS(read), SCMP_SYS(pread64), SCMP_SYS(readv), SCMP_SYS(close), SCMP_SYS(fstat),
                 SCMP_SYS(newfstatat), SCMP_SYS(statx), SCMP_SYS(lstat), SCMP_SYS(stat), SCMP_SYS(lseek),
                 SCMP_SYS(readlink), SCMP_SYS(readlinkat), SCMP_SYS(getcwd), SCMP_SYS(mmap), SCMP_SYS(munmap),
                 SCMP_SYS(mremap), SCMP_SYS(mprotect), SCMP_SYS(madvise), SCMP_SYS(brk), SCMP_SYS(futex),
                 SCMP_SYS(rt_sigreturn), SCMP_SYS(rt_sigprocmask), SCMP_SYS(sigaltstack),
                 SCMP_SYS(clock_gettime), SCMP_SYS(gettimeofday), SCMP_SYS(getpid), SCMP_SYS(gettid),
                 SCMP_SYS(getrandom), SCMP_SYS(sched_yield), SCMP_SYS(exit), SCMP_SYS(exit_group),
                 SCMP_SYS(fcntl)})
    rc |= seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0);
  // Writes to stdout (the reply) and stderr (the daemon's log) only.
  rc |= seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(write), 1, arg(0, SCMP_CMP_EQ, 1));
  rc |= seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(write), 1, arg(0, SCMP_CMP_EQ, 2));
#ifdef CUW_SANITIZED
  // A sanitizer tells readable memory from unreadable by writing it into a pipe of its own
  // (sanitizer_common's IsAccessibleMemoryRange): without these its checks report errors
  // that are not there. Test builds only.
  rc |= seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(pipe), 0);
  rc |= seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(pipe2), 0);
  rc |= seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(write), 1, arg(0, SCMP_CMP_GT, 2));
#endif
  // Opens for reading only: no O_WRONLY/O_RDWR, no O_CREAT, no O_TMPFILE.
  const scmp_datum_t bad = O_ACCMODE | O_CREAT | (O_TMPFILE & ~O_DIRECTORY);
  rc |= seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(openat), 1, arg(2, SCMP_CMP_MASKED_EQ, bad, 0));
  rc |= seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(open), 1, arg(1, SCMP_CMP_MASKED_EQ, bad, 0));
  if (rc != 0 || seccomp_load(ctx) != 0) die("seccomp");
  seccomp_release(ctx);
}

}  // namespace

// ---- the request and the reply ---------------------------------------------------------------

bool parse_symbolize_request(std::string_view text, SymbolizeRequest* out) {
  const nlohmann::json req = nlohmann::json::parse(text, nullptr, false);
  if (!req.is_object()) return false;
  // Unsigned integers only: get<uint64_t>() of a float out of range is undefined, and a uid
  // above 32 bits would wrap (to 0: root).
  auto word = [](const nlohmann::json& j, uint64_t* v) {
    if (!j.is_number_unsigned()) return false;
    *v = j.get<uint64_t>();
    return true;
  };
  SymbolizeRequest r;
  uint64_t uid = 0;
  const auto u = req.find("uid");
  if (u == req.end() || !word(*u, &uid) || uid > UINT32_MAX) return false;
  r.uid = static_cast<uint32_t>(uid);
  if (const auto c = req.find("cpu_seconds"); c != req.end() && !word(*c, &r.cpu_seconds)) return false;
  const auto mods = req.find("modules");
  const auto pcs = req.find("pcs");
  if (mods == req.end() || !mods->is_array() || pcs == req.end() || !pcs->is_array()) return false;
  for (const auto& m : *mods) {
    ModuleInfo mi;
    if (!m.is_array() || m.size() != 5 || !word(m[0], &mi.start) || !word(m[1], &mi.end) || !word(m[2], &mi.bias) ||
        !m[3].is_string() || !m[4].is_string())
      return false;
    mi.path = m[3].get<std::string>();
    mi.build_id = m[4].get<std::string>();
    r.modules.push_back(std::move(mi));
  }
  for (const auto& p : *pcs) {
    uint64_t pc = 0;
    if (!word(p, &pc)) return false;
    r.pcs.push_back(pc);
  }
  *out = std::move(r);
  return true;
}

std::string symbolize_request_text(const SymbolizeRequest& r) {
  nlohmann::json req;
  req["uid"] = r.uid;
  req["cpu_seconds"] = r.cpu_seconds;
  nlohmann::json mods = nlohmann::json::array();
  for (const ModuleInfo& m : r.modules) mods.push_back(nlohmann::json::array({m.start, m.end, m.bias, m.path, m.build_id}));
  req["modules"] = std::move(mods);
  req["pcs"] = r.pcs;
  return req.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::size_t take_symbolize_reply(std::string& pending, std::vector<std::vector<SnapFrame>>& named) {
  std::size_t answered = 0;
  std::size_t start = 0;
  for (;;) {
    const std::size_t nl = pending.find('\n', start);
    if (nl == std::string::npos) break;
    const auto j = nlohmann::json::parse(pending.begin() + static_cast<std::ptrdiff_t>(start),
                                         pending.begin() + static_cast<std::ptrdiff_t>(nl), nullptr, false);
    start = nl + 1;
    if (!j.is_array() || j.size() != 2 || !j[0].is_number_unsigned() || !j[1].is_array()) continue;
    const auto i = j[0].get<uint64_t>();
    if (i >= named.size() || !named[i].empty()) continue;
    std::vector<SnapFrame> frames;
    for (const auto& f : j[1]) {
      if (frames.size() >= Symbolizer::kMaxInlineFrames) break;
      if (!f.is_array() || f.size() != 3 || !f[0].is_string() || !f[1].is_string() || !f[2].is_number_unsigned())
        continue;
      SnapFrame s;
      s.function = f[0].get<std::string>().substr(0, kMaxNameBytes);
      s.file = f[1].get<std::string>().substr(0, kMaxNameBytes);
      s.line = static_cast<uint32_t>(std::min<uint64_t>(f[2].get<uint64_t>(), UINT32_MAX));
      frames.push_back(std::move(s));
    }
    if (!frames.empty()) {
      named[i] = std::move(frames);
      ++answered;
    }
  }
  pending.erase(0, start);
  return answered;
}

int symbolize_worker_main() {
  // The request, whole, before anything else: the daemon writes it and closes the pipe.
  std::string in;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(0, buf, sizeof buf);
    if (n > 0) {
      in.append(buf, static_cast<std::size_t>(n));
      if (in.size() > kMaxRequestBytes) return 65;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return 66;
    break;
  }
  SymbolizeRequest req;
  if (!parse_symbolize_request(in, &req)) return 65;
  const std::vector<ModuleInfo>& modules = req.modules;
  const std::vector<uint64_t>& pcs = req.pcs;
  const uint32_t uid = req.uid;
  const uint64_t cpu_s = req.cpu_seconds;
  in.clear();
  in.shrink_to_fit();

  drop_rights(uid);
#ifndef CUW_SANITIZED  // a sanitizer's shadow memory is reserved address space, terabytes of it
  limit(RLIMIT_AS, kAddressSpace);
#endif
  limit(RLIMIT_CPU, static_cast<rlim_t>(cpu_s));
  // No RLIMIT_FSIZE: the filter below lets it write to its standard output and error only,
  // and a limit of 0 would kill it (SIGXFSZ) for a diagnostic on an error stream that is a file.
  limit(RLIMIT_CORE, 0);
  limit(RLIMIT_NOFILE, 256);
  install_fault_guard();  // a file truncated under libdw costs its module, not the worker
  install_seccomp();

  Symbolizer sym;
  std::string out;
  for (std::size_t i = 0; i < pcs.size(); ++i) {
    const std::vector<SnapFrame> frames = sym.resolve(modules, pcs[i], true);
    if (frames.empty() || (frames.size() == 1 && frames[0].function.empty() && frames[0].file.empty())) continue;
    nlohmann::json f = nlohmann::json::array();
    for (const SnapFrame& x : frames) f.push_back(nlohmann::json::array({x.function, x.file, x.line}));
    out += nlohmann::json::array({i, std::move(f)}).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    out += '\n';
    // Written as it goes: what was named before the deadline reaches the daemon.
    if (out.size() >= 16384 || i + 1 == pcs.size()) {
      for (std::size_t off = 0; off < out.size();) {
        const ssize_t n = ::write(1, out.data() + off, out.size() - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return 74;
        off += static_cast<std::size_t>(n);
      }
      out.clear();
    }
  }
  for (std::size_t off = 0; off < out.size();) {
    const ssize_t n = ::write(1, out.data() + off, out.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return 74;
    off += static_cast<std::size_t>(n);
  }
  return 0;
}

// ---- the daemon's side -----------------------------------------------------------------------

namespace {

/// A frame with what the module list alone says of `pc`: module and offset, as resolve().
SnapFrame base_frame(const std::vector<ModuleInfo>& modules, uint64_t pc, const ModuleInfo** in) {
  SnapFrame f;
  f.pc = pc;
  *in = nullptr;
  for (const ModuleInfo& m : modules)
    if (pc >= m.start && pc < m.end) {
      f.module = m.path;
      if (pc >= m.bias) {
        f.offset = pc - m.bias;
        *in = &m;
      }
      break;
    }
  return f;
}

struct Exchange {
  std::vector<std::vector<SnapFrame>> named;  ///< per pc index: empty when not named
  std::size_t answered = 0;
  std::string failure;                         ///< why the worker stopped short ("" when it did not)
};

void take_lines(std::string& pending, Exchange& x) { x.answered += take_symbolize_reply(pending, x.named); }

/// Runs the worker on `request` for `pcs` pcs, until it ends or the deadline passes.
void run_worker(const SymbolizeOptions& o, const std::string& request, Exchange& x) {
  int to[2], from[2];
  if (pipe2(to, O_CLOEXEC) != 0) {
    x.failure = std::string("pipe: ") + std::strerror(errno);
    return;
  }
  if (pipe2(from, O_CLOEXEC) != 0) {
    x.failure = std::string("pipe: ") + std::strerror(errno);
    ::close(to[0]);
    ::close(to[1]);
    return;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from[1], 1);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);       // the daemon blocks its signals for signalfd
  posix_spawnattr_setsigdefault(&attr, &all);     // and ignores SIGPIPE
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::string exe = o.worker, flag = kSymbolizeWorkerFlag;
  char* argv[] = {exe.data(), flag.data(), nullptr};
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, exe.c_str(), &fa, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(to[0]);
  ::close(from[1]);
  if (rc != 0) {
    x.failure = "cannot start the symbolization worker " + o.worker + ": " + std::strerror(rc);
    ::close(to[1]);
    ::close(from[0]);
    return;
  }
  fcntl(to[1], F_SETFL, O_NONBLOCK);
  fcntl(from[0], F_SETFL, O_NONBLOCK);
  const uint64_t deadline = mono_ns() + o.deadline_ns;
  std::size_t sent = 0, received = 0;
  std::string pending;
  bool eof = false;
  int wfd = to[1];
  while (!eof) {
    const uint64_t now = mono_ns();
    if (now >= deadline) {
      x.failure = "the symbolization worker did not finish within " + std::to_string(o.deadline_ns / 1'000'000) +
                  " ms (killed)";
      break;
    }
    pollfd fds[2] = {{from[0], POLLIN, 0}, {wfd, POLLOUT, 0}};
    const int n = ::poll(fds, wfd >= 0 ? 2 : 1, static_cast<int>((deadline - now + 999'999) / 1'000'000));
    if (n < 0 && errno != EINTR) {
      x.failure = std::string("poll: ") + std::strerror(errno);
      break;
    }
    if (wfd >= 0 && (fds[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
      const ssize_t w = ::write(wfd, request.data() + sent, request.size() - sent);
      if (w > 0) sent += static_cast<std::size_t>(w);
      if ((w < 0 && errno != EAGAIN && errno != EINTR) || sent == request.size()) {
        ::close(wfd);
        wfd = -1;
      }
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[65536];
      for (;;) {
        const ssize_t r = ::read(from[0], buf, sizeof buf);
        if (r > 0) {
          received += static_cast<std::size_t>(r);
          pending.append(buf, static_cast<std::size_t>(r));
          take_lines(pending, x);
          if (received > kMaxReplyBytes) {
            x.failure = "the symbolization worker said too much (killed)";
            eof = true;
            break;
          }
          continue;
        }
        if (r == 0) eof = true;
        break;
      }
    }
  }
  if (wfd >= 0) ::close(wfd);
  ::close(from[0]);
  // Done or not, it goes now: a worker that closed its output and lingers, or one stopped by a
  // signal, must not outlive its request (SIGKILL reaches a stopped process too).
  int status = 0;
  pid_t ended = ::waitpid(pid, &status, WNOHANG);
  if (ended == 0) {
    ::kill(pid, SIGKILL);
    while ((ended = ::waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
    }
  } else if (x.failure.empty() && WIFEXITED(status) && WEXITSTATUS(status) != 0) {
    x.failure = "the symbolization worker failed (exit " + std::to_string(WEXITSTATUS(status)) + ")";
  } else if (x.failure.empty() && WIFSIGNALED(status)) {
    x.failure = "the symbolization worker died (signal " + std::to_string(WTERMSIG(status)) + ")";
  }
}

}  // namespace

void symbolize(TakenSnapshot& t, const SymbolizeOptions& o) {
  if (t.symbolized) return;
  // The distinct pcs that lie in a module with a file, in site order, up to max_pcs.
  std::unordered_map<uint64_t, std::size_t> index;
  std::vector<uint64_t> pcs;
  std::size_t over = 0;
  for (const SnapSite& site : t.snap.sites)
    for (const SnapFrame& f : site.frames) {
      if (f.python || f.pc == 0 || index.count(f.pc)) continue;
      const ModuleInfo* m = nullptr;
      (void)base_frame(t.modules, f.pc, &m);
      if (m == nullptr || m->path.empty() || m->path[0] != '/') continue;
      if (pcs.size() >= o.max_pcs) {
        ++over;
        continue;
      }
      index.emplace(f.pc, pcs.size());
      pcs.push_back(f.pc);
    }
  Exchange x;
  x.named.resize(pcs.size());
  if (!pcs.empty()) {
    SymbolizeRequest req;
    req.uid = t.uid;
    req.cpu_seconds = o.deadline_ns / 1'000'000'000 + 1;
    req.modules = t.modules;
    req.pcs = pcs;
    run_worker(o, symbolize_request_text(req), x);
  }
  for (SnapSite& site : t.snap.sites) {
    std::vector<SnapFrame> named;
    named.reserve(site.frames.size());
    for (SnapFrame& f : site.frames) {
      if (f.python || f.pc == 0) {
        named.push_back(std::move(f));
        continue;
      }
      const ModuleInfo* m = nullptr;
      SnapFrame base = base_frame(t.modules, f.pc, &m);
      const auto it = index.find(f.pc);
      if (it == index.end() || x.named[it->second].empty()) {
        named.push_back(std::move(base));
        continue;
      }
      for (const SnapFrame& r : x.named[it->second]) {
        SnapFrame g = base;
        g.function = r.function;
        g.file = r.file;
        g.line = r.line;
        named.push_back(std::move(g));
      }
    }
    site.frames = std::move(named);
  }
  std::string note;
  if (!x.failure.empty())
    note = x.failure + " (" + std::to_string(pcs.size() - x.answered) + " of " + std::to_string(pcs.size()) +
           " distinct frames left unnamed)";
  if (over != 0) {
    if (!note.empty()) note += "; ";
    note += std::to_string(over) + " distinct frames past the first " + std::to_string(o.max_pcs) + " were not named";
  }
  t.symbols_note = std::move(note);
  t.symbolized = true;
}

}  // namespace cuw::daemon
