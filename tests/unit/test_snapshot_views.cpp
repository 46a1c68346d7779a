// Unit tests for the snapshot views (daemon/src/views/snapshot_views.hpp) and the pickle
// writer under them (views/pickle.cpp), on Snapshots built by hand: a passthrough process
// with Python and native call sites on two GPUs, a pooled one whose segments the blocks
// tile, one with no live records. The PyTorch pickle is read back by Python's pickle and
// checked by check_pytorch_snapshot.py for every key PyTorch's memory tools read.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cuw/counters.hpp"
#include "cuw/ring.hpp"
#include "views/pickle.hpp"
#include "views/snapshot_views.hpp"

using namespace cuw::daemon;
using cuw::ring::Api;
using cuw::ring::EventKind;
namespace counters = cuw::counters;

namespace {

constexpr uint64_t kKiB = 1ULL << 10, kMiB = 1ULL << 20, kGiB = 1ULL << 30;
constexpr uint64_t kSec = 1000000000ULL;
constexpr uint64_t T = 1'800'000'000ULL * kSec;  // the snapshots' time (2027-01-15)

/// A file that removes itself.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& bytes) {
    const char* dir = std::getenv("TMPDIR");
    std::string tmpl = std::string(dir && *dir ? dir : "/tmp") + "/cuw_snapshot_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    const int fd = mkstemp(buf.data());
    REQUIRE(fd >= 0);
    path = buf.data();
    REQUIRE(write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
    close(fd);
  }
  ~TempFile() { unlink(path.c_str()); }
};

/// Runs `cmd` through the shell; returns its exit status and puts stdout+stderr in *out.
int run(const std::string& cmd, std::string* out) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE(p);
  char buf[4096];
  std::size_t n;
  out->clear();
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  const int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// check_pytorch_snapshot.py on `pickle_bytes`, with expectations (JSON); its exit status.
int check_pickle(const std::string& pickle_bytes, const nlohmann::json& expect, std::string* out) {
  TempFile f(pickle_bytes);
  return run("python3 " + quote(CUW_SNAPSHOT_CHECKER) + " " + quote(f.path) + " " + quote(expect.dump()), out);
}

SnapFrame native(std::string fn, std::string file, uint32_t line, std::string module, uint64_t pc) {
  SnapFrame f;
  f.function = std::move(fn);
  f.file = std::move(file);
  f.line = line;
  f.module = std::move(module);
  f.pc = pc;
  f.offset = pc & 0xfffff;
  return f;
}

SnapFrame python(std::string fn, std::string file, uint32_t line) {
  SnapFrame f;
  f.python = true;
  f.function = std::move(fn);
  f.file = std::move(file);
  f.line = line;
  return f;
}

SnapDevice device(int ordinal, uint64_t used, uint64_t reserved, uint64_t peak, uint64_t limit) {
  SnapDevice d;
  d.ordinal = ordinal;
  d.uuid = "GPU-00000000-0000-0000-0000-00000000000" + std::to_string(ordinal);
  d.name = "NVIDIA H200";
  d.total = 141 * kGiB;
  auto set = [&](counters::Id id, uint64_t v) { d.counters[static_cast<std::size_t>(id)] = v; };
  set(counters::Id::used, used);
  set(counters::Id::reserved, reserved);
  set(counters::Id::peak, peak);
  set(counters::Id::limit, limit);
  set(counters::Id::in_use, used);
  return d;
}

SnapAlloc alloc(uint64_t addr, uint64_t bytes, int dev, uint32_t site, SnapKind kind, uint64_t age_ns,
                Api api = Api::cuMemAlloc, uint64_t stream = 0) {
  SnapAlloc a;
  a.address = addr;
  a.bytes = bytes;
  a.device = dev;
  a.site = site;
  a.kind = kind;
  a.time_ns = T - age_ns;
  a.api = static_cast<uint16_t>(api);
  a.stream = stream;
  return a;
}

SnapEvent event(EventKind kind, int dev, uint64_t addr, uint64_t bytes, uint64_t used_after, uint64_t t,
                uint32_t site = 0, Api api = Api::cuMemAlloc) {
  SnapEvent e;
  e.kind = static_cast<uint8_t>(kind);
  e.device = dev;
  e.address = addr;
  e.bytes = bytes;
  e.used_after = used_after;
  e.time_ns = t;
  e.site = site;
  e.api = static_cast<uint16_t>(api);
  return e;
}

// A: a PyTorch training without a pool, call sites on: two GPUs, a cuMemCreate handle, pinned
// host memory, a cap set to 8 GiB and a refusal.
constexpr uint64_t kBig = 0x7f0000000000, kSmall = 0x7f0080000000, kHandle = 0x5555aaaa0000, kHost = 0x7fff00001000,
                   kDev1 = 0x7f1000000000, kGone = 0x7f00c0000000;

