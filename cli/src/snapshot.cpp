// cuwarden CLI: `cuwarden snapshot`, `cuwarden summary` and `cuwarden oom`: a process's live
// memory (now, or as it was at a refusal) in the daemon's formats, and the out-of-memory
// reports the daemon kept.
#include <cstdint>
#include <cstdio>
#include <fmt/format.h>
#include <string>
#include <unistd.h>

#include "client.hpp"
#include "commands.hpp"
#include "cuw/size.hpp"
#include "cuw/text.hpp"
#include "json_access.hpp"

namespace cuw::cli {

using json = nlohmann::ordered_json;

namespace {

std::string unbase64(const std::string& in) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    const int v = val(c);
    if (v < 0) continue;  // '=' padding
    acc = acc << 6 | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

int write_out(const std::string& data, const std::string& path, bool binary) {
  if (path.empty() || path == "-") {
    if (binary && isatty(fileno(stdout))) {
      std::fprintf(stderr, "cuwarden: the pytorch format is a pickle: write it with -o FILE.pickle\n");
      return kExitUsage;
    }
    std::fwrite(data.data(), 1, data.size(), stdout);
    return kExitOk;
  }
  FILE* f = std::fopen(path.c_str(), binary ? "wb" : "w");
  if (!f || std::fwrite(data.data(), 1, data.size(), f) != data.size() || std::fclose(f) != 0) {
    std::fprintf(stderr, "cuwarden: cannot write %s\n", path.c_str());
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace

std::optional<uint64_t> parse_seconds(const std::string& s) {
  std::size_t i = 0;
  uint64_t n = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
    if (n > (UINT64_MAX - 9) / 10) return std::nullopt;
    n = n * 10 + static_cast<uint64_t>(s[i++] - '0');
  }
  if (i == 0) return std::nullopt;
  const std::string unit = s.substr(i);
  const uint64_t mult = unit.empty() || unit == "s" ? 1 : unit == "m" || unit == "min" ? 60 : unit == "h" ? 3600 : 0;
  if (mult == 0 || n > UINT64_MAX / mult / 1'000'000'000ULL) return std::nullopt;
  return n * mult;
}

int cmd_snapshot(const SnapshotOptions& o) {
  if (!proto::is_snapshot_format(o.format)) {
    std::fprintf(stderr, "cuwarden snapshot: bad --format '%s': use text, json, pytorch, perfetto or folded\n",
                 o.format.c_str());
    return kExitUsage;
  }
  // Said before asking, whatever the reply holds: a pickle on a terminal is noise.
  if (o.format == "pytorch" && (o.output.empty() || o.output == "-") && isatty(fileno(stdout))) {
    std::fprintf(stderr, "cuwarden: the pytorch format is a pickle: write it with -o FILE.pickle\n");
    return kExitUsage;
  }
  json req{{"pid", o.pid}, {"format", o.format}, {"top", o.top}};
  if (o.oom >= 0) req["oom"] = o.oom;
  if (o.full) req["full"] = 1;
  if (!o.by.empty()) req["by"] = o.by;
  if (!o.since.empty() && o.leaks) {
    std::fprintf(stderr, "cuwarden snapshot: --leaks and --since are two views: give one\n");
    return kExitUsage;
  }
  if (!o.since.empty()) {
    const auto secs = parse_seconds(o.since);
    if (!secs || (o.format != "text" && o.format != "json")) {
      std::fprintf(stderr, "cuwarden snapshot: --since takes a duration (30s, 10m, 1h) and writes text or json\n");
      return kExitUsage;
    }
    req["since"] = *secs;
  }
  if (o.leaks) {
    if (o.format != "text" && o.format != "json") {
      std::fprintf(stderr, "cuwarden snapshot: --leaks writes text or json\n");
      return kExitUsage;
    }
    req["leaks"] = 1;
    if (!o.leak_warmup.empty()) {
      const auto secs = parse_seconds(o.leak_warmup);
      if (!secs) {
        std::fprintf(stderr, "cuwarden snapshot: --leak-warmup takes a duration (0, 30s, 2m)\n");
        return kExitUsage;
      }
      req["leak_warmup"] = *secs;
    }
  }
  // The daemon names frames in a worker it kills at its own deadline (--symbolize-timeout,
  // 5 s by default), which a busy machine stretches: wait well past that, not the 10 s of a
  // state or limit request.
  const auto r = ask(o.socket, proto::Command::get_snapshot, req, nullptr, 60000);
  if (!r) return kExitFailure;
  const std::string body = jstr(*r, "body");
  const bool binary = jstr(*r, "encoding") == "base64";
  if (r->contains("exact") && (*r)["exact"].is_boolean() && !(*r)["exact"].get<bool>())
    std::fprintf(stderr, "cuwarden: pid %lld: the live allocations could not be read (%s): counters and events only\n",
                 static_cast<long long>(o.pid), jstr(*r, "why_not_exact").c_str());
  if (!jstr(*r, "symbols_note").empty())  // frames shown by module and offset only
    std::fprintf(stderr, "cuwarden: pid %lld: some frames are not named: %s\n", static_cast<long long>(o.pid),
                 cuw::printable(jstr(*r, "symbols_note")).c_str());
  return write_out(binary ? unbase64(body) : body, o.output, binary);
}

int cmd_oom(const OomOptions& o) {
  json req = json::object();
  if (o.pid >= 0) req["pid"] = o.pid;
  const auto r = ask(o.socket, proto::Command::get_ooms, req);
  if (!r) return kExitFailure;
  if (o.json) {
    std::puts(r->dump(1).c_str());
    return kExitOk;
  }
  const json& reps = (*r)["reports"];
  if (!reps.is_array() || reps.empty()) {
    std::puts(o.pid >= 0 ? "No out-of-memory reports for this process." : "No out-of-memory reports.");
    return kExitOk;
  }
  for (const json& rep : reps) {
    const uint64_t ns = jnum(rep, "time_ns");
    const time_t secs = static_cast<time_t>(ns / 1000000000ULL);
    char when[32] = "?";
    struct tm tm {};
    if (localtime_r(&secs, &tm)) std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
    const std::string cap = rep.contains("cap_bytes") && rep["cap_bytes"].is_number()
                                ? format_bytes(jnum(rep, "cap_bytes"))
                                : std::string("none");
    const std::string kind = jstr(rep, "kind");
    std::printf("%s  pid %llu (%s, %s)  GPU %lld: %s asked for %s; %s; cap %s, in use %s%s\n", when,
                static_cast<unsigned long long>(jnum(rep, "pid")), jstr(rep, "process_name").c_str(),
                jstr(rep, "user").c_str(),
                static_cast<long long>(rep.contains("device") && rep["device"].is_number_integer()
                                           ? rep["device"].get<long long>()
                                           : -1),
                jstr(rep, "api").c_str(), format_bytes(jnum(rep, "bytes")).c_str(),
                kind == "job_refuse"     ? "refused by the job's cap"
                : kind == "driver_error" ? "refused by the driver"
                                         : "refused by the cap",
                cap.c_str(), format_bytes(jnum(rep, "used_after")).c_str(),
                rep.contains("exact") && rep["exact"].is_boolean() && !rep["exact"].get<bool>()
                    ? " (live allocations unknown)"
                    : "");
    if (rep.contains("asked_at") && rep["asked_at"].is_string())
      std::printf("    asked at: %s\n", rep["asked_at"].get<std::string>().c_str());
    if (rep.contains("sites") && rep["sites"].is_array())
      for (const json& s : rep["sites"])
        std::printf("    %10s in %llu allocations: %s\n", format_bytes(jnum(s, "live_bytes")).c_str(),
                    static_cast<unsigned long long>(jnum(s, "live_allocations")), jstr(s, "frame").c_str());
    std::printf("    full snapshot: cuwarden snapshot %llu --oom %llu\n",
                static_cast<unsigned long long>(jnum(rep, "pid")), static_cast<unsigned long long>(jnum(rep, "index")));
  }
  return kExitOk;
}

}  // namespace cuw::cli
