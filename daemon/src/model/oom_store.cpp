// cuwarden daemon model: out-of-memory reports on disk (see oom_store.hpp).
#include "model/oom_store.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

namespace cuw::daemon {

namespace {

using nlohmann::json;

constexpr int kOomReportVersion = 1;
constexpr std::size_t kOomMaxText = 4096;
constexpr std::size_t kMaxDepth = 8;

// ---- writing ----------------------------------------------------------------------------------

json oom_frame_json(const SnapFrame& f) {
  return json::array({f.pc, f.python, f.function, f.file, f.line, f.module, f.offset});
}

json event_json(const ring::Event& e) {
  return json::array({e.time_ns, e.address, e.bytes, e.used_after, e.aux, e.tid, e.api, e.kind, e.device, e.result,
                      e.site});
}

// ---- reading: every access checked; a mismatch throws, caught once at the top ----------------

struct Bad : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const json& at(const json& j, const char* key) {
  if (!j.is_object()) throw Bad("not an object");
  const auto it = j.find(key);
  if (it == j.end()) throw Bad(std::string("no \"") + key + "\"");
  return *it;
}
const json& item(const json& j, std::size_t i) {
  if (!j.is_array() || i >= j.size()) throw Bad("short array");
  return j[i];
}
uint64_t u64(const json& j) {
  if (!j.is_number_unsigned()) throw Bad("not a number >= 0");
  return j.get<uint64_t>();
}
template <class T>
T uint_as(const json& j) {
  const uint64_t v = u64(j);
  if (v > std::numeric_limits<T>::max()) throw Bad("number out of range");
  return static_cast<T>(v);
}
int64_t i64(const json& j) {
  if (!j.is_number_integer()) throw Bad("not an integer");
  return j.get<int64_t>();
}
bool boolean(const json& j) {
  if (!j.is_boolean()) throw Bad("not a boolean");
  return j.get<bool>();
}
std::string text(const json& j) {
  if (!j.is_string()) throw Bad("not a string");
  const auto& s = j.get_ref<const std::string&>();
  return s.size() > kOomMaxText ? s.substr(0, kOomMaxText) : s;
}
const json& list(const json& j, std::size_t max) {
  if (!j.is_array()) throw Bad("not an array");
  if (j.size() > max) throw Bad("array too long");
  return j;
}
int device_of(const json& j) {
  const int64_t d = i64(j);
  if (d < -1 || d > 255) throw Bad("device out of range");
  return static_cast<int>(d);
}

SnapFrame frame_of(const json& j) {
  list(j, 16);
  SnapFrame f;
  f.pc = u64(item(j, 0));
  f.python = boolean(item(j, 1));
  f.function = text(item(j, 2));
  f.file = text(item(j, 3));
  f.line = uint_as<uint32_t>(item(j, 4));
  f.module = text(item(j, 5));
  f.offset = u64(item(j, 6));
  return f;
}

ring::Event event_of(const json& j) {
  list(j, 16);
  ring::Event e;
  e.time_ns = u64(item(j, 0));
  e.address = u64(item(j, 1));
  e.bytes = u64(item(j, 2));
  e.used_after = u64(item(j, 3));
  e.aux = u64(item(j, 4));
  e.tid = uint_as<uint32_t>(item(j, 5));
  e.api = uint_as<uint16_t>(item(j, 6));
  e.kind = uint_as<uint8_t>(item(j, 7));
  const int64_t d = i64(item(j, 8));
  if (d < -128 || d > 127) throw Bad("device out of range");
  e.device = static_cast<int8_t>(d);
  e.result = uint_as<uint32_t>(item(j, 9));
  e.site = uint_as<uint32_t>(item(j, 10));
  return e;
}

/// The deepest nesting of `s` outside strings: nlohmann's parser recurses, so a file of a
/// million '[' must be refused before it is parsed.
std::size_t depth_of(std::string_view s) {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : s) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') deepest = std::max(deepest, ++depth);
    else if ((c == ']' || c == '}') && depth > 0) --depth;
  }
  return deepest;
}

}  // namespace