Snapshot passthrough() {
  Snapshot s;
  s.pid = 4242;
  s.comm = "python3";
  s.cmdline = "python3 train.py --batch 64";
  s.user = "alice";
  s.pool = "off";
  s.time_ns = T;
  s.exact = true;
  s.callsite_frames = 16;
  const uint64_t used0 = 2 * kGiB + 512 * kKiB + 64 * kMiB;
  s.devices.push_back(device(0, used0, used0, 3 * kGiB, 8 * kGiB));
  s.devices.push_back(device(1, 1 * kGiB, 1 * kGiB, 1 * kGiB, cuw::ring::kNoLimit));
  auto& c0 = s.devices[0].counters;
  c0[static_cast<std::size_t>(counters::Id::live_allocations)] = 3;
  c0[static_cast<std::size_t>(counters::Id::alloc_count)] = 41;
  c0[static_cast<std::size_t>(counters::Id::free_count)] = 38;
  c0[static_cast<std::size_t>(counters::Id::refusals)] = 1;
  SnapSite s1;
  s1.id = 1;
  s1.frames = {native("cuw::hooks::cuMemAlloc_v2", "", 0, "/usr/lib/x86_64-linux-gnu/cuwarden/libcuwarden.so", 0x7f55000a1000),
               native("cudaMalloc", "", 0, "/opt/conda/lib/libcudart.so.12", 0x7f5500b2c000),
               native("c10::cuda::CUDACachingAllocator::malloc", "/pytorch/c10/cuda/CUDACachingAllocator.cpp", 1200,
                      "/opt/conda/lib/libc10_cuda.so", 0x7f5500c3d000),
               python("forward", "/home/alice/train.py", 42), python("<module>", "/home/alice/train.py", 88)};
  SnapSite s2;
  s2.id = 2;
  s2.frames = {native("cuw::hooks::cuMemAlloc_v2", "", 0, "/usr/lib/x86_64-linux-gnu/cuwarden/libcuwarden.so", 0x7f55000a1000),
               native("main", "/src/bench.cpp", 17, "/usr/bin/bench", 0x401234),
               native("\x1b[31mevil", "", 0, "/usr/bin/bench", 0x401300)};
  s.sites = {s1, s2};
  s.allocations = {alloc(kHandle, 64 * kMiB, 0, 0, SnapKind::handle, 30 * kSec, Api::cuMemCreate),
                   alloc(kBig, 2 * kGiB, 0, 1, SnapKind::device, 12'300'000'000ULL),
                   alloc(kSmall, 512 * kKiB, 0, 2, SnapKind::device, 1 * kSec),
                   alloc(kDev1, 1 * kGiB, 1, 1, SnapKind::device, 5 * kSec, Api::cuMemAllocAsync, 0x1234),
                   alloc(kHost, 8 * kMiB, 0, 1, SnapKind::host, 2 * kSec, Api::cuMemHostAlloc)};
  const uint64_t t0 = T - 40 * kSec;
  s.trace = {event(EventKind::alloc, 0, kHandle, 64 * kMiB, 64 * kMiB, t0, 0, Api::cuMemCreate),
             event(EventKind::alloc, 0, kBig, 2 * kGiB, 2 * kGiB + 64 * kMiB, t0 + 1 * kSec, 1),
             event(EventKind::alloc, 0, kGone, 4 * kMiB, 2 * kGiB + 68 * kMiB, t0 + 2 * kSec, 1),
             event(EventKind::host_alloc, 0, kHost, 8 * kMiB, 2 * kGiB + 68 * kMiB, t0 + 3 * kSec, 1, Api::cuMemHostAlloc),
             event(EventKind::free, 0, kGone, 4 * kMiB, 2 * kGiB + 64 * kMiB, t0 + 4 * kSec, 1, Api::cuMemFree),
             event(EventKind::alloc, 0, kSmall, 512 * kKiB, used0, t0 + 5 * kSec, 2),
             event(EventKind::alloc, 1, kDev1, 1 * kGiB, 1 * kGiB, t0 + 6 * kSec, 1, Api::cuMemAllocAsync),
             event(EventKind::limit_change, 0, 0, 8 * kGiB, used0, t0 + 7 * kSec, 0, Api::control),
             event(EventKind::refuse, 0, 0, 10 * kGiB, used0, t0 + 8 * kSec, 1)};
  s.trace[6].stream = 0x1234;
  s.trace[7].aux = cuw::ring::kNoLimit;  // the previous cap: none
  return s;
}

// B: the cache pool. Segments: a slab with two small blocks, a 20 MiB one with two large
// blocks, a free one, two adjacent 2 MiB runs a 3 MiB block crosses; besides, a managed
// allocation (its own driver memory) and a pooled block no segment names.
constexpr uint64_t kS1 = 0x7e0000000000, kS2 = 0x7e0000200000, kS3 = 0x7e0002000000, kS4 = 0x7e0010000000,
                   kS5 = 0x7e0003000000, kManaged = 0x7d0000000000, kStray = 0x7c0000000000;

Snapshot pooled() {
  Snapshot s;
  s.pid = 777;
  s.comm = "python3";
  s.cmdline = "python3 serve.py";
  s.pool = "cache";
  s.time_ns = T;
  s.exact = true;
  s.callsite_frames = 8;
  s.devices.push_back(device(0, 48 * kMiB, 48 * kMiB, 60 * kMiB, cuw::ring::kNoLimit));
  auto& c = s.devices[0].counters;
  c[static_cast<std::size_t>(counters::Id::cached)] = 20 * kMiB;
  c[static_cast<std::size_t>(counters::Id::in_use)] = 28 * kMiB;
  c[static_cast<std::size_t>(counters::Id::live_allocations)] = 7;
  c[static_cast<std::size_t>(counters::Id::alloc_count)] = 100;
  c[static_cast<std::size_t>(counters::Id::free_count)] = 93;
  SnapSite s1;
  s1.id = 5;
  s1.frames = {python("step", "/srv/serve.py", 10)};
  s.sites = {s1};
  s.segments = {{kS1, 2 * kMiB, 0}, {kS2, 20 * kMiB, 0}, {kS3, 4 * kMiB, 0}, {kS4, 2 * kMiB, 0}, {kS4 + 2 * kMiB, 2 * kMiB, 0}};
  s.allocations = {alloc(kStray, 1 * kMiB, 0, 0, SnapKind::pooled, kSec),
                   alloc(kManaged, 16 * kMiB, 0, 0, SnapKind::device, kSec, Api::cuMemAllocManaged),
                   alloc(kS1, 1000, 0, 5, SnapKind::pooled, kSec),
                   alloc(kS1 + 1024, 700 * kKiB, 0, 5, SnapKind::pooled, kSec),
                   alloc(kS2, 5 * kMiB, 0, 5, SnapKind::pooled, kSec),
                   alloc(kS2 + 8 * kMiB, 1 * kMiB + 1, 0, 5, SnapKind::pooled, kSec),
                   alloc(kS4, 3 * kMiB, 0, 0, SnapKind::pooled, kSec)};
  const uint64_t t = T - 10 * kSec;
  s.trace = {event(EventKind::segment_alloc, 0, kS1, 2 * kMiB, 2 * kMiB, t),  // its blocks predate the trace
             event(EventKind::segment_alloc, 0, kS2, 20 * kMiB, 22 * kMiB, t + 1),
             event(EventKind::alloc, 0, kManaged, 16 * kMiB, 38 * kMiB, t + 2, 0, Api::cuMemAllocManaged),
             event(EventKind::alloc, 0, kS2, 5 * kMiB, 38 * kMiB, t + 3, 5),
             event(EventKind::alloc, 0, kS2 + 8 * kMiB, 1 * kMiB + 1, 38 * kMiB, t + 4, 5),
             event(EventKind::alloc, 0, kS2 + 6 * kMiB, 1536 * kKiB, 38 * kMiB, t + 5, 5),
             event(EventKind::free, 0, kS2 + 6 * kMiB, 1536 * kKiB, 38 * kMiB, t + 6, 5, Api::cuMemFree),
             event(EventKind::segment_alloc, 0, kS5, 2 * kMiB, 40 * kMiB, t + 7),
             event(EventKind::alloc, 0, kS5, 4 * kKiB, 40 * kMiB, t + 8, 5),
             event(EventKind::free, 0, kS5, 4 * kKiB, 40 * kMiB, t + 9, 5, Api::cuMemFree),
             event(EventKind::segment_free, 0, kS5, 2 * kMiB, 38 * kMiB, t + 10),
             event(EventKind::free, 0, kManaged, 16 * kMiB, 22 * kMiB, t + 11, 0, Api::cuMemFree),
             event(EventKind::driver_error, 0, kManaged, 16 * kMiB, 60 * kMiB, t + 12, 0, Api::cuMemFree),
             event(EventKind::job_refuse, 0, 0, 30 * kMiB, 100 * kMiB, t + 13, 5),
             event(EventKind::driver_error, 0, 0, 64 * kMiB, 60 * kMiB, t + 14, 5)};
  s.trace[12].result = 1;       // the free failed: CUDA_ERROR_INVALID_VALUE
  s.trace[13].aux = 200 * kMiB;  // the job's cap
  s.trace[14].result = 2;       // CUDA_ERROR_OUT_OF_MEMORY
  return s;
}

/// Lines of `text` containing `needle`.
std::vector<std::string> lines_with(const std::string& text, const std::string& needle) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (l.find(needle) != std::string::npos) out.push_back(l);
  return out;
}

}  // namespace

