// cuwarden integration tests for the daemon's model in-process: States published by the
// loop thread while other threads read them (run under TSan in the sanitizer build), what
// it keeps of a ring that faults, and the site samples behind `snapshot --leaks`.
#include <catch2/catch.hpp>
#include <fcntl.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "core/live_segment.hpp"
#include "core/live_table.hpp"
#include "daemon_test_support.hpp"
#include "base/util.hpp"
#include "model/fault_guard.hpp"
#include "model/gpus.hpp"
#include "model/registry.hpp"
#include "model/series.hpp"
#include "views/events_json.hpp"
#include "views/state_json.hpp"

using namespace cuwt;

namespace {

/// A run directory of its own for a Registry in this process (the daemon's fault guard
/// installed: reading a ring that faults is what some cases do), and the options that use it.
struct ModelRun {
  TempDir dir;
  std::string run = dir / "run";
  ModelRun() {
    cuw::daemon::install_fault_guard();
    REQUIRE(::mkdir(run.c_str(), 0700) == 0);
  }
  /// Options for the run directory; exited processes' rings are kept.
  cuw::daemon::RegistryOptions options() const {
    cuw::daemon::RegistryOptions o;
    o.run_dir = run;
    o.unlink_exited = false;
    return o;
  }
  /// The run directory, opened as the Registry takes it.
  int dirfd() const { return ::open(run.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); }
};

/// The UUID a hand-made process below names for GPU number `n`.
std::string hand_uuid(uint32_t n) {
  uint8_t u[16] = {0xca, 0xfe};
  for (int i = 0; i < 4; ++i) u[12 + i] = static_cast<uint8_t>(n >> (8 * i));
  return cuw::daemon::format_uuid(u);
}

/// A process as a State lists it, made by hand (any uid, no ring): on GPUs `gpus` (numbers
/// for hand_uuid), 1 MiB used on each.
cuw::daemon::ProcessState hand_process(uint32_t uid, uint32_t pid, const std::vector<uint32_t>& gpus) {
  cuw::daemon::ProcessState p;
  p.file_name = cuw::paths::ring_file_name(pid, 1);
  p.pid = p.ns_pid = p.header.pid = pid;
  p.uid = p.header.uid = uid;
  p.user = std::to_string(uid);
  p.start_time = p.header.start_time = 1;
  for (std::size_t d = 0; d < gpus.size() && d < ring::kMaxDevices; ++d) {
    cuw::daemon::DeviceSnapshot& ds = p.header.devices[d];
    ds.present = true;
    for (int i = 0; i < 4; ++i) ds.uuid[12 + i] = static_cast<uint8_t>(gpus[d] >> (8 * i));
    ds.uuid[0] = 0xca;
    ds.uuid[1] = 0xfe;
    ds.used = kMiB;
  }
  p.history = std::make_shared<const cuw::daemon::EventHistory::View>();
  return p;
}

}  // namespace

