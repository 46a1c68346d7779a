// cuwarden unit tests: calls made on the daemon's loop thread (daemon/src/base/loop_queue.hpp),
// and SharedLoopCall's one run for the callers that waited for it together (the publish
// behind every query).
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "base/loop_queue.hpp"

namespace d = cuw::daemon;

namespace {

template <class F>
bool wait_for(F&& pred, int ms = 10000) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return pred();
}

}  // namespace

TEST_CASE("loop_queue_callers_waiting_together_share_one_run") {
  d::LoopQueue q;
  std::atomic<int> runs{0};
  d::SharedLoopCall publish(q, [&] { ++runs; });
  constexpr int kCallers = 8;
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) callers.emplace_back([&] { publish.call(); });
  REQUIRE(wait_for([&] { return q.pending() == kCallers; }));
  q.run_pending();  // the loop comes round once
  for (auto& t : callers) t.join();
  CHECK(runs == 1);
  // Each caller still got a run begun after it asked: the next one gets one of its own.
  std::thread later([&] { publish.call(); });
  REQUIRE(wait_for([&] { return q.pending() == 1; }));
  q.run_pending();
  later.join();
  CHECK(runs == 2);
}

TEST_CASE("loop_queue_a_caller_who_asks_during_a_run_gets_a_run_of_its_own") {
  // A run already under way may have read the rings before the caller's program wrote them.
  d::LoopQueue q;
  std::mutex m;
  std::condition_variable cv;
  bool in_run = false, go = false;
  std::atomic<int> runs{0};
  d::SharedLoopCall publish(q, [&] {
    std::unique_lock<std::mutex> lk(m);
    if (++runs == 1) {
      in_run = true;
      cv.notify_all();
      cv.wait(lk, [&] { return go; });
    }
  });
  std::thread first([&] { publish.call(); });
  REQUIRE(wait_for([&] { return q.pending() == 1; }));
  std::thread loop([&] { q.run_pending(); });
  {
    std::unique_lock<std::mutex> lk(m);
    REQUIRE(cv.wait_for(lk, std::chrono::seconds(10), [&] { return in_run; }));
  }
  std::thread second([&] { publish.call(); });
  REQUIRE(wait_for([&] { return q.pending() == 1; }));
  {
    std::lock_guard<std::mutex> g(m);
    go = true;
  }
  cv.notify_all();
  loop.join();
  first.join();
  q.run_pending();
  second.join();
  CHECK(runs == 2);
}