// ---- pickle ---------------------------------------------------------------------------------

TEST_CASE("pickle: every value type reads back in Python, with only opcodes memory_viz knows") {
  pickle::Writer w;
  w.begin_dict();
  w.str("ints");
  w.begin_list();
  for (uint64_t v : {0ULL, 255ULL, 256ULL, 65535ULL, 65536ULL, 2147483647ULL, 2147483648ULL, 4294967296ULL,
                     9223372036854775807ULL, 18446744073709551615ULL})
    w.uinteger(v);
  for (int64_t v : {int64_t{-1}, int64_t{-128}, int64_t{-2147483648LL}, int64_t{-2147483649LL},
                    int64_t{-549755813888LL}, INT64_MIN, int64_t{7}})
    w.integer(v);
  w.end_list();
  w.str("text");
  w.str("h\xc3\xa9llo");
  w.str("long");
  w.str(std::string(300, 'x'));
  w.str("bad utf-8");
  w.str("a\xff" "b\xc0\xaf" "c\xed\xa0\x80");  // a stray byte, an overlong '/', a surrogate
  w.str("float");
  w.real(-1.5e300);
  w.str("flags");
  w.begin_list();
  w.boolean(true);
  w.boolean(false);
  w.none();
  w.end_list();
  w.str("pair");
  w.pair(0, -3);
  w.str("empty");
  w.begin_dict();
  w.end_dict();
  w.str("big");
  w.begin_list();
  for (int i = 0; i < 2500; ++i) w.integer(i);
  w.end_list();
  w.end_dict();
  TempFile f(w.finish());
  const std::string py = R"(
import pickle, pickletools, sys
data = open(sys.argv[1], 'rb').read()
d = pickle.loads(data)
want = {'ints': [0, 255, 256, 65535, 65536, 2147483647, 2147483648, 4294967296, 9223372036854775807,
                 18446744073709551615, -1, -128, -2147483648, -2147483649, -549755813888, -9223372036854775808, 7],
        'text': 'h\u00e9llo', 'long': 'x' * 300, 'bad utf-8': 'a\ufffdb\ufffd\ufffdc\ufffd\ufffd\ufffd',
        'float': -1.5e300, 'flags': [True, False, None], 'pair': (0, -3), 'empty': {}, 'big': list(range(2500))}
assert d == want, repr(d)
ops = [op.name for op, _, _ in pickletools.genops(data)]
known = {'PROTO', 'EMPTY_DICT', 'EMPTY_LIST', 'MARK', 'SETITEMS', 'APPENDS', 'BININT1', 'BININT2', 'BININT',
         'LONG1', 'SHORT_BINUNICODE', 'BINUNICODE', 'BINFLOAT', 'NONE', 'NEWTRUE', 'NEWFALSE', 'TUPLE2', 'STOP'}
assert set(ops) <= known, set(ops) - known
assert ops.count('APPENDS') >= 3 + 2, ops.count('APPENDS')  # 2500 items: three batches of at most 1000
assert data[:2] == b'\x80\x04'
print('ok')
)";
  std::string out;
  CHECK(run("python3 -c " + quote(py) + " " + quote(f.path), &out) == 0);
  INFO(out);
  CHECK(out == "ok\n");
}

TEST_CASE("pickle: misuse is refused") {
  pickle::Writer w;
  w.begin_list();
  CHECK_THROWS_AS(w.end_dict(), std::logic_error);
  CHECK_THROWS_AS(w.finish(), std::logic_error);
  pickle::Writer d;
  d.begin_dict();
  d.str("key without a value");
  CHECK_THROWS_AS(d.end_dict(), std::logic_error);
}

// ---- PyTorch format -------------------------------------------------------------------------

TEST_CASE("pytorch: passthrough snapshot, every key memory_viz reads, frames innermost first") {
  const Snapshot s = passthrough();
  const uint64_t used0 = s.devices[0].get(counters::Id::used);
  nlohmann::json expect = {
      {"segments", 4},  // dev 0: the handle, 2 GiB, 512 KiB; dev 1: 1 GiB (host memory is left out)
      {"devices", 2},
      {"actions",
       {{"segment_alloc", 5}, {"alloc", 5}, {"free_requested", 1}, {"free_completed", 1}, {"segment_free", 1}, {"oom", 1}}},
      {"frames",
       {"/home/alice/train.py:42:forward", "/home/alice/train.py:88:<module>",
        "/pytorch/c10/cuda/CUDACachingAllocator.cpp:1200:c10::cuda::CUDACachingAllocator::malloc",
        "/opt/conda/lib/libcudart.so.12:0:cudaMalloc"}},
      {"oom_device_free", {8 * kGiB - used0}},
      {"settings", {{"pool", "off"}, {"host_bytes", 8 * kMiB}, {"host_allocations", 1}, {"trace_entries_left_out", 0}}}};
  std::string out;
  CHECK(check_pickle(snapshot_pytorch(s), expect, &out) == 0);
  INFO(out);

  // PyTorch's order: innermost first, the Python frames after the native ones below them.
  TempFile f(snapshot_pytorch(s));
  const std::string py = R"(
import pickle, sys
d = pickle.load(open(sys.argv[1], 'rb'))
seg = [g for g in d['segments'] if g['address'] == 0x7f0000000000][0]
assert seg['device'] == 0 and seg['segment_type'] == 'large' and seg['total_size'] == 2 << 30, seg
names = [f['name'] for f in seg['blocks'][0]['frames']]
assert names == ['cuw::hooks::cuMemAlloc_v2', 'cudaMalloc', 'c10::cuda::CUDACachingAllocator::malloc', 'forward', '<module>'], names
small = [g for g in d['segments'] if g['address'] == 0x7f0080000000][0]
assert small['segment_type'] == 'small'
dev1 = [g for g in d['segments'] if g['device'] == 1][0]
assert dev1['stream'] == 0x1234 and dev1['blocks'][0]['state'] == 'active_allocated'
t = d['device_traces'][0]
acts = [e['action'] for e in t]
assert acts == ['segment_alloc', 'alloc', 'segment_alloc', 'alloc', 'segment_alloc', 'alloc', 'free_requested',
                'free_completed', 'segment_free', 'segment_alloc', 'alloc', 'oom'], acts
assert t[3]['time_us'] == (1800000000 - 39) * 1000000 and t[3]['size'] == 2 << 30 and t[3]['addr'] == 0x7f0000000000
assert 'addr' not in t[-1] and t[-1]['size'] == 10 << 30
print('ok')
)";
  CHECK(run("python3 -c " + quote(py) + " " + quote(f.path), &out) == 0);
  INFO(out);
  CHECK(out == "ok\n");
}

