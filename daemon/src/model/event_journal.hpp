// cuwarden daemon model: the event history across restarts.
//
// Every event a process's history gets (drained from its ring, or a limit change the daemon
// made) is also copied into a journal: a file of fixed size in the state directory, mapped,
// kJournalSlots events in a circle. A copy is a store into the mapping, no system call, so it
// costs the loop thread about what the history's own copy does; the kernel writes the pages
// back, and a daemon killed with SIGKILL loses nothing it had copied (a machine that loses
// power loses what was not yet written back: the history is a convenience, the counters are
// in the rings). A restarted daemon reads the journal back, as untrusted input, and gives each
// process it finds again (same pid and start time) its earlier events, numbered as before;
// new events are numbered after them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/history.hpp"

namespace cuw::daemon {

/// Events of each process (pid, start time) read back from a journal, oldest first.
using RestoredHistory = std::map<std::pair<uint32_t, uint64_t>, std::vector<StoredEvent>>;

class EventJournal {
 public:
  static constexpr uint64_t kJournalSlots = 1ULL << 18;  ///< 262,144 events, 20 MiB

  EventJournal() = default;
  ~EventJournal();
  EventJournal(const EventJournal&) = delete;
  EventJournal& operator=(const EventJournal&) = delete;

  /// Map `path` (mode 0600, made when missing; refused when a link or not a regular file, and
  /// started afresh when it is not a journal of this layout). False with *error.
  bool open(const std::string& path, std::string* error);
  /// What the journal held when opened: each process's events (seq increasing, at most
  /// kJournalSlots in all), and in *max_seq the highest seq. Checked as untrusted input: a
  /// slot out of order is dropped. After open().
  RestoredHistory read_back(uint64_t* max_seq) const;
  /// Copy `ev` of process (pid, start_time) in. Loop thread; no system call. No-op unopened.
  void append(uint32_t pid, uint64_t start_time, const StoredEvent& ev) noexcept;

 private:
  struct Header;
  struct Slot;
  void* base_ = nullptr;
  std::size_t size_ = 0;
  Header* header() const noexcept { return static_cast<Header*>(base_); }
  Slot* slots() const noexcept;
};

}  // namespace cuw::daemon
