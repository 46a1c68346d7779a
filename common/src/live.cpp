// cuwarden: the live segment's reader (live.hpp). The writer is the interposer's
// (interposer/src/core/live_segment.cpp).
#include "cuw/live.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <new>

namespace cuw::live {

std::string file_name(uint32_t pid, uint64_t start_time) {
  return std::string(kFilePrefix) + std::to_string(pid) + "-" + std::to_string(start_time) + kFileSuffix;
}

const char* read_error_name(ReadError e) noexcept {
  switch (e) {
    case ReadError::none: return "none";
    case ReadError::too_small: return "too small for a live segment";
    case ReadError::bad_magic: return "not a live segment (bad magic)";
    case ReadError::bad_abi: return "a live segment of an unknown version";
    case ReadError::bad_layout: return "a region lies outside the file";
    case ReadError::busy: return "the writer kept moving its tables";
  }
  return "unknown";
}

namespace {

template <class T>
T load(const T* p) noexcept {
  return __atomic_load_n(p, __ATOMIC_RELAXED);
}

uint64_t round8(uint64_t v) { return (v + 7) & ~uint64_t{7}; }

/// A region [offset, offset + bytes) that lies inside the mapping and past the header.
bool region_ok(uint64_t offset, uint64_t bytes, uint64_t mapped) {
  return offset >= kHeaderBytes && offset % kPage == 0 && bytes <= mapped && offset <= mapped - bytes;
}

void parse_sites(const unsigned char* p, uint64_t used, std::vector<Site>* out) {
  for (uint64_t at = 0; at + sizeof(SiteRecord) <= used;) {
    SiteRecord r;
    std::memcpy(&r, p + at, sizeof r);
    const uint64_t frames = uint64_t{r.native} + r.python;
    if (r.size != sizeof(SiteRecord) + 8 * frames || r.size > used - at) return;  // torn or hostile: stop
    Site s;
    s.id = r.id;
    s.native.resize(r.native);
    s.python.resize(r.python);
    if (r.native) std::memcpy(s.native.data(), p + at + sizeof r, 8 * std::size_t{r.native});
    if (r.python) std::memcpy(s.python.data(), p + at + sizeof r + 8 * std::size_t{r.native}, 8 * std::size_t{r.python});
    out->push_back(std::move(s));
    at += r.size;
  }
}

void parse_modules(const unsigned char* p, uint64_t used, std::vector<Module>* out) {
  for (uint64_t at = 0; at + sizeof(ModuleRecord) <= used;) {
    ModuleRecord r;
    std::memcpy(&r, p + at, sizeof r);
    if (r.size != sizeof r + round8(r.path_len) || r.size > used - at || r.path_len > 4096) return;
    Module m;
    m.start = r.start;
    m.end = r.end;
    m.bias = r.bias;
    m.path.assign(reinterpret_cast<const char*>(p + at + sizeof r), r.path_len);
    m.build_id.assign(r.build_id, strnlen(r.build_id, sizeof r.build_id - 1));
    out->push_back(std::move(m));
    at += r.size;
  }
}

void parse_codes(const unsigned char* p, uint64_t used, std::vector<Code>* out) {
  for (uint64_t at = 0; at + sizeof(CodeRecord) <= used;) {
    CodeRecord r;
    std::memcpy(&r, p + at, sizeof r);
    if (r.size != sizeof r + round8(uint64_t{r.file_len} + r.function_len) || r.size > used - at) return;
    Code c;
    c.id = r.id;
    c.first_line = r.first_line;
    const char* text = reinterpret_cast<const char*>(p + at + sizeof r);
    c.file.assign(text, r.file_len);
    c.function.assign(text + r.file_len, r.function_len);
    out->push_back(std::move(c));
    at += r.size;
  }
}

}  // namespace

ReadError read(const void* base, uint64_t mapped, Contents* out, bool want_logs, int attempts) {
  if (base == nullptr || mapped < kHeaderBytes) return ReadError::too_small;
  const auto* h = static_cast<const LiveHeader*>(base);
  const auto* bytes = static_cast<const unsigned char*>(base);
  if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != kMagic) return ReadError::bad_magic;
  const uint32_t version = load(&h->abi_version);
  if (version < kOldestAbiVersion || version > kAbiVersion) return ReadError::bad_abi;
  uint32_t header_size = load(&h->header_size);
  if (header_size < kMinHeaderSize || header_size > kHeaderBytes) return ReadError::bad_abi;
  if (version == 1) header_size = kMinHeaderSize;  // every device's pooled blocks in Table::pooled
  for (int attempt = 0; attempt < attempts; ++attempt) {
    Contents c;
    c.pid = load(&h->pid);
    c.uid = load(&h->uid);
    c.start_time = load(&h->start_time);
    c.created_ns = load(&h->created_ns);
    c.callsite_frames = load(&h->callsite_frames);
    c.pyframes = load(&h->pyframes) != 0;
    c.incomplete = h->incomplete.load(std::memory_order_relaxed) != 0;
    const uint64_t s1 = h->layout.load(std::memory_order_acquire);
    if (s1 & 1) {
      sched_yield();
      continue;
    }
    TableDesc tables[kTableSlots] = {};
    uint64_t log_off[kLogs], log_cap[kLogs], log_used[kLogs];
    for (uint32_t t = 0; t < kTableSlots; ++t)
      if (const TableDesc* d = table_desc(*h, t, header_size)) {
        tables[t].offset = load(&d->offset);
        tables[t].capacity = load(&d->capacity);
      }
    for (uint32_t l = 0; l < kLogs; ++l) {
      log_off[l] = load(&h->logs[l].offset);
      log_cap[l] = load(&h->logs[l].capacity);
      log_used[l] = h->logs[l].used.load(std::memory_order_acquire);
    }
    bool layout_ok = true;
    for (uint32_t t = 0; t < kTableSlots && layout_ok; ++t) {
      if (tables[t].capacity == 0) continue;
      if (tables[t].capacity > mapped / sizeof(LiveSlot) ||
          !region_ok(tables[t].offset, tables[t].capacity * sizeof(LiveSlot), mapped)) {
        layout_ok = false;
        break;
      }
      const auto* slots = reinterpret_cast<const LiveSlot*>(bytes + tables[t].offset);
      for (uint64_t i = 0; i < tables[t].capacity; ++i) {
        const uint64_t k1 = __atomic_load_n(&slots[i].key, __ATOMIC_ACQUIRE);
        if (k1 == kEmpty || k1 == kTomb) continue;
        // Acquire loads (not a fence, which TSan does not model): the key's second read stays
        // after them.
        const uint64_t rec = __atomic_load_n(&slots[i].rec, __ATOMIC_ACQUIRE);
        const uint64_t stream = __atomic_load_n(&slots[i].stream, __ATOMIC_ACQUIRE);
        const uint64_t tag = __atomic_load_n(&slots[i].tag, __ATOMIC_ACQUIRE);
        if (load(&slots[i].key) != k1) continue;  // changed under us: removed or being rewritten
        c.records.push_back(Record{table_of_slot(t), k1, rec_bytes(rec), stream, rec_device(rec), rec_api(rec),
                                   tag_time_ns(tag, c.created_ns), tag_site(tag)});
      }
    }
    if (layout_ok && want_logs) {
      for (uint32_t l = 0; l < kLogs; ++l) {
        if (log_cap[l] == 0) continue;
        if (log_used[l] > log_cap[l] || !region_ok(log_off[l], log_cap[l], mapped)) {
          layout_ok = false;
          break;
        }
        const unsigned char* p = bytes + log_off[l];
        if (l == static_cast<uint32_t>(Log::sites)) parse_sites(p, log_used[l], &c.sites);
        if (l == static_cast<uint32_t>(Log::modules)) parse_modules(p, log_used[l], &c.modules);
        if (l == static_cast<uint32_t>(Log::codes)) parse_codes(p, log_used[l], &c.codes);
      }
    }
    // (The table loads above are acquire loads, so this one stays after them. The logs are
    // plain copies: read() on a live mapping is for the process's own tables; the daemon
    // reads a still copy, read_file's.)
    const uint64_t s2 = h->layout.load(std::memory_order_acquire);
    if (s2 != s1) continue;  // a region moved while we copied it: its old place may be gone
    if (!layout_ok) return ReadError::bad_layout;
    *out = std::move(c);
    return ReadError::none;
  }
  return ReadError::busy;
}

