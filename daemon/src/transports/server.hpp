// cuwarden daemon: the unix-socket server, non-blocking, driven by the daemon's poll loop.
//
// Framing is cuw::proto's (16-byte header + JSON body), parsed here incrementally because
// proto::recv_message blocks: one slow or garbage client must never stall the loop. Each
// connection gets a bounded request size and a deadline; bad framing closes it.
//
// Two lanes: most requests (limits, state, events) are answered on the socket's thread at
// once; those that may take seconds (snapshots and out-of-memory reports, which name frames
// in a worker process) go to a small pool of threads, at most PoolLimits::per_uid of one user
// at once, so that no request of theirs holds up a `cuwarden limit`. A queued request whose
// client has gone by the time a pool thread takes it is dropped unexecuted.
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/peer.hpp"

namespace cuw::daemon {

class Server {
 public:
  /// Reply to one request: the command word to send back (proto::Command | kReplyBit, or
  /// proto::Command::error) and the JSON body.
  struct Reply {
    uint16_t command;
    std::string body;
  };
  /// Called once per request with the connection's peer credentials (see Peer).
  using Handler = std::function<Reply(const Peer& peer, uint16_t command, const std::string& body)>;

  static constexpr uint32_t kMaxRequestBody = 64 * 1024;  ///< requests are small JSON objects
  static constexpr std::size_t kMaxConnections = 256;  ///< beyond: the longest idle one is closed
  static constexpr uint64_t kRequestTimeoutNs = 5'000'000'000;   ///< to send a whole request
  static constexpr uint64_t kReplyTimeoutNs = 30'000'000'000;    ///< to read a whole reply

  /// Whether a command goes to the pool (may take long) rather than being answered at once.
  using SlowTest = std::function<bool(uint16_t command)>;
  struct PoolLimits {
    std::size_t threads = 4;   ///< pool threads
    std::size_t per_uid = 2;   ///< slow requests of one uid in flight (queued or running); past it: "busy"
    std::size_t in_flight = 64;  ///< slow requests in flight in all; past it: "busy"
  };

  /// `slow` empty: every request is answered on the calling thread (tests, fuzzers).
  Server(Handler handler, SlowTest slow, PoolLimits pool);
  explicit Server(Handler handler, SlowTest slow = {});
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// The previous release's clients (its CLI, its interposer's check for a daemon) look for
  /// the daemon at `run_dir`/cuwardend.sock. Where that is not `socket_path` (this daemon's),
  /// a server listening there that answers every request, privileged or not, with an error
  /// saying where the daemon (release `version`) is now, so that they do not say "no daemon
  /// is running". Null when the name is this daemon's or cannot be had (said once in the log:
  /// it is a courtesy, never a reason not to start). Cold path.
  static std::unique_ptr<Server> for_previous_release(const std::string& run_dir, const std::string& socket_path,
                                                      const std::string& version);

  /// Bind `path` (mode 0666). Refuses when another daemon answers there; removes a stale
  /// socket file that nothing answers on; refuses to remove anything but a socket.
  bool listen(const std::string& path, std::string* error);

  /// Append the listening socket and every connection to `fds`.
  void collect(std::vector<pollfd>& fds) const;
  /// Act on the revents of the entries collect() appended, starting at fds[first].
  void dispatch(const std::vector<pollfd>& fds, std::size_t first);
  /// Close connections past their deadline.
  void expire(uint64_t mono_now);
  /// Close everything and remove the socket file if it still is ours.
  void shutdown();

  std::size_t connection_count() const noexcept { return conns_.size(); }
  /// Slow requests dropped because their client went before a pool thread took them. Any
  /// thread.
  uint64_t dropped_unexecuted() const noexcept { return dropped_.load(std::memory_order_relaxed); }

 private:
  struct Pool;
  struct Conn {
    uint64_t id = 0;
    bool working = false;  ///< its request is in the pool: nothing read or sent until it returns
    std::shared_ptr<bool> gone;  ///< set (under the pool's lock) when the client went meanwhile
    int fd = -1;
    Peer peer;
    std::string in;
    std::string out;
    std::size_t out_off = 0;
    uint64_t deadline = 0;
    bool close_after_write = false;
    bool dead = false;
  };
  void accept_all();
  void on_readable(Conn& c);
  void on_writable(Conn& c);
  void process(Conn& c);
  void queue(Conn& c, uint16_t command, uint32_t seq, const std::string& body);
  void collect_done();
  void forget(Conn& c);

  Handler handler_;
  int listen_fd_ = -1;
  std::string path_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  std::vector<Conn> conns_;
  uint64_t evictions_ = 0;  ///< connections closed or refused because of kMaxConnections
  SlowTest slow_;
  PoolLimits limits_;
  std::unique_ptr<Pool> pool_;  ///< null without a SlowTest
  uint64_t next_id_ = 1;
  std::size_t in_flight_ = 0;
  std::map<uint32_t, std::size_t> in_flight_by_uid_;
  std::atomic<uint64_t> dropped_{0};
};

/// The socket thread's loop: serve `server` (and `previous`, the previous release's socket,
/// when not null) until `stop_fd` is readable. Throws what the server throws (the caller
/// stops the daemon). Blocks; one thread.
void serve_until(Server& server, Server* previous, int stop_fd);

}  // namespace cuw::daemon
