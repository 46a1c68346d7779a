// cuwarden interposer core: the calling thread's Python stack, read without the GIL (see
// pyframes.hpp for why and what is promised; pyframes_detail.hpp for the layouts).
//
// What a capture reads, per frame: the frame (its code, its link to the caller, where it is in
// its bytecode), the code object's fields, and the lengths and first and last characters of
// its file and name (to notice a code object freed and another made at its address). Nothing
// is written to Python's memory.
// The thread's frames cannot change while it is inside our hook (it is not running Python and
// frames are only pushed and popped by their own thread); the code objects they point at hold
// strong references to their names and line tables. Every object is checked to be of the type
// it should be before its fields are used, and every walk is bounded, so a layout we got wrong
// yields no frames rather than wrong ones.
#include "core/callsites/pyframes.hpp"

#include <dlfcn.h>
#include <pthread.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "base/log.hpp"
#include "base/real.hpp"
#include "base/spin_lock.hpp"
#include "core/callsites/pyframes_detail.hpp"

namespace cuw::core::pyframes {

namespace detail {

namespace {

/// An unsigned varint of the location table (6 bits a byte, bit 6 = more), from t[i] on.
unsigned read_varint(const uint8_t* t, size_t n, size_t& i) noexcept {
  if (i >= n) return 0;
  unsigned b = t[i++];
  unsigned value = b & 63;
  unsigned shift = 0;
  while ((b & 64) && i < n && shift < 24) {
    b = t[i++];
    shift += 6;
    value |= (b & 63) << shift;
  }
  return value;
}

int read_signed_varint(const uint8_t* t, size_t n, size_t& i) noexcept {
  const unsigned u = read_varint(t, n, i);
  return (u & 1) ? -static_cast<int>(u >> 1) : static_cast<int>(u >> 1);
}

}  // namespace

int line_for(const uint8_t* t, size_t n, int first_line, int addr, int format) noexcept {
  if (addr < 0) return first_line;  // a frame not started yet (PyCode_Addr2Line does the same)
  if (!t) return -1;
  int64_t line = first_line;  // 64 bits: a table of garbage cannot overflow it
  int64_t end = 0;
  int64_t ar_line = -1;
  size_t i = 0;
  if (format == 310) {
    // 3.10 (Objects/lnotab_notes.txt, codeobject.c advance()): pairs of (bytecode bytes
    // covered, unsigned; line delta, signed, -128 = the range has no line).
    while (end <= addr) {
      if (i + 2 > n) return -1;
      end += t[i];
      const int delta = static_cast<int8_t>(t[i + 1]);
      i += 2;
      if (delta == -128) {
        ar_line = -1;
      } else {
        line += delta;
        ar_line = line;
      }
    }
  } else {
    // 3.11+ (Objects/locations.md, codeobject.c advance()): entries starting with a byte
    // whose bit 7 is set; bits 3-6 say the form, bits 0-2 the code units covered less one.
    // 15: no location; 14: long form and 13: no columns, both a signed varint line delta;
    // 10-12: one line, delta form-10; 0-9: short form, same line.
    while (end <= addr) {
      if (i >= n) return -1;
      const uint8_t b = t[i];
      const int form = (b >> 3) & 15;
      size_t j = i + 1;
      if (form == 13 || form == 14) {
        line += read_signed_varint(t, n, j);
      } else if (form >= 10 && form <= 12) {
        line += form - 10;
      }
      ar_line = (b >> 3) == 0x1f ? -1 : line;
      end += ((b & 7) + 1) * 2;
      do {
        ++i;
      } while (i < n && (t[i] & 128) == 0);
    }
  }
  return ar_line < 0 || ar_line > INT32_MAX ? -1 : static_cast<int>(ar_line);
}

}  // namespace detail

namespace {

using detail::Layout;
using detail::Model;

constexpr int kMaxFrames = 256;
/// Frames passed over without being reported (shims, frames not started): a walk visits at
/// most 2 * max + this many frames (a 3.12 stack crossing C alternates shims and frames), so
/// a cycle in a damaged chain ends.
constexpr int kMaxSkipped = 64;
constexpr size_t kMaxText = 256;          ///< bytes of a copied name, its NUL included
constexpr int64_t kMaxTable = 1 << 22;    ///< line table bytes read at most
constexpr int64_t kMaxStringLength = 1 << 24;
constexpr uint8_t kOwnedByGenerator = 1;  ///< FRAME_OWNED_BY_GENERATOR (3.11+)

// ---- the interpreter ----------------------------------------------------------------------

struct Interp {
  Layout l;
  void* (*this_thread_state)() = nullptr;  ///< PyGILState_GetThisThreadState
  int (*is_initialized)() = nullptr;       ///< Py_IsInitialized
  int (*is_finalizing)() = nullptr;        ///< Py_IsFinalizing (3.13+) / _Py_IsFinalizing
  uintptr_t code_type = 0, unicode_type = 0, bytes_type = 0, frame_type = 0;
};

enum State : int { kUnprobed, kProbing, kReady, kOff };
std::atomic<int> g_state{kUnprobed};
Interp g_py;  // written once by probe(), before g_state becomes kReady (release)

template <class T>
inline T rd(uintptr_t base, uint32_t off) noexcept {
  T v;
  std::memcpy(&v, reinterpret_cast<const void*>(base + off), sizeof v);
  return v;
}

inline bool is_a(const Interp& py, uintptr_t obj, uintptr_t type) noexcept {
  return obj != 0 && (obj & 7) == 0 && rd<uintptr_t>(obj, py.l.ob_type) == type;
}

void* sym(const char* name) noexcept { return hook::real_dlsym(RTLD_DEFAULT, name); }

/// Fills `l` from a mirror of the debug offsets; false if they do not look like what the
/// mirror describes (another layout of the groups: the offsets would be read from the wrong
/// words).
template <class D>
bool from_debug_offsets(const D& d, Layout& l) noexcept {
  const auto& ts = d.thread_state;
  const auto& fr = d.interpreter_frame;
  const auto& co = d.code_object;
  const auto& uni = d.unicode_object;
  // PyThreadState starts with prev, next, interp in every version; the frame group must fit
  // the frame; every code field lies inside the code object, the bytecode last.
  const bool plausible =
      ts.prev == 0 && ts.next == 8 && ts.interp == 16 && ts.current_frame < ts.size && ts.size < 65536 &&
      fr.size <= 512 && fr.previous < fr.size && fr.executable < fr.size && fr.instr_ptr < fr.size &&
      fr.owner < fr.size && co.size <= 4096 && co.filename < co.size && co.name < co.size && co.qualname < co.size &&
      co.linetable < co.size && co.firstlineno < co.size && co.co_code_adaptive <= co.size &&
      co.co_code_adaptive > co.linetable && d.pyobject.ob_type < d.pyobject.size && d.pyobject.size <= 64 &&
      d.tuple_object.ob_size < d.tuple_object.size && d.bytes_object.ob_size < d.bytes_object.ob_sval &&
      d.bytes_object.ob_sval < d.bytes_object.size && uni.length < uni.asciiobject_size &&
      uni.state < uni.asciiobject_size && uni.asciiobject_size <= 128;
  if (!plausible) return false;
  l.model = Model::interp_frames;
  l.ts_frame = static_cast<uint32_t>(ts.current_frame);
  l.fr_code = static_cast<uint32_t>(fr.executable);
  l.fr_previous = static_cast<uint32_t>(fr.previous);
  l.fr_instr = static_cast<uint32_t>(fr.instr_ptr);
  l.fr_owner = static_cast<uint32_t>(fr.owner);
  l.owner_skip_from = 3;  // 3.13 FRAME_OWNED_BY_CSTACK; 3.14 FRAME_OWNED_BY_INTERPRETER, _CSTACK = 4
  l.co_size = static_cast<uint32_t>(d.tuple_object.ob_size);  // PyVarObject's ob_size, as in any var object
  l.co_firstlineno = static_cast<uint32_t>(co.firstlineno);
  l.co_filename = static_cast<uint32_t>(co.filename);
  l.co_name = static_cast<uint32_t>(co.name);
  l.co_qualname = static_cast<uint32_t>(co.qualname);
  l.co_linetable = static_cast<uint32_t>(co.linetable);
  l.co_code_adaptive = static_cast<uint32_t>(co.co_code_adaptive);
  // _co_firsttraceable is not published: frames not started yet (a few instructions long,
  // calling nothing) are not told apart from 3.13 on.
  l.co_firsttraceable = Layout::kNone;
  l.ob_type = static_cast<uint32_t>(d.pyobject.ob_type);
  l.str_length = static_cast<uint32_t>(uni.length);
  l.str_state = static_cast<uint32_t>(uni.state);
  l.str_ascii_size = static_cast<uint32_t>(uni.asciiobject_size);
  l.str_compact_size = l.str_ascii_size + 16;  // utf8_length, utf8 (no wstr since 3.12)
  l.bytes_size = static_cast<uint32_t>(d.bytes_object.ob_size);
  l.bytes_data = static_cast<uint32_t>(d.bytes_object.ob_sval);
  l.line_format = 311;
  return true;
}

void prepare_fork() noexcept;
void after_fork() noexcept;

/// Finds the interpreter and its layout. False (with one warning when there is a Python we
/// cannot read) leaves capture() off for the process's life.
bool probe() noexcept {
  Interp py;
  py.this_thread_state = reinterpret_cast<void* (*)()>(sym("PyGILState_GetThisThreadState"));
  if (!py.this_thread_state) return false;  // no Python here: nothing to say
  unsigned long hex = 0;
  if (const auto* v = static_cast<const unsigned long*>(sym("Py_Version"))) {
    hex = *v;  // 3.11+: PY_VERSION_HEX as data
  } else if (auto get = reinterpret_cast<const char* (*)()>(sym("Py_GetVersion"))) {
    unsigned major = 0, minor = 0, micro = 0;
    if (const char* s = get(); s && std::sscanf(s, "%u.%u.%u", &major, &minor, &micro) >= 2)
      hex = (major << 24) | (minor << 16) | (micro << 8);
  }
  const unsigned major = static_cast<unsigned>(hex >> 24), minor = static_cast<unsigned>((hex >> 16) & 0xff);
  const unsigned micro = static_cast<unsigned>((hex >> 8) & 0xff);
  if (major != 3 || minor < 10) {
    if (hex)
      log::warn("python frames: Python %u.%u is not read (3.10 and later are); call sites keep native frames only",
                major, minor);
    else
      log::warn("python frames: the Python in this process does not say its version; call sites keep native frames only");
    return false;
  }
  py.is_initialized = reinterpret_cast<int (*)()>(sym("Py_IsInitialized"));
  py.is_finalizing = reinterpret_cast<int (*)()>(sym("Py_IsFinalizing"));
  if (!py.is_finalizing) py.is_finalizing = reinterpret_cast<int (*)()>(sym("_Py_IsFinalizing"));
  py.code_type = reinterpret_cast<uintptr_t>(sym("PyCode_Type"));
  py.unicode_type = reinterpret_cast<uintptr_t>(sym("PyUnicode_Type"));
  py.bytes_type = reinterpret_cast<uintptr_t>(sym("PyBytes_Type"));
  py.frame_type = reinterpret_cast<uintptr_t>(sym("PyFrame_Type"));
  if (!py.is_initialized || !py.is_finalizing || !py.code_type || !py.unicode_type || !py.bytes_type ||
      (minor == 10 && !py.frame_type)) {
    log::warn("python frames: Python %u.%u lacks a symbol they are read with; call sites keep native frames only",
              major, minor);
    return false;
  }
  if (minor <= 12) {
    // A larger object header (Py_TRACE_REFS) moves every field; 3.13+ publish where they are.
    if (sym("_Py_PrintReferenceAddresses")) {
      log::warn("python frames: Python %u.%u built with Py_TRACE_REFS is not read; call sites keep native frames only",
                major, minor);
      return false;
    }
    py.l = minor == 10 ? detail::k310 : minor == 11 ? detail::k311 : detail::k312;
  } else {
    const auto* rt = static_cast<const char*>(sym("_PyRuntime"));
    detail::DebugOffsets314 d{};  // the larger mirror: either one's prefix is read into it
    if (rt) std::memcpy(&d, rt, minor == 13 ? sizeof(detail::DebugOffsets313) : sizeof d);
    if (!rt || std::memcmp(d.cookie, detail::kDebugCookie, sizeof d.cookie) != 0 || (d.version >> 16) != (hex >> 16)) {
      log::warn("python frames: Python %u.%u publishes no debug offsets we recognize; call sites keep native frames only",
                major, minor);
      return false;
    }
    if (d.free_threaded) {
      log::warn("python frames: free-threaded Python %u.%u is not read; call sites keep native frames only", major,
                minor);
      return false;
    }
    bool ok = false;
    if (minor == 13) {
      detail::DebugOffsets313 d13;
      std::memcpy(&d13, rt, sizeof d13);
      ok = from_debug_offsets(d13, py.l);
    } else {
      ok = from_debug_offsets(d, py.l);
      py.l.code_tagged = true;  // f_executable is a _PyStackRef
    }
    if (!ok) {
      log::warn("python frames: Python %u.%u's debug offsets are not laid out as %s; call sites keep native frames only",
                major, minor, minor == 13 ? "3.13's" : "3.14's");
      return false;
    }
    if (minor > 14)
      log::info("python frames: Python %u.%u read through 3.14's debug offsets (they passed their checks)", major,
                minor);
  }
  g_py = py;
  pthread_atfork(prepare_fork, after_fork, after_fork);
  log::debug("python frames: Python %u.%u.%u found", major, minor, micro);
  return true;
}

// ---- the code table -----------------------------------------------------------------------
//
// Entries (id - 1 -> Entry) sit in chunks that are never moved or freed, so code(id) is two
// loads. A hash map from a code object's address to its id is read without a lock. Each slot
// also holds a digest of what identifies the code (Sig), the last line found for it and its
// first traceable instruction, so that capturing through a known code touches one line of
// ours. The map grows by copying into a new one that replaces it (the old one stays mapped,
// for readers still in it). Inserts take g_lock, a spin lock held for a few hundred
// instructions: the strings are read and converted before it is taken.

/// A str's length and its first and last 8 bytes (raw, whatever its kind).
struct StrSum {
  int64_t length = -1;
  uint64_t head = 0, tail = 0;
  bool operator==(const StrSum&) const = default;
};

/// What identifies a code object beyond its address. A code object freed and another made at
/// the same address (pymalloc hands back the block freed last) often gets its name and file
/// strings at the same addresses too when they died with it (exec'd code; torch.fx modules,
/// whose files are "<eval_with_key>.N"): their characters tell them apart. A code object
/// differing from a dead one at its address only in its qualified name (same file, name and
/// first line) is taken for it.
struct Sig {
  uintptr_t filename = 0, name = 0;
  StrSum file_sum, name_sum;
  int32_t first_line = 0;
  bool operator==(const Sig&) const = default;

