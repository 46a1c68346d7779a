// cuwarden bench: what the hot path's building blocks cost on this machine, so that design
// choices (a clock read per event, a locked add per counter, an event record per pooled
// free) rest on measured numbers rather than folklore.
//
//   cuw_bench_primitives [--iters 2000000]
//
// cuwarden_event_clock is the interposer's event timestamp (fast_clock.hpp).
// Prints one JSON object: for each primitive the median over 15 rounds of the mean cost of
// one call in nanoseconds. CPU rows need nothing; driver rows (cuCtxGetCurrent,
// cuEventRecord, cuEventQuery, cuStreamQuery ...) need a GPU and are left out without one.
// Exit 0; 1 bad usage.
#include <cuda.h>
#include <time.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "driver_api.hpp"
#include "base/fast_clock.hpp"

namespace {

/// Median over rounds of the mean ns per call of `op` run `iters` times.
double measure(long iters, const std::function<void(long)>& op) {
  std::vector<double> rounds;
  for (int r = 0; r < 15; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    op(iters);
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    rounds.push_back(ns / static_cast<double>(iters));
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[rounds.size() / 2];
}

std::string row(const char* name, double ns) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "\"%s\":%.2f", name, ns);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  long iters = 2'000'000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) iters = std::atol(argv[++i]);
    else {
      std::fprintf(stderr, "usage: cuw_bench_primitives [--iters N]\n");
      return 1;
    }
  }
  std::vector<std::string> rows;
  volatile uint64_t sink = 0;
  auto clock_row = [&](const char* name, clockid_t id) {
    rows.push_back(row(name, measure(iters, [&](long n) {
      timespec ts;
      for (long k = 0; k < n; ++k) {
        clock_gettime(id, &ts);
        sink = sink + static_cast<uint64_t>(ts.tv_nsec);
      }
    })));
  };
  clock_row("clock_gettime_realtime", CLOCK_REALTIME);
  clock_row("clock_gettime_monotonic", CLOCK_MONOTONIC);
  clock_row("clock_gettime_realtime_coarse", CLOCK_REALTIME_COARSE);
  // The interposer's event clock (interposer/src/base/fast_clock.hpp): coarse (the default: the
  // vDSO's own clock_gettime, called directly), and fine once calibrated.
  const auto coarse_fn = cuw::fast_clock::detail::vdso_clock_gettime();
  rows.push_back(row("cuwarden_event_clock_coarse", measure(iters, [&](long n) {
    for (long k = 0; k < n; ++k) sink = sink + cuw::fast_clock::detail::coarse_ns(coarse_fn);
  })));
  // How far the coarse event clock is behind CLOCK_REALTIME: the largest gap seen over 200 ms
  // (ns; a tick or two, more while the kernel's ticks come late).
  {
    auto realtime = [](clockid_t id) {
      timespec t;
      clock_gettime(id, &t);
      return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
    };
    int64_t worst = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    while (std::chrono::steady_clock::now() < until)
      worst = std::max(worst, realtime(CLOCK_REALTIME) - realtime(CLOCK_REALTIME_COARSE));
    rows.push_back(row("coarse_clock_lag_max", static_cast<double>(worst)));
  }
  cuw::fast_clock::init(cuw::fast_clock::Mode::fine);
  {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(120);
    while (std::chrono::steady_clock::now() < until) sink = sink + cuw::fast_clock::realtime_ns();
  }
  rows.push_back(row("cuwarden_event_clock_fine", measure(iters, [&](long n) {
    for (long k = 0; k < n; ++k) sink = sink + cuw::fast_clock::realtime_ns();
  })));
#if defined(__x86_64__)
  rows.push_back(row("rdtsc", measure(iters, [&](long n) {
    for (long k = 0; k < n; ++k) sink = sink + __rdtsc();
  })));
  rows.push_back(row("rdtscp", measure(iters, [&](long n) {
    unsigned aux;
    for (long k = 0; k < n; ++k) sink = sink + __rdtscp(&aux);
  })));