TEST_CASE("daemon.model_published_state_is_read_from_another_thread_while_the_loop_drains") {
  ModelRun m;
  const std::string& run = m.run;
  Child child;
  FakeRing r(run, child.pid, child.start_time(), 1024);
  r.device(0, 0x20).limit.store(ring::kNoLimit);

  cuw::daemon::RegistryOptions o = m.options();
  o.history_per_process = 700;  // not a multiple of the history's chunk: trimming is exercised
  cuw::daemon::Registry reg(o, m.dirfd(), nullptr);
  reg.scan();
  reg.publish();

  constexpr int kBursts = 40, kPerBurst = 100, kLimits = 4;  // a cap change at bursts 5, 15, 25, 35
  cuw::daemon::Peer peer;
  peer.known = true;
  peer.uid = getuid();
  peer.gid = getgid();
  peer.pid = getpid();
  std::atomic<bool> done{false};
  std::atomic<uint64_t> reads{0};
  std::string failure;
  std::thread reader([&] {
    uint64_t last_seq = 0;
    while (!done.load()) {
      auto st = reg.store().load();
      const auto state = cuw::daemon::state_json(*st);
      const auto ev = cuw::daemon::events_json(*st, nlohmann::json{{"max", 100000}});
      const uint64_t seq = state["events_seq"].get<uint64_t>();
      const auto& events = ev["events"];
      // One State is one instant: its events end at its events_seq, numbered without a
      // gap, at most the history's size, and the sequence never goes back.
      bool ok = seq >= last_seq && ev["latest"] == seq && events.size() <= o.history_per_process;
      if (ok && !events.empty()) {
        ok = events.back()["seq"] == seq &&
             events.back()["seq"].get<uint64_t>() - events.front()["seq"].get<uint64_t>() + 1 == events.size();
      }
      if (!ok && failure.empty()) failure = "inconsistent State at events_seq " + std::to_string(seq);
      last_seq = seq;
      reads.fetch_add(1);
    }
  });
  for (int b = 0; b < kBursts; ++b) {
    for (int i = 0; i < kPerBurst; ++i)
      REQUIRE(r.push(ring::EventKind::alloc, ring::Api::cuMemAlloc, 0, 4096, 0x1000 + i, 4096 * (i + 1)));
    r.h->devices[0].used.store(4096ULL * kPerBurst * (b + 1));
    while (reg.drain_all() == cuw::daemon::Registry::DrainPace::again) {
    }
    reg.publish();
    if (b % 10 == 5) {
      // A cap change on the loop thread: it names its requester (user names are looked up
      // on both threads, the reader's events view naming who changed a cap).
      cuw::daemon::LimitRequest req;
      req.pid = static_cast<uint32_t>(child.pid);
      req.ask.bytes = (64ULL - b) << 30;
      REQUIRE(reg.set_limit_and_publish(peer, req).outcome == cuw::daemon::LimitResult::Outcome::changed);
    }
  }
  // Readers keep what they loaded: the loop may publish again at once.
  auto held = reg.store().load();
  reg.publish();
  REQUIRE(wait_until([&] { return reads.load() > 10; }));
  done.store(true);
  reader.join();
  INFO(failure);
  CHECK(failure.empty());

  const auto state = cuw::daemon::state_json(*held);
  CHECK(state["events_seq"] == kBursts * kPerBurst + kLimits);
  REQUIRE(state["processes"].size() == 1);
  CHECK(state["processes"][0]["devices"][0]["used_bytes"] == 4096ULL * kPerBurst * kBursts);
  const auto ev = cuw::daemon::events_json(*held, nlohmann::json{{"max", 100000}});
  CHECK(ev["events"].size() == o.history_per_process);
  CHECK(ev["events"].front()["seq"] == kBursts * kPerBurst + kLimits - o.history_per_process + 1);
  std::size_t by = 0;
  for (const auto& e : ev["events"]) by += e.contains("by");
  CHECK(by == 1);  // the change at burst 35 is within the last 700 events
  // "after" lands inside the history, across chunks.
  const auto after = cuw::daemon::events_json(*held, nlohmann::json{{"after", 3500}, {"max", 3}});
  REQUIRE(after["events"].size() == 3);
  CHECK(after["events"][0]["seq"] == 3501);
  CHECK(after["next"] == 3503);
}

TEST_CASE("daemon.model_a_ring_that_faults_is_retired_with_the_counters_last_published") {
  ModelRun m;
  const std::string& run = m.run;
  Child child;
  FakeRing r(run, child.pid, child.start_time(), 1024, "fakeproc", "etl");
  ring::DeviceSlot& dev = r.device(0, 0x20);
  dev.limit.store(ring::kNoLimit);
  dev.alloc_count.store(5);
  dev.refusals.store(2);

  cuw::daemon::RegistryOptions o = m.options();
  cuw::daemon::Registry reg(o, m.dirfd(), nullptr);
  reg.scan();
  reg.publish();
  REQUIRE(reg.store().load()->processes.size() == 1);
  // Counted on after that State, then the owner truncates its file: the daemon's next read
  // faults, and what it keeps of the process is what it last published.
  dev.alloc_count.store(7);
  REQUIRE(::truncate(r.path.c_str(), 100) == 0);
  reg.publish();
  const auto st = reg.store().load();
  CHECK(st->processes.empty());
  REQUIRE(st->retired);
  REQUIRE(st->retired->by_gpu.size() == 1);
  const auto& [k, row] = *st->retired->by_gpu.begin();
  CHECK(k.uuid == uuid_for(0x20));
  CHECK(k.job == "etl");
  CHECK(row.values[static_cast<std::size_t>(cuw::counters::Id::alloc_count)] == 5);
  CHECK(row.values[static_cast<std::size_t>(cuw::counters::Id::refusals)] == 2);
  CHECK(row.values[static_cast<std::size_t>(cuw::counters::Id::used)] == 0);  // a gauge is not summed
}

