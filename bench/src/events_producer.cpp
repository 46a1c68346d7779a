// cuwarden bench: a synthetic event producer for the event-pipeline benchmark.
//
// Creates a ring in the run directory exactly as the interposer does (same file name, same
// header, `ring::init`) and pushes events the way Tracker::emit does (CLOCK_REALTIME stamp,
// one ring::push), either as fast as it can (--rate 0) or paced to --rate events/s. With a
// daemon draining the run directory this measures the pipeline; without one it measures
// what a process loses (drops) and whether it slows down (it must not).
//
// Usage: cuw_bench_events --run-dir DIR [--seconds S] [--rate EV_PER_S] [--threads T]
//                         [--drain-wait-ms MS]
// stdout: one JSON line: target rate, threads, elapsed seconds, attempted, written, dropped,
//   attempt_rate (events/s the producer managed to offer), drained (events the consumer
//   took, read after waiting up to --drain-wait-ms for it to catch up), consumer_attached.
//
// Hold mode (a synthetic interposed process for the CLI-latency row, where real CUDA
// processes come up too slowly to reach 128):
//        cuw_bench_events --run-dir DIR --hold-used BYTES [--hold-limit BYTES] [--like RING]
// creates the ring the same way (pid = its own, comm/cmdline from /proc/self like the
// tracker), fills device slot 0 as the tracker does after one allocation of BYTES (used,
// peak, reserved, one live allocation, cap --hold-limit or none; uuid, name and physical
// memory copied from device slot 0 of RING, a real holder's ring, when given), pushes that
// allocation's event, prints "holding synthetic pid=<pid>" and sleeps until SIGTERM/SIGINT,
// then exits as the interposer does (ring marked exited; removed when no daemon reads it).
// Exit 0, or 1 on bad usage / a run directory that cannot hold the ring.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuw/paths.hpp"
#include "cuw/ring.hpp"

namespace ring = cuw::ring;

namespace {

uint64_t realtime_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t mono_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

struct Options {
  std::string run_dir;
  double seconds = 1.0;
  double rate = 0;  // events/s for the whole process; 0 = as fast as possible
  unsigned threads = 1;
  unsigned drain_wait_ms = 2000;
  // hold mode
  bool hold = false;
  uint64_t hold_used = 0;
  uint64_t hold_limit = ring::kNoLimit;
  std::string like;
};

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    char* end = nullptr;
    if (a == "--run-dir") {
      o.run_dir = v;
      continue;
    }
    if (a == "--like") {
      o.like = v;
      continue;
    }
    const double x = std::strtod(v, &end);
    if (!end || *end != '\0' || x < 0) return false;
    if (a == "--seconds") o.seconds = x;
    else if (a == "--rate") o.rate = x;
    else if (a == "--threads") o.threads = static_cast<unsigned>(x);
    else if (a == "--drain-wait-ms") o.drain_wait_ms = static_cast<unsigned>(x);
    else if (a == "--hold-used") o.hold = true, o.hold_used = static_cast<uint64_t>(x);
    else if (a == "--hold-limit") o.hold_limit = static_cast<uint64_t>(x);
    else return false;
  }
  return !o.run_dir.empty() && o.threads >= 1 && o.threads <= 256 && o.seconds > 0;
}

struct Ring {
  std::string path;
  ring::RingHeader* h = nullptr;
  ring::EventSlot* slots = nullptr;
  uint32_t slot_count = 0;
};

// /proc/self/<what> into `out` (cmdline: NULs become spaces), as the tracker reads it.
void read_self(const char* what, char* out, size_t cap, bool cmdline) {
  const std::string p = std::string("/proc/self/") + what;
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  const ssize_t n = ::read(fd, out, cap - 1);
  ::close(fd);
  if (n <= 0) return;
  size_t len = static_cast<size_t>(n);
  while (len > 0 && (out[len - 1] == '\n' || out[len - 1] == '\0')) --len;
  out[len] = '\0';
  if (cmdline)
    for (size_t i = 0; i < len; ++i)
      if (out[i] == '\0') out[i] = ' ';
}

// The ring file, as the interposer creates it (interposer/src/core/tracker.cpp: create_ring); `ring::init`
// (which publishes the magic) is left to the caller, after it filled the header.
bool create_ring(const std::string& run_dir, Ring& r) {
  r.slot_count = ring::kDefaultSlotCount;
  const uint64_t bytes = ring::file_size(r.slot_count);
  const uint32_t pid = static_cast<uint32_t>(getpid());
  const uint64_t start = cuw::paths::process_start_time(pid);
  r.path = run_dir + "/" + cuw::paths::ring_file_name(pid, start);
  int fd = ::open(r.path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0 || ::fchmod(fd, 0644) != 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    std::fprintf(stderr, "cuw_bench_events: cannot create %s: %s\n", r.path.c_str(), std::strerror(errno));
    if (fd >= 0) ::close(fd), ::unlink(r.path.c_str());
    return false;
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    std::fprintf(stderr, "cuw_bench_events: mmap: %s\n", std::strerror(errno));
    ::unlink(r.path.c_str());
    return false;
  }
  r.h = static_cast<ring::RingHeader*>(base);
  r.slots = reinterpret_cast<ring::EventSlot*>(static_cast<char*>(base) + ring::kHeaderBytes);
  r.h->pid = pid;
  r.h->uid = static_cast<uint32_t>(getuid());
  r.h->start_time = start;
  r.h->created_ns = realtime_ns();
  return true;
}

