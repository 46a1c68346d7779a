// cuwarden daemon model: the event journal (see event_journal.hpp).
#include "model/event_journal.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

namespace cuw::daemon {

namespace {
constexpr uint64_t kMagic = 0x314c4e524a574355ULL;  // "CUWJRNL1"
constexpr uint32_t kJournalVersion = 1;
}  // namespace

struct EventJournal::Header {
  uint64_t magic;
  uint32_t version;
  uint32_t slot_size;
  uint64_t slots;
  std::atomic<uint64_t> head;  ///< events appended ever; slot head % slots is the next
  uint64_t reserved[4];
};
static_assert(sizeof(std::atomic<uint64_t>) == 8 && std::atomic<uint64_t>::is_always_lock_free);

/// One event: fixed-width fields, as StoredEvent holds them.
struct EventJournal::Slot {
  uint32_t pid;
  uint32_t by_uid;
  uint64_t start_time;
  uint64_t seq;
  uint64_t time_ns, address, bytes, used_after, aux;
  uint32_t tid;
  uint16_t api;
  uint8_t kind;
  int8_t device;
  uint32_t result;
  uint32_t site;
};

EventJournal::Slot* EventJournal::slots() const noexcept {
  static_assert(sizeof(Slot) == 80, "the journal's layout (kJournalVersion)");
  return reinterpret_cast<Slot*>(static_cast<char*>(base_) + sizeof(Header));
}

EventJournal::~EventJournal() {
  if (base_ != nullptr) ::munmap(base_, size_);
}

bool EventJournal::open(const std::string& path, std::string* error) {
  const std::size_t want = sizeof(Header) + kJournalSlots * sizeof(Slot);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0600);
  struct stat st{};
  if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) {
    *error = "cannot use " + path + " (a regular file of ours): " + std::strerror(fd < 0 ? errno : EPERM);
    if (fd >= 0) ::close(fd);
    return false;
  }
  // Another size is another layout, or a file cut short: started afresh (its events are lost,
  // which is all a journal that cannot be read could give).
  const bool fresh = static_cast<std::size_t>(st.st_size) != want;
  if (fresh && (::ftruncate(fd, 0) != 0 || ::posix_fallocate(fd, 0, static_cast<off_t>(want)) != 0)) {
    *error = "cannot size " + path + ": " + std::strerror(errno);
    ::close(fd);
    return false;
  }
  void* base = ::mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    *error = "cannot map " + path + ": " + std::strerror(errno);
    return false;
  }
  base_ = base;
  size_ = want;
  Header* h = header();
  if (fresh || h->magic != kMagic || h->version != kJournalVersion || h->slot_size != sizeof(Slot) ||
      h->slots != kJournalSlots) {
    std::memset(base_, 0, sizeof(Header));
    h->version = kJournalVersion;
    h->slot_size = sizeof(Slot);
    h->slots = kJournalSlots;
    h->head.store(0, std::memory_order_relaxed);
    h->magic = kMagic;
  }
  return true;
}

RestoredHistory EventJournal::read_back(uint64_t* max_seq) const {
  RestoredHistory out;
  *max_seq = 0;
  if (base_ == nullptr) return out;
  const uint64_t head = header()->head.load(std::memory_order_acquire);
  // Not the oldest slot of a full circle: it is the one a writer killed mid-copy was filling.
  const uint64_t n = std::min(head, kJournalSlots - 1);
  for (uint64_t i = head - n; i < head; ++i) {
    Slot s;
    std::memcpy(&s, &slots()[i % kJournalSlots], sizeof s);
    if (s.seq == 0) continue;
    std::vector<StoredEvent>& v = out[{s.pid, s.start_time}];
    if (!v.empty() && v.back().seq >= s.seq) continue;  // a history's seqs only grow
    StoredEvent ev;
    ev.seq = s.seq;
    ev.by_uid = s.by_uid;
    ev.e.time_ns = s.time_ns;
    ev.e.address = s.address;
    ev.e.bytes = s.bytes;
    ev.e.used_after = s.used_after;
    ev.e.aux = s.aux;
    ev.e.tid = s.tid;
    ev.e.api = s.api;
    ev.e.kind = s.kind;
    ev.e.device = s.device;
    ev.e.result = s.result;
    ev.e.site = s.site;
    v.push_back(ev);
    *max_seq = std::max(*max_seq, s.seq);
  }
  return out;
}

void EventJournal::append(uint32_t pid, uint64_t start_time, const StoredEvent& ev) noexcept {
  if (base_ == nullptr) return;
  Header* h = header();
  const uint64_t at = h->head.load(std::memory_order_relaxed);
  Slot& s = slots()[at % kJournalSlots];
  s = Slot{pid,         ev.by_uid, start_time,  ev.seq,   ev.e.time_ns, ev.e.address, ev.e.bytes,
           ev.e.used_after, ev.e.aux, ev.e.tid, ev.e.api, ev.e.kind,    ev.e.device,  ev.e.result,
           ev.e.site};
  h->head.store(at + 1, std::memory_order_release);  // the slot is whole before it counts
}

}  // namespace cuw::daemon