TEST_CASE("pytorch: pooled snapshot, blocks tile the pool's segments, lost events left out") {
  const Snapshot s = pooled();
  nlohmann::json expect = {
      {"segments", 6},  // S1, S2, S3, S4 (two runs joined), the managed allocation, the stray block
      {"devices", 1},
      {"actions",
       {{"segment_alloc", 4}, {"alloc", 6}, {"free_requested", 3}, {"free_completed", 3}, {"segment_free", 2}, {"oom", 2}}},
      {"frames", {"/srv/serve.py:10:step"}},
      {"oom_device_free", {200 * kMiB - 100 * kMiB - 60 * kMiB, 0}},
      {"settings", {{"pool", "cache"}, {"trace_entries_left_out", 1}, {"allocations_left_out", 0}}}};
  std::string out;
  CHECK(check_pickle(snapshot_pytorch(s), expect, &out) == 0);
  INFO(out);

  TempFile f(snapshot_pytorch(s));
  const std::string py = R"(
import pickle, sys
d = pickle.load(open(sys.argv[1], 'rb'))
segs = {g['address']: g for g in d['segments']}
def blocks(a): return [(b['address'] - a, b['size'], b['requested_size'], b['state']) for b in segs[a]['blocks']]
MiB = 1 << 20
s1 = 0x7e0000000000
assert blocks(s1) == [(0, 1024, 1000, 'active_allocated'), (1024, 768 << 10, 700 << 10, 'active_allocated'),
                      (1024 + (768 << 10), 2 * MiB - 1024 - (768 << 10), 0, 'inactive')], blocks(s1)
assert segs[s1]['segment_type'] == 'small' and segs[s1]['allocated_size'] == 1024 + (768 << 10)
s2 = 0x7e0000200000
assert blocks(s2) == [(0, 6 * MiB, 5 * MiB, 'active_allocated'), (6 * MiB, 2 * MiB, 0, 'inactive'),
                      (8 * MiB, 2 * MiB, MiB + 1, 'active_allocated'), (10 * MiB, 10 * MiB, 0, 'inactive')], blocks(s2)
assert segs[s2]['segment_type'] == 'large' and segs[s2]['requested_size'] == 6 * MiB + 1
assert blocks(0x7e0002000000) == [(0, 4 * MiB, 0, 'inactive')]
assert segs[0x7e0010000000]['total_size'] == 4 * MiB and blocks(0x7e0010000000) == [(0, 4 * MiB, 3 * MiB, 'active_allocated')]
assert blocks(0x7d0000000000) == [(0, 16 * MiB, 16 * MiB, 'active_allocated')]
assert blocks(0x7c0000000000) == [(0, MiB, MiB, 'active_allocated')]
t = d['device_traces'][0]
assert [e['action'] for e in t][:3] == ['segment_alloc', 'segment_alloc', 'alloc'], t[:3]
assert t[0]['addr'] == s2, 'the slab segment_alloc, older than its live blocks, is left out'
print('ok')
)";
  CHECK(run("python3 -c " + quote(py) + " " + quote(f.path), &out) == 0);
  INFO(out);
  CHECK(out == "ok\n");
}

TEST_CASE("pytorch: no live records and no call sites still make a valid snapshot") {
  Snapshot s = passthrough();
  s.exact = false;
  s.allocations.clear();
  s.sites.clear();
  s.callsite_frames = 0;
  for (auto& e : s.trace) e.site = 0;
  // With no segments, the segment_alloc of an allocation still live names nothing the viewer
  // could remove: left out; the freed one's segment comes back with its segment_free.
  nlohmann::json expect = {{"segments", 0},
                           {"devices", 2},
                           {"actions", {{"segment_alloc", 1}, {"segment_free", 1}, {"alloc", 5}, {"oom", 1}}},
                           {"settings", {{"trace_entries_left_out", 4}, {"live_records_exact", false}}}};
  std::string out;
  CHECK(check_pickle(snapshot_pytorch(s), expect, &out) == 0);
  INFO(out);
}

TEST_CASE("pytorch: the checker fails a snapshot whose blocks do not tile their segment") {
  pickle::Writer w;
  w.begin_dict();
  w.str("segments");
  w.begin_list();
  w.begin_dict();
  for (auto [k, v] : {std::pair<const char*, uint64_t>{"device", 0}, {"address", 4096}, {"total_size", 8192},
                      {"allocated_size", 4096}, {"active_size", 4096}, {"requested_size", 4096}, {"stream", 0}}) {
    w.str(k);
    w.uinteger(v);
  }
  w.str("segment_type");
  w.str("small");
  w.str("blocks");
  w.begin_list();
  w.begin_dict();
  for (auto [k, v] : {std::pair<const char*, uint64_t>{"address", 4096}, {"size", 4096}, {"requested_size", 4096}}) {
    w.str(k);
    w.uinteger(v);
  }
  w.str("state");
  w.str("active_allocated");
  w.str("frames");
  w.begin_list();
  w.end_list();
  w.end_dict();
  w.end_list();  // 4096 of 8192 bytes tiled
  w.end_dict();
  w.end_list();
  w.str("device_traces");
  w.begin_list();
  w.begin_list();
  w.end_list();
  w.end_list();
  w.end_dict();
  std::string out;
  CHECK(check_pickle(w.finish(), nlohmann::json::object(), &out) == 1);
  CHECK(out.find("blocks add up to 4096, total_size is 8192") != std::string::npos);
  CHECK(run("python3 " + quote(CUW_SNAPSHOT_CHECKER) + " --self-test", &out) == 0);
  INFO(out);
}

