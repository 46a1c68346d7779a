// cuwarden interposer core: the live segment's writer (live_segment.hpp).
#include "core/live_segment.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/log.hpp"

namespace cuw::core {

namespace {
uint64_t round_page(uint64_t v) { return (v + live::kPage - 1) & ~(live::kPage - 1); }
}  // namespace

bool LiveSegment::open(const std::string& dir, uint32_t pid, uint32_t uid, uint64_t start_time, uint64_t created_ns,
                       uint32_t callsite_frames, bool pyframes) noexcept {
  if (!dir.empty()) {
    path_ = dir + "/" + live::file_name(pid, start_time);
    // 0600, unlike the ring: call sites and module addresses are the owner's (and root's)
    // business, not every user's.
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd_ >= 0) {
      // Every page the mapping writes is allocated first (fallocate, not ftruncate): on a
      // full tmpfs a write fault on an unallocated page would be SIGBUS in the program.
      if (::fallocate(fd_, 0, 0, live::kHeaderBytes) != 0) {
        ::close(fd_);
        ::unlink(path_.c_str());
        fd_ = -1;
      }
    }
  }
  // The whole reservation at once: regions never move. MAP_NORESERVE: nothing is committed
  // until written, and pages past the file's end are never touched.
  void* b = fd_ >= 0 ? ::mmap(nullptr, live::kMaxFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd_, 0)
                     : MAP_FAILED;
  if (b == MAP_FAILED && fd_ >= 0) {
    ::close(fd_);
    ::unlink(path_.c_str());
    fd_ = -1;
  }
  limit_ = live::kMaxFileBytes;
  if (fd_ >= 0) {
    // Growing a file past RLIMIT_FSIZE would raise SIGXFSZ in the program: stop below it.
    rlimit rl{};
    if (::getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < limit_)
      limit_ = rl.rlim_cur & ~(live::kPage - 1);
  }
  if (fd_ < 0) {
    path_.clear();
    // Private memory for the program's own reports: small, since with strict overcommit a
    // reservation counts whole (past it, tables fall back to the heap).
    limit_ = kAnonBytes;
    b = ::mmap(nullptr, limit_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (b == MAP_FAILED) {
      log::warn("cuwarden: no memory for the live segment: snapshots and out-of-memory reports lack allocations");
      return false;
    }
  }
  base_ = static_cast<char*>(b);
  end_.store(live::kHeaderBytes, std::memory_order_release);
  live::LiveHeader& h = header();
  h.abi_version = live::kAbiVersion;
  h.header_size = sizeof(live::LiveHeader);
  h.pid = pid;
  h.uid = uid;
  h.start_time = start_time;
  h.created_ns = created_ns;
  h.callsite_frames = callsite_frames;
  h.pyframes = pyframes ? 1 : 0;
  __atomic_store_n(&h.magic, live::kMagic, __ATOMIC_RELEASE);  // last: a reader seeing it sees the rest
  return fd_ >= 0;
}

void* LiveSegment::new_region(uint64_t bytes, uint64_t* offset) noexcept {
  if (!base_) return nullptr;
  const uint64_t size = round_page(bytes);
  std::lock_guard<std::mutex> g(region_mu_);
  // A region given back earlier, if one is large enough (first fit; the rest of it stays
  // free): the file then stays within about twice what the tables and logs hold, however
  // long the program churns. A reader still copying it saw the table move (`layout`).
  uint64_t at = ~uint64_t{0};
  for (std::size_t i = 0; i < free_.size(); ++i) {
    if (free_[i].second < size) continue;
    at = free_[i].first;
    free_[i].first += size;
    free_[i].second -= size;
    if (free_[i].second == 0) free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
    break;
  }
  const uint64_t end = end_.load(std::memory_order_relaxed);
  const bool fresh = at == ~uint64_t{0};
  if (fresh) {
    if (size > limit_ - std::min(limit_, end)) {
      mark_incomplete();
      return nullptr;
    }
    at = end;
  }
  // Allocated before any write through the mapping (a full tmpfs: ENOSPC here, not SIGBUS
  // later); fresh pages, or a punched region, read as zero.
  if (fd_ >= 0 && ::fallocate(fd_, 0, static_cast<off_t>(at), static_cast<off_t>(size)) != 0) {
    if (!fresh) free_.emplace_back(at, size);
    mark_incomplete();
    return nullptr;
  }
  if (!fresh && fd_ < 0) std::memset(base_ + at, 0, size);  // MADV_DONTNEED zeroed it; to be sure
  if (fresh) end_.store(at + size, std::memory_order_release);
  *offset = at;
  return base_ + at;
}

void LiveSegment::retire(uint64_t offset, uint64_t bytes) noexcept {
  if (!base_ || bytes == 0) return;
  const uint64_t size = round_page(bytes);
  {
    std::lock_guard<std::mutex> g(region_mu_);
    try {
      free_.emplace_back(offset, size);
    } catch (...) {
      // Not reused: only the file's size grows.
    }
  }
  // The pages go back; the file keeps its size (a reader maps it whole), reading as zero.
  if (fd_ >= 0) {
    if (::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                    static_cast<off_t>(size)) != 0)
      log::debug("cuwarden: live segment: cannot punch %llu bytes: %s", static_cast<unsigned long long>(size),
                 std::strerror(errno));
  } else {
    ::madvise(base_ + offset, size, MADV_DONTNEED);
  }
}

