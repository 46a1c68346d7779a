// cuwarden interposer core: the calling thread's Python stack, read without the GIL.
//
// Why without it: PyTorch releases the GIL around every operator and holds its caching
// allocator's lock across cudaMalloc, so a hook that took the GIL could wait on a thread that
// waits on that lock. A thread inside one of our hooks is not running Python, so its own frame
// chain cannot change under us: it is read as memory. The interpreter is called only for
// PyGILState_GetThisThreadState, Py_IsInitialized and the finalization probe; no Python object
// is made, no reference taken, no Python code run (a collection run from a hook could free
// CUDA memory inside it).
//
// Versions: 3.10, 3.11 and 3.12 by their struct layouts (pyframes_detail.hpp, checked against
// the real headers by tests/interposer/pyframes_layout.cpp); 3.13 and later by the debug
// offsets the interpreter publishes in _PyRuntime. Others (and free-threaded or Py_TRACE_REFS
// builds): capture() returns 0 and one warning says why. No Python in the process: nothing.
//
// Strings: each code object's file and function name are copied once into a process-wide
// table and named by an id from then on (what the shared-memory stack table stores); an id
// stays valid for the process's life. A code object freed and another made at its address is
// noticed (its fields are compared with what was copied) and given a new id.
#pragma once

#include <cstdint>

namespace cuw::core::pyframes {

/// One Python frame: the code object's id in the table (>= 1; code()) and the line the frame
/// is at (0 when the code has no line there).
struct Frame {
  uint32_t code;
  uint32_t line;
};

/// A code object as first seen: NUL-terminated UTF-8, each at most 255 bytes (a longer file
/// keeps its end after "...", a longer name its start); first_line is co_firstlineno.
/// function is the qualified name (Class.method, outer.<locals>.inner) from 3.11 on, the plain
/// name on 3.10. Never freed.
struct Code {
  const char* file;
  const char* function;
  uint32_t first_line;
};

/// Whether a supported interpreter is in the process. The first call looks for it (a few
/// dlsym calls, and one log line if it is a version we cannot read); later calls cost one
/// load. Thread-safe; a call made while another thread is still looking answers false
/// rather than wait for it (that thread is in dlsym, under the loader's lock).
bool available() noexcept;

/// The calling thread's Python frames, innermost first, at most `max` (at most 256) into
/// `out`; 0 when the thread has no Python frames, the interpreter is starting or finalizing,
/// or it is not supported. Never takes the GIL and never calls into Python beyond the probes
/// above. Thread-safe: many threads capture at once. Frames the interpreter keeps for itself
/// (3.12+ shims, frames not started yet) are left out; a chain longer than `max` stops there.
/// Cost with every code already in the table: no lock, about 270 instructions a frame (its
/// code object, its file's and name's headers, one slot of the code table, which also keeps
/// the frame's line); 16 frames took 0.25-0.5 us with warm caches and 4.5-15 us with all of
/// it evicted (measured by tests/interposer/test_pyframes.py). A code seen for the first time
/// is copied under a small spin lock: about 0.5 us.
int capture(Frame* out, int max) noexcept;

/// The code with id `id`, or nullptr if there is none (yet). Stable for the process's life.
/// Thread-safe, lock-free.
const Code* code(uint32_t id) noexcept;

/// The next id to be given: codes with ids in [first, count()) are the ones added since a
/// caller saw count() == first. Thread-safe, lock-free.
uint32_t count() noexcept;

}  // namespace cuw::core::pyframes
