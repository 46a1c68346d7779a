// cuwarden daemon transport: the HTTP server, read only, on its own thread.
//
// Non-blocking and poll-driven like the unix-socket server, not a thread per connection:
// a client that sends its request a byte at a time, never reads its reply, or opens
// thousands of connections holds a buffer and a slot here, never a thread, so the daemon's
// other clients are still served. Each connection has a bounded head, a deadline to send it,
// an idle deadline between keep-alive requests and a write deadline; past the connection
// cap the longest idle keep-alive connection is closed, else the oldest one still sending
// its head after a second (a slow client's), else the new one gets a 503 that says so. Event streams are capped the same way. Requests that may take
// long (snapshots: symbolizing) run on a few worker threads, past which they get a 503.
#pragma once

#include <poll.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "commands/feed.hpp"
#include "transports/http_request.hpp"

namespace cuw::daemon {

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  ///< extra ones
  /// Open an event stream: the head goes now, then what the stream source produces for
  /// `cursor`, until the client goes or falls behind.
  bool stream = false;
  StreamCursor cursor;
};

class HttpServer {
 public:
  struct Limits {
    std::size_t max_connections = 256;
    std::size_t max_streams = 16;
    std::size_t max_head = 8192;                  ///< request line and headers, bytes (431 past it)
    uint64_t head_timeout_ns = 5'000'000'000;     ///< to send a whole request head
    uint64_t idle_timeout_ns = 30'000'000'000;    ///< between requests on a kept-alive connection
    uint64_t write_timeout_ns = 30'000'000'000;   ///< with no byte of a reply taken by the client
    std::size_t max_unsent = 256u << 20;          ///< reply bytes waiting for all clients together (503 past it)
    std::size_t max_stream_backlog = 8u << 20;    ///< unsent stream bytes before the client is dropped
    std::size_t max_workers = 2;                  ///< slow requests at once (503 past it)
    uint64_t keepalive_comment_ns = 15'000'000'000;  ///< ": keep-alive" on a quiet stream
    uint64_t tick_ns = 100'000'000;               ///< how often streams are fed
    std::vector<std::string> host_names;          ///< Host names served besides addresses and localhost (--http-host)
  };
  /// Answers a request (any thread: worker threads call it for slow requests).
  using Handler = std::function<HttpResponse(const HttpRequest&)>;
  /// True when a request should run on a worker thread.
  using SlowTest = std::function<bool(const HttpRequest&)>;
  /// Bytes to append to a stream for `cursor`, moving it on (the server's thread only).
  using StreamSource = std::function<std::string(StreamCursor& cursor, uint64_t mono_now)>;

  HttpServer(Handler handler, SlowTest slow, StreamSource source, Limits limits);
  HttpServer(Handler handler, SlowTest slow, StreamSource source) : HttpServer(handler, slow, source, Limits{}) {}
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  /// Listen on `address`: "HOST:PORT" with a numeric IPv4 host, "[IPv6]:PORT", or
  /// "localhost:PORT"; PORT 0 picks a free one (port() says which). False with *error.
  bool listen(const std::string& address, std::string* error);
  /// The bound port (after listen).
  uint16_t port() const noexcept { return port_; }
  /// Whether the bound address is a loopback one.
  bool loopback() const noexcept { return loopback_; }
  /// Serve until `stop_fd` is readable. Throws on a failing poll().
  void run(int stop_fd);
  /// Event-stream clients now (any thread).
  std::size_t stream_count() const noexcept { return streams_.load(std::memory_order_relaxed); }

 private:
  enum class Phase { reading, working, writing, streaming };
  struct Conn {
    int fd = -1;
    Phase phase = Phase::reading;
    std::string in, out;
    std::size_t out_off = 0;
    uint64_t deadline = 0;
    bool idle = false;        ///< kept alive, waiting for a next request with nothing read
    bool keep_alive = false;  ///< after this reply
    bool dead = false;
    bool reparse = false;     ///< a pipelined request is waiting in `in`
    bool peer_closed = false; ///< the client shut its sending side: answer what it sent, then close
    uint64_t since = 0;       ///< monotonic ns its current request began (accept or first byte)
    StreamCursor cursor;
    uint64_t last_write_ns = 0;
  };
  struct Done {
    uint64_t id;
    bool head_only, keep_alive;
    HttpResponse response;
  };
  /// What worker threads share with the server, owned by both: a worker still blocked when
  /// the server goes (a snapshot's file that never answers) is left behind, not joined.
  struct WorkerShared {
    Handler handler;
    std::mutex mu;
    std::deque<Done> done;
    int wake_fd = -1;  ///< eventfd: a worker finished
    ~WorkerShared();
  };

  void accept_all(uint64_t now);
  void on_readable(uint64_t id, Conn& c, uint64_t now);
  void on_writable(Conn& c, uint64_t now);
  void try_parse(uint64_t id, Conn& c, uint64_t now);
  void respond(Conn& c, const HttpResponse& r, bool head_only, bool keep_alive, uint64_t now);
  void collect_done(uint64_t now);
  void feed_streams(uint64_t now);
  void close_conn(Conn& c);

  Handler handler_;
  SlowTest slow_;
  StreamSource source_;
  Limits lim_;
  int listen_fd_ = -1;
  uint64_t accept_paused_until_ = 0;  ///< out of descriptors: the listening socket rests a tick
  uint16_t port_ = 0;
  bool loopback_ = true;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Conn> conns_;
  std::atomic<std::size_t> streams_{0};
  std::size_t workers_busy_ = 0;
  std::map<uint64_t, std::thread> workers_;  ///< by connection id
  std::shared_ptr<WorkerShared> shared_ = std::make_shared<WorkerShared>();
  uint64_t next_feed_ = 0;
};

/// Reason phrase of an HTTP status ("OK", "Not Found", ...). Pure.
const char* http_reason(int status);

}  // namespace cuw::daemon
