// cuwarden interposer core: the code table (code_table.hpp): ids given, names copied, the
// map grown; code() and count() of pyframes.hpp.
#include "core/callsites/code_table.hpp"

#include <sys/mman.h>

#include <cstring>
#include <mutex>
#include <new>

#include "base/log.hpp"
#include "base/spin_lock.hpp"
#include "core/callsites/pyframes.hpp"

namespace cuw::core::pyframes {

namespace detail {

std::atomic<Map*> g_map{nullptr};

namespace {

constexpr size_t kMaxText = 256;  ///< bytes of a copied name, its NUL included

struct Entry {
  Code pub;
  uintptr_t code;
  Sig sig;
};

constexpr uint32_t kChunkBits = 10;
constexpr uint32_t kChunk = 1u << kChunkBits;
constexpr uint32_t kMaxChunks = 1024;
constexpr uint32_t kMaxCodes = kChunk * kMaxChunks;  // ~1M codes: ids below 2^20

std::atomic<Entry*> g_chunks[kMaxChunks];
std::atomic<uint32_t> g_next_id{1};
spin_lock g_lock;

void* map_pages(size_t bytes) noexcept {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

Map* map_make(size_t capacity) noexcept {
  auto* m = static_cast<Map*>(map_pages(64 + capacity * sizeof(Slot)));
  if (!m) return nullptr;
  m->mask = capacity - 1;
  m->used = 0;
  m->slots = reinterpret_cast<Slot*>(reinterpret_cast<char*>(m) + 64);
  return m;
}

/// Under g_lock: `code`'s slot in `m` holds these words (a new slot, or the code's own with
/// them replaced). nullptr if `m` is full.
Slot* map_put(Map* m, uintptr_t code, uint64_t ident, uint64_t memo, uint64_t traceable) noexcept {
  size_t i = hash_of(code) & m->mask;
  for (size_t probes = 0; probes <= m->mask; ++probes, i = (i + 1) & m->mask) {
    Slot& s = m->slots[i];
    if (s.key == code) {
      store(s.traceable, traceable, std::memory_order_relaxed);
      store(s.ident, ident, std::memory_order_release);
      return &s;
    }
    if (s.key == 0) {
      store(s.ident, ident, std::memory_order_relaxed);
      store(s.memo, memo, std::memory_order_relaxed);
      store(s.traceable, traceable, std::memory_order_relaxed);
      store(s.key, code, std::memory_order_release);
      ++m->used;
      return &s;
    }
  }
  return nullptr;
}

/// Under g_lock: the map with room for one more (grown to twice its size past half full).
Map* map_with_room() noexcept {
  Map* m = g_map.load(std::memory_order_relaxed);
  if (m && (m->used + 1) * 2 <= m->mask + 1) return m;
  const size_t capacity = m ? (m->mask + 1) * 2 : 1024;
  Map* grown = map_make(capacity);
  if (!grown) return m && m->used <= m->mask ? m : nullptr;
  if (m)
    for (size_t i = 0; i <= m->mask; ++i) {
      Slot& s = m->slots[i];
      if (s.key)
        map_put(grown, s.key, s.ident, load(s.memo, std::memory_order_relaxed), s.traceable);
    }
  g_map.store(grown, std::memory_order_release);  // the old map stays mapped: readers may be in it
  return grown;
}

/// Under g_lock: `len` bytes for strings that live as long as the process.
char* arena_alloc(size_t len) noexcept {
  constexpr size_t kBlock = 64 * 1024;
  static char* cur = nullptr;
  static size_t left = 0;
  if (len > left) {
    cur = static_cast<char*>(map_pages(kBlock));
    left = cur ? kBlock : 0;
    if (!cur) return nullptr;
  }
  char* p = cur;
  cur += len;
  left -= len;
  return p;
}

inline const Entry* entry(uint32_t id) noexcept {
  if (id == 0 || id >= g_next_id.load(std::memory_order_acquire)) return nullptr;
  const Entry* chunk = g_chunks[(id - 1) >> kChunkBits].load(std::memory_order_acquire);
  return chunk ? &chunk[(id - 1) & (kChunk - 1)] : nullptr;
}

// ---- strings ------------------------------------------------------------------------------

/// A str object's characters where they lie: `kind` bytes each (1 latin-1, 2 UCS-2, 4 UCS-4).
struct Chars {
  uintptr_t data = 0;
  int64_t length = 0;
  int kind = 0;
};

/// A compact str's characters; none (kind 0) for anything else (a legacy string of 3.10 or
/// 3.11, or not a str at all). The state bitfield (Include/cpython/unicodeobject.h, 3.10
/// to 3.14 alike): interned 2 bits, kind 3, compact 1, ascii 1.
Chars chars_of(const Interp& py, uintptr_t str) noexcept {
  Chars c;
  if (!is_a(py, str, py.unicode_type)) return c;
  const Layout& l = py.l;
  const auto state = rd<uint32_t>(str, l.str_state);
  const int kind = static_cast<int>((state >> 2) & 7);
  const bool compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
  const auto length = rd<int64_t>(str, l.str_length);
  if (!compact || (kind != 1 && kind != 2 && kind != 4) || length < 0 || length > kMaxStringLength) return c;
  c.data = str + (ascii ? l.str_ascii_size : l.str_compact_size);
  c.length = length;
  c.kind = kind;
  return c;
}

inline uint32_t char_at(const Chars& c, int64_t i) noexcept {
  switch (c.kind) {
    case 1: return rd<uint8_t>(c.data, static_cast<uint32_t>(i));
    case 2: return rd<uint16_t>(c.data, static_cast<uint32_t>(i * 2));
    default: return rd<uint32_t>(c.data, static_cast<uint32_t>(i * 4));
  }
}

/// `ch` as UTF-8 into `out` (room for 4); a lone surrogate or a value past U+10FFFF as '?'.
size_t utf8(uint32_t ch, char* out) noexcept {
  if (ch < 0x80) {
    out[0] = static_cast<char>(ch);
    return 1;
  }
  if (ch < 0x800) {
    out[0] = static_cast<char>(0xC0 | (ch >> 6));
    out[1] = static_cast<char>(0x80 | (ch & 0x3F));
    return 2;
  }
  if ((ch >= 0xD800 && ch <= 0xDFFF) || ch > 0x10FFFF) {
    out[0] = '?';
    return 1;
  }
  if (ch < 0x10000) {
    out[0] = static_cast<char>(0xE0 | (ch >> 12));
    out[1] = static_cast<char>(0x80 | ((ch >> 6) & 0x3F));
    out[2] = static_cast<char>(0x80 | (ch & 0x3F));
    return 3;
  }
  out[0] = static_cast<char>(0xF0 | (ch >> 18));
  out[1] = static_cast<char>(0x80 | ((ch >> 12) & 0x3F));
  out[2] = static_cast<char>(0x80 | ((ch >> 6) & 0x3F));
  out[3] = static_cast<char>(0x80 | (ch & 0x3F));
  return 4;
}

/// `str` as UTF-8 into `out` (kMaxText bytes with the NUL), keeping its start (`keep_end`
/// false) or its end after "..." (true) when it does not fit; "?" when it is not a compact
/// str. Reads at most kMaxText characters.
void text_of(const Interp& py, uintptr_t str, bool keep_end, char* out) noexcept {
  const Chars c = chars_of(py, str);
  if (c.kind == 0) {
    std::memcpy(out, "?", 2);
    return;
  }
  constexpr size_t room = kMaxText - 1;
  char u[4];
  if (!keep_end) {
    size_t n = 0;
    for (int64_t i = 0; i < c.length; ++i) {
      const size_t k = utf8(char_at(c, i), u);
      if (n + k > room) break;
      std::memcpy(out + n, u, k);
      n += k;
    }
    out[n] = '\0';
    return;
  }
  // From the end: the characters that fit, then "..." before them if some did not.
  char tail[kMaxText];
  size_t n = 0;  // bytes at the end of tail[] in use
  int64_t i = c.length;
  while (i > 0) {
    const size_t k = utf8(char_at(c, i - 1), u);
    if (n + k > room) break;
    std::memcpy(tail + room - n - k, u, k);
    n += k;
    --i;
  }
  size_t at = 0;
  if (i > 0) {  // cut: make room for "..." by dropping whole characters from the front
    while (n + 3 > room) {
      size_t k = 1;
      while (k < n && (static_cast<unsigned char>(tail[room - n + k]) & 0xC0) == 0x80) ++k;
      n -= k;
    }
    std::memcpy(out, "...", 3);
    at = 3;
  }
  std::memcpy(out + at, tail + room - n, n);
  out[at + n] = '\0';
}

bool g_full_said = false;  // under g_lock

}  // namespace

Slot* map_find(const Map* m, uintptr_t code) noexcept {
  if (!m) return nullptr;
  size_t i = hash_of(code) & m->mask;
  for (size_t probes = 0; probes <= m->mask; ++probes, i = (i + 1) & m->mask) {
    Slot& s = m->slots[i];
    const uintptr_t k = load(s.key, std::memory_order_acquire);
    if (k == code) return &s;
    if (k == 0) return nullptr;
  }
  return nullptr;
}

Known add_code(const Interp& py, uintptr_t code, const Sig& s) noexcept {
  const Layout& l = py.l;
  char file[kMaxText], function[kMaxText];
  text_of(py, s.filename, true, file);
  text_of(py, l.co_qualname == Layout::kNone ? s.name : rd<uintptr_t>(code, l.co_qualname), false, function);
  const size_t file_len = std::strlen(file) + 1, function_len = std::strlen(function) + 1;
  const uint32_t traceable =
      l.co_firsttraceable == Layout::kNone ? 0 : static_cast<uint32_t>(rd<int32_t>(code, l.co_firsttraceable));
  const uint32_t digest = s.digest();

  std::lock_guard<spin_lock> guard(g_lock);
  if (Slot* slot = map_find(g_map.load(std::memory_order_relaxed), code)) {
    const auto id = static_cast<uint32_t>(slot->ident >> 32);
    const Entry* e = entry(id);
    if (e && e->sig == s) {  // another thread was first (or a digest collision: now settled)
      store(slot->ident, (uint64_t{id} << 32) | digest, std::memory_order_release);
      return {id, slot};
    }
  }
  const uint32_t id = g_next_id.load(std::memory_order_relaxed);
  if (id > kMaxCodes) {
    if (!g_full_said) {
      g_full_said = true;
      log::warn("python frames: %u code objects seen; stacks stop at the first code not seen before", kMaxCodes);
    }
    return {0, nullptr};
  }
  const uint32_t chunk = (id - 1) >> kChunkBits;
  Entry* entries = g_chunks[chunk].load(std::memory_order_relaxed);
  if (!entries) {
    entries = static_cast<Entry*>(map_pages(kChunk * sizeof(Entry)));
    if (!entries) return {0, nullptr};
    g_chunks[chunk].store(entries, std::memory_order_release);
  }
  Map* m = map_with_room();
  char* text = arena_alloc(file_len + function_len);
  if (!m || !text) return {0, nullptr};
  std::memcpy(text, file, file_len);
  std::memcpy(text + file_len, function, function_len);
  new (&entries[(id - 1) & (kChunk - 1)])
      Entry{Code{text, text + file_len, static_cast<uint32_t>(s.first_line < 0 ? 0 : s.first_line)}, code, s};
  g_next_id.store(id + 1, std::memory_order_release);
  // A reused address gets its new id here; readers of the old id's slot words see the id
  // does not match.
  Slot* slot = map_put(m, code, (uint64_t{id} << 32) | digest, 0, (uint64_t{id} << 32) | traceable);
  return {id, slot};
}

void prepare_fork() noexcept { g_lock.lock(); }
void after_fork() noexcept { g_lock.unlock(); }

}  // namespace detail

const Code* code(uint32_t id) noexcept {
  const detail::Entry* e = detail::entry(id);
  return e ? &e->pub : nullptr;
}

uint32_t count() noexcept { return detail::g_next_id.load(std::memory_order_acquire); }

}  // namespace cuw::core::pyframes
