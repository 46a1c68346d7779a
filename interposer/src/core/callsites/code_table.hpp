// cuwarden interposer core: the code table of the Python frames (pyframes.hpp: code(),
// count()): each code object met is given an id, its file and name copied once.
//
// Entries (id - 1 -> Entry) sit in chunks that are never moved or freed, so code(id) is two
// loads. A hash map from a code object's address to its id is read without a lock. Each slot
// also holds a digest of what identifies the code (Sig), the last line found for it and its
// first traceable instruction, so that capturing through a known code touches one line of
// ours. The map grows by copying into a new one that replaces it (the old one stays mapped,
// for readers still in it). Inserts take g_lock, a spin lock held for a few hundred
// instructions: the strings are read and converted before it is taken.
//
// What a capture reads of a code object to find it in the table is here, inline; what adds
// one, and the strings it copies, are in code_table.cpp.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/callsites/pyframes_interp.hpp"

namespace cuw::core::pyframes::detail {

constexpr int64_t kMaxStringLength = 1 << 24;  ///< characters of a str read at most

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

/// One code object in the map. Words are read and written whole (std::atomic_ref); the
/// ones after `ident` carry the id they belong to, so a slot whose code was replaced (a
/// reused address) never lends the old code's line or first instruction to the new one.
struct Slot {
  uintptr_t key;       ///< the code object's address; 0 = empty
  uint64_t ident;      ///< id << 32 | Sig digest
  uint64_t memo;       ///< the last line found for it, packed as in g_lines (pyframes.cpp)
  uint64_t traceable;  ///< id << 32 | its _co_firsttraceable (3.11, 3.12)
};
static_assert(sizeof(Slot) == 32);

struct Map {
  size_t mask;
  size_t used;  ///< under g_lock (code_table.cpp)
  Slot* slots;  ///< 32-byte aligned: a slot is one cache line's quarter, never two lines
};
/// The current map (replaced, never freed, as it grows). Read without a lock.
extern std::atomic<Map*> g_map;

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

/// The slot of `code` in `m`, nullptr if none. Lock-free: a slot's words are stored before
/// its key (release); its ident may be replaced meanwhile (a reused address), which the
/// caller checks against the code object anyway.
Slot* map_find(const Map* m, uintptr_t code) noexcept;

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

inline Sig sig_of(const Interp& py, uintptr_t code) noexcept {
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

/// Slow path: a new id for `code` (or the one another thread just gave it), its strings
/// copied. Takes the table's spin lock. Never inlined: it stays out of the walk's code.
__attribute__((noinline)) Known add_code(const Interp& py, uintptr_t code, const Sig& s) noexcept;

/// pthread_atfork's handlers (registered by available()): the table's lock is held across a
/// fork, so that the child never starts with it taken by a thread it does not have.
void prepare_fork() noexcept;
void after_fork() noexcept;

}  // namespace cuw::core::pyframes::detail
