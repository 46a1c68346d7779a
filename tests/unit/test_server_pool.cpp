// cuwarden unit tests: the unix-socket server's two lanes (daemon/src/transports/server.hpp),
// driven in-process on a temporary socket: a slow request waits in the pool without holding
// up fast ones, and a queued one whose client has gone is dropped without being run.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "cuw/protocol.hpp"
#include "transports/server.hpp"

namespace d = cuw::daemon;
namespace proto = cuw::proto;

namespace {

template <class F>
bool wait_for_pool(F&& pred, int ms = 10000) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return pred();
}

int connect_to(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

}  // namespace

TEST_CASE("server.a_queued_slow_request_whose_client_left_is_never_run") {
  char dir[] = "/tmp/cuwt-pool-XXXXXX";
  REQUIRE(mkdtemp(dir));
  const std::string path = std::string(dir) + "/s.sock";
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> slow_runs{0}, fast_runs{0};
  constexpr uint16_t kSlow = static_cast<uint16_t>(proto::Command::get_snapshot);
  d::Server::PoolLimits one_thread;
  one_thread.threads = 1;
  d::Server server(
      [&](const d::Peer&, uint16_t cmd, const std::string&) {
        if (cmd == kSlow) {
          ++slow_runs;
          std::unique_lock lock(mu);
          cv.wait(lock, [&] { return release; });
        } else {
          ++fast_runs;
        }
        return d::Server::Reply{static_cast<uint16_t>(cmd | proto::kReplyBit), "{}"};
      },
      [](uint16_t cmd) { return cmd == kSlow; }, one_thread);
  std::string error;
  REQUIRE(server.listen(path, &error));
  std::atomic<bool> stop{false};
  std::thread loop([&] {
    std::vector<pollfd> fds;
    while (!stop) {
      fds.clear();
      server.collect(fds);
      if (::poll(fds.data(), fds.size(), 20) > 0) server.dispatch(fds, 0);
    }
  });

  // A: a slow request that holds the pool's one thread.
  const int a = connect_to(path);
  REQUIRE(proto::send_message(a, proto::Command::get_snapshot, 1, "{}", 1000));
  REQUIRE(wait_for_pool([&] { return slow_runs == 1; }));
  // B: a slow request of the same user, queued behind A. A fast request answered after it was
  // sent shows B's was read (the server serves connections in the order they came).
  const int b = connect_to(path);
  REQUIRE(proto::send_message(b, proto::Command::get_snapshot, 1, "{}", 1000));
  auto fast = [&] {
    const int c = connect_to(path);
    REQUIRE(proto::send_message(c, proto::Command::get_state, 1, "{}", 1000));
    const bool answered = proto::recv_message(c, 2000).has_value();
    ::close(c);
    return answered;
  };
  CHECK(fast());  // answered at once while the pool is busy
  // B gives up and goes; a fast request after that shows the server saw it go.
  ::close(b);
  CHECK(fast());
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  CHECK(proto::recv_message(a, 5000).has_value());  // A is answered
  CHECK(wait_for_pool([&] { return server.dropped_unexecuted() == 1; }));
  CHECK(slow_runs == 1);  // B's was never run
  CHECK(fast_runs == 2);
  ::close(a);
  stop = true;
  loop.join();
  server.shutdown();
  ::rmdir(dir);
}
