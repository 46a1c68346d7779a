// cuwarden fuzz target: a live segment (cuw/live.hpp) as the daemon reads it: another user's
// process writes the file, so every byte is hostile. Arbitrary bytes are the file; read()
// runs on them as a mapping, and read_file() on them as a file (a memfd).
// Invariants: never read outside the buffer; the records, sites, modules and codes returned
// lie within what the buffer could hold; no hang (a layout left odd is "busy").
//
// Input: byte 0 = flags (bit 0: stamp a valid magic, version and header size, so that the
// rest is explored; bit 1: also read_file()), then the file's bytes.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuw/live.hpp"

namespace live = cuw::live;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > (1u << 20)) return 0;
  const uint8_t flags = data[0];
  std::vector<unsigned char> buf(data + 1, data + size);
  if ((flags & 1) && buf.size() >= live::kHeaderBytes) {
    auto* h = reinterpret_cast<live::LiveHeader*>(buf.data());
    h->magic = live::kMagic;
    h->abi_version = live::kAbiVersion;
    h->header_size = sizeof(live::LiveHeader);
  }
  live::Contents c;
  const live::ReadError e = live::read(buf.data(), buf.size(), &c, true, 2);
  (void)live::read_error_name(e);
  if (e == live::ReadError::none) {
    // Each record came from a slot inside the buffer: at most one per 32 bytes.
    if (c.records.size() > buf.size() / sizeof(live::LiveSlot)) std::abort();
    if (c.sites.size() > buf.size() / sizeof(live::SiteRecord)) std::abort();
    if (c.modules.size() > buf.size() / sizeof(live::ModuleRecord)) std::abort();
  }
  if (flags & 2) {
    const int fd = memfd_create("fuzz_live", MFD_CLOEXEC);
    if (fd < 0) return 0;
    if (::write(fd, buf.data(), buf.size()) == static_cast<ssize_t>(buf.size())) {
      live::Contents f;
      std::string why;
      const std::string path = "/proc/self/fd/" + std::to_string(fd);
      // O_NOFOLLOW refuses the /proc link itself: through it, only the error path runs;
      // the pread path is read() on the copy, fuzzed above.
      (void)live::read_file(path, -1, &f, &why, true, 1 << 20);
    }
    ::close(fd);
  }
  return 0;
}
