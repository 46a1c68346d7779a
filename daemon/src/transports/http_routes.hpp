// cuwarden daemon transport: an HTTP request dispatched by its path (docs/http.md): the
// routes of the table of commands (commands/table.hpp), whose handlers answer them; the
// event stream's cursor; the dashboard's files.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "commands/backend.hpp"
#include "commands/feed.hpp"
#include "transports/http_server.hpp"

namespace cuw::daemon {

struct HttpApiOptions {
  std::string web_root;    ///< the dashboard's files ("" or missing: `/` says it is not installed)
  bool snapshots = false;  ///< serve /api/v1/processes/PID/snapshot (HTTP cannot tell who asks)
};

class HttpApi {
 public:
  /// `store`, `series` and `symbolize` must outlive the HttpApi; `symbolize` may be null
  /// (frames keep their addresses). It carries no privileged command.
  HttpApi(const StateStore* store, const SeriesStore* series, const SymbolizeOptions* symbolize, HttpApiOptions options)
      : backend_{store, {}, {}, symbolize, series}, opt_(std::move(options)), feed_(store) {}

  /// The answer to `req` (GET or HEAD; the server has refused the others). Never throws for
  /// bad input: 400/403/404 with a JSON error. Thread-safe.
  HttpResponse handle(const HttpRequest& req) const;
  /// Whether `req` may take long (its route is slow: a snapshot names its frames): the
  /// server runs it on a worker thread. Pure.
  static bool slow(const HttpRequest& req);
  /// The event stream's next bytes for `c` (EventFeed::next). The server's thread only.
  std::string feed(StreamCursor& c, uint64_t mono_now) { return feed_.next(c, mono_now); }

 private:
  HttpResponse static_file(const std::string& name) const;
  HttpResponse events(const HttpRequest& req) const;

  Backend backend_;  ///< read only: no refresh, no set_limit
  HttpApiOptions opt_;
  EventFeed feed_;
};

}  // namespace cuw::daemon
