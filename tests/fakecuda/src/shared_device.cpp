// fakecuda: one device's capacity shared by every process that names it (CUWARDEN_FAKE_DIR).
//
// Opt-in: without CUWARDEN_FAKE_DIR each process has devices of its own (CUWARDEN_FAKE_MEMORY
// bytes each), which is what every test written before this mode expects. With it, the file
// DIR/device-<UUID> holds the device's capacity and one slot per process (pid, start time,
// bytes), so a process's cuMemAlloc fails when the other processes fill the device, its
// cuMemGetInfo counts their bytes, and the simulated NVML lists each process and the total.
//
// Updates are read-modify-write under flock(LOCK_EX) on the file (plus a mutex: flock does not
// exclude the threads of one process, they share the open file); readers take LOCK_SH. A
// process that dies holding the lock releases it with its descriptor. A dead process's slot
// (its pid gone, a zombie, or another process under the same pid: the start time tells) still
// holds bytes in the file; readers skip it, and the next writer that needs room or a slot
// clears it, as the GPU takes a process's memory back when it exits.
//
// The file is created 0666 (whatever the umask) so that processes of several users share it;
// the directory must let each of them create files (01777 for several users).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstddef>

#include "internal.hpp"

namespace fc {

namespace {

constexpr uint32_t kMagic = 0x76646366;  // "fcdv"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kSlots = 128;

struct FileHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t header_size;
  uint32_t slot_count;
  uint64_t capacity;  // bytes, set by the process that created the file
  uint64_t reserved[5];
};
struct Slot {
  int32_t pid;  // 0: free
  uint32_t reserved0;
  uint64_t start_time;  // process_start_time(pid) when the slot was taken
  uint64_t bytes;
  uint64_t reserved1;
};
struct File {
  FileHeader header;
  Slot slots[kSlots];
};
static_assert(sizeof(FileHeader) == 64 && sizeof(Slot) == 32);
static_assert(offsetof(File, slots) == sizeof(FileHeader));

// Holds the file's lock for one read or update.
class Locked {
 public:
  Locked(SharedDevice* s, bool exclusive);
  ~Locked();
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;

 private:
  SharedDevice* s_;
};

}  // namespace

struct SharedDevice {
  int fd = -1;
  File* file = nullptr;
  std::mutex mu;
  int my_slot = -1;  // this process's slot, valid while slot_pid == getpid()
  int slot_pid = 0;
};

namespace {

Locked::Locked(SharedDevice* s, bool exclusive) : s_(s) {
  s_->mu.lock();
  while (flock(s_->fd, exclusive ? LOCK_EX : LOCK_SH) != 0 && errno == EINTR) {
  }
}
Locked::~Locked() {
  flock(s_->fd, LOCK_UN);
  s_->mu.unlock();
}

bool slot_alive(const Slot& slot) {
  return slot.pid > 0 && slot.start_time != 0 && process_start_time(slot.pid) == slot.start_time;
}

// Frees the slots of processes that are gone. Caller holds the lock exclusively.
void reap_locked(File* f) {
  for (Slot& slot : f->slots)
    if (slot.pid != 0 && !slot_alive(slot)) std::memset(&slot, 0, sizeof slot);
}

uint64_t total_locked(const File* f, bool live_only) {
  uint64_t sum = 0;
  for (const Slot& slot : f->slots)
    if (slot.pid != 0 && (!live_only || slot_alive(slot))) sum += slot.bytes;
  return sum;
}

// This process's slot, taken on first use; nullptr when all are held by live processes.
// Caller holds the lock exclusively.
Slot* my_slot_locked(SharedDevice* s) {
  const int pid = getpid();
  if (s->slot_pid == pid) return &s->file->slots[s->my_slot];
  const uint64_t me = process_start_time(pid);
  for (int pass = 0; pass < 2; ++pass) {
    for (uint32_t i = 0; i < kSlots; ++i) {
      Slot& slot = s->file->slots[i];
      if (slot.pid != 0) continue;
      slot.pid = pid;
      slot.start_time = me;
      slot.bytes = 0;
      s->my_slot = static_cast<int>(i);
      s->slot_pid = pid;
      return &slot;
    }
    reap_locked(s->file);
  }
  return nullptr;
}

}  // namespace