// Exit as the interposer does (Tracker::on_exit): mark the ring exited; remove it ourselves
// only when no daemon is reading (an attached daemon drains the rest and removes it).
void exit_ring(Ring& r) {
  r.h->exited_ns.store(realtime_ns(), std::memory_order_relaxed);
  r.h->state.store(static_cast<uint32_t>(ring::ProcessState::exited), std::memory_order_release);
  const uint64_t beat = r.h->consumer_heartbeat_ns.load(std::memory_order_relaxed);
  if (beat == 0 || realtime_ns() - beat > 5'000'000'000ULL) ::unlink(r.path.c_str());
}

// Hold mode: a synthetic interposed process holding one allocation of `hold_used` bytes.
int run_hold(const Options& o) {
  // Block the signals we wait for before anything else, so an early SIGTERM is not lost.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  ring::DeviceSlot like{};
  bool have_like = false;
  if (!o.like.empty()) {
    int fd = ::open(o.like.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      ring::RingHeader rh;
      if (::pread(fd, &rh, sizeof rh, 0) == static_cast<ssize_t>(sizeof rh) && rh.magic == ring::kMagic &&
          rh.devices[0].present.load(std::memory_order_relaxed) != 0) {
        std::memcpy(like.uuid, rh.devices[0].uuid, sizeof like.uuid);
        std::memcpy(like.name, rh.devices[0].name, sizeof like.name);
        like.name[sizeof like.name - 1] = '\0';
        like.physical_total = rh.devices[0].physical_total;
        have_like = true;
      }
      ::close(fd);
    }
    if (!have_like) std::fprintf(stderr, "cuw_bench_events: %s has no device slot 0 to copy\n", o.like.c_str());
  }

  Ring r;
  if (!create_ring(o.run_dir, r)) return 1;
  read_self("comm", r.h->comm, sizeof r.h->comm, false);
  read_self("cmdline", r.h->cmdline, sizeof r.h->cmdline, true);
  std::snprintf(r.h->pool, sizeof r.h->pool, "off");
  r.h->state.store(static_cast<uint32_t>(ring::ProcessState::running), std::memory_order_relaxed);
  ring::init(*r.h, r.slots, r.slot_count);  // publishes the magic last

  // Device slot 0, as Tracker::fill_device (on the first call) and one successful charge
  // leave it.
  ring::DeviceSlot& d = r.h->devices[0];
  if (have_like) {
    std::memcpy(d.uuid, like.uuid, sizeof d.uuid);
    std::memcpy(d.name, like.name, sizeof d.name);
    d.physical_total = like.physical_total;
  } else {
    std::snprintf(d.name, sizeof d.name, "synthetic");
  }
  d.ordinal = 0;
  d.limit.store(o.hold_limit, std::memory_order_relaxed);
  d.used.store(o.hold_used, std::memory_order_relaxed);
  d.peak.store(o.hold_used, std::memory_order_relaxed);
  d.reserved.store(o.hold_used, std::memory_order_relaxed);
  d.live_allocations.store(o.hold_used ? 1 : 0, std::memory_order_relaxed);
  d.alloc_count.store(o.hold_used ? 1 : 0, std::memory_order_relaxed);
  r.h->device_count.store(1, std::memory_order_relaxed);
  d.present.store(1, std::memory_order_release);

  if (o.hold_used) {  // the allocation's event, as Tracker::emit writes it
    ring::Event e;
    e.time_ns = realtime_ns();
    e.address = 0x7f0000000000;
    e.bytes = o.hold_used;
    e.tid = static_cast<uint32_t>(syscall(SYS_gettid));
    e.api = static_cast<uint16_t>(ring::Api::cuMemAlloc);
    e.kind = static_cast<uint8_t>(ring::EventKind::alloc);
    e.device = 0;
    e.used_after = o.hold_used;
    ring::push(*r.h, r.slots, r.slot_count, e);
  }
  std::printf("holding synthetic pid=%d bytes=%llu\n", static_cast<int>(getpid()),
              static_cast<unsigned long long>(o.hold_used));
  std::fflush(stdout);

  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  exit_ring(r);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) {
    std::fprintf(stderr,
                 "usage: cuw_bench_events --run-dir DIR [--seconds S] [--rate EV_PER_S] [--threads T] "
                 "[--drain-wait-ms MS]\n"
                 "       cuw_bench_events --run-dir DIR --hold-used BYTES [--hold-limit BYTES] [--like RING]\n");
    return 1;
  }
  if (o.hold) return run_hold(o);

  Ring r;
  if (!create_ring(o.run_dir, r)) return 1;
  auto* h = r.h;
  auto* slots = r.slots;
  const uint32_t slot_count = r.slot_count;
  std::snprintf(h->comm, sizeof h->comm, "cuw_bench_events");
  std::snprintf(h->cmdline, sizeof h->cmdline, "cuw_bench_events --rate %.0f --threads %u", o.rate, o.threads);
  std::snprintf(h->pool, sizeof h->pool, "off");
  h->state.store(static_cast<uint32_t>(ring::ProcessState::running), std::memory_order_relaxed);
  ring::init(*h, slots, slot_count);

  // Give a daemon time to discover the ring (inotify: immediate; rescans: 1 s) so the
  // measurement does not start with nobody draining.
  const uint64_t attach_deadline = mono_ns() + 1500ULL * 1000000;
  while (h->consumer_heartbeat_ns.load(std::memory_order_relaxed) == 0 && mono_ns() < attach_deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const bool attached_before = h->consumer_heartbeat_ns.load(std::memory_order_relaxed) != 0;

  std::atomic<uint64_t> attempted{0};
  const double per_thread_rate = o.rate / o.threads;
  const uint64_t t0 = mono_ns();
  const uint64_t t_end = t0 + static_cast<uint64_t>(o.seconds * 1e9);
  auto producer = [&] {
    ring::Event e;
    e.address = 0x7f0000000000;
    e.bytes = 4096;
    e.tid = static_cast<uint32_t>(syscall(SYS_gettid));
    e.api = static_cast<uint16_t>(ring::Api::cuMemAlloc);
    e.device = 0;
    uint64_t n = 0;
    constexpr uint64_t kBatch = 64;  // pacing granularity: the clock is read once per batch
    for (;;) {
      const uint64_t now = mono_ns();
      if (now >= t_end) break;
      if (per_thread_rate > 0) {
        const double allowed = per_thread_rate * static_cast<double>(now - t0) * 1e-9;
        if (static_cast<double>(n) >= allowed) continue;  // ahead of schedule: spin
      }
      for (uint64_t i = 0; i < kBatch; ++i, ++n) {
        e.time_ns = realtime_ns();
        e.kind = static_cast<uint8_t>((n & 1) ? ring::EventKind::free : ring::EventKind::alloc);
        ring::push(*h, slots, slot_count, e);
      }
    }
    attempted.fetch_add(n, std::memory_order_relaxed);
  };
  std::vector<std::thread> threads;
  for (unsigned i = 1; i < o.threads; ++i) threads.emplace_back(producer);
  producer();
  for (auto& t : threads) t.join();
  const double elapsed = static_cast<double>(mono_ns() - t0) * 1e-9;

  // Let the consumer catch up, then read what it took.
  const uint64_t written = h->write_pos.load(std::memory_order_acquire);
  const uint64_t wait_deadline = mono_ns() + uint64_t{o.drain_wait_ms} * 1000000;
  while (h->read_pos.load(std::memory_order_acquire) < h->write_pos.load(std::memory_order_acquire) &&
         mono_ns() < wait_deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const uint64_t drained = h->read_pos.load(std::memory_order_acquire);
  const uint64_t dropped = h->events_dropped.load(std::memory_order_acquire);
  const bool attached = h->consumer_heartbeat_ns.load(std::memory_order_relaxed) != 0;

  std::printf(
      "{\"program\":\"cuw_bench_events\",\"rate_target\":%.0f,\"threads\":%u,\"seconds\":%.4f,"
      "\"attempted\":%llu,\"written\":%llu,\"dropped\":%llu,\"attempt_rate\":%.0f,\"written_rate\":%.0f,"
      "\"drained\":%llu,\"consumer_attached\":%s,\"consumer_attached_at_start\":%s}\n",
      o.rate, o.threads, elapsed, static_cast<unsigned long long>(attempted.load()),
      static_cast<unsigned long long>(written), static_cast<unsigned long long>(dropped),
      static_cast<double>(attempted.load()) / elapsed, static_cast<double>(written) / elapsed,
      static_cast<unsigned long long>(drained), attached ? "true" : "false", attached_before ? "true" : "false");
  std::fflush(stdout);

  // Exit as the interposer does: mark the ring exited; remove it ourselves only when no
  // daemon is reading (an attached daemon drains the rest and removes it).
  h->exited_ns.store(realtime_ns(), std::memory_order_relaxed);
  h->state.store(static_cast<uint32_t>(ring::ProcessState::exited), std::memory_order_release);
  if (!attached) ::unlink(r.path.c_str());
  return 0;
}