std::string oom_report_file_text(const OomReport& r) {
  const Snapshot& s = r.snapshot.snap;
  json devices = json::array();
  for (const SnapDevice& d : s.devices)
    devices.push_back({{"ordinal", d.ordinal}, {"uuid", d.uuid}, {"name", d.name}, {"total", d.total},
                       {"counters", d.counters}});
  json allocations = json::array();
  for (const SnapAlloc& a : s.allocations)
    allocations.push_back(json::array({a.address, a.bytes, a.device, a.stream, a.time_ns, a.site, a.api,
                                       static_cast<unsigned>(a.kind), a.count}));
  json segments = json::array();
  for (const SnapSegment& g : s.segments) segments.push_back(json::array({g.address, g.bytes, g.device}));
  json sites = json::array();
  for (const SnapSite& site : s.sites) {
    json frames = json::array();
    for (const SnapFrame& f : site.frames) frames.push_back(oom_frame_json(f));
    sites.push_back({{"id", site.id}, {"frames", std::move(frames)}});
  }
  json trace = json::array();
  for (const SnapEvent& e : s.trace)
    trace.push_back(json::array(
        {e.time_ns, e.kind, e.api, e.device, e.address, e.bytes, e.used_after, e.stream, e.aux, e.site, e.result}));
  const json snap = {{"pid", s.pid},
                     {"comm", s.comm},
                     {"cmdline", s.cmdline},
                     {"user", s.user},
                     {"job", s.job},
                     {"pool", s.pool},
                     {"time_ns", s.time_ns},
                     {"exited", s.exited},
                     {"exact", s.exact},
                     {"events_dropped", s.events_dropped},
                     {"callsite_frames", s.callsite_frames},
                     {"devices", std::move(devices)},
                     {"allocations", std::move(allocations)},
                     {"segments", std::move(segments)},
                     {"sites", std::move(sites)},
                     {"trace", std::move(trace)}};
  const json doc = {{"cuwarden_oom_report", kOomReportVersion},
                    {"pid", r.pid},
                    {"uid", r.uid},
                    {"start_time", r.start_time},
                    {"process_name", r.process_name},
                    {"user", r.user},
                    {"seq", r.event.seq},
                    {"by_uid", r.event.by_uid},
                    {"event", event_json(r.event.e)},
                    {"live_error", r.snapshot.live_error},
                    {"symbols_note", r.snapshot.symbols_note},
                    {"snapshot", snap}};
  return doc.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

std::optional<OomReport> parse_oom_report_file(std::string_view in, std::string* why) {
  auto fail = [why](const std::string& w) {
    if (why) *why = w;
    return std::nullopt;
  };
  if (in.size() > OomStore::kMaxFileBytes) return fail("larger than " + std::to_string(OomStore::kMaxFileBytes) + " bytes");
  if (depth_of(in) > kMaxDepth) return fail("nested too deeply");
  const json doc = json::parse(in.begin(), in.end(), nullptr, false);
  if (doc.is_discarded()) return fail("not JSON");
  try {
    if (i64(at(doc, "cuwarden_oom_report")) != kOomReportVersion) return fail("not a report of this version");
    OomReport r;
    r.pid = uint_as<uint32_t>(at(doc, "pid"));
    r.uid = uint_as<uint32_t>(at(doc, "uid"));
    r.start_time = u64(at(doc, "start_time"));
    r.process_name = text(at(doc, "process_name"));
    r.user = text(at(doc, "user"));
    r.event.seq = u64(at(doc, "seq"));
    r.event.by_uid = uint_as<uint32_t>(at(doc, "by_uid"));
    r.event.e = event_of(at(doc, "event"));
    TakenSnapshot& t = r.snapshot;
    t.live_error = text(at(doc, "live_error"));
    t.symbols_note = text(at(doc, "symbols_note"));
    t.symbolized = true;
    t.uid = r.uid;
    t.start_time = r.start_time;
    const json& sj = at(doc, "snapshot");
    Snapshot& s = t.snap;
    s.pid = uint_as<uint32_t>(at(sj, "pid"));
    s.comm = text(at(sj, "comm"));
    s.cmdline = text(at(sj, "cmdline"));
    s.user = text(at(sj, "user"));
    s.job = text(at(sj, "job"));
    s.pool = text(at(sj, "pool"));
    s.time_ns = u64(at(sj, "time_ns"));
    s.exited = boolean(at(sj, "exited"));
    s.exact = boolean(at(sj, "exact"));
    s.events_dropped = u64(at(sj, "events_dropped"));
    s.callsite_frames = uint_as<uint32_t>(at(sj, "callsite_frames"));
    for (const json& d : list(at(sj, "devices"), 64)) {
      SnapDevice sd;
      sd.ordinal = device_of(at(d, "ordinal"));
      sd.uuid = text(at(d, "uuid"));
      sd.name = text(at(d, "name"));
      sd.total = u64(at(d, "total"));
      const json& c = list(at(d, "counters"), sd.counters.size());
      for (std::size_t i = 0; i < c.size(); ++i) sd.counters[i] = u64(c[i]);
      s.devices.push_back(std::move(sd));
    }
    for (const json& a : list(at(sj, "allocations"), 1u << 20)) {
      list(a, 16);
      SnapAlloc x;
      x.address = u64(item(a, 0));
      x.bytes = u64(item(a, 1));
      x.device = device_of(item(a, 2));
      x.stream = u64(item(a, 3));
      x.time_ns = u64(item(a, 4));
      x.site = uint_as<uint32_t>(item(a, 5));
      x.api = uint_as<uint16_t>(item(a, 6));
      const auto kind = uint_as<uint8_t>(item(a, 7));
      if (kind > static_cast<uint8_t>(SnapKind::host)) throw Bad("unknown allocation kind");
      x.kind = static_cast<SnapKind>(kind);
      x.count = uint_as<uint32_t>(item(a, 8));
      s.allocations.push_back(x);
    }
    for (const json& g : list(at(sj, "segments"), 1u << 20)) {
      list(g, 8);
      s.segments.push_back(SnapSegment{u64(item(g, 0)), u64(item(g, 1)), device_of(item(g, 2))});
    }
    for (const json& site : list(at(sj, "sites"), 1u << 18)) {
      SnapSite ss;
      ss.id = uint_as<uint32_t>(at(site, "id"));
      for (const json& f : list(at(site, "frames"), 4096)) ss.frames.push_back(frame_of(f));
      s.sites.push_back(std::move(ss));
    }
    std::sort(s.sites.begin(), s.sites.end(), [](const SnapSite& a, const SnapSite& b) { return a.id < b.id; });
    for (const json& e : list(at(sj, "trace"), 1u << 20)) {
      list(e, 16);
      SnapEvent x;
      x.time_ns = u64(item(e, 0));
      x.kind = uint_as<uint8_t>(item(e, 1));
      x.api = uint_as<uint16_t>(item(e, 2));
      x.device = device_of(item(e, 3));
      x.address = u64(item(e, 4));
      x.bytes = u64(item(e, 5));
      x.used_after = u64(item(e, 6));
      x.stream = u64(item(e, 7));
      x.aux = u64(item(e, 8));
      x.site = uint_as<uint32_t>(item(e, 9));
      x.result = uint_as<uint32_t>(item(e, 10));
      s.trace.push_back(x);
    }
    return r;
  } catch (const std::exception& e) {  // Bad, and nlohmann's own
    return fail(e.what());
  }
}

// ---- the directory --------------------------------------------------------------------------

namespace {

/// Opens `path` as a directory of ours, making it (0700) when missing; its mode set to 0700.
int own_dir(int at, const std::string& path, std::string* error) {
  if (::mkdirat(at, path.c_str(), 0700) != 0 && errno != EEXIST) {
    *error = "cannot create " + path + ": " + std::strerror(errno);
    return -1;
  }
  const int fd = ::openat(at, path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st{};
  if (fd < 0 || ::fstat(fd, &st) != 0) {
    *error = "cannot open " + path + " (a directory, not a link): " + std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return -1;
  }
  if (st.st_uid != ::geteuid()) {
    *error = path + " belongs to uid " + std::to_string(st.st_uid) + ", not to this daemon's";
    ::close(fd);
    return -1;
  }
  if ((st.st_mode & 07777) != 0700 && ::fchmod(fd, 0700) != 0) {
    *error = "cannot make " + path + " mode 0700: " + std::strerror(errno);
    ::close(fd);
    return -1;
  }
  return fd;
}

struct Entry {
  std::string name;
  uint64_t bytes = 0;
};

/// The report files in `fd`, oldest first (names sort by time: oom-<20-digit ns>-<pid>.json).
std::vector<Entry> list_reports(int fd) {
  std::vector<Entry> out;
  const int dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return out;
  DIR* d = ::fdopendir(dup);
  if (d == nullptr) {
    ::close(dup);
    return out;
  }
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("oom-", 0) != 0) continue;
    struct stat st{};
    if (::fstatat(fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) {
      ::unlinkat(fd, name.c_str(), 0);  // a write that a crash cut short
      continue;
    }
    if (name.size() < 5 || name.compare(name.size() - 5, 5, ".json") != 0) continue;
    out.push_back({name, static_cast<uint64_t>(st.st_size)});
  }
  ::closedir(d);
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.name < b.name; });
  return out;
}

}  // namespace

