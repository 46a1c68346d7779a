// Interposer tests: the offsets the Python frames (core/callsites/pyframes*) read Python's structs with
// (interposer/src/core/callsites/pyframes_detail.hpp), held to the installed Python's own headers. Built
// against whichever Python CMake finds (3.10 to 3.14): a number that disagrees with the
// header stops the build; the program then checks the one thing a static_assert cannot (the
// bit positions of PyASCIIObject's state) and prints the version it checked.
#define Py_BUILD_CORE 1
#include <Python.h>
#if PY_VERSION_HEX < 0x030b0000
#include <frameobject.h>
#elif PY_VERSION_HEX < 0x030d0000
#include <internal/pycore_frame.h>
#elif PY_VERSION_HEX < 0x030e0000
#include <internal/pycore_frame.h>
#include <internal/pycore_runtime.h>
#else
#include <internal/pycore_debug_offsets.h>
#include <internal/pycore_interpframe_structs.h>
#endif

#include <cstddef>
#include <cstdio>
#include <cstring>

#include "core/callsites/pyframes_detail.hpp"

namespace d = cuw::core::pyframes::detail;

// Every version: the object header, strings and bytes as the walker reads them.
static_assert(offsetof(PyObject, ob_type) == 8);
static_assert(offsetof(PyVarObject, ob_size) == 16);
static_assert(offsetof(PyBytesObject, ob_base.ob_size) == 16 && offsetof(PyBytesObject, ob_sval) == 32);
static_assert(offsetof(PyASCIIObject, length) == 16 && offsetof(PyASCIIObject, state) == 32);

#if PY_VERSION_HEX >= 0x030a0000 && PY_VERSION_HEX < 0x030b0000
constexpr d::Layout L = d::k310;
static_assert(offsetof(PyThreadState, frame) == L.ts_frame);
static_assert(offsetof(PyFrameObject, f_back) == L.fr_previous);
static_assert(offsetof(PyFrameObject, f_code) == L.fr_code);
static_assert(offsetof(PyFrameObject, f_lasti) == L.fr_instr);
static_assert(offsetof(PyFrameObject, f_lineno) == L.fr_lineno);
static_assert(offsetof(PyCodeObject, co_code) == L.co_bytecode);
static_assert(offsetof(PyCodeObject, co_firstlineno) == L.co_firstlineno);
static_assert(offsetof(PyCodeObject, co_filename) == L.co_filename);
static_assert(offsetof(PyCodeObject, co_name) == L.co_name);
static_assert(offsetof(PyCodeObject, co_linetable) == L.co_linetable);
#elif PY_VERSION_HEX >= 0x030b0000 && PY_VERSION_HEX < 0x030d0000
#if PY_VERSION_HEX < 0x030c0000
constexpr d::Layout L = d::k311;
static_assert(L.owner_skip_from > 255);  // 3.11 has no shim frames
#else
constexpr d::Layout L = d::k312;
static_assert(FRAME_OWNED_BY_CSTACK == L.owner_skip_from);
#endif
static_assert(FRAME_OWNED_BY_GENERATOR == 1);
static_assert(offsetof(PyThreadState, cframe) == L.ts_cframe);
static_assert(offsetof(_PyCFrame, current_frame) == L.cframe_current);
static_assert(offsetof(_PyInterpreterFrame, f_code) == L.fr_code);
static_assert(offsetof(_PyInterpreterFrame, previous) == L.fr_previous);
static_assert(offsetof(_PyInterpreterFrame, prev_instr) == L.fr_instr);
static_assert(offsetof(_PyInterpreterFrame, owner) == L.fr_owner);
static_assert(offsetof(PyCodeObject, ob_base.ob_size) == L.co_size);
static_assert(offsetof(PyCodeObject, co_firstlineno) == L.co_firstlineno);
static_assert(offsetof(PyCodeObject, co_filename) == L.co_filename);
static_assert(offsetof(PyCodeObject, co_name) == L.co_name);
static_assert(offsetof(PyCodeObject, co_qualname) == L.co_qualname);
static_assert(offsetof(PyCodeObject, co_linetable) == L.co_linetable);
static_assert(offsetof(PyCodeObject, _co_firsttraceable) == L.co_firsttraceable);
static_assert(offsetof(PyCodeObject, co_code_adaptive) == L.co_code_adaptive);
#else
// 3.13+: the mirror's words must be the interpreter's, for every field read.
#if PY_VERSION_HEX < 0x030e0000
using M = d::DebugOffsets313;
static_assert(FRAME_OWNED_BY_CSTACK == 3);
#else
using M = d::DebugOffsets314;
static_assert(FRAME_OWNED_BY_INTERPRETER == 3);
#endif
#define CUWT_SAME(field) static_assert(offsetof(_Py_DebugOffsets, field) == offsetof(M, field), #field)
CUWT_SAME(version);
CUWT_SAME(free_threaded);
CUWT_SAME(thread_state.prev);
CUWT_SAME(thread_state.next);
CUWT_SAME(thread_state.interp);
CUWT_SAME(thread_state.current_frame);
CUWT_SAME(interpreter_frame.size);
CUWT_SAME(interpreter_frame.previous);
CUWT_SAME(interpreter_frame.executable);
CUWT_SAME(interpreter_frame.instr_ptr);
CUWT_SAME(interpreter_frame.owner);
CUWT_SAME(code_object.size);
CUWT_SAME(code_object.filename);
CUWT_SAME(code_object.name);
CUWT_SAME(code_object.qualname);
CUWT_SAME(code_object.linetable);
CUWT_SAME(code_object.firstlineno);
CUWT_SAME(code_object.co_code_adaptive);
CUWT_SAME(pyobject.size);
CUWT_SAME(pyobject.ob_type);
CUWT_SAME(tuple_object.size);
CUWT_SAME(tuple_object.ob_size);
CUWT_SAME(bytes_object.size);
CUWT_SAME(bytes_object.ob_size);
CUWT_SAME(bytes_object.ob_sval);
CUWT_SAME(unicode_object.state);
CUWT_SAME(unicode_object.length);
CUWT_SAME(unicode_object.asciiobject_size);
static_assert(sizeof(PyCompactUnicodeObject) == sizeof(PyASCIIObject) + 16);  // what pyframes_probe.cpp assumes
#undef CUWT_SAME
#endif

#if PY_VERSION_HEX < 0x030d0000
static_assert(sizeof(PyASCIIObject) == L.str_ascii_size);
static_assert(sizeof(PyCompactUnicodeObject) == L.str_compact_size);
static_assert(offsetof(PyASCIIObject, length) == L.str_length && offsetof(PyASCIIObject, state) == L.str_state);
static_assert(offsetof(PyBytesObject, ob_sval) == L.bytes_data);
#endif

int main() {
  // kind at bits 2-4, compact at 5, ascii at 6 (code_table.cpp chars_of(), code_table.hpp sum_of()).
  PyASCIIObject s;
  std::memset(&s, 0, sizeof s);
  s.state.kind = PyUnicode_4BYTE_KIND;
  s.state.compact = 1;
  s.state.ascii = 1;
  unsigned bits = 0;
  std::memcpy(&bits, &s.state, sizeof bits);
  if (bits != ((4u << 2) | (1u << 5) | (1u << 6))) {
    std::printf("PyASCIIObject.state bits are 0x%x, not kind<<2 | compact<<5 | ascii<<6\n", bits);
    return 1;
  }
  std::printf("pyframes layout agrees with the headers of Python %s\n", PY_VERSION);
  return 0;
}