void LiveSegment::move(uint64_t& offset, uint64_t& capacity, uint64_t unit, uint64_t new_offset,
                       uint64_t new_capacity) noexcept {
  uint64_t old_offset = 0, old_bytes = 0;
  {
    std::lock_guard<std::mutex> g(region_mu_);
    old_offset = offset;
    old_bytes = capacity * unit;
    live::LiveHeader& h = header();
    // The odd count before the new descriptor: stored with release (not a fence, which TSan
    // does not model), which orders the count's store before them.
    h.layout.store(h.layout.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    __atomic_store_n(&offset, new_offset, __ATOMIC_RELEASE);
    __atomic_store_n(&capacity, new_capacity, __ATOMIC_RELEASE);
    h.layout.store(h.layout.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }
  // After the count moved on: a reader that copied the old region sees the change and retries.
  if (old_bytes) retire(old_offset, old_bytes);
}

live::LiveSlot* LiveSegment::new_table_region(uint64_t capacity) noexcept {
  uint64_t offset = 0;
  return static_cast<live::LiveSlot*>(new_region(capacity * sizeof(live::LiveSlot), &offset));
}

void LiveSegment::publish_table(uint32_t slot, live::LiveSlot* slots, uint64_t capacity) noexcept {
  if (!base_) return;
  live::TableDesc& d = *live::table_desc(header(), slot, sizeof(live::LiveHeader));
  move(d.offset, d.capacity, sizeof(live::LiveSlot), static_cast<uint64_t>(reinterpret_cast<char*>(slots) - base_),
       capacity);
}

bool LiveSegment::append(live::Log l, const void* record, std::size_t bytes) noexcept {
  if (!base_) return false;
  live::LogDesc& d = header().logs[static_cast<uint32_t>(l)];
  const uint64_t used = d.used.load(std::memory_order_relaxed);
  if (used + bytes > d.capacity) {
    uint64_t cap = d.capacity ? d.capacity * 2 : 64 * 1024;
    while (cap < used + bytes) cap *= 2;
    uint64_t offset = 0;
    char* fresh = static_cast<char*>(new_region(cap, &offset));
    if (!fresh) return false;  // marked incomplete
    if (used) std::memcpy(fresh, base_ + d.offset, used);
    move(d.offset, d.capacity, 1, offset, cap);
  }
  std::memcpy(base_ + d.offset + used, record, bytes);
  __atomic_store_n(&d.records, d.records + 1, __ATOMIC_RELAXED);
  d.used.store(used + bytes, std::memory_order_release);  // the record is whole before it counts
  return true;
}

void LiveSegment::drop_table(uint32_t slot) noexcept {
  if (!base_) return;
  live::TableDesc& d = *live::table_desc(header(), slot, sizeof(live::LiveHeader));
  mark_incomplete();
  move(d.offset, d.capacity, sizeof(live::LiveSlot), 0, 0);
}

void LiveSegment::unlink() noexcept {
  if (fd_ >= 0 && !path_.empty()) ::unlink(path_.c_str());
}

}  // namespace cuw::core
