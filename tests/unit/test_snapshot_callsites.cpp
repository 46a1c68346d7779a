// Unit tests for how the snapshot views show call sites (views/detail/snapshot.hpp's
// presenter over cuw/frames.hpp): three sites that share a dozen innermost frames (a helper
// chain, as a framework's caching allocator is) told apart in the text report, the JSON, the
// out-of-memory report and the leak report; a site's own frame rules; the folded stacks for
// flame graphs, read back by a parser of the format.
#include <catch2/catch.hpp>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cuw/frames.hpp"
#include "views/oom_json.hpp"
#include "views/snapshot_views.hpp"

using namespace cuw::daemon;

namespace {

constexpr uint64_t kCsMiB = 1ULL << 20;
constexpr uint64_t kT0 = 1'800'000'000'000'000'000ULL;

SnapFrame native_frame(const std::string& fn, const std::string& file, uint32_t line, const std::string& module, uint64_t pc) {
  SnapFrame f;
  f.function = fn;
  f.file = file;
  f.line = line;
  f.module = module;
  f.pc = pc;
  f.offset = pc & 0xfffff;
  return f;
}

/// A site allocating through cudart and a 12-deep helper chain of the program's own, called
/// from `caller` at `line`.
SnapSite chain_site(uint32_t id, const std::string& caller, uint32_t line) {
  SnapSite s;
  s.id = id;
  s.frames.push_back(native_frame("cuw::hooks::cuMemAlloc_v2", "", 0, "/usr/lib/libcuwarden.so", 0x7f0000001000));
  s.frames.push_back(native_frame("cudaMalloc", "", 0, "/usr/local/cuda/lib64/libcudart.so.13", 0x7f0000102000));
  for (int i = 12; i >= 1; --i)
    s.frames.push_back(native_frame("pool::level_" + std::to_string(i), "/src/pool.cpp", 100u + static_cast<uint32_t>(i),
                              "/opt/app/bin/trainer", 0x401000 + static_cast<uint64_t>(i) * 0x10));
  s.frames.push_back(native_frame(caller, "/src/model.cpp", line, "/opt/app/bin/trainer", 0x402000 + line));
  s.frames.push_back(native_frame("main", "/src/main.cpp", 9, "/opt/app/bin/trainer", 0x403000));
  s.frames.push_back(native_frame("__libc_start_main", "", 0, "/usr/lib/x86_64-linux-gnu/libc.so.6", 0x7f0000203000));
  return s;
}

Snapshot chain_snapshot() {
  Snapshot s;
  s.pid = 77;
  s.comm = "trainer";
  s.time_ns = kT0;
  s.exact = true;
  s.callsite_frames = 32;
  s.sites = {chain_site(1, "load_weights", 40), chain_site(2, "make_buffers", 52), chain_site(3, "load_weights", 44)};
  auto alloc = [&](uint64_t addr, uint64_t bytes, uint32_t site) {
    SnapAlloc a;
    a.address = addr;
    a.bytes = bytes;
    a.device = 0;
    a.site = site;
    a.time_ns = kT0;
    s.allocations.push_back(a);
  };
  alloc(0x1000000, 64 * kCsMiB, 1);
  alloc(0x9000000, 32 * kCsMiB, 2);
  alloc(0xb000000, 16 * kCsMiB, 3);
  alloc(0xc000000, 1 * kCsMiB, 0);
  return s;
}

std::vector<std::string> lines_of(const std::string& t) {
  std::vector<std::string> out;
  std::istringstream in(t);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

/// Folded stacks as flamegraph.pl and inferno read them: the count after the line's last
/// space, frames split at ';'. Fails the test on a malformed line.
std::map<std::vector<std::string>, uint64_t> parse_folded(const std::string& text) {
  std::map<std::vector<std::string>, uint64_t> out;
  for (const std::string& l : lines_of(text)) {
    const auto sp = l.rfind(' ');
    REQUIRE(sp != std::string::npos);
    REQUIRE(sp > 0);
    const std::string count = l.substr(sp + 1);
    REQUIRE(!count.empty());
    REQUIRE(count.find_first_not_of("0123456789") == std::string::npos);
    std::vector<std::string> frames;
    std::string stack = l.substr(0, sp), cur;
    for (char c : stack) {
      if (c == ';') {
        frames.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    frames.push_back(cur);
    for (const std::string& f : frames) REQUIRE(!f.empty());
    out[frames] += std::stoull(count);
  }
  return out;
}

}  // namespace

TEST_CASE("callsites: three sites through one helper chain are told apart by their differing frame") {
  const Snapshot s = chain_snapshot();
  const std::string t = snapshot_text(s, {});
  INFO(t);
  // Each leads with the innermost user frame, folds cudart and cuwarden, then names the caller
  // where the stacks part, with the 11 chain frames between folded into its count; the two
  // load_weights sites differ only by line.
  CHECK(t.find("site 1\n      pool::level_12 (/src/pool.cpp:112)\n      (2 frames in libcudart.so.13, libcuwarden.so)\n"
               "      < load_weights (/src/model.cpp:40)  (+11 frames)\n") != std::string::npos);
  CHECK(t.find("site 2\n      pool::level_12 (/src/pool.cpp:112)\n      (2 frames in libcudart.so.13, libcuwarden.so)\n"
               "      < make_buffers (/src/model.cpp:52)  (+11 frames)\n") != std::string::npos);
  CHECK(t.find("< load_weights (/src/model.cpp:44)  (+11 frames)") != std::string::npos);
  // The folded frames and the chain are not listed; main is not needed to tell them apart.
  CHECK(t.find("cudaMalloc") == std::string::npos);
  CHECK(t.find("pool::level_11") == std::string::npos);
  CHECK(t.find("main (") == std::string::npos);
  CHECK(t.find("(no call site captured)") != std::string::npos);
  // The largest allocations name the site by its one-line form.
  CHECK(t.find("1: pool::level_12 (/src/pool.cpp:112) < load_weights (/src/model.cpp:40) (+11)") != std::string::npos);

  TextOptions full;
  full.full = true;
  const std::string tf = snapshot_text(s, full);
  CHECK(tf.find("        cudaMalloc (libcudart.so.13+0x2000)  [cuda]") != std::string::npos);
  CHECK(tf.find("        pool::level_11 (/src/pool.cpp:111)  [user]") != std::string::npos);
  CHECK(tf.find("        __libc_start_main (libc.so.6+0x3000)  [libc]") != std::string::npos);
  // Every frame outward of the head, the one that tells the site apart among them, marked.
  CHECK(tf.find("      < load_weights (/src/model.cpp:40)  [user]") != std::string::npos);
  CHECK(tf.find("        pool::level_1 (/src/pool.cpp:101)  [user]") != std::string::npos);

  const auto j = snapshot_json(s);
  std::map<uint64_t, std::string> label;
  for (const auto& site : j["sites"]) label[site["id"].get<uint64_t>()] = site["label"].get<std::string>();
  CHECK(label[1] == "pool::level_12 (/src/pool.cpp:112) < load_weights (/src/model.cpp:40) (+11)");
  CHECK(label[2] == "pool::level_12 (/src/pool.cpp:112) < make_buffers (/src/model.cpp:52) (+11)");
  CHECK(label[3] == "pool::level_12 (/src/pool.cpp:112) < load_weights (/src/model.cpp:44) (+11)");
  CHECK(j["sites"][0]["head_frame"] == 2);
  // The label's parts, for the web page: the head, the frame that tells the site apart (its
  // index in frames and the frames skipped before it), the frames in calling order.
  for (const auto& site : j["sites"]) {
    if (site["id"] != 1) continue;
    CHECK(site["label_head"] == "pool::level_12 (/src/pool.cpp:112)");
    REQUIRE(site["label_via"].size() == 1);
    CHECK(site["label_via"][0]["text"] == "load_weights (/src/model.cpp:40)");
    CHECK(site["label_via"][0]["skipped"] == 11);
    const auto via = site["label_via"][0]["frame"].get<std::size_t>();
    CHECK(site["frames"][via]["function"] == "load_weights");
    REQUIRE(site["calling_order"].size() == site["frames"].size());
    CHECK(site["calling_order"][0] == 0);  // native only: the frames' own order
    CHECK(site["calling_order"][via] == via);
  }
  CHECK(j["segments_note"] == "");  // no framework's allocator: nothing to say
  CHECK(t.find("caching allocator") == std::string::npos);
  CHECK(j["sites"][0]["frames"][16]["class"] == "libc");
}

TEST_CASE("callsites: the out-of-memory report tells its sites apart") {
  const Snapshot s = chain_snapshot();
  OomReport r;
  r.pid = 77;
  r.event.e.kind = static_cast<uint8_t>(cuw::ring::EventKind::refuse);
  r.event.e.device = 0;
  r.event.e.site = 2;
  const auto j = oom_json(r, s, 0);
  CHECK(j["asked_at"] == "pool::level_12 (/src/pool.cpp:112) < make_buffers (/src/model.cpp:52) (+11)");
  REQUIRE(j["sites"].size() == 3);
  CHECK(j["sites"][0]["frame"] == "pool::level_12 (/src/pool.cpp:112) < load_weights (/src/model.cpp:40) (+11)");
  CHECK(j["sites"][1]["frame"] == "pool::level_12 (/src/pool.cpp:112) < make_buffers (/src/model.cpp:52) (+11)");
  CHECK(j["sites"][2]["frame"] == "pool::level_12 (/src/pool.cpp:112) < load_weights (/src/model.cpp:44) (+11)");
}

TEST_CASE("callsites: a site's own rules make its library a framework") {
  Snapshot s = chain_snapshot();
  for (SnapSite& site : s.sites)
    for (std::size_t i = 2; i < 14; ++i) site.frames[i].module = "/opt/lab/lib/libslab.so";
  cuw::frames::Rules rules;
  rules.add("/opt/lab/lib/", cuw::frames::Class::framework);
  TextOptions o;
  o.rules = &rules;
  const std::string t = snapshot_text(s, o);
  INFO(t);
  // The chain is folded now: the callers lead, and tell the sites apart without a via frame.
  CHECK(t.find("site 1\n      load_weights (/src/model.cpp:40)\n      (14 frames in libslab.so, libcudart.so.13, "
               "libcuwarden.so)\n") != std::string::npos);
  CHECK(t.find("site 2\n      make_buffers (/src/model.cpp:52)\n") != std::string::npos);
  CHECK(snapshot_json(s, &rules)["sites"][0]["frames"][5]["class"] == "framework");
  CHECK(snapshot_json(s)["sites"][0]["frames"][5]["class"] == "user");
}

TEST_CASE("callsites: folded stacks, root first, read back by a parser of the format") {
  Snapshot s = chain_snapshot();
  s.sites[1].frames[3].function = "evil;name\x1b[31m";  // a ';' would split a frame; ESC a terminal
  const std::string text = snapshot_folded(s);
  INFO(text);
  const auto stacks = parse_folded(text);
  REQUIRE(stacks.size() == 4);
  uint64_t total = 0;
  for (const auto& [frames, bytes] : stacks) total += bytes;
  CHECK(total == 113 * kCsMiB);
  CHECK(stacks.at({"(no call site)"}) == 1 * kCsMiB);
  bool found = false;
  for (const auto& [frames, bytes] : stacks) {
    if (bytes != 64 * kCsMiB) continue;
    found = true;
    REQUIRE(frames.size() == 17);
    CHECK(frames.front() == "__libc_start_main (libc.so.6+0x3000)");
    CHECK(frames[1] == "main (/src/main.cpp:9)");
    CHECK(frames[2] == "load_weights (/src/model.cpp:40)");
    CHECK(frames.back() == "cuw::hooks::cuMemAlloc_v2 (libcuwarden.so+0x1000)");
  }
  CHECK(found);
  CHECK(text.find('\x1b') == std::string::npos);
  CHECK(text.find("evil,name?[31m") != std::string::npos);
  CHECK(snapshot_folded(Snapshot{}).empty());
}

TEST_CASE("callsites: sites whose user frames are equal are one, their bytes added") {
  Snapshot s = chain_snapshot();
  // Site 4: load_weights at line 40 again, through another path of cudart (another native
  // stack, the same user frames): it goes into site 1. Site 5 and 6: no user frame, named by
  // their operator; 7: another operator.
  SnapSite again = chain_site(4, "load_weights", 40);
  again.frames[1] = native_frame("cudaMallocAsync", "", 0, "/usr/local/cuda/lib64/libcudart.so.13", 0x7f0000109000);
  auto backward = [](uint32_t id, const std::string& op, uint64_t pc) {
    SnapSite b;
    b.id = id;
    b.frames = {native_frame("cudaMalloc", "", 0, "/usr/local/cuda/lib64/libcudart.so.13", 0x7f0000102000),
                native_frame("c10::cuda::CUDACachingAllocator::malloc", "", 0, "/opt/torch/lib/libc10_cuda.so", pc),
                native_frame("torch::autograd::generated::" + op + "::apply", "", 0, "/opt/torch/lib/libtorch_cpu.so", pc + 0x100)};
    return b;
  };
  s.sites.push_back(again);
  s.sites.push_back(backward(5, "MmBackward0", 0x7f0000500000));
  s.sites.push_back(backward(6, "MmBackward0", 0x7f0000600000));
  s.sites.push_back(backward(7, "AddmmBackward0", 0x7f0000700000));
  for (uint32_t id : {4u, 5u, 6u, 7u}) {
    SnapAlloc a;
    a.address = 0x20000000 + id * 0x1000000;
    a.bytes = id * kCsMiB;
    a.device = 0;
    a.site = id;
    a.time_ns = kT0;
    s.allocations.push_back(a);
  }
  Snapshot native_view = s;  // --by native: as captured
  const auto to = merge_sites_by_user_frames(s);
  CHECK(to == std::map<uint32_t, uint32_t>{{4, 1}, {6, 5}});
  std::map<uint32_t, uint64_t> bytes;
  const auto j = snapshot_json(s);
  for (const auto& site : j["sites"]) bytes[site["id"].get<uint32_t>()] = site["live_bytes"].get<uint64_t>();
  CHECK(bytes == std::map<uint32_t, uint64_t>{{1, 68 * kCsMiB}, {2, 32 * kCsMiB}, {3, 16 * kCsMiB}, {5, 11 * kCsMiB}, {7, 7 * kCsMiB}});
  // The same renaming applies to a sample of the process (the leak and since views).
  remap_sites(native_view, to);
  CHECK(native_view.sites.size() == s.sites.size());
  CHECK(native_view.allocations.back().site == 7);
  CHECK(native_view.allocations[native_view.allocations.size() - 2].site == 5);
}

TEST_CASE("callsites: no segments note where PyTorch allocates each tensor itself") {
  Snapshot s = chain_snapshot();
  SnapSite torch;
  torch.id = 9;
  torch.frames = {native_frame("cudaMalloc", "", 0, "/usr/local/cuda/lib64/libcudart.so.13", 0x7f0000102000),
                  native_frame("c10::cuda::CUDACachingAllocator::malloc", "", 0, "/opt/torch/lib/libc10_cuda.so", 0x7f0000500000)};
  s.sites.push_back(torch);
  auto alloc = [&](uint64_t address, uint64_t bytes) {
    SnapAlloc a;
    a.address = address;
    a.bytes = bytes;
    a.device = 0;
    a.site = 9;
    a.time_ns = kT0;
    s.allocations.push_back(a);
  };
  // Its caching allocator's segments: 2 MiB and 20 MiB, the sizes it asks the driver for.
  alloc(0x40000000, 2 * kCsMiB);
  alloc(0x41000000, 20 * kCsMiB);
  CHECK(snapshot_json(s)["segments_note"].get<std::string>().find("PyTorch's caching allocator") != std::string::npos);
  // PYTORCH_NO_CUDA_MEMORY_CACHING=1: a tensor of 512 bytes straight from the driver.
  alloc(0x42000000, 512);
  CHECK(snapshot_json(s)["segments_note"] == "");
}
