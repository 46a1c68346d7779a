// Unit tests: the live segment (cuw/live.hpp): the interposer's writer (core/live_segment,
// live tables kept in it) and the reader the daemon uses, including what a hostile file does.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/live_segment.hpp"
#include "core/live_table.hpp"
#include "cuw/live.hpp"

using cuw::core::LiveRecord;
using cuw::core::LiveSegment;
using cuw::core::LiveTable;
namespace live = cuw::live;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/cuwt-live-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
};

uint64_t file_size(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

}  // namespace

TEST_CASE("live segment: a reader copies every live record of tables kept in it", "[live_segment]") {
  TempDir dir;
  LiveSegment seg;
  REQUIRE(seg.open(dir.path, 4242, getuid(), 777, 1'700'000'000'000'000'000ULL, 16, false));
  struct stat st {};
  REQUIRE(::stat(seg.path().c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);  // call sites are the owner's business
  LiveTable t, other;
  t.attach(&seg, live::Table::device);
  other.attach(&seg, live::Table::pooled);
  std::map<uint64_t, uint64_t> want;
  for (uint64_t i = 1; i <= 5000; ++i) {  // several growths
    const uint64_t key = 0x7f0000000000 + i * 4096, bytes = i * 8;
    REQUIRE(t.insert(key, LiveRecord{bytes, 0, 1, 0x5000 + i, live::make_tag(1'700'000'001'000'000'000ULL, 9)}));
    want[key] = bytes;
  }
  for (uint64_t i = 1; i <= 5000; i += 2) {
    REQUIRE(t.take(0x7f0000000000 + i * 4096, nullptr));
    want.erase(0x7f0000000000 + i * 4096);
  }
  REQUIRE(other.insert(0x1000, LiveRecord{2 << 20, 1, 1}));
  live::Contents c;
  std::string why;
  REQUIRE(live::read_file(seg.path(), getuid(), &c, &why));
  CHECK(c.pid == 4242);
  CHECK(c.start_time == 777);
  CHECK_FALSE(c.incomplete);
  std::map<uint64_t, uint64_t> got;
  for (const live::Record& r : c.records)
    if (r.table == live::Table::device) {
      got[r.key] = r.bytes;
      CHECK(r.site == 9);
      CHECK(r.stream == 0x5000 + (r.key - 0x7f0000000000) / 4096);
      CHECK(r.time_ns >> live::kTagShift == 1'700'000'001'000'000'000ULL >> live::kTagShift);
    }
  CHECK(got == want);
  CHECK(std::count_if(c.records.begin(), c.records.end(),
                      [](const live::Record& r) { return r.table == live::Table::pooled && r.device == 1; }) == 1);
  CHECK_FALSE(live::read_file(seg.path(), getuid() + 1, &c, &why));  // another owner's file is refused
  CHECK(why.find("another user") != std::string::npos);
}

TEST_CASE("live segment: each device's pooled blocks have a table of their own, read as pooled", "[live_segment]") {
  TempDir dir;
  LiveSegment seg;
  REQUIRE(seg.open(dir.path, 4243, getuid(), 778, 1'700'000'000'000'000'000ULL, 0, false));
  // Device 0's pools use Table::pooled (what a reader before the per-device tables reads),
  // devices 1..15 a slot each past the kTables.
  CHECK(live::pooled_slot(0) == static_cast<uint32_t>(live::Table::pooled));
  CHECK(live::pooled_slot(1) == live::kTables);
  CHECK(live::pooled_slot(15) == live::kTableSlots - 1);
  std::vector<std::unique_ptr<LiveTable>> books;
  for (int d = 0; d < 16; ++d) {
    books.push_back(std::make_unique<LiveTable>());
    books.back()->attach_slot(&seg, live::pooled_slot(d));
    for (uint64_t i = 1; i <= 100; ++i)  // a growth or two each
      REQUIRE(books.back()->insert((uint64_t(d + 1) << 32) + i * 512,
                                   LiveRecord{i, static_cast<int8_t>(d), 1, 0, live::make_tag(0, 0)}));
  }
  live::Contents c;
  std::string why;
  REQUIRE(live::read_file(seg.path(), getuid(), &c, &why));
  std::map<int, int> by_device;
  for (const live::Record& r : c.records) {
    CHECK(r.table == live::Table::pooled);
    CHECK(r.key >> 32 == static_cast<uint64_t>(r.device + 1));
    ++by_device[r.device];
  }
  CHECK(by_device.size() == 16);
  for (const auto& [d, n] : by_device) CHECK(n == 100);

  // A writer of version 1, from before the per-device tables (its header_size ends at them),
  // is read as it was: its tables, nothing past its header; so is a version 1 header that
  // claims more (the descriptors past version 1's are not its).
  auto& h = seg.header();
  const uint32_t full = h.header_size;
  CHECK(h.abi_version == 2);
  for (uint32_t size : {live::kMinHeaderSize, full}) {
    h.abi_version = 1;
    h.header_size = size;
    REQUIRE(live::read_file(seg.path(), getuid(), &c, &why));
    CHECK(c.records.size() == 100);
    for (const live::Record& r : c.records) CHECK(r.device == 0);
  }
  h.abi_version = 2;
  h.header_size = live::kMinHeaderSize - 8;  // shorter than any writer's: refused
  CHECK_FALSE(live::read_file(seg.path(), getuid(), &c, &why));
  h.header_size = full;
  h.abi_version = 3;  // a version this reader does not know: refused, not misread
  CHECK_FALSE(live::read_file(seg.path(), getuid(), &c, &why));
  h.abi_version = 2;
}

TEST_CASE("live segment: regions given back are reused, so churn does not grow the file", "[live_segment]") {
  TempDir dir;
  LiveSegment seg;
  REQUIRE(seg.open(dir.path, 1, getuid(), 1, 0, 0, false));
  LiveTable t;
  t.attach(&seg, live::Table::device);
  uint64_t next = 1;
  for (int round = 0; round < 200; ++round) {  // 200,000 distinct keys, at most 1,000 live
    std::vector<uint64_t> keys;
    for (int i = 0; i < 1000; ++i) {
      keys.push_back(next++ * 256);
      REQUIRE(t.insert(keys.back(), LiveRecord{256, 0, 1}));
    }
    for (uint64_t k : keys) REQUIRE(t.take(k, nullptr));
  }
  // Without reuse each rebuild (tombstones) would take a fresh 64 KiB+ region: megabytes.
  CHECK(file_size(seg.path()) < 1024 * 1024);
  live::Contents c;
  std::string why;
  REQUIRE(live::read_file(seg.path(), -1, &c, &why));
  CHECK(c.records.empty());
}

TEST_CASE("live segment: a table that cannot grow in the file moves to the heap and counts on", "[live_segment]") {
  TempDir dir;
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // A 1 MiB file limit: growing past it would be SIGXFSZ in a real program.
    std::signal(SIGXFSZ, SIG_DFL);
    rlimit rl{1 << 20, 1 << 20};
    setrlimit(RLIMIT_FSIZE, &rl);
    LiveSegment seg;
    if (!seg.open(dir.path, 2, getuid(), 2, 0, 0, false)) _exit(10);
    LiveTable t;
    t.attach(&seg, live::Table::device);
    for (uint64_t i = 1; i <= 100000; ++i)  // 4 MiB of slots by the end
      if (!t.insert(i * 512, LiveRecord{512, 0, 1})) _exit(11);
    for (uint64_t i = 1; i <= 100000; ++i)
      if (!t.take(i * 512, nullptr)) _exit(12);
    live::Contents c;
    std::string why;
    if (!live::read_file(seg.path(), -1, &c, &why)) _exit(13);
    if (!c.incomplete) _exit(14);  // readers are told the records are no longer all there
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));  // not killed by SIGXFSZ or SIGBUS
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("live segment: the reader refuses what a hostile writer can put in the file", "[live_segment]") {
  std::vector<unsigned char> buf(64 * 1024, 0);
  auto* h = reinterpret_cast<live::LiveHeader*>(buf.data());
  live::Contents c;
  CHECK(live::read(buf.data(), 100, &c) == live::ReadError::too_small);
  CHECK(live::read(buf.data(), buf.size(), &c) == live::ReadError::bad_magic);
  h->magic = live::kMagic;
  h->abi_version = 99;
  CHECK(live::read(buf.data(), buf.size(), &c) == live::ReadError::bad_abi);
  h->abi_version = live::kAbiVersion;
  h->header_size = sizeof(live::LiveHeader);
  h->tables[0].offset = 8192;
  h->tables[0].capacity = ~0ULL / 8;  // past the mapping, and an overflow if multiplied blindly
  CHECK(live::read(buf.data(), buf.size(), &c) == live::ReadError::bad_layout);
  h->tables[0].capacity = 1;
  h->tables[0].offset = 4096 + 1;  // not page-aligned
  CHECK(live::read(buf.data(), buf.size(), &c) == live::ReadError::bad_layout);
  h->tables[0].offset = 8192;
  // A sites log whose record claims more bytes than the log holds: parsing stops there.
  h->logs[0].offset = 12288;
  h->logs[0].capacity = 4096;
  h->logs[0].used.store(64);
  live::SiteRecord rec{4000, 1, 400, 0, 0};
  std::memcpy(buf.data() + 12288, &rec, sizeof rec);
  REQUIRE(live::read(buf.data(), buf.size(), &c) == live::ReadError::none);
  CHECK(c.sites.empty());
  h->logs[0].used.store(8192);  // used past capacity
  CHECK(live::read(buf.data(), buf.size(), &c) == live::ReadError::bad_layout);
  // A layout the writer left odd (a move that never ended) is "busy", not a hang.
  h->logs[0].used.store(0);
  h->layout.store(1);
  CHECK(live::read(buf.data(), buf.size(), &c, true, 4) == live::ReadError::busy);
}

TEST_CASE("live segment: read_file copies at most its limit", "[live_segment]") {
  TempDir dir;
  LiveSegment seg;
  REQUIRE(seg.open(dir.path, 3, getuid(), 3, 0, 0, false));
  LiveTable t;
  t.attach(&seg, live::Table::device);
  for (uint64_t i = 1; i <= 40000; ++i) REQUIRE(t.insert(i * 64, LiveRecord{64, 0, 1}));  // 2 MiB of slots
  live::Contents c;
  std::string why;
  CHECK_FALSE(live::read_file(seg.path(), -1, &c, &why, true, 1 << 20));
  CHECK(why.find("hold more than 1 MiB") != std::string::npos);
  REQUIRE(live::read_file(seg.path(), -1, &c, &why, true, 64 << 20));
  CHECK(c.records.size() == 40000);
}
