// cuwarden daemon transport: what each HTTP path answers (docs/http.md), from the published
// State and the history; and the event stream's content.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/series.hpp"
#include "model/state.hpp"
#include "model/symbolize_worker.hpp"
#include "transports/http_server.hpp"

namespace cuw::daemon {

struct HttpApiOptions {
  std::string web_root;    ///< the dashboard's files ("" or missing: `/` says it is not installed)
  bool snapshots = false;  ///< serve /api/v1/processes/PID/snapshot (HTTP cannot tell who asks)
};

class HttpApi {
 public:
  /// `store`, `series` and `symbolize` must outlive the HttpApi; `symbolize` may be null
  /// (frames keep their addresses).
  HttpApi(const StateStore* store, const SeriesStore* series, const SymbolizeOptions* symbolize, HttpApiOptions options)
      : store_(store), series_(series), symbolize_(symbolize), opt_(std::move(options)) {}

  /// The answer to `req` (GET or HEAD; the server has refused the others). Never throws for
  /// bad input: 400/403/404 with a JSON error. Thread-safe.
  HttpResponse handle(const HttpRequest& req) const;
  /// Whether `req` may take long (a snapshot names its frames): the server runs it on a
  /// worker thread. Pure.
  static bool slow(const HttpRequest& req);
  /// The event stream's next bytes for `c`: memory events after c.last_seq (one process's
  /// with c.pid), and a state document when a newer State was published and a second has
  /// passed since the last one (c.state). The server's thread only (it caches the document
  /// of the newest State for all clients).
  std::string feed(StreamCursor& c, uint64_t mono_now);

 private:
  HttpResponse static_file(const std::string& name) const;
  HttpResponse history(const HttpRequest& req, std::optional<uint32_t> pid) const;
  HttpResponse snapshot(const HttpRequest& req, uint32_t pid) const;

  const StateStore* store_;
  const SeriesStore* series_;
  const SymbolizeOptions* symbolize_;
  HttpApiOptions opt_;
  uint64_t cached_generation_ = 0;  ///< feed()'s cache
  std::shared_ptr<const State> cached_state_;
  std::string cached_state_doc_;
};

}  // namespace cuw::daemon