  /// 32 bits of all of it, for the map's slot: about 15 instructions.
  uint32_t digest() const noexcept {
    uint64_t h = filename ^ (name << 1) ^ (static_cast<uint64_t>(static_cast<uint32_t>(first_line)) << 40);
    h ^= file_sum.head * 0x9E3779B97F4A7C15ull;
    h ^= file_sum.tail * 0xC2B2AE3D27D4EB4Full;
    h ^= name_sum.head * 0x165667B19E3779F9ull;
    h ^= name_sum.tail * 0xD6E8FEB86659FD93ull;
    h ^= (static_cast<uint64_t>(file_sum.length) << 24) ^ static_cast<uint64_t>(name_sum.length);
    h *= 0x9E3779B97F4A7C15ull;
    return static_cast<uint32_t>(h >> 32);
  }
};

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

/// One code object in the map. Words are read and written whole (std::atomic_ref); the
/// ones after `ident` carry the id they belong to, so a slot whose code was replaced (a
/// reused address) never lends the old code's line or first instruction to the new one.
struct Slot {
  uintptr_t key;       ///< the code object's address; 0 = empty
  uint64_t ident;      ///< id << 32 | Sig digest
  uint64_t memo;       ///< the last line found for it, packed as in g_lines (below)
  uint64_t traceable;  ///< id << 32 | its _co_firsttraceable (3.11, 3.12)
};
static_assert(sizeof(Slot) == 32);

struct Map {
  size_t mask;
  size_t used;  ///< under g_lock
  Slot* slots;  ///< 32-byte aligned: a slot is one cache line's quarter, never two lines
};
std::atomic<Map*> g_map{nullptr};

void* map_pages(size_t bytes) noexcept {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

inline size_t hash_of(uintptr_t code) noexcept {
  return static_cast<size_t>(((code >> 4) * 0x9E3779B97F4A7C15ull) >> 20);
}

template <class T>
inline T load(T& word, std::memory_order order) noexcept {
  return std::atomic_ref<T>(word).load(order);
}
template <class T>
inline void store(T& word, T value, std::memory_order order) noexcept {
  std::atomic_ref<T>(word).store(value, order);
}

/// The slot of `code`, nullptr if none. Lock-free: a slot's words are stored before its key
/// (release); its ident may be replaced meanwhile (a reused address), which the caller
/// checks against the code object anyway.
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

// ---- identifying a code object ------------------------------------------------------------

/// `str`'s length and first and last 8 bytes of characters (bytes past its end masked off);
/// length -1 for what chars_of() refuses. The first word is read whole even when shorter:
/// a compact str's characters are followed by their NUL, and its block (pymalloc's, rounded
/// to 16 bytes, or malloc's, to 8) ends at an 8-byte boundary past it, so the word stays
/// inside the object. About 20 instructions.
inline StrSum sum_of(const Interp& py, uintptr_t str) noexcept {
  StrSum m;
  if (!is_a(py, str, py.unicode_type)) return m;
  const Layout& l = py.l;
  const auto state = rd<uint32_t>(str, l.str_state);
  const auto length = rd<int64_t>(str, l.str_length);
  const unsigned kind = (state >> 2) & 7;
  if (!((state >> 5) & 1) || (kind != 1 && kind != 2 && kind != 4) || length < 0 || length > kMaxStringLength)
    return m;
  const uintptr_t data = str + (((state >> 6) & 1) ? l.str_ascii_size : l.str_compact_size);
  const auto bytes = static_cast<uint64_t>(length) * kind;
  m.length = length;
  if (bytes >= 8) {
    m.head = rd<uint64_t>(data, 0);
    m.tail = rd<uint64_t>(data, static_cast<uint32_t>(bytes - 8));
  } else {
    m.head = rd<uint64_t>(data, 0) & ((uint64_t{1} << (bytes * 8)) - 1);
  }
  return m;
}

Sig sig_of(const Interp& py, uintptr_t code) noexcept {
  const Layout& l = py.l;
  Sig s;
  s.filename = rd<uintptr_t>(code, l.co_filename);
  s.name = rd<uintptr_t>(code, l.co_name);
  s.first_line = rd<int32_t>(code, l.co_firstlineno);
  s.file_sum = sum_of(py, s.filename);
  s.name_sum = sum_of(py, s.name);
  return s;
}

struct Known {
  uint32_t id;  ///< 0: none (the table is full, or memory ran out)
  Slot* slot;
};

bool g_full_said = false;  // under g_lock

/// Slow path: a new id for `code` (or the one another thread just gave it).
__attribute__((noinline)) Known add_code(const Interp& py, uintptr_t code, const Sig& s) noexcept {
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

/// The id of the code object at `code` (checked to be one), adding it the first time.
/// Hot path: the code object's fields, its file's and name's headers, one map slot.
inline Known code_id(const Interp& py, uintptr_t code) noexcept {
  const Sig s = sig_of(py, code);
  if (Slot* slot = map_find(g_map.load(std::memory_order_acquire), code)) {
    const uint64_t ident = load(slot->ident, std::memory_order_acquire);
    if (__builtin_expect(static_cast<uint32_t>(ident) == s.digest(), 1))
      return {static_cast<uint32_t>(ident >> 32), slot};
  }
  return add_code(py, code, s);
}

// ---- lines --------------------------------------------------------------------------------
//
// A line found for (code id, instruction) is kept in the code's slot (the last one) and in a
// direct-mapped cache (for code that allocates from several lines): the frames of a training
// loop's stack sit at the same instructions allocation after allocation, and the line table is
// a walk from its start. Both pack it in one 64-bit word (id 24 bits, instruction + 1 20 bits,
// line 20 bits), read and written whole without a lock; 0 is empty (ids start at 1).

constexpr size_t kLineSlots = 8192;
std::atomic<uint64_t> g_lines[kLineSlots];

uint32_t line_of(const Interp& py, const Known& k, uintptr_t code, int64_t lasti) noexcept {
  const Layout& l = py.l;
  const uint64_t pos = static_cast<uint64_t>(lasti + 1);
  const bool cacheable = k.id < (1u << 24) && pos < (1u << 20);
  const uint64_t tag = (static_cast<uint64_t>(k.id) << 20) | pos;
  std::atomic<uint64_t>& cached = g_lines[(tag * 0x9E3779B97F4A7C15ull) >> 51];
  if (cacheable) {
    uint64_t v = k.slot ? load(k.slot->memo, std::memory_order_relaxed) : 0;
    if ((v >> 20) == tag) return static_cast<uint32_t>(v & 0xFFFFF);
    v = cached.load(std::memory_order_relaxed);
    if ((v >> 20) == tag) {
      if (k.slot) store(k.slot->memo, v, std::memory_order_relaxed);
      return static_cast<uint32_t>(v & 0xFFFFF);
    }
  }
  int line = -1;
  // The instruction must lie inside the bytecode (PyCode_Addr2Line asserts it).
  int64_t units = 0;
  if (l.co_size != Layout::kNone) {
    units = rd<int64_t>(code, l.co_size);
  } else if (const auto bytecode = rd<uintptr_t>(code, l.co_bytecode); is_a(py, bytecode, py.bytes_type)) {
    units = rd<int64_t>(bytecode, l.bytes_size) / 2;
  }
  const auto first = rd<int32_t>(code, l.co_firstlineno);
  if (lasti < 0) {
    line = first;
  } else if (lasti < units) {
    const auto table = rd<uintptr_t>(code, l.co_linetable);
    if (is_a(py, table, py.bytes_type)) {
      int64_t n = rd<int64_t>(table, l.bytes_size);
      if (n > kMaxTable) n = kMaxTable;
      if (n > 0)
        line = detail::line_for(reinterpret_cast<const uint8_t*>(table + l.bytes_data), static_cast<size_t>(n), first,
                                static_cast<int>(lasti * 2), l.line_format);
    }
  }
  const uint32_t result = line > 0 ? static_cast<uint32_t>(line) : 0;
  if (cacheable && result < (1u << 20)) {
    const uint64_t v = (tag << 20) | result;
    cached.store(v, std::memory_order_relaxed);
    if (k.slot) store(k.slot->memo, v, std::memory_order_relaxed);
  }
  return result;
}

// ---- the walk -----------------------------------------------------------------------------

int walk(const Interp& py, uintptr_t frame, Frame* out, int max) noexcept {
  const Layout& l = py.l;
  int n = 0;
  for (int visited = 0; frame != 0 && n < max && visited < 2 * max + kMaxSkipped; ++visited) {
    if (frame & 7) break;
    if (l.model == Model::frame_objects && rd<uintptr_t>(frame, l.ob_type) != py.frame_type) break;
    const auto previous = rd<uintptr_t>(frame, l.fr_previous);
    uintptr_t code = rd<uintptr_t>(frame, l.fr_code);
    if (l.code_tagged) code &= ~uintptr_t{7};
    const unsigned owner = l.fr_owner == Layout::kNone ? 0u : rd<uint8_t>(frame, l.fr_owner);
    if (static_cast<int>(owner) >= l.owner_skip_from || !is_a(py, code, py.code_type)) {
      frame = previous;  // the interpreter's own (3.12+ shims; f_executable None)
      continue;
    }
    const Known k = code_id(py, code);
    if (k.id == 0) break;
    int64_t lasti;
    uint32_t line = 0;
    if (l.model == Model::frame_objects) {
      lasti = rd<int32_t>(frame, l.fr_instr);
      const auto lineno = rd<int32_t>(frame, l.fr_lineno);  // kept up to date only while tracing
      if (lineno > 0) line = static_cast<uint32_t>(lineno);
    } else {
      const auto instr = rd<uintptr_t>(frame, l.fr_instr);
      lasti = (static_cast<int64_t>(instr) - static_cast<int64_t>(code + l.co_code_adaptive)) / 2;
      if (l.co_firsttraceable != Layout::kNone && owner != kOwnedByGenerator) {
        // Not started yet (_PyFrame_IsIncomplete): tracebacks leave such frames out too.
        const uint64_t t = k.slot ? load(k.slot->traceable, std::memory_order_relaxed) : 0;
        const int32_t first = (t >> 32) == k.id ? static_cast<int32_t>(t) : rd<int32_t>(code, l.co_firsttraceable);
        if (lasti < first) {
          frame = previous;
          continue;
        }
      }
    }
    out[n].code = k.id;
    out[n].line = line ? line : line_of(py, k, code, lasti < -1 ? -1 : lasti);
    ++n;
    frame = previous;
  }
  return n;
}

void prepare_fork() noexcept { g_lock.lock(); }
void after_fork() noexcept { g_lock.unlock(); }

}  // namespace

bool available() noexcept {
  int s = g_state.load(std::memory_order_acquire);
  if (__builtin_expect(s >= kReady, 1)) return s == kReady;
  int expected = kUnprobed;
  if (!g_state.compare_exchange_strong(expected, kProbing, std::memory_order_acq_rel)) {
    // Another thread is probing: not yet, rather than wait for it. It is in dlsym, which
    // takes the loader's lock, and this thread may hold that lock (a CUDA call from a
    // library's constructor): waiting here could wait forever.
    return expected == kReady;
  }
  s = probe() ? kReady : kOff;
  g_state.store(s, std::memory_order_release);
  return s == kReady;
}

int capture(Frame* out, int max) noexcept {
  if (!out || max <= 0) return 0;
  if (__builtin_expect(g_state.load(std::memory_order_acquire) != kReady, 0) && !available()) return 0;
  const Interp& py = g_py;
  if (max > kMaxFrames) max = kMaxFrames;
  // Before Py_Initialize and once finalizing has begun (thread states of other threads are
  // then being deleted), nothing is read.
  if (!py.is_initialized() || py.is_finalizing()) return 0;
  const auto ts = reinterpret_cast<uintptr_t>(py.this_thread_state());
  if (!ts || (ts & 7)) return 0;
  const Layout& l = py.l;
  uintptr_t frame;
  if (l.ts_cframe != Layout::kNone) {
    const auto cframe = rd<uintptr_t>(ts, l.ts_cframe);
    if (!cframe || (cframe & 7)) return 0;
    frame = rd<uintptr_t>(cframe, l.cframe_current);
  } else {
    frame = rd<uintptr_t>(ts, l.ts_frame);
  }
  const int n = walk(py, frame, out, max);
  // Finalization that began during the walk may have freed what it read: say nothing then.
  return n > 0 && py.is_finalizing() ? 0 : n;
}

const Code* code(uint32_t id) noexcept {
  const Entry* e = entry(id);
  return e ? &e->pub : nullptr;
}

uint32_t count() noexcept { return g_next_id.load(std::memory_order_acquire); }

}  // namespace cuw::core::pyframes
