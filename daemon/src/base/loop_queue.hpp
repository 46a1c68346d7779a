// cuwarden daemon: calls another thread makes on the loop thread (the model's writes), and
// waits for. The loop polls fd() and calls run_pending(); the caller blocks in call().
// SharedLoopCall: one run on the loop thread for every caller that waited for it together
// (queries that each need a State published after they came share one publish).
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <stdexcept>
#include <utility>

namespace cuw::daemon {

class LoopQueue {
 public:
  LoopQueue() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (fd_ < 0) throw std::runtime_error("eventfd failed");
  }
  ~LoopQueue() {
    close_queue();
    ::close(fd_);
  }
  LoopQueue(const LoopQueue&) = delete;
  LoopQueue& operator=(const LoopQueue&) = delete;

  /// Readable when calls wait: the loop thread polls it.
  int fd() const noexcept { return fd_; }

  /// Run `f` on the loop thread and return its result, or rethrow what it threw. Blocks the
  /// calling thread until then. Throws std::runtime_error once the queue is closed. Any
  /// thread but the loop's (which would wait for itself).
  template <class F>
  auto call(F&& f) -> decltype(f()) {
    std::packaged_task<decltype(f())()> task(std::forward<F>(f));
    auto result = task.get_future();
    {
      std::lock_guard<std::mutex> g(mu_);
      if (closed_) throw std::runtime_error("the daemon is stopping");
      tasks_.emplace_back([t = std::make_shared<decltype(task)>(std::move(task))] { (*t)(); });
    }
    const uint64_t one = 1;
    (void)!::write(fd_, &one, sizeof one);
    try {
      return result.get();
    } catch (const std::future_error&) {
      // close_queue() dropped the task unrun: its promise broke.
      throw std::runtime_error("the daemon is stopping");
    }
  }

  /// How many calls wait to be run. Any thread.
  std::size_t pending() const {
    std::lock_guard<std::mutex> g(mu_);
    return tasks_.size();
  }

  /// Run every waiting call, in order. Loop thread only.
  void run_pending() {
    uint64_t n;
    (void)!::read(fd_, &n, sizeof n);
    std::deque<std::function<void()>> now;
    {
      std::lock_guard<std::mutex> g(mu_);
      now.swap(tasks_);
    }
    for (auto& t : now) t();
  }

  /// Refuse further calls; calls still waiting fail with "the daemon is stopping" (their
  /// tasks are destroyed unrun, which breaks their promises). Any thread.
  void close_queue() {
    std::deque<std::function<void()>> dropped;
    {
      std::lock_guard<std::mutex> g(mu_);
      closed_ = true;
      dropped.swap(tasks_);
    }
  }

 private:
  int fd_;
  mutable std::mutex mu_;
  bool closed_ = false;
  std::deque<std::function<void()>> tasks_;
};

/// `f` run on the loop thread for callers who each need a run of it begun after they asked
/// (a query needs a State built after it came), where one run serves every caller waiting
/// at the time it begins: a burst of queries costs one publish, not one each. Callers still
/// queue through the LoopQueue, so the loop's other work keeps its order.
class SharedLoopCall {
 public:
  SharedLoopCall(LoopQueue& queue, std::function<void()> f) : queue_(queue), f_(std::move(f)) {}

  /// Returns once a run of `f` that began after this call was made has finished on the loop
  /// thread (this caller's or another's). Rethrows what `f` threw in the run this caller
  /// started; a caller served by another's run sees nothing of that run's failure. Throws
  /// std::runtime_error once the queue is closed. Any thread but the loop's.
  void call() {
    uint64_t asked;
    {
      std::lock_guard<std::mutex> g(mu_);
      asked = begun_;
    }
    // The loop thread runs one task at a time: a run begun after `asked` has also ended
    // by the time this task runs, and the mutex orders the caller's reads before it.
    queue_.call([this, asked] {
      {
        std::lock_guard<std::mutex> g(mu_);
        if (begun_ != asked) return;
        ++begun_;
      }
      f_();
    });
  }

 private:
  LoopQueue& queue_;
  std::function<void()> f_;
  std::mutex mu_;
  uint64_t begun_ = 0;  ///< runs of f_ begun
};

}  // namespace cuw::daemon