bool read_file(const std::string& path, long expect_uid, Contents* out, std::string* why, bool want_logs,
               uint64_t max_bytes) {
  // Copies with pread rather than a mapping: the file belongs to another process, which may
  // truncate it under a mapping (SIGBUS); pread just returns less. Only the header and the
  // regions it publishes are read, into an image at their offsets (untouched pages of the
  // image cost nothing), and no more than `max_bytes` of them: the file's size is the
  // writer's to choose.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    *why = path + ": " + std::strerror(errno);
    return false;
  }
  auto pread_all = [fd](unsigned char* dst, uint64_t n, uint64_t off) {
    uint64_t got = 0;
    while (got < n) {
      const ssize_t r = ::pread(fd, dst + got, n - got, static_cast<off_t>(off + got));
      if (r <= 0) break;
      got += static_cast<uint64_t>(r);
    }
    return got;
  };
  bool ok = false;
  for (int attempt = 0; attempt < 16 && !ok; ++attempt) {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      *why = path + ": not a regular file";
      break;
    }
    if (expect_uid >= 0 && st.st_uid != static_cast<uid_t>(expect_uid)) {
      *why = path + ": owned by another user";
      break;
    }
    const auto size = static_cast<uint64_t>(st.st_size);
    if (size < kHeaderBytes || size > kMaxFileBytes) {
      *why = path + ": " + read_error_name(ReadError::too_small);
      break;
    }
    void* img = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (img == MAP_FAILED) {
      *why = path + ": no address space for a copy";
      break;
    }
    auto* bytes = static_cast<unsigned char*>(img);
    bool retry = false;
    if (pread_all(bytes, kHeaderBytes, 0) == kHeaderBytes) {
      LiveHeader h;
      std::memcpy(static_cast<void*>(&h), bytes, sizeof h);
      const uint64_t before = h.layout.load(std::memory_order_relaxed);
      uint64_t total = 0;
      bool fits = !(before & 1), too_big = false;
      auto region = [&](uint64_t off, uint64_t n) {
        if (!fits || too_big || n == 0) return;
        if (n > max_bytes - std::min(max_bytes, total)) {
          too_big = true;
          return;
        }
        if (off < kHeaderBytes || off > size || n > size - off) {
          fits = false;
          return;
        }
        total += n;
        pread_all(bytes + off, n, off);
      };
      for (uint32_t t = 0; t < kTableSlots; ++t)
        if (const TableDesc* d = table_desc(h, t, h.header_size); !d)
          continue;
        else if (d->capacity <= size / sizeof(LiveSlot))
          region(d->offset, d->capacity * sizeof(LiveSlot));
        else
          fits = false;
      if (want_logs)
        for (uint32_t l = 0; l < kLogs; ++l) region(h.logs[l].offset, h.logs[l].used.load(std::memory_order_relaxed));
      uint64_t after = 0;
      if (::pread(fd, &after, sizeof after, offsetof(LiveHeader, layout)) != sizeof after) after = before + 1;
      if (before & 1 || after != before) {
        retry = true;  // a table moved while it was copied
        *why = path + ": " + read_error_name(ReadError::busy);
      } else if (too_big) {
        *why = path + ": its tables hold more than " + std::to_string(max_bytes >> 20) + " MiB";
      } else if (!fits) {
        retry = true;  // a region past the size seen: the file grew meanwhile
        *why = path + ": " + read_error_name(ReadError::bad_layout);
      } else {
        const ReadError e = read(bytes, size, out, want_logs, 1);
        ok = e == ReadError::none;
        if (!ok) *why = path + ": " + read_error_name(e);
      }
    } else {
      *why = path + ": " + read_error_name(ReadError::too_small);
    }
    ::munmap(img, size);
    if (!ok && !retry) break;
    if (retry) sched_yield();
  }
  ::close(fd);
  return ok;
}

}  // namespace cuw::live