TEST_CASE("daemon.model_a_ring_found_is_drained_before_its_first_site_sample") {
  ModelRun m;
  const std::string& run = m.run;
  Child child;
  const uint64_t start = child.start_time();
  FakeRing r(run, child.pid, start, 1024);
  r.device(0, 0x20).limit.store(ring::kNoLimit);
  // The live table beside the ring, as the interposer keeps it; one allocation and its event,
  // written before the daemon looks.
  cuw::core::LiveSegment seg;
  REQUIRE(seg.open(run, static_cast<uint32_t>(child.pid), getuid(), start, r.h->created_ns, 0, false));
  cuw::core::LiveTable table;
  table.attach(&seg, cuw::live::Table::device);
  REQUIRE(table.insert(0x7f0000100000, cuw::core::LiveRecord{1 * kMiB, 0, 1, 0, 0}));
  REQUIRE(r.push(ring::EventKind::alloc, ring::Api::cuMemAlloc, 0, 1 * kMiB, 0x7f0000100000, 1 * kMiB));

  cuw::daemon::RegistryOptions o = m.options();
  o.sample_every_ns = 1;  // a sample at every scan
  cuw::daemon::Registry reg(o, m.dirfd(), nullptr);
  // The samples as the State has them: "MiB x allocations" of the one call site.
  using Samples = std::vector<std::string>;
  auto samples = [&] {
    reg.publish();
    const auto st = reg.store().load();
    Samples out;
    REQUIRE(st->processes.size() == 1);
    REQUIRE(st->processes[0].samples);
    for (const auto& s : *st->processes[0].samples) {
      REQUIRE(s->allocations.size() == 1);
      out.push_back(std::to_string(s->allocations[0].bytes / kMiB) + "x" + std::to_string(s->allocations[0].count));
    }
    return out;
  };

  reg.scan();  // found: its event drained, then its first sample taken
  CHECK(samples() == Samples{"1x1"});
  CHECK(reg.store().load()->processes[0].events_received == 1);
  // A record changed without an event shows whether the table is read: with no event
  // drained or dropped since the first sample, the sample stands again.
  REQUIRE(table.insert(0x7f0000300000, cuw::core::LiveRecord{2 * kMiB, 0, 1, 0, 0}));
  while (reg.drain_all() == cuw::daemon::Registry::DrainPace::again) {
  }
  reg.scan();
  CHECK(samples() == Samples{"1x1", "1x1"});
  // An event drained since: the table is read again.
  REQUIRE(r.push(ring::EventKind::alloc, ring::Api::cuMemAlloc, 0, 2 * kMiB, 0x7f0000300000, 3 * kMiB));
  while (reg.drain_all() == cuw::daemon::Registry::DrainPace::again) {
  }
  reg.scan();
  CHECK(samples() == Samples{"1x1", "1x1", "3x2"});
  // So is one the ring had no room for (counted as dropped, never drained).
  REQUIRE(table.take(0x7f0000100000, nullptr));
  r.h->events_dropped.fetch_add(1);
  reg.scan();
  CHECK(samples() == Samples{"1x1", "1x1", "3x2", "2x1"});
  // The newest kSamplesKept are kept.
  for (std::size_t i = 0; i < cuw::daemon::kSamplesKept; ++i) reg.scan();
  CHECK(samples() == Samples(cuw::daemon::kSamplesKept, "2x1"));
}