// ---- text -----------------------------------------------------------------------------------

TEST_CASE("text: header, devices, call sites with the Python frames first, largest allocations") {
  const std::string t = snapshot_text(passthrough(), {});
  CHECK(t.find("cuwarden snapshot of pid 4242 (python3), user alice") != std::string::npos);
  CHECK(t.find("pool off; live records exact; 0 events dropped; call sites on (16 native frames)") != std::string::npos);
  CHECK(t.find("taken 2027-01-15 08:00:00 UTC") != std::string::npos);
  // Devices: used, reserved, peak, cap, cached.
  REQUIRE(lines_with(t, "NVIDIA H200").size() == 2);
  CHECK(lines_with(t, "NVIDIA H200")[0].find("8.00 GiB") != std::string::npos);
  CHECK(lines_with(t, "NVIDIA H200")[1].find("none") != std::string::npos);
  // Site 1 holds 3 GiB on two GPUs (host memory is not counted): its printed form leads with
  // the innermost user frame (the Python one), the frames inner to it folded into one line.
  const auto site1 = t.find("3.00 GiB       2 allocations  site 1\n"
                            "      forward (/home/alice/train.py:42)\n"
                            "      (3 frames in libc10_cuda.so, libcudart.so.12, libcuwarden.so)\n");
  CHECK(site1 != std::string::npos);
  // PyTorch's caching allocator is in a stack: a site is where a segment was made.
  CHECK(t.find("The process runs PyTorch's caching allocator: a call site here is where a segment it sub-allocates "
               "was made, not where the tensors now in it were (torch.cuda.memory._snapshot() shows its tensors).") !=
        std::string::npos);
  // Default views do not list the folded frames, nor the callers outward of the head.
  CHECK(t.find("cudaMalloc (") == std::string::npos);
  CHECK(t.find("<module> (") == std::string::npos);
  CHECK(t.find("      main (/src/bench.cpp:17)\n      (1 frame in libcuwarden.so)\n") != std::string::npos);
  // The handle has no call site; the escape sequence never reaches the terminal.
  CHECK(t.find("64.00 MiB       1 allocation   (no call site captured)") != std::string::npos);
  CHECK(t.find('\x1b') == std::string::npos);
  // --full lists every frame with its class.
  TextOptions full;
  full.full = true;
  const std::string tf = snapshot_text(passthrough(), full);
  CHECK(tf.find("        cudaMalloc (libcudart.so.12+0x2c000)  [cuda]\n") != std::string::npos);
  CHECK(tf.find("        c10::cuda::CUDACachingAllocator::malloc (/pytorch/c10/cuda/CUDACachingAllocator.cpp:1200)  "
                "[framework]\n") != std::string::npos);
  CHECK(tf.find("        <module> (/home/alice/train.py:88)  [user]\n") != std::string::npos);
  CHECK(tf.find("        ?[31mevil (bench+0x1300)  [user]") != std::string::npos);
  CHECK(tf.find('\x1b') == std::string::npos);
  // Largest first: address, size, GPU, stream, age, site.
  const auto big = lines_with(t, "0x7f0000000000");
  REQUIRE(big.size() == 1);
  CHECK(big[0].find("2.00 GiB") != std::string::npos);
  CHECK(big[0].find("12.3 s") != std::string::npos);
  CHECK(big[0].find("1: forward (/home/alice/train.py:42)") != std::string::npos);
  CHECK(t.find("0x7f0000000000") < t.find("0x7f1000000000"));
  CHECK(lines_with(t, "0x7f1000000000")[0].find("0x1234") != std::string::npos);
  CHECK(big[0].find(" default ") != std::string::npos);  // stream 0: the legacy default stream
  CHECK(lines_with(t, "0x5555aaaa0000")[0].find("(handle)") != std::string::npos);
  CHECK(t.find("Pinned host memory (not device memory, never capped): 1 allocation, 8.00 MiB") != std::string::npos);

  TextOptions top1;
  top1.top = 1;
  const std::string t1 = snapshot_text(passthrough(), top1);
  CHECK(t1.find("Live device memory by call site (top 1 of 3)") != std::string::npos);
  CHECK(t1.find("<module> (") == std::string::npos);
  CHECK(t1.find("Largest live allocations (top 1 of 4)") != std::string::npos);
}

TEST_CASE("text: counters only when the live records cannot be read, call sites off") {
  Snapshot s = passthrough();
  s.exact = false;
  s.callsite_frames = 0;
  s.events_dropped = 12;
  s.allocations.clear();
  const std::string t = snapshot_text(s, {});
  CHECK(t.find("live records not available (counters only); 12 events dropped") != std::string::npos);
  CHECK(t.find("call sites off") != std::string::npos);
  CHECK(t.find("The live allocations could not be read") != std::string::npos);
  CHECK(t.find("Largest live allocations") == std::string::npos);
}

// ---- JSON -----------------------------------------------------------------------------------

