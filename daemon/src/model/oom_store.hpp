// cuwarden daemon model: out-of-memory reports kept on disk, so that a restarted daemon (an
// upgrade, a crash, kill -9) still shows them.
//
// Each report, named and with its snapshot, is one file `<state dir>/oom/oom-<ns>-<pid>.json`,
// written when it is taken (a temporary file, fsync, rename, fsync of the directory): a
// report is there whole or not at all. The newest kMaxReports files, at most kMaxBytes in
// all, are kept. At start they are read back as untrusted input (anyone who could write the
// directory could have put anything there; the directory is root's, mode 0700, but a disk
// fills up and files get cut): size, nesting depth, every type and every length is checked,
// and a file that fails is skipped and said once (tests/fuzz/fuzz_oom_store.cpp fuzzes the
// reader).
//
// OomKeeper names a taken report's frames (symbolize_worker.hpp) and saves it on a thread of
// its own, so that the loop thread that takes reports never waits for a worker or a disk.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "model/state.hpp"
#include "model/symbolize_worker.hpp"

namespace cuw::daemon {

/// `r` as the JSON text a report file holds. Pure.
std::string oom_report_file_text(const OomReport& r);

/// A report from a file's text (untrusted). Nullopt, with *why, when the text is not one.
/// Bounded: at most kMaxFileBytes of text, nesting depth 8, each string cut at 4096 bytes,
/// each list at a bound of its own. Pure; never throws.
std::optional<OomReport> parse_oom_report_file(std::string_view text, std::string* why);

class OomStore {
 public:
  static constexpr std::size_t kMaxReports = 64;
  static constexpr uint64_t kMaxBytes = 64ULL << 20;
  static constexpr uint64_t kMaxFileBytes = 16ULL << 20;

  /// Reports in `dir`/oom. Nothing is touched until open().
  explicit OomStore(std::string dir) : dir_(std::move(dir)) {}
  ~OomStore();
  OomStore(const OomStore&) = delete;
  OomStore& operator=(const OomStore&) = delete;

  /// Make (mode 0700) or check the state directory and its oom/ subdirectory: real
  /// directories, not links, owned by this process's user; their mode is set to 0700. The
  /// state directory is locked (flock) while this store lives: one daemon per directory.
  /// False with *error when they cannot be used or another process holds the lock.
  bool open(std::string* error);
  /// The reports on disk, oldest first (the newest kMaxReports); files that are not reports
  /// are skipped, and named in *skipped. After open().
  std::vector<std::shared_ptr<const OomReport>> load(std::vector<std::string>* skipped);
  /// Write `r` (temporary file, fsync, rename, fsync of the directory), then remove the
  /// oldest files past kMaxReports or kMaxBytes. False with *error. After open(); one
  /// thread at a time.
  bool save(const OomReport& r, std::string* error);

  const std::string& dir() const noexcept { return dir_; }

 private:
  std::string dir_;
  int fd_ = -1;      ///< the oom/ subdirectory
  int top_fd_ = -1;  ///< the state directory, locked
};

/// Names and saves reports off the loop thread: submit() queues a report as taken; the
/// keeper's thread symbolizes a copy, saves it to `store` (may be null: not saved), and hands
/// both to `done` (on the keeper's thread), which puts the named one in the report's place.
/// At most kMaxQueued wait; past that a report is neither named nor saved here and stays as
/// taken (named when asked). Thread-safe.
class OomKeeper {
 public:
  static constexpr std::size_t kMaxQueued = 64;
  using Done = std::function<void(const std::shared_ptr<const OomReport>& taken,
                                  std::shared_ptr<const OomReport> named)>;

  OomKeeper(OomStore* store, const SymbolizeOptions* symbolize, Done done);
  ~OomKeeper();  ///< finishes the report in hand (at most the symbolize deadline), drops the rest
  OomKeeper(const OomKeeper&) = delete;
  OomKeeper& operator=(const OomKeeper&) = delete;

  void submit(std::shared_ptr<const OomReport> taken);

 private:
  void run();
  OomStore* store_;
  const SymbolizeOptions* symbolize_;
  Done done_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<const OomReport>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace cuw::daemon
