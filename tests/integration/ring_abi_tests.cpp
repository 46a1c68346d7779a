// cuwarden: an upgraded daemon reads the rings of programs started under the previous
// library (ring.hpp, the ABI rule). The ring here is written byte by byte at the offsets the
// previous library (0.1.0, ABI 1) used: frozen numbers, not this build's struct, so a field
// that moves, or a counter row inserted before another, fails here.
#include <catch2/catch.hpp>

#include <cstring>

#include "daemon_test_support.hpp"

using namespace cuwt;

namespace {

/// The previous library's ring, ABI version 1: offsets in bytes.
namespace v1 {
constexpr uint64_t kMagic = 0x31474e4952575543ULL;
constexpr std::size_t kHeaderBytes = 16384, kSlotBytes = 64;
constexpr std::size_t magic = 0, abi_version = 8, header_size = 12, slot_size = 16, slot_count = 20, pid = 24,
                      uid = 28, start_time = 32, created_ns = 40, state = 48, device_count = 52, comm = 88,
                      cmdline = 120, job = 376, pool = 440, cap_scope = 456, write_pos = 768, devices = 896;
constexpr uint32_t kHeaderSize = 6016;  // sizeof(RingHeader) as it compiled it
constexpr std::size_t kDeviceBytes = 320;
// In a device slot.
constexpr std::size_t present = 0, ordinal = 4, uuid = 8, name = 24, physical_total = 120;
constexpr std::size_t counters = 128;  // used, peak, limit, reserved, live, allocs, frees, refusals,
                                       // driver errors, host, cached, pool hits, pool waits, context
// In an event slot.
constexpr std::size_t ev_seq = 0, ev_time = 8, ev_address = 16, ev_bytes = 24, ev_used_after = 32, ev_tid = 48,
                      ev_api = 52, ev_kind = 54, ev_device = 55;
}  // namespace v1

template <class T>
void put(char* base, std::size_t at, T v) {
  std::memcpy(base + at, &v, sizeof v);
}

}  // namespace