OomStore::~OomStore() {
  if (fd_ >= 0) ::close(fd_);
  if (top_fd_ >= 0) ::close(top_fd_);  // and with it the lock
}

bool OomStore::open(std::string* error) {
  top_fd_ = own_dir(AT_FDCWD, dir_, error);
  if (top_fd_ < 0) return false;
  // One daemon per state directory, as per run directory: two would write one journal.
  if (::flock(top_fd_, LOCK_EX | LOCK_NB) != 0) {
    *error = "another cuwardend uses the state directory " + dir_;
    return false;
  }
  fd_ = own_dir(top_fd_, "oom", error);
  return fd_ >= 0;
}

std::vector<std::shared_ptr<const OomReport>> OomStore::load(std::vector<std::string>* skipped) {
  std::vector<std::shared_ptr<const OomReport>> out;
  if (fd_ < 0) return out;
  std::vector<Entry> files = list_reports(fd_);
  if (files.size() > kMaxReports) files.erase(files.begin(), files.end() - kMaxReports);
  for (const Entry& e : files) {
    std::string why;
    const int fd = ::openat(fd_, e.name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    struct stat st{};
    std::string content;
    if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      why = "not a regular file";
    } else if (static_cast<uint64_t>(st.st_size) > kMaxFileBytes) {
      why = "larger than " + std::to_string(kMaxFileBytes) + " bytes";
    } else {
      content.resize(static_cast<std::size_t>(st.st_size));
      std::size_t got = 0;
      while (got < content.size()) {
        const ssize_t n = ::pread(fd, content.data() + got, content.size() - got, static_cast<off_t>(got));
        if (n <= 0) break;
        got += static_cast<std::size_t>(n);
      }
      content.resize(got);
      if (auto r = parse_oom_report_file(content, &why)) out.push_back(std::make_shared<const OomReport>(std::move(*r)));
    }
    if (fd >= 0) ::close(fd);
    if (!why.empty() && skipped) skipped->push_back(dir_ + "/oom/" + e.name + ": " + why);
  }
  return out;
}

