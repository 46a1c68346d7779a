// cuwarden daemon: calls another thread makes on the loop thread (the model's writes), and
// waits for. The loop polls fd() and calls run_pending(); the caller blocks in call().
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

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
  std::mutex mu_;
  bool closed_ = false;
  std::deque<std::function<void()>> tasks_;
};

}  // namespace cuw::daemon
