// cuwarden fuzz target: a ring file as the daemon's consumer code sees it. Arbitrary bytes
// are laid out as header + slots, then validate() and, if it passes, drain() run on them.
// Invariants: never read outside the mapping; drain() returns at most `max` events and
// moves read_pos forward by at most slot_count.
//
// Input: byte 0 = flags (bit 0: stuck_skip; bit 1: map exactly the input size instead of
// the size the header's slot_count implies), then the file's bytes (zero-padded).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "cuw/ring.hpp"

namespace ring = cuw::ring;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  ++data;
  --size;
  uint64_t mapped = size;
  if (!(flags & 2) && size >= 24) {
    uint32_t sc;
    std::memcpy(&sc, data + 20, 4);  // RingHeader::slot_count
    if (sc <= 1024) mapped = ring::file_size(sc);  // keep the buffer small; larger = as is
  }
  if (mapped > (1u << 20)) return 0;
  // The consumer maps whole pages, 64-byte aligned; so does this buffer.
  const size_t alloc = mapped ? mapped : 1;
  auto* mem = static_cast<unsigned char*>(::operator new(alloc, std::align_val_t{64}));
  std::memset(mem, 0, alloc);
  std::memcpy(mem, data, size < mapped ? size : mapped);

  const ring::Invalid inv = ring::validate(mem, mapped);
  (void)ring::invalid_reason(inv);
  if (inv == ring::Invalid::none) {
    auto* h = reinterpret_cast<ring::RingHeader*>(mem);
    auto* slots = reinterpret_cast<ring::EventSlot*>(mem + ring::kHeaderBytes);
    uint32_t sc;
    std::memcpy(&sc, &h->slot_count, 4);
    const uint64_t before = h->read_pos.load();
    ring::Event out[128];
    uint64_t lost = 0;
    for (int round = 0; round < 4; ++round) {
      const size_t n = ring::drain(*h, slots, sc, out, 128, flags & 1, &lost);
      if (n > 128) std::abort();
      for (size_t i = 0; i < n; ++i) {
        (void)ring::api_name(out[i].api);
        (void)ring::kind_name(out[i].kind);
      }
    }
    // Every step of drain() consumed one slot it could see: at most one lap per round.
    if (h->read_pos.load() - before > 4ull * 128) std::abort();
  }
  ::operator delete(mem, std::align_val_t{64});
  return 0;
}
