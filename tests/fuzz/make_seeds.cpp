// cuwarden fuzz seeds: writes the binary seed corpora (rings, framed requests) under DIR.
// Usage: cuw_fuzz_seeds tests/fuzz/corpus    (text seeds for size/env are plain files there)
// Ring images are written without their trailing zero bytes: the targets pad them back.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuw/job.hpp"
#include "cuw/live.hpp"
#include "fuzz_support.hpp"

using namespace cuw;

namespace {

void put(const std::string& dir, const std::string& name, std::string bytes, bool trim) {
  if (trim)
    while (bytes.size() > 64 && bytes.back() == '\0') bytes.pop_back();
  mkdir(dir.c_str(), 0755);
  FILE* f = std::fopen((dir + "/" + name).c_str(), "wb");
  if (!f) return;
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

std::string bytes_of(const std::vector<unsigned char>& v) { return std::string(v.begin(), v.end()); }

std::string read_all(const std::string& path) {
  std::string out;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return out;
  char buf[65536];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  std::fclose(f);
  return out;
}

/// Job files as members leave them: this process and a dead one on two GPUs, one with a cap.
void job_seeds(const std::string& dir) {
  char tmpl[] = "/tmp/cuwseeds-XXXXXX";
  if (!mkdtemp(tmpl)) return;
  const std::string tmp = tmpl;
  const auto uid = static_cast<uint32_t>(getuid());
  std::string err;
  job::Segment* seg = job::Segment::open(tmp, uid, "seed", true, &err);
  if (!seg) {
    std::fprintf(stderr, "job seed: %s\n", err.c_str());
    return;
  }
  const std::string file = tmp + "/" + job::file_name(uid, "seed");
  put(dir, "empty", "\x00" + read_all(file), true);
  const uint8_t uuid0[16] = {1, 2, 3}, uuid1[16] = {4, 5, 6};
  const int g0 = seg->gpu_index(uuid0, 80ull << 30), g1 = seg->gpu_index(uuid1, 40ull << 30);
  const auto pid = static_cast<uint32_t>(getpid());
  const int me = seg->join(pid, paths::process_start_time(pid), 8ull << 30, 1700000000000000000ull);
  const int dead = seg->join(4242, 99, job::kNoLimit, 1700000000000000000ull);
  if (me >= 0 && dead >= 0) {
    (void)seg->charge(me, g0, 1ull << 30);
    (void)seg->charge(dead, g1, 2ull << 30);
  }
  const std::string two = read_all(file);
  put(dir, "two_members", "\x00" + two, true);
  put(dir, "two_members_policy", "\x04" + two, true);
  put(dir, "two_members_lower_only", "\x0c" + two, true);
  put(dir, "short", "\x02" + two.substr(0, 5000), false);
  delete seg;
  unlink(file.c_str());
  rmdir(tmp.c_str());
}

/// A live segment's module record, as the interposer appends it.
std::string module_record(uint64_t start, uint64_t end, uint64_t bias, const std::string& path, const char* build_id) {
  live::ModuleRecord r{};
  r.path_len = static_cast<uint32_t>(path.size());
  r.size = static_cast<uint32_t>(sizeof r + ((path.size() + 7) & ~std::size_t{7}));
  r.start = start;
  r.end = end;
  r.bias = bias;
  std::strncpy(r.build_id, build_id, sizeof r.build_id - 1);
  std::string out(reinterpret_cast<const char*>(&r), sizeof r);
  out += path;
  out.resize(r.size, '\0');
  return out;
}

void module_seeds(const std::string& dir) {
  const std::string libc = module_record(0x7f0000000000, 0x7f0000200000, 0x7f0000000000,
                                         "/usr/lib/x86_64-linux-gnu/libc.so.6", "0123456789abcdef0123456789abcdef01234567");
  const std::string app = module_record(0x555555554000, 0x555555600000, 0x555555554000, "/opt/app/bin/train", "");
  put(dir, "log_two", std::string(1, '\0') + libc + app, false);
  put(dir, "log_torn", std::string(1, '\0') + libc + app.substr(0, 40), false);
  put(dir, "request", "\x01{\"uid\":1000,\"cpu_seconds\":6,\"modules\":[[139637976727552,139637978824704,"
                      "139637976727552,\"/usr/lib/x86_64-linux-gnu/libc.so.6\",\"0123abcd\"]],"
                      "\"pcs\":[139637976731648,139637976731700]}", false);
  put(dir, "request_float", "\x01{\"uid\":1000,\"modules\":[[1e30,2,3,\"/a\",\"\"]],\"pcs\":[1]}", false);
  put(dir, "reply", "\x0a[0,[[\"main\",\"/src/main.cc\",42],[\"inlined\",\"/src/a.h\",7]]]\n"
                    "[1,[[\"f\",\"\",0]]]\n[1,[[\"again\",\"\",1]]]\n[9,[]]\nnot json\n[0,", false);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::string root = argv[1];
  const std::string r = root + "/fuzz_ring", dr = root + "/fuzz_daemon_ring";
  mkdir(root.c_str(), 0755);

  std::string ok = bytes_of(fuzz::make_ring(64, 10, 4242, 99));
  put(r, "valid_64_10events", "\x00" + ok, true);
  put(r, "valid_64_10events_skip", "\x01" + ok, true);
  put(r, "full_64", "\x01" + bytes_of(fuzz::make_ring(64, 80, 4242, 99)), true);
  std::string stuck = ok;  // a claimed slot never published: write_pos one ahead
  {
    uint64_t wp;
    std::memcpy(&wp, stuck.data() + offsetof(ring::RingHeader, write_pos), 8);
    wp += 3;
    std::memcpy(stuck.data() + offsetof(ring::RingHeader, write_pos), &wp, 8);
  }
  put(r, "stuck_slots", "\x01" + stuck, true);
  std::string bad = ok;
  bad[0] ^= 0x55;
  put(r, "bad_magic", "\x00" + bad, true);
  put(r, "header_only", "\x02" + ok.substr(0, ring::kHeaderBytes), false);

  // Daemon target: flags 3 = fix pid/start_time and uid to what the file name/owner say.
  put(dr, "valid", "\x03" + ok, true);
  put(dr, "stuck_exited", "\x07" + stuck, true);
  std::string exited = bytes_of(fuzz::make_ring(64, 5, 4242, 99));
  {
    const uint32_t st = static_cast<uint32_t>(ring::ProcessState::exited);
    std::memcpy(exited.data() + offsetof(ring::RingHeader, state), &st, 4);
  }
  put(dr, "exited", "\x03" + exited, true);
  put(dr, "foreign_uid", "\x01" + ok, true);
  put(dr, "wrong_pid", "\x02" + ok, true);

  // Socket protocol: whole requests, pipelined, bad version, oversized, cut short.
  const auto gs = static_cast<uint16_t>(proto::Command::get_state);
  const auto ge = static_cast<uint16_t>(proto::Command::get_events);
  const auto sl = static_cast<uint16_t>(proto::Command::set_limit);
  const std::vector<std::pair<std::string, std::string>> frames = {
      {"get_state", fuzz::frame(gs, 1, "")},
      {"get_state_body", fuzz::frame(gs, 2, "{}")},
      {"get_events_after", fuzz::frame(ge, 3, "{\"after\":0,\"max\":5}")},
      {"get_events_pid", fuzz::frame(ge, 4, "{\"pid\":4242}")},
      {"get_events_bad", fuzz::frame(ge, 5, "{\"after\":-1,\"max\":\"x\"}")},
      {"set_limit", fuzz::frame(sl, 6, "{\"pid\":1,\"bytes\":1024}")},
      {"unknown_cmd", fuzz::frame(77, 7, "[]")},
      {"pipelined", fuzz::frame(gs, 8, "") + fuzz::frame(ge, 9, "{}") + fuzz::frame(gs, 10, "")},
      {"bad_version", fuzz::frame(gs, 11, "", 9)},
      {"bad_magic", fuzz::frame(gs, 12, "", 1, 0x12345678)},
      {"too_long", fuzz::frame(gs, 13, "").substr(0, 12) + std::string("\xff\xff\xff\x7f", 4)},
      {"half", fuzz::frame(ge, 14, "{\"after\":0}").substr(0, 20)},
      {"deep", fuzz::frame(ge, 15, std::string(100, '[') + std::string(100, ']'))},
  };
  for (const auto& [name, bytes] : frames) {
    put(root + "/fuzz_server", name, bytes, false);
    put(root + "/fuzz_recv_message", name, bytes, false);
  }
  // handle_request direct path: 2 bytes of command, then the body.
  put(root + "/fuzz_server", "direct_get_events", std::string("\x02\x00", 2) + "{\"max\":2}", false);
  // set_limit bodies, framed and on the direct path (where the peer is root for inputs of
  // even length, an unprivileged uid for odd ones). They seed the request's shapes; the
  // scratch ring's pid is the fuzzer's own, found by mutation.
  const std::vector<std::pair<std::string, std::string>> limits = {
      {"set_limit_pid", "{\"pid\":4242,\"bytes\":1048576}"},
      {"set_limit_pid_device", "{\"pid\":4242,\"bytes\":1048576,\"device\":0}"},
      {"set_limit_remove", "{\"pid\":4242,\"bytes\":null}"},
      {"set_limit_share", "{\"pid\":4242,\"share\":0.5}"},
      {"set_limit_job", "{\"job\":\"train\",\"bytes\":1073741824}"},
      {"set_limit_job_user", "{\"job\":\"train\",\"user\":\"root\",\"bytes\":null}"},
      {"set_limit_job_uid", "{\"job\":\"train\",\"user\":0,\"bytes\":5}"},
      {"set_limit_bad", "{\"pid\":-1,\"job\":\"../x\",\"bytes\":\"8G\",\"share\":2}"},
  };
  for (const auto& [name, body] : limits) {
    put(root + "/fuzz_server", "direct_" + name, std::string("\x03\x00", 2) + body, false);
    put(root + "/fuzz_server", name, fuzz::frame(sl, 20, body), false);
  }
  job_seeds(root + "/fuzz_job_file");
  module_seeds(root + "/fuzz_modules");
  return 0;
}
