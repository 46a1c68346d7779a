// cuwarden fuzz target: the module list a symbolizer is given, and what goes between the
// daemon and its symbolization worker (model/symbolize_worker.hpp). The module list comes
// from a live segment that the process's owner writes freely; the worker's reply comes from
// a process that ran libdw over files that owner crafted; the ELF file is the owner's.
//
// Input: byte 0 = flags; bits 0-1 pick what the rest is:
//   0: a live segment's modules log (live::read's parse_modules), turned into the daemon's
//      ModuleInfo list and its request to the worker, which the worker's parser reads back:
//      the same count of modules, the same addresses, pcs and uid;
//   1: the worker's request as the worker reads it (parse_symbolize_request): what parses
//      writes back to text that parses to the same request;
//   2: the worker's reply as the daemon reads it (take_symbolize_reply), for 1 + bits 2-7
//      pcs: no index outside them, each named once, frames and strings within their bounds;
//   3: an ELF file that a process loaded, named by Symbolizer::resolve at a few pcs (Debian's
//      libdw is not instrumented: this finds its crashes and hangs, not its bad reads).
// Invariants: as above; never a crash, leak or hang.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "cuw/live.hpp"
#include "fuzz_support.hpp"
#include "model/symbolize_worker.hpp"
#include "model/symbolizer.hpp"

namespace cd = cuw::daemon;
namespace live = cuw::live;

namespace {

void modules_log(const uint8_t* data, size_t size) {
  const uint64_t cap = (size + 7) & ~uint64_t{7};
  std::vector<unsigned char> buf(live::kHeaderBytes + cap, 0);
  auto* h = reinterpret_cast<live::LiveHeader*>(buf.data());
  h->magic = live::kMagic;
  h->abi_version = live::kAbiVersion;
  h->header_size = sizeof(live::LiveHeader);
  if (cap != 0) {
    auto& l = h->logs[static_cast<uint32_t>(live::Log::modules)];
    l.offset = live::kHeaderBytes;
    l.capacity = cap;
    l.used.store(size);
    std::memcpy(buf.data() + live::kHeaderBytes, data, size);
  }
  live::Contents c;
  if (live::read(buf.data(), buf.size(), &c, true, 2) != live::ReadError::none) std::abort();
  if (c.modules.size() > size / sizeof(live::ModuleRecord)) std::abort();
  // As snapshots.cpp hands them to symbolize(), which writes the worker's request.
  cd::SymbolizeRequest req;
  req.uid = 1000;
  for (const live::Module& m : c.modules) {
    if (m.path.size() > 4096 || m.build_id.size() >= sizeof(live::ModuleRecord::build_id)) std::abort();
    req.modules.push_back(cd::ModuleInfo{m.start, m.end, m.bias, m.path, m.build_id});
    req.pcs.push_back(m.start);
  }
  cd::SymbolizeRequest back;
  if (!cd::parse_symbolize_request(cd::symbolize_request_text(req), &back)) std::abort();
  if (back.uid != req.uid || back.pcs != req.pcs || back.modules.size() != req.modules.size()) std::abort();
  for (std::size_t i = 0; i < req.modules.size(); ++i)
    if (back.modules[i].start != req.modules[i].start || back.modules[i].end != req.modules[i].end ||
        back.modules[i].bias != req.modules[i].bias)
      std::abort();
}

bool same(const cd::SymbolizeRequest& a, const cd::SymbolizeRequest& b) {
  if (a.uid != b.uid || a.cpu_seconds != b.cpu_seconds || a.pcs != b.pcs || a.modules.size() != b.modules.size())
    return false;
  for (std::size_t i = 0; i < a.modules.size(); ++i)
    if (a.modules[i].start != b.modules[i].start || a.modules[i].end != b.modules[i].end ||
        a.modules[i].bias != b.modules[i].bias)
      return false;
  return true;
}

void request(const uint8_t* data, size_t size) {
  cd::SymbolizeRequest r;
  if (!cd::parse_symbolize_request(std::string_view(reinterpret_cast<const char*>(data), size), &r)) return;
  cd::SymbolizeRequest again;
  if (!cd::parse_symbolize_request(cd::symbolize_request_text(r), &again) || !same(r, again)) std::abort();
}

void reply(uint8_t flags, const uint8_t* data, size_t size) {
  std::vector<std::vector<cd::SnapFrame>> named(1 + (flags >> 2));
  std::string pending(reinterpret_cast<const char*>(data), size);
  const std::size_t answered = cd::take_symbolize_reply(pending, named);
  std::size_t filled = 0;
  for (const auto& frames : named) {
    if (frames.size() > cd::Symbolizer::kMaxInlineFrames) std::abort();
    for (const auto& f : frames)
      if (f.function.size() > 4096 || f.file.size() > 4096) std::abort();
    filled += !frames.empty();
  }
  if (answered != filled || pending.find('\n') != std::string::npos) std::abort();
}

void elf(const uint8_t* data, size_t size) {
  static const std::string path = cuw::fuzz::scratch_dir() + "/module.so";
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();
  const bool written = size == 0 || write(fd, data, size) == static_cast<ssize_t>(size);
  close(fd);
  if (!written) std::abort();
  constexpr uint64_t kBase = 0x7f0000000000ull;
  const std::vector<cd::ModuleInfo> modules{{kBase, kBase + (1u << 20), kBase, path, ""}};
  cd::Symbolizer sym;  // a fresh one: its caches would answer from the previous input
  // Fixed pcs (the seeds' functions lie at 0x2a0..0x2b0), and the ELF header's entry point.
  uint64_t entry = 0;
  if (size >= 0x20) std::memcpy(&entry, data + 0x18, sizeof entry);
  for (const uint64_t off : std::initializer_list<uint64_t>{0x40, 0x2a1, 0x2a6, 0x2a8, 0x1000, 0x1021, entry & 0xfffff})
    (void)sym.resolve(modules, kBase + off, (off & 1) != 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > (1u << 18)) return 0;
  const uint8_t flags = data[0];
  switch (flags & 3) {
    case 0: modules_log(data + 1, size - 1); break;
    case 1: request(data + 1, size - 1); break;
    case 2: reply(flags, data + 1, size - 1); break;
    default: elf(data + 1, size - 1); break;
  }
  return 0;
}
