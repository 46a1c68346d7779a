// cuwarden daemon: small helpers (see util.hpp).
#include "base/util.hpp"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <vector>

#include "cuw/ring.hpp"
#include "cuw/size.hpp"
#include "cuw/text.hpp"

namespace cuw::daemon {

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

uint64_t now_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t mono_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

std::string format_uuid(const uint8_t (&uuid)[16]) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += kHex[uuid[i] >> 4];
    s += kHex[uuid[i] & 15];
  }
  return s;
}

std::string field_text(const char* data, std::size_t cap) { return cuw::printable(std::string_view(data, strnlen(data, cap))); }

/// The name people know a process by: argv[0]'s base name when the kernel's 15-character
/// comm is a cut of it ("train_resnet50_" of train_resnet50_with_attention), else the comm (a
/// program that renamed itself, as a data-loader worker does, says more that way).
std::string process_name(const std::string& comm, const std::string& cmdline) {
  std::string argv0 = cmdline.substr(0, cmdline.find(' '));
  argv0 = argv0.substr(argv0.rfind('/') == std::string::npos ? 0 : argv0.rfind('/') + 1);
  return comm.size() >= 15 && argv0.size() > comm.size() && argv0.compare(0, comm.size(), comm) == 0 ? argv0 : comm;
}

std::string user_name(uint32_t uid) {
  // Called from the loop thread (new rings, jobs, limit changes) and the socket thread (the
  // events view names who changed a cap): the cache, which keeps NSS off both, is locked.
  // NSS itself is asked outside the lock.
  static std::mutex mu;
  static std::map<uint32_t, std::string> cache;
  {
    std::lock_guard<std::mutex> g(mu);
    if (auto it = cache.find(uid); it != cache.end()) return it->second;
  }
  std::string name = std::to_string(uid);
  passwd pw{};
  passwd* res = nullptr;
  std::vector<char> buf(16384);
  if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &res) == 0 && res && res->pw_name) name = res->pw_name;
  std::lock_guard<std::mutex> g(mu);
  if (cache.size() > 4096) cache.clear();
  cache.emplace(uid, name);
  return name;
}

std::optional<uint32_t> uid_of(const std::string& name) {
  passwd pw{};
  passwd* res = nullptr;
  std::vector<char> buf(16384);
  if (getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &res) == 0 && res) return res->pw_uid;
  return std::nullopt;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

std::string cap_text(uint64_t bytes) { return bytes == ring::kNoLimit ? "none" : format_bytes(bytes); }

std::optional<uint64_t> parse_u64(std::string_view s) {
  if (s.empty() || s.size() > 20 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  uint64_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<uint32_t> parse_pid(std::string_view s) {
  const auto v = parse_u64(s);
  if (!v || *v == 0 || *v > 0x7fffffffULL) return std::nullopt;
  return static_cast<uint32_t>(*v);
}

}  // namespace cuw::daemon