#endif
  std::atomic<uint64_t> word{0};
  rows.push_back(row("atomic_fetch_add", measure(iters, [&](long n) {
    for (long k = 0; k < n; ++k) word.fetch_add(1, std::memory_order_relaxed);
  })));
  rows.push_back(row("atomic_cas", measure(iters, [&](long n) {
    for (long k = 0; k < n; ++k) {
      uint64_t v = word.load(std::memory_order_relaxed);
      word.compare_exchange_strong(v, v + 1, std::memory_order_relaxed);
    }
  })));
  rows.push_back(row("atomic_exchange", measure(iters, [&](long n) {
    for (long k = 0; k < n; ++k) sink = sink + word.exchange(static_cast<uint64_t>(k), std::memory_order_acquire);
  })));
  rows.push_back(row("plain_load_add_store", measure(iters, [&](long n) {
    for (long k = 0; k < n; ++k) word.store(word.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  })));
  std::mutex mu;
  rows.push_back(row("mutex_lock_unlock", measure(iters, [&](long n) {
    for (long k = 0; k < n; ++k) {
      mu.lock();
      mu.unlock();
    }
  })));

  cuw::bench::Driver drv;
  bool gpu = drv.open(0);
  if (gpu) {
    using ctx_fn = CUresult (*)(CUcontext*);
    using dev_fn = CUresult (*)(CUdevice*);
    using ev_create_fn = CUresult (*)(CUevent*, unsigned);
    using ev_record_fn = CUresult (*)(CUevent, CUstream);
    using ev_fn = CUresult (*)(CUevent);
    using st_create_fn = CUresult (*)(CUstream*, unsigned);
    using st_fn = CUresult (*)(CUstream);
    auto get_current = reinterpret_cast<ctx_fn>(dlsym(drv.lib, "cuCtxGetCurrent"));
    auto get_device = reinterpret_cast<dev_fn>(dlsym(drv.lib, "cuCtxGetDevice"));
    auto ev_create = reinterpret_cast<ev_create_fn>(dlsym(drv.lib, "cuEventCreate"));
    auto ev_record = reinterpret_cast<ev_record_fn>(dlsym(drv.lib, "cuEventRecord"));
    auto ev_query = reinterpret_cast<ev_fn>(dlsym(drv.lib, "cuEventQuery"));
    auto ev_sync = reinterpret_cast<ev_fn>(dlsym(drv.lib, "cuEventSynchronize"));
    auto st_create = reinterpret_cast<st_create_fn>(dlsym(drv.lib, "cuStreamCreate"));
    auto st_query = reinterpret_cast<st_fn>(dlsym(drv.lib, "cuStreamQuery"));
    auto ctx_sync = reinterpret_cast<CUresult (*)()>(dlsym(drv.lib, "cuCtxSynchronize"));
    const long few = std::max<long>(iters / 20, 1000);
    rows.push_back(row("cuCtxGetCurrent", measure(iters, [&](long n) {
      CUcontext c;
      for (long k = 0; k < n; ++k) get_current(&c);
    })));
    rows.push_back(row("cuCtxGetDevice", measure(iters, [&](long n) {
      CUdevice d;
      for (long k = 0; k < n; ++k) get_device(&d);
    })));
    CUevent ev = nullptr;
    ev_create(&ev, CU_EVENT_DISABLE_TIMING);
    CUstream nb = nullptr;
    st_create(&nb, CU_STREAM_NON_BLOCKING);
    rows.push_back(row("cuEventRecord_legacy", measure(few, [&](long n) {
      for (long k = 0; k < n; ++k) ev_record(ev, CU_STREAM_LEGACY);
    })));
    ctx_sync();
    rows.push_back(row("cuEventRecord_nonblocking", measure(few, [&](long n) {
      for (long k = 0; k < n; ++k) ev_record(ev, nb);
    })));
    ctx_sync();
    rows.push_back(row("cuEventRecord_then_query", measure(few, [&](long n) {
      for (long k = 0; k < n; ++k) {
        ev_record(ev, CU_STREAM_LEGACY);
        sink = sink + static_cast<uint64_t>(ev_query(ev));
      }
    })));
    ctx_sync();
    ev_sync(ev);
    rows.push_back(row("cuEventQuery_completed", measure(iters / 4, [&](long n) {
      for (long k = 0; k < n; ++k) sink = sink + static_cast<uint64_t>(ev_query(ev));
    })));
    rows.push_back(row("cuStreamQuery_legacy_idle", measure(iters / 4, [&](long n) {
      for (long k = 0; k < n; ++k) sink = sink + static_cast<uint64_t>(st_query(CU_STREAM_LEGACY));
    })));
    rows.push_back(row("cuStreamQuery_nonblocking_idle", measure(iters / 4, [&](long n) {
      for (long k = 0; k < n; ++k) sink = sink + static_cast<uint64_t>(st_query(nb));
    })));
    rows.push_back(row("cuCtxSynchronize_idle", measure(few, [&](long n) {
      for (long k = 0; k < n; ++k) ctx_sync();
    })));
  }
  std::printf("{\"program\":\"cuw_bench_primitives\",\"gpu\":%s,\"iters\":%ld", gpu ? "true" : "false", iters);
  for (const std::string& r : rows) std::printf(",%s", r.c_str());
  std::printf("}\n");
  return 0;
}