const char* shared_dir() {
  static const char* dir = [] {
    const char* v = std::getenv("CUWARDEN_FAKE_DIR");
    return v && *v ? v : nullptr;
  }();
  return dir;
}

uint64_t process_start_time(int pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[1024];
  const ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses; fields follow the last ')'.
  const char* p = std::strrchr(buf, ')');
  if (!p || p[1] != ' ') return 0;
  p += 2;
  if (*p == 'Z' || *p == 'X') return 0;
  // The state is field 3, the start time field 22.
  for (int field = 3; field < 22; ++field) {
    p = std::strchr(p, ' ');
    if (!p) return 0;
    ++p;
  }
  return std::strtoull(p, nullptr, 10);
}

SharedDevice* shared_device_open(const std::string& uuid, size_t capacity) {
  const char* dir = shared_dir();
  if (!dir) return nullptr;
  const std::string path = std::string(dir) + "/device-" + uuid;
  // Open an existing file without O_CREAT first: in a sticky world-writable directory,
  // fs.protected_regular refuses O_CREAT on another user's file.
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) fchmod(fd, 0666);
    else if (errno == EEXIST) fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  }
  if (fd < 0) {
    std::fprintf(stderr, "[fakecuda] cannot open %s: %s\n", path.c_str(), std::strerror(errno));
    std::abort();
  }
  auto* s = new SharedDevice;  // never destroyed: driver calls may run during exit
  s->fd = fd;
  {
    while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {
    }
    struct stat st {};
    fstat(fd, &st);
    bool fresh = st.st_size == 0;
    if (fresh && ftruncate(fd, sizeof(File)) != 0) {
      std::fprintf(stderr, "[fakecuda] cannot size %s: %s\n", path.c_str(), std::strerror(errno));
      std::abort();
    }
    void* p = mmap(nullptr, sizeof(File), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED || (!fresh && st.st_size != static_cast<off_t>(sizeof(File)))) {
      std::fprintf(stderr, "[fakecuda] %s is not a simulated device file\n", path.c_str());
      std::abort();
    }
    s->file = static_cast<File*>(p);
    if (fresh) {
      s->file->header = FileHeader{kMagic, kVersion, sizeof(FileHeader), kSlots, capacity, {}};
    } else if (s->file->header.magic != kMagic || s->file->header.version != kVersion ||
               s->file->header.header_size != sizeof(FileHeader) || s->file->header.slot_count != kSlots) {
      std::fprintf(stderr, "[fakecuda] %s has another layout\n", path.c_str());
      std::abort();
    }
    flock(fd, LOCK_UN);
  }
  return s;
}

bool shared_device_add(SharedDevice* s, size_t bytes, bool check) {
  Locked lock(s, true);
  Slot* mine = my_slot_locked(s);
  if (!mine) return !check;  // 128 live processes on one device: counted nowhere
  if (check) {
    const uint64_t capacity = s->file->header.capacity;
    uint64_t used = total_locked(s->file, false);
    if (bytes > capacity || used > capacity - bytes) {
      reap_locked(s->file);  // room held by processes that are gone comes back first
      used = total_locked(s->file, false);
      if (bytes > capacity || used > capacity - bytes) return false;
    }
  }
  mine->bytes += bytes;
  return true;
}

void shared_device_sub(SharedDevice* s, size_t bytes) {
  Locked lock(s, true);
  Slot* mine = my_slot_locked(s);
  if (!mine) return;
  // A forked child gives back bytes its parent counted: never below zero.
  mine->bytes -= std::min<uint64_t>(mine->bytes, bytes);
}

size_t shared_device_used(SharedDevice* s) {
  Locked lock(s, false);
  return static_cast<size_t>(total_locked(s->file, true));
}

int shared_device_processes(SharedDevice* s, int* pids, size_t* bytes, int max) {
  Locked lock(s, false);
  int n = 0;
  for (const Slot& slot : s->file->slots) {
    if (slot.pid == 0 || slot.bytes == 0 || !slot_alive(slot)) continue;
    if (n < max) {
      pids[n] = slot.pid;
      bytes[n] = static_cast<size_t>(slot.bytes);
    }
    ++n;
  }
  return n;
}

}  // namespace fc