bool OomStore::save(const OomReport& r, std::string* error) {
  if (fd_ < 0) {
    *error = "no state directory";
    return false;
  }
  char name[64];
  std::snprintf(name, sizeof name, "oom-%020llu-%u.json", static_cast<unsigned long long>(r.event.e.time_ns), r.pid);
  const std::string tmp = std::string(name) + ".tmp";
  const std::string text = oom_report_file_text(r);
  const int fd = ::openat(fd_, tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    *error = "cannot create " + dir_ + "/oom/" + tmp + ": " + std::strerror(errno);
    return false;
  }
  std::size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    off += static_cast<std::size_t>(n);
  }
  const bool written = off == text.size() && ::fsync(fd) == 0;
  const int saved_errno = errno;
  ::close(fd);
  if (!written || ::renameat(fd_, tmp.c_str(), fd_, name) != 0) {
    *error = "cannot write " + dir_ + "/oom/" + name + ": " + std::strerror(written ? errno : saved_errno);
    ::unlinkat(fd_, tmp.c_str(), 0);
    return false;
  }
  ::fsync(fd_);  // the rename itself
  std::vector<Entry> files = list_reports(fd_);
  uint64_t total = 0;
  for (const Entry& e : files) total += e.bytes;
  for (std::size_t i = 0; i < files.size() && (files.size() - i > kMaxReports || total > kMaxBytes); ++i) {
    if (files[i].name == name) break;  // never the one just written
    ::unlinkat(fd_, files[i].name.c_str(), 0);
    total -= files[i].bytes;
  }
  return true;
}

// ---- the keeper -----------------------------------------------------------------------------

OomKeeper::OomKeeper(OomStore* store, const SymbolizeOptions* symbolize, Done done)
    : store_(store), symbolize_(symbolize), done_(std::move(done)), thread_([this] { run(); }) {}

OomKeeper::~OomKeeper() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  thread_.join();
}

void OomKeeper::submit(std::shared_ptr<const OomReport> taken) {
  {
    std::lock_guard lock(mu_);
    if (stop_ || queue_.size() >= kMaxQueued) return;
    queue_.push_back(std::move(taken));
  }
  cv_.notify_one();
}

void OomKeeper::run() {
  for (;;) {
    std::shared_ptr<const OomReport> taken;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      taken = queue_.front();
      queue_.pop_front();
    }
    auto named = std::make_shared<OomReport>(*taken);
    if (symbolize_) symbolize(named->snapshot, *symbolize_);
    named->snapshot.modules.clear();  // named now: the paths' job is done
    std::string error;
    if (store_ && !store_->save(*named, &error)) spdlog::warn("out-of-memory report of pid {} not kept on disk: {}", named->pid, error);
    if (done_) done_(taken, std::move(named));
  }
}

}  // namespace cuw::daemon
