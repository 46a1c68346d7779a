// cuwarden interposer core: the calling thread's Python stack, read without the GIL (see
// pyframes.hpp for why and what is promised; pyframes_detail.hpp for the layouts,
// pyframes_probe.cpp for how they are chosen, code_table.hpp for the ids of code objects).
// Here: the walk of a thread's frames and the line each frame is at.
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

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/callsites/code_table.hpp"
#include "core/callsites/pyframes_detail.hpp"
#include "core/callsites/pyframes_interp.hpp"

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

using namespace detail;

constexpr int kMaxFrames = 256;
/// Frames passed over without being reported (shims, frames not started): a walk visits at
/// most 2 * max + this many frames (a 3.12 stack crossing C alternates shims and frames), so
/// a cycle in a damaged chain ends.
constexpr int kMaxSkipped = 64;
constexpr int64_t kMaxTable = 1 << 22;    ///< line table bytes read at most
constexpr uint8_t kOwnedByGenerator = 1;  ///< FRAME_OWNED_BY_GENERATOR (3.11+)

enum State : int { kUnprobed, kProbing, kReady, kOff };
std::atomic<int> g_state{kUnprobed};
Interp g_py;  // written once by probe(), before g_state becomes kReady (release)

// ---- a frame's code -----------------------------------------------------------------------

/// The id of the code object at `code` (checked to be one), adding it to the table the first
/// time. Hot path: the code object's fields, its file's and name's headers, one map slot.
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
  const bool found = probe(g_py);
  if (found) pthread_atfork(prepare_fork, after_fork, after_fork);
  s = found ? kReady : kOff;
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

}  // namespace cuw::core::pyframes