TEST_CASE("daemon.model_one_uid_tracks_at_most_its_rings_and_states_share_the_retired_counters") {
  ModelRun m;
  Child a, b, c;
  FakeRing ra(m.run, a.pid, a.start_time(), 64, "a", "ja");
  FakeRing rb(m.run, b.pid, b.start_time(), 64, "b", "jb");
  FakeRing rc(m.run, c.pid, c.start_time(), 64, "c", "jc");
  for (FakeRing* r : {&ra, &rb, &rc}) r->device(0, 0x20).alloc_count.store(1);
  cuw::daemon::RegistryOptions o = m.options();
  o.max_rings_per_uid = 2;
  cuw::daemon::Registry reg(o, m.dirfd(), nullptr);
  reg.scan();
  reg.publish();
  auto st = reg.store().load();
  CHECK(st->processes.size() == 2);  // the third waits, reported as a problem once past its grace
  CHECK(reg.process_count() == 2);

  // One process goes: its counters are retired once, then shared by every State after.
  const std::string first = st->processes[0].file_name;
  const uint32_t gone = st->processes[0].pid;
  (gone == static_cast<uint32_t>(a.pid) ? a : gone == static_cast<uint32_t>(b.pid) ? b : c).kill_and_reap();
  REQUIRE(wait_until([&] {
    reg.scan();
    reg.publish();
    st = reg.store().load();
    return std::any_of(st->processes.begin(), st->processes.end(),
                       [&](const auto& p) { return p.file_name == first && p.exited; });
  }));
  CHECK(reg.remove_exited() == 1);
  reg.publish();
  const auto s1 = reg.store().load();
  REQUIRE(s1->retired);
  CHECK(s1->retired->by_gpu.size() == 1);
  reg.publish();
  CHECK(reg.store().load()->retired == s1->retired);  // nothing retired since: the same copy
  // The freed place goes to the ring that waited.
  reg.scan();
  CHECK(reg.process_count() == 2);
}

TEST_CASE("daemon.model_one_uid_s_made_up_gpus_crowd_out_no_other_uid_s_gpu_or_its_history") {
  // Without NVML a GPU is whatever the rings name, and any user writes rings: uid A's 8
  // running processes name 16 made-up GPUs each, and a new set every second; uid B's one
  // process uses one GPU (its ring's name sorts last).
  constexpr uint32_t kA = 50001, kB = 50002, kBGpu = 0xb0b;
  const std::string b_gpu = hand_uuid(kBGpu);
  const auto state = [&](uint32_t second, bool b_runs) {
    cuw::daemon::State st;
    st.time_ns = (1'700'000'000ULL + second) * 1'000'000'000ULL;
    for (uint32_t i = 0; i < 8; ++i) {
      std::vector<uint32_t> gpus;
      for (uint32_t d = 0; d < 16; ++d) gpus.push_back(1000 * (second + 1) + 16 * i + d);
      st.processes.push_back(hand_process(kA, 100000 + i, gpus));
    }
    if (b_runs) st.processes.push_back(hand_process(kB, 999999, {kBGpu}));
    return st;
  };
  const auto count_of = [](const std::vector<cuw::daemon::GpuRow>& rows, uint32_t uid) {
    return std::count_if(rows.begin(), rows.end(), [&](const auto& r) { return r.uids == std::vector<uint32_t>{uid}; });
  };

  // B's GPU is a row; A's rings make at most their share of rows, and A is named as over it.
  std::set<uint32_t> over;
  const auto rows = cuw::daemon::gpu_rows(state(0, true), &over);
  CHECK(std::any_of(rows.begin(), rows.end(), [&](const auto& r) { return r.uuid == b_gpu; }));
  CHECK(count_of(rows, kA) == static_cast<std::ptrdiff_t>(cuw::daemon::kMaxRingGpusPerUid));
  CHECK(count_of(rows, kB) == 1);
  CHECK(over == std::set<uint32_t>{kA});

  // B's GPU has a history, and keeps it once B's process is gone while A goes on naming new
  // GPUs for 40 s (640 of them, past the 256 GPUs the history keeps in all).
  cuw::daemon::SeriesStore series;
  series.record(state(0, true));
  for (uint32_t t = 1; t <= 40; ++t) series.record(state(t, false));
  const auto h = series.copy(false, std::nullopt);
  REQUIRE(h);
  CHECK(std::any_of(h->gpus.begin(), h->gpus.end(), [&](const auto& g) { return g.uuid == b_gpu; }));
  CHECK(h->gpus.size() <= cuw::daemon::kMaxRingGpusPerUid + 1);
}
