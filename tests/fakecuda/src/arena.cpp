// fakecuda: the per-device arena, a first-fit free-list allocator over one lazy host mapping.
//
// The mapping is PROT_READ|PROT_WRITE, MAP_NORESERVE and as large as the device, so device
// pointers are real host addresses (memcpy works) and untouched memory costs nothing. It maps
// a memfd, shared, so that another process can map an allocation a legacy IPC handle names
// (ipc_peer.cpp); a child forked after the arena exists gets a private arena of its own (the
// driver gives a forked child no access to its parent's memory).
// First fit in address order with coalescing reproduces what tests need from a GPU:
// fragmentation can make an allocation fail although enough bytes are free in total.
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "internal.hpp"

namespace fc {

namespace {

std::mutex g_arenas_mu;
auto& g_arenas = *new std::vector<Arena*>;  // live arenas, for the fork handler

}  // namespace

Arena::Arena(size_t capacity) : capacity_(capacity) {
  fd_ = memfd_create("fakecuda-arena", MFD_CLOEXEC);
  void* p = MAP_FAILED;
  if (fd_ >= 0 && ftruncate(fd_, static_cast<off_t>(capacity)) == 0)
    p = mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd_, 0);
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "[fakecuda] cannot map a %zu-byte device arena\n", capacity);
    std::abort();
  }
  base_ = reinterpret_cast<uintptr_t>(p);
  free_[0] = capacity - capacity % kAlign;
  static const bool handler = [] {
    pthread_atfork([] { g_arenas_mu.lock(); }, [] { g_arenas_mu.unlock(); }, [] {
      // The child: the same addresses, private and empty, so that neither process writes
      // into the other's allocations. Its memory cannot be exported any more.
      for (Arena* a : g_arenas) {
        mmap(reinterpret_cast<void*>(a->base_), a->capacity_, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        close(a->fd_);
        a->fd_ = -1;
      }
      g_arenas_mu.unlock();
    });
    return true;
  }();
  (void)handler;
  std::lock_guard lock(g_arenas_mu);
  g_arenas.push_back(this);
}

Arena::~Arena() {
  {
    std::lock_guard lock(g_arenas_mu);
    std::erase(g_arenas, this);
  }
  munmap(reinterpret_cast<void*>(base_), capacity_);
  if (fd_ >= 0) close(fd_);
}

uintptr_t Arena::allocate(size_t bytes) {
  if (bytes == 0 || bytes > capacity_) return 0;
  size_t need = (bytes + kAlign - 1) / kAlign * kAlign;
  std::lock_guard lock(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    size_t off = it->first;
    size_t len = it->second;
    free_.erase(it);
    if (len > need) free_[off + need] = len - need;
    used_[off] = need;
    return base_ + off;
  }
  return 0;
}

size_t Arena::release(uintptr_t addr) {
  if (addr < base_ || addr >= base_ + capacity_) return 0;
  size_t off = addr - base_;
  size_t len;
  {
    std::lock_guard lock(mu_);
    auto it = used_.find(off);
    if (it == used_.end()) return 0;
    len = it->second;
    used_.erase(it);
    // Give big blocks' pages back so long tests do not grow the resident set (the contents
    // of freed device memory are undefined anyway). Before the range is free again: done
    // after, it zeroed the pages of an allocation another thread had been handed meanwhile.
    constexpr size_t kPage = 4096;
    const uintptr_t lo = (addr + kPage - 1) / kPage * kPage;
    const uintptr_t hi = (addr + len) / kPage * kPage;
    if (hi > lo && hi - lo >= 16 * kPage) {
      if (fd_ < 0 || fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(lo - base_),
                               static_cast<off_t>(hi - lo)) != 0)
        madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
    }
    size_t start = off, end = off + len;
    auto next = free_.lower_bound(off);
    if (next != free_.end() && next->first == end) {
      end += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == start) {
        start = prev->first;
        free_.erase(prev);
      }
    }
    free_[start] = end - start;
  }
  return len;
}

size_t Arena::largest_free() const {
  std::lock_guard lock(mu_);
  size_t best = 0;
  for (const auto& [off, len] : free_) best = std::max(best, len);
  return best;
}

std::vector<std::pair<uintptr_t, size_t>> Arena::used_blocks() const {
  std::lock_guard lock(mu_);
  std::vector<std::pair<uintptr_t, size_t>> out;
  for (const auto& [off, len] : used_) out.emplace_back(base_ + off, len);
  return out;
}

void Arena::discard() {
  std::lock_guard lock(mu_);
  if (fd_ < 0 || fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(capacity_)) != 0)
    madvise(reinterpret_cast<void*>(base_), capacity_, MADV_DONTNEED);
}

size_t Arena::free_block_count() const {
  std::lock_guard lock(mu_);
  return free_.size();
}

}  // namespace fc