TEST_CASE("json: every part of the snapshot under its documented key") {
  const nlohmann::ordered_json j = snapshot_json(passthrough());
  for (const char* k : {"pid", "process_name", "comm", "cmdline", "user", "job", "pool", "time_ns", "exited", "exact",
                        "events_dropped", "callsite_frames", "devices", "host", "allocations", "segments", "sites", "trace"})
    CHECK(j.contains(k));
  CHECK(j["pid"] == 4242);
  REQUIRE(j["devices"].size() == 2);
  CHECK(j["devices"][0]["used_bytes"] == 2 * kGiB + 512 * kKiB + 64 * kMiB);
  CHECK(j["devices"][0]["limit_bytes"] == 8 * kGiB);
  CHECK(j["devices"][1]["limit_bytes"].is_null());
  CHECK(j["devices"][0]["live_bytes"] == 2 * kGiB + 512 * kKiB + 64 * kMiB);
  CHECK(j["devices"][0]["live_allocations"] == 3);
  CHECK(j["host"]["bytes"] == 8 * kMiB);
  REQUIRE(j["allocations"].size() == 5);
  CHECK(j["allocations"][0]["kind"] == "handle");
  CHECK(j["allocations"][0]["api"] == "cuMemCreate");
  CHECK(j["allocations"][1]["age_ns"] == 12'300'000'000ULL);
  REQUIRE(j["sites"].size() == 2);
  CHECK(j["sites"][0]["live_bytes"] == 3 * kGiB);
  CHECK(j["sites"][0]["frames"][3]["python"] == true);
  CHECK(j["sites"][0]["frames"][3]["file"] == "/home/alice/train.py");
  // Each frame carries its class; each site its printed form and the head's index.
  CHECK(j["sites"][0]["frames"][0]["class"] == "cuwarden");
  CHECK(j["sites"][0]["frames"][1]["class"] == "cuda");
  CHECK(j["sites"][0]["frames"][2]["class"] == "framework");
  CHECK(j["sites"][0]["frames"][3]["class"] == "user");
  CHECK(j["sites"][0]["label"] == "forward (/home/alice/train.py:42)");
  CHECK(j["sites"][0]["label_folded"] == "3 frames in libc10_cuda.so, libcudart.so.12, libcuwarden.so");
  CHECK(j["sites"][0]["head_frame"] == 3);
  CHECK(j["sites"][0]["label_head"] == "forward (/home/alice/train.py:42)");
  CHECK(j["sites"][0]["frames"][3]["text"] == "forward (/home/alice/train.py:42)");
  CHECK(j["sites"][0]["frames"][1]["text"].get<std::string>().rfind("cudaMalloc (libcudart.so.12+0x", 0) == 0);
  CHECK(j["sites"][0]["label_via"].empty());
  // Calling order: the native frames up to the interpreter's, then the Python ones.
  CHECK(j["sites"][0]["calling_order"][3] == 3);
  CHECK(j["segments_note"].get<std::string>().find("PyTorch's caching allocator") != std::string::npos);
  CHECK(j["trace"][7]["kind"] == "limit_change");
  CHECK(j["trace"][7]["aux"] == cuw::ring::kNoLimit);
  CHECK_NOTHROW(j.dump());  // valid UTF-8 throughout
}

// ---- Perfetto -------------------------------------------------------------------------------

TEST_CASE("perfetto: the trace-event fields Perfetto's JSON importer reads") {
  const nlohmann::json doc = nlohmann::json::parse(snapshot_perfetto(passthrough()));
  CHECK(doc["displayTimeUnit"] == "ms");
  REQUIRE(doc["traceEvents"].is_array());
  std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> series;
  int instants = 0, meta = 0;
  for (const auto& e : doc["traceEvents"]) {
    REQUIRE(e["ph"].is_string());
    REQUIRE(e["name"].is_string());
    REQUIRE(e["pid"] == 4242);
    REQUIRE(e["ts"].is_number_unsigned());
    const std::string ph = e["ph"];
    if (ph == "C") {
      REQUIRE(e["args"].size() == 1);  // one arg: one track ("<name> bytes")
      REQUIRE(e["args"]["bytes"].is_number());
      series[e["name"]].emplace_back(e["ts"].get<uint64_t>(), e["args"]["bytes"].get<uint64_t>());
    } else if (ph == "i") {
      CHECK(e["s"] == "p");
      ++instants;
    } else if (ph == "M") {
      CHECK(e["args"]["name"].is_string());
      ++meta;
    } else {
      FAIL("unexpected phase " << ph);
    }
  }
  CHECK(meta == 2);
  CHECK(instants == 2);  // the cap change and the refusal
  const uint64_t t0 = (T - 40 * kSec) / 1000;
  // used: each event's used_after, then the counter at snapshot time.
  REQUIRE(series.count("GPU 0 used"));
  CHECK(series["GPU 0 used"].front() == std::pair<uint64_t, uint64_t>{t0, 64 * kMiB});
  CHECK(series["GPU 0 used"].back().first == T / 1000);
  // cap: none (drawn at the device's memory) until the change to 8 GiB.
  REQUIRE(series.count("GPU 0 cap"));
  CHECK(series["GPU 0 cap"].front() == std::pair<uint64_t, uint64_t>{t0, 141 * kGiB});
  CHECK(series["GPU 0 cap"][1] == std::pair<uint64_t, uint64_t>{t0 + 7'000'000, 8 * kGiB});
  REQUIRE(series.count("GPU 0 reserved"));
  REQUIRE(series.count("GPU 1 used"));
  for (const auto& [name, pts] : series)
    CHECK(std::is_sorted(pts.begin(), pts.end(), [](const auto& a, const auto& b) { return a.first < b.first; }));
  const std::string text = snapshot_perfetto(passthrough());
  CHECK(text.find("refused by the cap: 10.00 GiB on GPU 0") != std::string::npos);
  CHECK(text.find("cap on GPU 0: 8.00 GiB") != std::string::npos);
}

TEST_CASE("perfetto: a pool's reserved bytes walked back through its segment events") {
  const nlohmann::json doc = nlohmann::json::parse(snapshot_perfetto(pooled()));
  std::vector<uint64_t> reserved;
  for (const auto& e : doc["traceEvents"])
    if (e["name"] == "GPU 0 reserved") reserved.push_back(e["args"]["bytes"]);
  // After each event, oldest first: S1 taken (28 MiB: 26 before), S2 (48), S5 (50), S5 given
  // back (48); then the counter at snapshot time.
  CHECK(reserved == std::vector<uint64_t>{28 * kMiB, 48 * kMiB, 50 * kMiB, 48 * kMiB, 48 * kMiB});
}

// ---- summary --------------------------------------------------------------------------------

TEST_CASE("summary: torch.cuda.memory_summary's table, '-' where cuwarden cannot know") {
  const std::string t = summary_text(passthrough());
  // Two devices, each a framed table of 77 columns.
  CHECK(lines_with(t, "device ID 0").size() == 1);
  CHECK(lines_with(t, "device ID 1").size() == 1);
  for (const auto& l : lines_with(t, "|")) CHECK(l.size() == 77);
  CHECK(t.find("|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |") != std::string::npos);
  // Device 0: 3 live allocations (the 2 GiB one and the 64 MiB handle large, the 512 KiB small),
  // 41 made, 38 freed; the peak of used bytes; requests have no peak.
  const auto allocs = lines_with(t, "| Allocations ");
  REQUIRE(allocs.size() == 2);
  CHECK(allocs[0] == "| Allocations           |       3    |       -    |      41    |      38    |");
  const auto large = lines_with(t, "|       from large pool ");
  CHECK(std::find(large.begin(), large.end(),
                  "|       from large pool |       2    |       -    |       -    |       -    |") != large.end());
  const auto allocated = lines_with(t, "| Allocated memory ");
  REQUIRE(allocated.size() == 2);
  CHECK(allocated[0] == "| Allocated memory      |   2112 MiB |   3072 MiB |      -     |      -     |");
  CHECK(lines_with(t, "| Requested memory ")[0] == "| Requested memory      |   2112 MiB |      -     |      -     |      -     |");
  CHECK(lines_with(t, "| GPU reserved segments ")[0] == "| GPU reserved segments |       3    |       -    |       -    |       -    |");
  CHECK(lines_with(t, "| Non-releasable memory ")[0] == "| Non-releasable memory |      0 B   |      -     |      -     |      -     |");
  CHECK(lines_with(t, "| Oversize allocations ")[0] == "| Oversize allocations  |       -    |       -    |       -    |       -    |");
  CHECK(t.find("CUDA OOMs: 1 ") != std::string::npos);
  // The header keeps its figures whole, however long the names: a name is what gets cut.
  Snapshot longer = passthrough();
  longer.comm = "cuw_demo_workload";
  longer.cmdline = "cuw_demo_workload --steps 8 --sleep-ms 500 --and-many-more-arguments-than-fit";
  for (auto& d : longer.devices) d.name = "cuwarden simulated GPU with a name much longer than any real one";
  const std::string lt = summary_text(longer);
  for (const auto& l : lines_with(lt, "|")) CHECK(l.size() == 77);
  CHECK(lines_with(lt, "| pid 4242, pool off, cuw_demo_workload").size() == 2);
  CHECK(lines_with(lt, "| used 2.06 GiB on cuwarden simulated GPU").size() == 1);
}

TEST_CASE("summary: a pool's free space that live blocks keep is non-releasable") {
  const std::string t = summary_text(pooled());
  // S1: 2 MiB less 1 KiB and 768 KiB; S2: 2 + 10 MiB; the empty S3 can go back to the driver.
  // (13,567 KiB: like PyTorch's, the unit moves up only from 768 of it.)
  static_assert(((2 * kMiB - 1024 - 768 * kKiB) + 12 * kMiB) / kKiB == 13567);
  CHECK(lines_with(t, "| Non-releasable memory ")[0] == "| Non-releasable memory |  13567 KiB |      -     |      -     |      -     |");
  CHECK(lines_with(t, "| Non-releasable allocs ")[0] == "| Non-releasable allocs |       3    |       -    |       -    |       -    |");
  // A pool's pending frees are unknown: Active rows are "-"; the allocated peak too.
  CHECK(lines_with(t, "| Active memory ")[0] == "| Active memory         |      -     |      -     |      -     |      -     |");
  CHECK(lines_with(t, "| Allocated memory ")[0] == "| Allocated memory      |  28672 KiB |      -     |      -     |      -     |");
  CHECK(lines_with(t, "| GPU reserved memory ")[0] == "| GPU reserved memory   |  49152 KiB |  61440 KiB |      -     |      -     |");
  CHECK(t.find("a pool's frees still waiting for their streams are not counted") != std::string::npos);

  Snapshot blind = pooled();
  blind.exact = false;
  blind.allocations.clear();
  const std::string b = summary_text(blind);
  CHECK(lines_with(b, "| Requested memory ")[0] == "| Requested memory      |      -     |      -     |      -     |      -     |");
  CHECK(lines_with(b, "| Allocations ")[0] == "| Allocations           |       7    |       -    |     100    |      93    |");
}

TEST_CASE("summary: every backend but off pools, whatever its name") {
  // A pooling backend the daemon has no list of reads as the cache does: its table is the
  // cache's, with nothing of the pool's counted as the program's own allocations.
  // Every line but the one that names the pool.
  const auto table = [](const std::string& t) {
    std::string out;
    std::istringstream in(t);
    for (std::string line; std::getline(in, line);)
      if (line.find(", pool ") == std::string::npos) out += line + "\n";
    return out;
  };
  const std::string cache = summary_text(pooled());
  REQUIRE(cache.find(", pool cache,") != std::string::npos);
  for (const char* name : {"vmm", "exact", "some-future-pool"}) {
    INFO(name);
    Snapshot p = pooled();
    p.pool = name;
    const std::string t = summary_text(p);
    CHECK(t.find(std::string(", pool ") + name + ",") != std::string::npos);
    CHECK(table(t) == table(cache));
  }
  for (const char* name : {"off", ""}) {
    INFO(name);
    Snapshot p = pooled();
    p.pool = name;
    const std::string t = summary_text(p);
    CHECK(t.find("a pool's frees still waiting for their streams are not counted") == std::string::npos);
    CHECK(lines_with(t, "| Active memory ")[0] != lines_with(cache, "| Active memory ")[0]);
  }
}

// ---- leaks ----------------------------------------------------------------------------------

TEST_CASE("leaks: the call sites whose live bytes only grew, largest growth first") {
  auto snap = [](uint64_t t, std::vector<std::pair<uint32_t, uint64_t>> per_site) {
    Snapshot s;
    s.pid = 99;
    s.comm = "train";
    s.time_ns = t;
    s.exact = true;
    uint64_t addr = 0x7f0000000000;
    for (auto [site, bytes] : per_site) {
      if (bytes) s.allocations.push_back(alloc(addr, bytes, 0, site, SnapKind::device, 0));
      addr += 1ULL << 36;
      SnapSite st;
      st.id = site;
      st.frames = {python("grow_" + std::to_string(site), "/w/train.py", site)};
      if (site) s.sites.push_back(st);
    }
    return s;
  };
  // Site 1 grows, 2 grows then falls, 3 stays, 4 appears, 5 dips and ends higher, 0 grows
  // (no call site); given out of order.
  std::vector<Snapshot> snaps = {
      snap(T + 120 * kSec, {{1, 3 * kGiB}, {2, 1 * kGiB}, {3, kGiB}, {4, 5 * kMiB}, {5, 3 * kGiB}, {0, 2 * kMiB}}),
      snap(T, {{1, 1 * kGiB}, {2, 1 * kGiB}, {3, kGiB}, {4, 0}, {5, 2 * kGiB}, {0, 1 * kMiB}}),
      snap(T + 60 * kSec, {{1, 2 * kGiB}, {2, 2 * kGiB}, {3, kGiB}, {4, 0}, {5, 1 * kGiB}, {0, 1 * kMiB}})};
  LeakOptions now;  // every snapshot counts: the allocations are made at T, the first snapshot's time
  now.warmup_ns = 0;
  const auto l = growing_sites(snaps, now);
  REQUIRE(l.size() == 3);
  CHECK(l[0].site == 1);
  CHECK(l[0].growth() == 2 * kGiB);
  CHECK(l[0].bytes == std::vector<uint64_t>{1 * kGiB, 2 * kGiB, 3 * kGiB});
  CHECK(l[0].frames.frames.at(0).function == "grow_1");
  CHECK(l[1].site == 4);
  CHECK(l[1].first_count == 0);
  CHECK(l[1].last_count == 1);
  CHECK(l[2].site == 0);

  const std::string t = leaks_text(snaps, {}, now);
  CHECK(t.find("over 2 min 00 s (3 snapshots") != std::string::npos);
  CHECK(t.find("+2.00 GiB  (1.00 GiB -> 3.00 GiB, 1 -> 1 allocations)  site 1\n      grow_1 (/w/train.py:1)\n") !=
        std::string::npos);
  CHECK(t.find("site 2") == std::string::npos);
  const auto j = leaks_json(snaps, nullptr, now);
  CHECK(j["snapshots"] == 3);
  CHECK(j["sites"][0]["growth_bytes"] == 2 * kGiB);
  CHECK(j["first_ns"] == T);

  // A snapshot without live records is skipped, not read as "nothing live".
  Snapshot blind = snaps[2];
  blind.exact = false;
  blind.allocations.clear();
  snaps.push_back(blind);
  CHECK(growing_sites(snaps, now).size() == 3);
  CHECK(leaks_text(snaps, {}, now).find("1 snapshot left out") != std::string::npos);
  // One usable snapshot is not a trend; two processes are not one.
  CHECK(growing_sites({snaps[0]}, now).empty());
  snaps[1].pid = 100;
  CHECK_THROWS_AS(growing_sites(snaps), std::invalid_argument);
}

TEST_CASE("since: the call sites whose live bytes changed between two samples, largest change first") {
  auto sample = [](uint64_t t, std::vector<std::pair<uint32_t, uint64_t>> per_site) {
    Snapshot s;
    s.pid = 5;
    s.comm = "train";
    s.time_ns = t;
    s.exact = true;
    uint64_t addr = 0x7f0000000000;
    for (auto [site, bytes] : per_site) {
      if (bytes) s.allocations.push_back(alloc(addr, bytes, 0, site, SnapKind::device, 0));
      addr += 1ULL << 36;
      SnapSite st;
      st.id = site;
      st.frames = {python("site_" + std::to_string(site), "/w/train.py", site)};
      if (site) s.sites.push_back(st);
    }
    return s;
  };
  // 1 grew, 2 shrank, 3 held, 4 freed everything (named by the older sample), 5 is new.
  const Snapshot then = sample(T, {{1, 1 * kGiB}, {2, 512 * kMiB}, {3, kGiB}, {4, 8 * kMiB}});
  const Snapshot now = sample(T + 600 * kSec, {{1, 3 * kGiB}, {2, 128 * kMiB}, {3, kGiB}, {5, 64 * kMiB}});
  const auto c = changed_sites(then, now);
  REQUIRE(c.size() == 4);
  CHECK(c[0].site == 1);
  CHECK(c[0].before == 1 * kGiB);
  CHECK(c[0].after == 3 * kGiB);
  CHECK(c[1].site == 2);
  CHECK(c[2].site == 5);
  CHECK(c[3].site == 4);
  CHECK(c[3].frames.frames.at(0).function == "site_4");
  const std::string t = since_text(then, now);
  INFO(t);
  CHECK(t.find("changed over 10 min 00 s") != std::string::npos);
  CHECK(t.find("  +2.00 GiB  (1.00 GiB -> 3.00 GiB, 1 -> 1 allocations)  site 1\n      site_1 (/w/train.py:1)\n") !=
        std::string::npos);
  CHECK(t.find("  -384.00 MiB  (512.00 MiB -> 128.00 MiB") != std::string::npos);
  CHECK(t.find("site 3") == std::string::npos);
  const auto j = since_json(then, now);
  CHECK(j["from_ns"] == T);
  CHECK(j["sites"].size() == 4);
  CHECK(j["sites"][0]["label"] == "site_1 (/w/train.py:1)");
  CHECK(j["sites"][3]["after_bytes"] == 0);
  CHECK(since_text(then, then).find("None.") != std::string::npos);
  Snapshot other = now;
  other.pid = 6;
  CHECK_THROWS_AS(changed_sites(then, other), std::invalid_argument);
}

TEST_CASE("leaks: a model's weights allocated once after start are not a leak but a real grower is") {
  // Samples every 30 s from the first allocation at T: the weights load over the first minute
  // (0 -> 128 MiB -> 256 MiB) and are held; the grower adds 2 MiB a sample; a cache creeps by
  // 100 KiB a sample (under 1 MiB); a buffer grows then falls back within the last three.
  const std::vector<uint64_t> weights = {1 * kMiB, 128 * kMiB, 256 * kMiB, 256 * kMiB, 256 * kMiB, 256 * kMiB, 256 * kMiB};
  auto sample = [&](std::size_t i) {
    Snapshot s;
    s.pid = 7;
    s.comm = "train";
    s.time_ns = T + i * 30 * kSec;
    s.exact = true;
    auto add = [&](uint32_t site, uint64_t bytes, uint64_t addr) {
      SnapAlloc a = alloc(addr, bytes, 0, site, SnapKind::device, 0);  // first allocated at T
      s.allocations.push_back(a);
      SnapSite st;
      st.id = site;
      st.frames = {python("site_" + std::to_string(site), "/w/train.py", site)};
      s.sites.push_back(st);
    };
    add(1, weights[i], 0x100000000);
    add(2, (i + 1) * 2 * kMiB, 0x200000000);
    add(3, 100 * kMiB + i * 100 * kKiB, 0x300000000);
    add(4, i == 5 ? 11 * kMiB : i >= 4 ? (4 + i) * kMiB : 8 * kMiB, 0x400000000);
    return s;
  };
  std::vector<Snapshot> snaps;
  for (std::size_t i = 0; i < weights.size(); ++i) snaps.push_back(sample(i));
  const auto l = growing_sites(snaps);  // the default warm-up: 60 s after the first allocation
  REQUIRE(l.size() == 1);
  CHECK(l[0].site == 2);
  CHECK(l[0].bytes == std::vector<uint64_t>{10 * kMiB, 12 * kMiB, 14 * kMiB});
  CHECK(l[0].growth() == 4 * kMiB);
  const std::string t = leaks_text(snaps, {});
  INFO(t);
  CHECK(t.find("(2 samples of the warm-up left out") != std::string::npos);
  CHECK(t.find("site_2 (/w/train.py:2)") != std::string::npos);
  CHECK(t.find("site_1 (") == std::string::npos);
  // Without the warm-up the weights' load (1 -> 256 MiB over the first three samples) would
  // be one; only the last three samples count, so they are not.
  LeakOptions none;
  none.warmup_ns = 0;
  CHECK(growing_sites(snaps, none).size() == 1);
  std::vector<Snapshot> early(snaps.begin(), snaps.begin() + 3);
  CHECK(growing_sites(early, none).size() == 2);
  CHECK(growing_sites(early).empty());  // all but one in the warm-up: too few samples
  CHECK(leaks_text(early, {}).find("Needs 3 samples with live records after the warm-up (1 so far)") != std::string::npos);
}
