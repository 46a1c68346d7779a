// cuwarden fuzz targets: shared helpers (a scratch directory, a ring written like the
// interposer writes one, framed protocol messages).
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "cuw/paths.hpp"
#include "cuw/protocol.hpp"
#include "cuw/ring.hpp"

namespace cuw::fuzz {

/// A private directory for one fuzzer process, removed by nobody (tmpfs, small).
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/cuwfuzz-XXXXXX";
    if (!mkdtemp(tmpl.data())) std::abort();
    return tmpl;
  }();
  return dir;
}

/// A valid ring image of `slots` slots owned by this process, with `events` events published.
inline std::vector<unsigned char> make_ring(uint32_t slots, uint32_t events, uint32_t pid, uint64_t start_time) {
  std::vector<unsigned char> img(ring::file_size(slots) + 64);
  // 64-byte alignment for the atomics: work in an aligned window of the vector.
  auto* base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(img.data()) + 63) & ~uintptr_t{63});
  auto* h = reinterpret_cast<ring::RingHeader*>(base);
  auto* s = reinterpret_cast<ring::EventSlot*>(base + ring::kHeaderBytes);
  h->pid = pid;
  h->uid = static_cast<uint32_t>(getuid());
  h->start_time = start_time;
  h->created_ns = 1700000000000000000ull;
  std::strcpy(h->comm, "fuzzapp");
  std::strcpy(h->cmdline, "fuzzapp --train");
  std::strcpy(h->job, "job1");
  std::strcpy(h->pool, "off");
  h->state.store(static_cast<uint32_t>(ring::ProcessState::running));
  h->device_count.store(1);
  ring::init(*h, s, slots);
  ring::DeviceSlot& d = h->devices[0];
  std::memset(d.uuid, 0xab, sizeof d.uuid);
  std::strcpy(d.name, "Fuzz GPU");
  d.physical_total = 80ull << 30;
  d.limit.store(8ull << 30);
  d.present.store(1);
  for (uint32_t i = 0; i < events; ++i) {
    ring::Event e;
    e.time_ns = 1700000000000000000ull + i;
    e.address = 0x7f0000000000ull + i * 4096;
    e.bytes = (i + 1) * 1024;
    e.kind = static_cast<uint8_t>(i % 3 == 2 ? ring::EventKind::free : ring::EventKind::alloc);
    e.api = static_cast<uint16_t>(1 + i % 19);
    e.device = 0;
    e.tid = 1234;
    ring::push(*h, s, slots, e);
  }
  return std::vector<unsigned char>(base, base + ring::file_size(slots));
}

/// Header + body, as proto::send_message frames it.
inline std::string frame(uint16_t command, uint32_t seq, const std::string& body, uint16_t version = proto::kVersion,
                         uint32_t magic = proto::kMagic) {
  proto::Header h{magic, version, command, seq, static_cast<uint32_t>(body.size())};
  std::string out(reinterpret_cast<const char*>(&h), sizeof h);
  return out + body;
}

}  // namespace cuw::fuzz