TEST_CASE("ring_abi.the_daemon_reads_a_ring_of_the_previous_library") {
  TempDir dir;
  ::mkdir((dir / "run").c_str(), 0755);
  Child child;
  const uint32_t slots = 64;
  const std::string file = dir / ("run/" + cuw::paths::ring_file_name(child.pid, child.start_time()));
  const std::size_t size = v1::kHeaderBytes + slots * v1::kSlotBytes;
  const std::string tmp = file + ".tmp";
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, static_cast<off_t>(size)) == 0);
  char* b = static_cast<char*>(mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ::close(fd);
  REQUIRE(b != MAP_FAILED);

  put<uint64_t>(b, v1::magic, v1::kMagic);
  put<uint32_t>(b, v1::abi_version, 1);
  put<uint32_t>(b, v1::header_size, v1::kHeaderSize);
  put<uint32_t>(b, v1::slot_size, v1::kSlotBytes);
  put<uint32_t>(b, v1::slot_count, slots);
  put<uint32_t>(b, v1::pid, static_cast<uint32_t>(child.pid));
  put<uint32_t>(b, v1::uid, getuid());
  put<uint64_t>(b, v1::start_time, child.start_time());
  put<uint64_t>(b, v1::created_ns, now_ns());
  put<uint32_t>(b, v1::state, 1);  // running
  put<uint32_t>(b, v1::device_count, 1);
  put<uint32_t>(b, v1::cap_scope, 1);  // process
  std::strcpy(b + v1::comm, "old_trainer");
  std::strcpy(b + v1::cmdline, "old_trainer --resume");
  std::strcpy(b + v1::job, "");
  std::strcpy(b + v1::pool, "cache");
  for (uint32_t i = 0; i < slots; ++i) put<uint64_t>(b, v1::kHeaderBytes + i * v1::kSlotBytes + v1::ev_seq, i);

  char* d = b + v1::devices;
  put<int32_t>(d, v1::ordinal, 0);
  for (int i = 0; i < 16; ++i) d[v1::uuid + i] = static_cast<char>(0xc0 + i);
  std::strcpy(d + v1::name, "NVIDIA H200");
  put<uint64_t>(d, v1::physical_total, 143771 * kMiB);
  const uint64_t values[14] = {3000 * kMiB, 3500 * kMiB, 8192 * kMiB, 3200 * kMiB, 7,  20,        13, 2, 1,
                               16 * kMiB,   200 * kMiB,  11,          4,           300 * kMiB};
  for (int i = 0; i < 14; ++i) put<uint64_t>(d, v1::counters + 8 * i, values[i]);
  put<uint32_t>(d, v1::present, 1);
  static_assert(v1::devices + v1::kDeviceBytes <= v1::kHeaderSize);

  // One published event: an allocation of 1 GiB on device 0.
  char* e = b + v1::kHeaderBytes;
  put<uint64_t>(e, v1::ev_time, now_ns());
  put<uint64_t>(e, v1::ev_address, 0x7f0000000000);
  put<uint64_t>(e, v1::ev_bytes, 1024 * kMiB);
  put<uint64_t>(e, v1::ev_used_after, 3000 * kMiB);
  put<uint32_t>(e, v1::ev_tid, 77);
  put<uint16_t>(e, v1::ev_api, 1);  // cuMemAlloc
  put<uint8_t>(e, v1::ev_kind, 1);  // alloc
  put<int8_t>(e, v1::ev_device, 0);
  put<uint64_t>(e, v1::ev_seq, 1);
  put<uint64_t>(b, v1::write_pos, 1);
  REQUIRE(::rename(tmp.c_str(), file.c_str()) == 0);

  Daemon daemon(dir);
  REQUIRE(wait_until([&] { return daemon.state()["events_seq"] == 1; }));
  const pid_t pid = child.pid;
  const json p = daemon.process(static_cast<uint32_t>(pid));
  REQUIRE(p.is_object());
  CHECK(p["process_name"] == "old_trainer");
  CHECK(p["pool"] == "cache");
  CHECK(p["cap_scope"] == "process");
  const json& dev = p["devices"][0];
  CHECK(dev["name"] == "NVIDIA H200");
  CHECK(dev["used_bytes"] == values[0]);
  CHECK(dev["peak_bytes"] == values[1]);
  CHECK(dev["limit_bytes"] == values[2]);
  CHECK(dev["reserved_bytes"] == values[3]);
  CHECK(dev["allocations"] == values[4]);
  CHECK(dev["alloc_count"] == values[5]);
  CHECK(dev["free_count"] == values[6]);
  CHECK(dev["ooms"] == values[7]);
  CHECK(dev["driver_errors"] == values[8]);
  CHECK(dev["host_bytes"] == values[9]);
  CHECK(dev["cached_bytes"] == values[10]);
  CHECK(dev["in_use_bytes"] == values[0] - values[10]);
  CHECK(dev["pool_hits"] == values[11]);
  CHECK(dev["pool_waits"] == values[12]);
  CHECK(dev["context_bytes"] == values[13]);
  const json ev = daemon.events(json::object())["events"];
  REQUIRE(ev.size() == 1);
  CHECK(ev[0]["api"] == "cuMemAlloc");
  CHECK(ev[0]["kind"] == "alloc");
  CHECK(ev[0]["bytes"] == 1024 * kMiB);
  CHECK(ev[0]["tid"] == 77);
  // The previous layout recorded no pid namespace (its word at 464 is reserved, zero): its
  // pid is the daemon's own, so the process's end is still seen, and judged.
  REQUIRE(b[464] == 0);
  child.kill_and_reap();
  CHECK(wait_until([&] { return daemon.process(static_cast<uint32_t>(pid))["state"] == "exited"; }));
  munmap(b, size);
}
