// cuwarden fuzz target: the daemon's whole ring-reading path on a hostile file. The input
// becomes a ring file in a scratch run directory; a Registry (daemon/src/model/registry.hpp)
// scans it (open_ring: lstat/O_NOFOLLOW, size, validate, uid and name checks), drains it
// and answers get_state / get_events from it, exactly as cuwardend does.
//
// Input: byte 0 = flags, then the file's bytes, zero-padded to the size the header's
// slot_count implies (unless flag bit 3). Bits 0/1 overwrite pid+start_time / uid with
// the values the file name and owner imply, so the fuzzer gets past those checks.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz_support.hpp"
#include "transports/handler.hpp"
#include "model/registry.hpp"

using namespace cuw;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > (1u << 20)) return 0;
  const uint8_t flags = data[0];
  std::string file(reinterpret_cast<const char*>(data + 1), size - 1);
  if (!(flags & 8) && file.size() >= 24) {
    uint32_t sc;
    std::memcpy(&sc, file.data() + 20, 4);
    if (sc <= 1024 && ring::file_size(sc) >= file.size()) file.resize(ring::file_size(sc), '\0');
  }
  static const uint32_t pid = static_cast<uint32_t>(getpid());
  static const uint64_t start = paths::process_start_time(pid);
  if (file.size() >= offsetof(ring::RingHeader, created_ns)) {
    if (flags & 1) {
      std::memcpy(file.data() + offsetof(ring::RingHeader, pid), &pid, 4);
      std::memcpy(file.data() + offsetof(ring::RingHeader, start_time), &start, 8);
    }
    if (flags & 2) {
      const uint32_t uid = static_cast<uint32_t>(getuid());
      std::memcpy(file.data() + offsetof(ring::RingHeader, uid), &uid, 4);
    }
  }
  const std::string& dir = fuzz::scratch_dir();
  const std::string name = paths::ring_file_name(pid, start);
  const std::string path = dir + "/" + name;
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return 0;
  size_t off = 0;
  while (off < file.size()) {
    const ssize_t w = write(fd, file.data() + off, file.size() - off);
    if (w <= 0) break;
    off += static_cast<size_t>(w);
  }
  close(fd);
  {
    daemon::RegistryOptions o;
    o.run_dir = dir;
    o.problem_grace_ns = 0;
    o.unlink_exited = false;
    o.exited_linger_ns = (flags & 4) ? 0 : 60'000'000'000ull;
    daemon::Registry reg(o, open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC), nullptr);
    reg.scan();
    reg.drain_all();
    reg.drain_all();
    (void)daemon::handle_request(reg, daemon::Peer{}, static_cast<uint16_t>(proto::Command::get_state), "");
    (void)daemon::handle_request(reg, daemon::Peer{}, static_cast<uint16_t>(proto::Command::get_events), "{\"after\":0,\"max\":50}");
    (void)daemon::handle_request(reg, daemon::Peer{}, static_cast<uint16_t>(proto::Command::get_events), "{\"max\":3}");
    reg.scan();  // exit detection and forgetting on the same file
  }
  unlink(path.c_str());
  return 0;
}
