// cuwarden daemon: mapping and reading ring files as untrusted input (see ring_view.hpp).
#include "model/ring_view.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuw/paths.hpp"

#include "model/fault_guard.hpp"

namespace cuw::daemon {

using ring::RingHeader;

RingView::~RingView() {
  if (base_) munmap(base_, size_);
}

bool RingView::snapshot(RingSnapshot& out) const noexcept {
  const RingHeader* h = header();
  auto copy = [&] {
    std::memcpy(&out.pid, &h->pid, sizeof out.pid);
    std::memcpy(&out.uid, &h->uid, sizeof out.uid);
    std::memcpy(&out.start_time, &h->start_time, sizeof out.start_time);
    std::memcpy(&out.created_ns, &h->created_ns, sizeof out.created_ns);
    out.state = h->state.load(std::memory_order_acquire);
    out.device_count = h->device_count.load(std::memory_order_relaxed);
    out.exited_ns = h->exited_ns.load(std::memory_order_relaxed);
    out.heartbeat_ns = h->consumer_heartbeat_ns.load(std::memory_order_relaxed);
    out.events_written = h->write_pos.load(std::memory_order_relaxed);  // every claim is published
    out.events_dropped = h->events_dropped.load(std::memory_order_relaxed);
    out.write_pos = h->write_pos.load(std::memory_order_relaxed);
    out.read_pos = h->read_pos.load(std::memory_order_relaxed);
    std::memcpy(out.comm, h->comm, sizeof out.comm);
    std::memcpy(out.cmdline, h->cmdline, sizeof out.cmdline);
    std::memcpy(out.job, h->job, sizeof out.job);
    std::memcpy(out.pool, h->pool, sizeof out.pool);
    std::memcpy(&out.cap_scope, &h->cap_scope, sizeof out.cap_scope);
    std::memcpy(&out.pidns, &h->pidns, sizeof out.pidns);
    std::memcpy(&out.priority, &h->priority, sizeof out.priority);
    std::memcpy(&out.priority_asked, &h->priority_asked, sizeof out.priority_asked);
    out.visible_devices = std::min(h->visible_devices.load(std::memory_order_acquire), ring::kMaxDevices);
    for (uint32_t d = 0; d < ring::kMaxDevices; ++d) {
      const ring::DeviceSlot& s = h->devices[d];
      DeviceSnapshot& o = out.devices[d];
      o.present = s.present.load(std::memory_order_acquire) == 1;
      if (d < out.visible_devices || o.present) std::memcpy(o.uuid, s.uuid, sizeof o.uuid);
      if (moved_mask_ >> d & 1) std::memcpy(o.uuid, moved_uuid_[d], sizeof o.uuid);
      if (!o.present) continue;
      std::memcpy(o.name, s.name, sizeof o.name);
      std::memcpy(&o.physical_total, &s.physical_total, sizeof o.physical_total);
      CUW_COPY_DEVICE_COUNTERS(CUW_DEVICE_COUNTERS)
    }
  };
  return guarded_call(copy);
}

bool RingView::status(RingStatus& out) const noexcept {
  const RingHeader* h = header();
  auto copy = [&] {
    out.state = h->state.load(std::memory_order_acquire);
    out.exited_ns = h->exited_ns.load(std::memory_order_relaxed);
    out.events_dropped = h->events_dropped.load(std::memory_order_relaxed);
  };
  return guarded_call(copy);
}

DrainResult RingView::drain(ring::Event* out, std::size_t max, bool stuck_skip, uint64_t heartbeat_ns,
                            bool beat_idle, bool read_present) noexcept {
  DrainResult r;
  if (!writable_) return r;
  RingHeader* h = header();
  auto body = [&] {
    // A writer that changed the geometry after we validated it is no longer a ring.
    const uint32_t sc = std::atomic_ref<uint32_t>(h->slot_count).load(std::memory_order_relaxed);
    if (sc != slot_count_) {
      r.ok = false;
      return;
    }
    r.events = ring::drain(*h, slots(), slot_count_, out, max, stuck_skip, &r.lost);
    if (r.events || beat_idle) h->consumer_heartbeat_ns.store(heartbeat_ns, std::memory_order_relaxed);
    r.write_pos = h->write_pos.load(std::memory_order_relaxed);
    r.read_pos = h->read_pos.load(std::memory_order_relaxed);
    if (read_present || r.events)
      for (uint32_t d = 0; d < ring::kMaxDevices; ++d)
        if (h->devices[d].present.load(std::memory_order_acquire) == 1) r.present |= 1u << d;
  };
  if (!guarded_call(body)) r.ok = false;
  return r;
}

RingView::SetLimit RingView::set_limit(uint32_t d, uint64_t expected, uint64_t desired, uint64_t* actual) noexcept {
  if (d >= ring::kMaxDevices) return SetLimit::not_present;
  if (!writable_) return SetLimit::read_only;
  SetLimit r = SetLimit::ok;
  auto body = [&] {
    ring::DeviceSlot& s = header()->devices[d];
    // The interposer fills a device (limit included) before it publishes present = 1; a
    // limit written before that would be overwritten by the process's own.
    if (s.present.load(std::memory_order_acquire) != 1) {
      r = SetLimit::not_present;
      return;
    }
    uint64_t e = expected;
    if (!s.limit.compare_exchange_strong(e, desired, std::memory_order_relaxed)) {
      *actual = e;
      r = SetLimit::changed;
    }
  };
  if (!guarded_call(body)) return SetLimit::fault;
  return r;
}

bool RingView::set_room_wait(uint32_t ms) noexcept {
  if (!writable_) return false;
  auto body = [&] { header()->room_wait_ms.store(ms, std::memory_order_relaxed); };
  return guarded_call(body);
}

bool RingView::set_held_back(uint32_t mask) noexcept {
  if (!writable_) return false;
  // The interposer's kDevicesMoved stays as it is (it clears it itself); a writer that
  // scribbles on the word meanwhile only costs another try, a bounded number of times.
  auto body = [&] {
    std::atomic<uint32_t>& w = header()->held_back;
    uint32_t cur = w.load(std::memory_order_relaxed);
    for (int i = 0; i < 64; ++i)
      if (w.compare_exchange_weak(cur, (cur & ring::kDevicesMoved) | (mask & ~ring::kDevicesMoved),
                                  std::memory_order_relaxed))
        return;
  };
  return guarded_call(body);
}

void RingView::set_moved_uuid(uint32_t ordinal, const uint8_t (&uuid)[16]) noexcept {
  if (ordinal >= ring::kMaxDevices) return;
  std::memcpy(moved_uuid_[ordinal], uuid, sizeof uuid);
  moved_mask_ |= 1u << ordinal;
}

bool RingView::notify_moved() noexcept {
  if (!writable_) return false;
  auto body = [&] { header()->held_back.fetch_or(ring::kDevicesMoved, std::memory_order_relaxed); };
  return guarded_call(body);
}

bool RingView::notify_resumed(uint64_t suspended_ns, const std::string& by) noexcept {
  if (!writable_) return false;
  auto body = [&] {
    ring::RingHeader* h = header();
    h->suspended_ns = suspended_ns;
    char name[sizeof h->suspended_by] = {};
    by.copy(name, sizeof name - 1);
    std::memcpy(h->suspended_by, name, sizeof name);
    h->resumes.fetch_add(1, std::memory_order_release);
  };
  return guarded_call(body);
}

namespace {

/// Real uid of process `pid` (the "Uid:" line of /proc/<pid>/status), or -1 when the
/// process is gone or the file cannot be parsed.
int64_t process_real_uid(uint32_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%u/status", pid);
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[4096];
  const ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = '\0';
  const char* p = std::strstr(buf, "\nUid:");
  if (!p) return -1;
  char* end = nullptr;
  const unsigned long long uid = std::strtoull(p + 5, &end, 10);
  if (end == p + 5) return -1;
  return static_cast<int64_t>(uid);
}

}  // namespace

struct RingOpener {
  static OpenResult open(int dirfd, const std::string& name, uint32_t expect_pid, uint64_t expect_start_time) {
    OpenResult res;
    auto fail = [&](std::string why, bool transient = false) {
      res.error = std::move(why);
      res.transient = transient;
      return std::move(res);
    };
    // Every check runs on a read-only descriptor and mapping: closing a descriptor opened for
    // writing raises IN_CLOSE_WRITE on the run directory, which wakes the next scan, so a bad
    // file probed read-write would be probed again for ever. Only a ring that passed is
    // reopened read-write (attach_writable, below).
    int fd = openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
      if (errno == ELOOP) return fail("is a symbolic link (refused)");
      if (errno == ENOENT) return fail("vanished", true);
      return fail(std::string("open: ") + std::strerror(errno));
    }
    struct stat st{};
    if (fstat(fd, &st) != 0) {
      const int e = errno;
      close(fd);
      return fail(std::string("fstat: ") + std::strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
      close(fd);
      return fail("not a regular file");
    }
    const auto size = static_cast<uint64_t>(st.st_size);
    if (size < ring::file_size(ring::kMinSlotCount)) {
      close(fd);
      return fail("file too small for a ring (" + std::to_string(size) + " bytes)", true);
    }
    if (size > ring::file_size(ring::kMaxSlotCount)) {
      close(fd);
      return fail("file too large for a ring (" + std::to_string(size) + " bytes)");
    }
    void* base = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    const int map_errno = errno;
    close(fd);
    if (base == MAP_FAILED) return fail(std::string("mmap: ") + std::strerror(map_errno));

    std::unique_ptr<RingView> v(new RingView());
    v->base_ = base;
    v->size_ = size;
    v->writable_ = false;
    v->dev_ = st.st_dev;
    v->ino_ = st.st_ino;

    ring::Invalid inv = ring::Invalid::too_small;
    uint32_t sc = 0;
    RingSnapshot snap;
    auto check = [&] {
      inv = ring::validate(base, size);
      if (inv == ring::Invalid::none) std::memcpy(&sc, &v->header()->slot_count, sizeof sc);
    };
    if (!guarded_call(check)) return fail("file changed size while being read");
    if (inv != ring::Invalid::none)
      return fail(ring::invalid_reason(inv), inv == ring::Invalid::bad_magic || inv == ring::Invalid::size_mismatch);
    // validate() compared its own copy of slot_count with the size; make sure ours agrees.
    if (ring::file_size(sc) != size) return fail(ring::invalid_reason(ring::Invalid::size_mismatch));
    v->slot_count_ = sc;
    if (!v->snapshot(snap)) return fail("file changed size while being read");
    // Both checks below may fail for a moment on a ring whose producer writes these fields
    // after init() published the magic: transient, reported only if they persist.
    if (snap.uid != st.st_uid)
      return fail("ring claims uid " + std::to_string(snap.uid) + " but the file belongs to uid " +
                  std::to_string(st.st_uid), true);
    if (snap.pid != expect_pid || snap.start_time != expect_start_time)
      return fail("ring claims pid " + std::to_string(snap.pid) + " starttime " + std::to_string(snap.start_time) +
                  ", its file name says pid " + std::to_string(expect_pid) + " starttime " +
                  std::to_string(expect_start_time), true);
    // Its writer's pid as this daemon counts pids: a ring from another pid namespace names
    // a pid of that namespace, which here may be another process or none.
    const int64_t host = paths::host_pid(snap.pidns, expect_pid);
    if (host < 0) {
      res.unmapped = true;
      return fail("written in pid namespace " + std::to_string(snap.pidns) + ", where no process this daemon can see has pid " +
                  std::to_string(expect_pid) + " (not judged; looked at again later)");
    }
    // The file's owner must be the user the process runs as: anyone may create files in the
    // run directory, and a ring named after another user's process must not speak for it.
    // A process that is gone (or whose pid was reused) is left to the exit detection.
    const auto hpid = static_cast<uint32_t>(host);
    const int64_t proc_uid = process_real_uid(hpid);
    if (proc_uid >= 0 && static_cast<uint64_t>(proc_uid) != st.st_uid &&
        paths::process_start_time(hpid) == expect_start_time)
      return fail("ring file belongs to uid " + std::to_string(st.st_uid) + " but process " +
                  std::to_string(hpid) + " runs as uid " + std::to_string(proc_uid) + " (not its ring; refused)");
    attach_writable(dirfd, name, st, *v);
    res.host_pid = hpid;
    res.view = std::move(v);
    return res;
  }

  /// Maps the ring that passed read-write in place of the read-only mapping, when the daemon
  /// may write it (its own or, as root, any user's) and the name still holds the same file.
  /// Otherwise the view stays read-only: counters yes, events and live cap changes no.
  static void attach_writable(int dirfd, const std::string& name, const struct stat& checked, RingView& v) {
    const int fd = openat(dirfd, name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return;
    struct stat st{};
    void* rw = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_dev == checked.st_dev && st.st_ino == checked.st_ino &&
        st.st_size == checked.st_size)
      rw = mmap(nullptr, v.size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (rw == MAP_FAILED) return;
    munmap(v.base_, v.size_);  // the view is new: nothing else holds its address yet
    v.base_ = rw;
    v.writable_ = true;
  }
};

OpenResult open_ring(int dirfd, const std::string& name, uint32_t expect_pid, uint64_t expect_start_time) {
  return RingOpener::open(dirfd, name, expect_pid, expect_start_time);
}

}  // namespace cuw::daemon
