// cuwarden interposer core: the interpreter the Python frames are read from (pyframes.hpp):
// its entry points, its types and the layout of its structs, found once by probe(); and the
// reads every walk of its memory makes.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/callsites/pyframes_detail.hpp"

namespace cuw::core::pyframes::detail {

/// The interpreter in the process, as probe() found it: written once, before any capture.
struct Interp {
  Layout l;
  void* (*this_thread_state)() = nullptr;  ///< PyGILState_GetThisThreadState
  int (*is_initialized)() = nullptr;       ///< Py_IsInitialized
  int (*is_finalizing)() = nullptr;        ///< Py_IsFinalizing (3.13+) / _Py_IsFinalizing
  uintptr_t code_type = 0, unicode_type = 0, bytes_type = 0, frame_type = 0;
};

/// The T at `base` + `off` bytes of the interpreter's memory, however aligned.
template <class T>
inline T rd(uintptr_t base, uint32_t off) noexcept {
  T v;
  std::memcpy(&v, reinterpret_cast<const void*>(base + off), sizeof v);
  return v;
}

/// Whether `obj` is an object of type `type` (its ob_type read; an unaligned or null pointer
/// is not).
inline bool is_a(const Interp& py, uintptr_t obj, uintptr_t type) noexcept {
  return obj != 0 && (obj & 7) == 0 && rd<uintptr_t>(obj, py.l.ob_type) == type;
}

/// Finds the interpreter and its layout into `out`. False (with one warning when there is a
/// Python we cannot read) leaves capture() off for the process's life. Cold (dlsym calls);
/// called once, by the first available().
bool probe(Interp& out) noexcept;

}  // namespace cuw::core::pyframes::detail
