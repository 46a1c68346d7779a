// cuwarden interposer core: what the Python frames know of CPython's insides, apart so that
// their tests can hold it to the real headers: the struct offsets of 3.10, 3.11 and 3.12 (which
// publish none), mirrors of the debug offsets 3.13 and 3.14 publish at the start of
// _PyRuntime, and the two line-table decoders. tests/interposer/pyframes_layout.cpp compiles
// against an installed Python's own headers and static_asserts every number here that belongs
// to that version; ctest builds it for each Python 3.10 to 3.14 it finds with headers (checked
// so far: 3.10.13, 3.11.7, 3.12.1, 3.12.3 and 3.13.0; 3.14's mirror below is taken from its
// release headers, not yet checked against an installed 3.14).
//
// All offsets are in bytes, for 64-bit release builds (x86-64 and aarch64 lay these structs
// out alike). A debug build with Py_TRACE_REFS has a larger object header: pyframes_probe.cpp
// turns the frames off there, and the object type checks would refuse every frame anyway.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cuw::core::pyframes::detail {

/// How frames are linked and what an instruction offset means.
enum class Model : uint8_t {
  frame_objects,  ///< 3.10: PyFrameObject chain (f_back), f_lasti in code units
  interp_frames,  ///< 3.11+: _PyInterpreterFrame chain (previous), pointer into the bytecode
};

/// The offsets the walker reads: one flat table for every supported version (the per-version
/// constants below, or filled from the debug offsets at start). kNone: no such field.
struct Layout {
  static constexpr uint32_t kNone = 0xffffffffu;
  Model model = Model::interp_frames;
  // PyThreadState -> the innermost frame: 3.11/3.12 go through tstate->cframe (a _PyCFrame on
  // the C stack of the innermost eval loop); 3.10 and 3.13+ hold the frame in the tstate.
  uint32_t ts_cframe = kNone;       ///< PyThreadState.cframe (3.11, 3.12)
  uint32_t cframe_current = kNone;  ///< _PyCFrame.current_frame (3.11, 3.12)
  uint32_t ts_frame = kNone;        ///< PyThreadState.frame (3.10) / current_frame (3.13+)
  // The frame.
  uint32_t fr_code = 0;         ///< f_code (3.10-3.12) / f_executable (3.13+)
  uint32_t fr_previous = 0;     ///< f_back (3.10) / previous (3.11+)
  uint32_t fr_instr = 0;        ///< prev_instr (3.11, 3.12) / instr_ptr (3.13+) / f_lasti (3.10, int)
  uint32_t fr_lineno = kNone;   ///< f_lineno (3.10 only: set while tracing, else 0)
  uint32_t fr_owner = kNone;    ///< owner (char, 3.11+)
  /// Frames whose owner is at least this are not the program's: 3.12's and 3.13's C-stack
  /// shim (FRAME_OWNED_BY_CSTACK = 3), 3.14's FRAME_OWNED_BY_INTERPRETER = 3 and
  /// FRAME_OWNED_BY_CSTACK = 4. 3.11 has no such frames (256: none skipped).
  int owner_skip_from = 256;
  bool code_tagged = false;  ///< f_executable is a _PyStackRef (3.14+): low bits are tags
  // The code object.
  uint32_t co_size = 0;             ///< ob_size of the code (3.11+: code units) or kNone
  uint32_t co_bytecode = kNone;     ///< 3.10: co_code (a bytes object), for its length
  uint32_t co_firstlineno = 0;
  uint32_t co_filename = 0;
  uint32_t co_name = 0;             ///< co_name: checked to notice a reused address
  uint32_t co_qualname = kNone;     ///< what we show (3.11+), else co_name
  uint32_t co_linetable = 0;
  uint32_t co_firsttraceable = kNone;  ///< _co_firsttraceable (3.11, 3.12)
  uint32_t co_code_adaptive = kNone;   ///< the bytecode inside the code object (3.11+)
  // Objects.
  uint32_t ob_type = 8;
  uint32_t str_length = 16;
  uint32_t str_state = 32;
  uint32_t str_ascii_size = 0;    ///< sizeof(PyASCIIObject): compact ASCII data follows it
  uint32_t str_compact_size = 0;  ///< sizeof(PyCompactUnicodeObject): other compact data
  uint32_t bytes_size = 16;       ///< PyBytesObject ob_size
  uint32_t bytes_data = 32;       ///< PyBytesObject ob_sval
  /// Line table format: 310 (co_linetable pairs) or 311 (3.11+ location table).
  int line_format = 311;
};

// ---- 3.10 -------------------------------------------------------------------------------
// Include/cpython/pystate.h (struct _ts: prev, next, interp, frame), Include/cpython/
// frameobject.h (struct _frame: PyObject_VAR_HEAD, f_back, f_code, f_builtins, f_globals,
// f_locals, f_valuestack, f_trace, int f_stackdepth, char f_trace_lines, char
// f_trace_opcodes, f_gen, int f_lasti, int f_lineno, ...), Include/cpython/code.h (PyObject_HEAD,
// seven ints ending with co_firstlineno, then co_code, co_consts, co_names, co_varnames,
// co_freevars, co_cellvars, co_cell2arg, co_filename, co_name, co_linetable),
// Include/cpython/unicodeobject.h (PyASCIIObject keeps wchar_t *wstr: 48 bytes;
// PyCompactUnicodeObject adds utf8_length, utf8, wstr_length: 72).
inline constexpr Layout k310 = [] {
  Layout l;
  l.model = Model::frame_objects;
  l.ts_frame = 24;
  l.fr_previous = 24;
  l.fr_code = 32;
  l.fr_instr = 96;  // f_lasti: index of the last instruction started, in code units
  l.fr_lineno = 100;
  l.co_size = Layout::kNone;
  l.co_bytecode = 48;
  l.co_firstlineno = 40;
  l.co_filename = 104;
  l.co_name = 112;
  l.co_linetable = 120;
  l.str_ascii_size = 48;
  l.str_compact_size = 72;
  l.line_format = 310;
  return l;
}();

// ---- 3.11 -------------------------------------------------------------------------------
// Include/cpython/pystate.h (struct _ts: prev, next, interp, int _initialized, int _static,
// five ints, then _PyCFrame *cframe at 56; _PyCFrame: uint8_t use_tracing, current_frame,
// previous), Include/internal/pycore_frame.h (_PyInterpreterFrame: f_func, f_globals,
// f_builtins, f_locals, f_code, frame_obj, previous, prev_instr, int stacktop, bool is_entry,
// char owner), Include/cpython/code.h (_PyCode_DEF), PyASCIIObject with wstr as in 3.10.
// Measured against /usr/include/python3.11 (tests/interposer/pyframes_layout.cpp).
inline constexpr Layout k311 = [] {
  Layout l;
  l.ts_cframe = 56;
  l.cframe_current = 8;
  l.fr_code = 32;
  l.fr_previous = 48;
  l.fr_instr = 56;  // prev_instr
  l.fr_owner = 69;
  l.owner_skip_from = 256;  // is_entry frames are the program's own: 3.11 has no shim frames
  l.co_size = 16;
  l.co_firstlineno = 72;
  l.co_filename = 112;
  l.co_name = 120;
  l.co_qualname = 128;
  l.co_linetable = 136;
  l.co_firsttraceable = 168;
  l.co_code_adaptive = 184;
  l.str_ascii_size = 48;
  l.str_compact_size = 72;
  return l;
}();

// ---- 3.12 -------------------------------------------------------------------------------
// Include/cpython/pystate.h (struct _ts: prev, next, interp, the 4-byte _status bitfield,
// six ints, then _PyCFrame *cframe at 56; _PyCFrame: current_frame, previous),
// Include/internal/pycore_frame.h (_PyInterpreterFrame: f_code, previous, f_funcobj,
// f_globals, f_builtins, f_locals, frame_obj, prev_instr, int stacktop, uint16_t
// return_offset, char owner; FRAME_OWNED_BY_CSTACK = 3), Include/cpython/code.h (_PyCode_DEF:
// after the var header co_consts, co_names, co_exceptiontable, eleven ints, uint32_t
// co_version, co_localsplusnames, co_localspluskinds, co_filename, co_name, co_qualname,
// co_linetable, co_weakreflist, _co_cached, uint64_t _co_instrumentation_version,
// _co_monitoring, int _co_firsttraceable, co_extra, co_code_adaptive),
// Include/cpython/unicodeobject.h (no wstr any more: PyASCIIObject 40, compact 56).
inline constexpr Layout k312 = [] {
  Layout l;
  l.ts_cframe = 56;
  l.cframe_current = 0;
  l.fr_code = 0;
  l.fr_previous = 8;
  l.fr_instr = 56;  // prev_instr
  l.fr_owner = 70;
  l.owner_skip_from = 3;  // FRAME_OWNED_BY_CSTACK
  l.co_size = 16;
  l.co_firstlineno = 68;
  l.co_filename = 112;
  l.co_name = 120;
  l.co_qualname = 128;
  l.co_linetable = 136;
  l.co_firsttraceable = 176;
  l.co_code_adaptive = 192;
  l.str_ascii_size = 40;
  l.str_compact_size = 56;
  return l;
}();

// ---- 3.13 and later: _Py_DebugOffsets ---------------------------------------------------
// The interpreter publishes the offsets of its own structs at the start of _PyRuntime, for
// out-of-process debuggers: a cookie, PY_VERSION_HEX, a free-threading flag, then one group
// of uint64_t per struct, each starting with the struct's size. The groups themselves change
// between minor versions (3.14 added fields to interpreter_state and interpreter_frame and
// groups after unicode_object), so the mirror to read them with is chosen by the version it
// states. 3.13: Include/internal/pycore_runtime.h; 3.14: Include/internal/
// pycore_debug_offsets.h. Only the groups up to the last one read are mirrored; what follows
// it is never touched.
inline constexpr char kDebugCookie[8] = {'x', 'd', 'e', 'b', 'u', 'g', 'p', 'y'};

struct DebugOffsets313 {
  char cookie[8];
  uint64_t version;
  uint64_t free_threaded;
  struct { uint64_t size, finalizing, interpreters_head; } runtime_state;
  struct {
    uint64_t size, id, next, threads_head, gc, imports_modules, sysdict, builtins, ceval_gil, gil_runtime_state,
        gil_runtime_state_enabled, gil_runtime_state_locked, gil_runtime_state_holder;
  } interpreter_state;
  struct {
    uint64_t size, prev, next, interp, current_frame, thread_id, native_thread_id, datastack_chunk, status;
  } thread_state;
  struct { uint64_t size, previous, executable, instr_ptr, localsplus, owner; } interpreter_frame;
  struct {
    uint64_t size, filename, name, qualname, linetable, firstlineno, argcount, localsplusnames, localspluskinds,
        co_code_adaptive;
  } code_object;
  struct { uint64_t size, ob_type; } pyobject;
  struct { uint64_t size, tp_name, tp_repr, tp_flags; } type_object;
  struct { uint64_t size, ob_item, ob_size; } tuple_object;
  struct { uint64_t size, ob_item, ob_size; } list_object;
  struct { uint64_t size, ma_keys, ma_values; } dict_object;
  struct { uint64_t size, ob_fval; } float_object;
  struct { uint64_t size, lv_tag, ob_digit; } long_object;
  struct { uint64_t size, ob_size, ob_sval; } bytes_object;
  struct { uint64_t size, state, length, asciiobject_size; } unicode_object;
};

struct DebugOffsets314 {
  char cookie[8];
  uint64_t version;
  uint64_t free_threaded;
  struct { uint64_t size, finalizing, interpreters_head; } runtime_state;
  struct {
    uint64_t size, id, next, threads_head, threads_main, gc, imports_modules, sysdict, builtins, ceval_gil,
        gil_runtime_state, gil_runtime_state_enabled, gil_runtime_state_locked, gil_runtime_state_holder,
        code_object_generation, tlbc_generation;
  } interpreter_state;
  struct {
    uint64_t size, prev, next, interp, current_frame, thread_id, native_thread_id, datastack_chunk, status;
  } thread_state;
  struct { uint64_t size, previous, executable, instr_ptr, localsplus, owner, stackpointer, tlbc_index; } interpreter_frame;
  struct {
    uint64_t size, filename, name, qualname, linetable, firstlineno, argcount, localsplusnames, localspluskinds,
        co_code_adaptive, co_tlbc;
  } code_object;
  struct { uint64_t size, ob_type; } pyobject;
  struct { uint64_t size, tp_name, tp_repr, tp_flags; } type_object;
  struct { uint64_t size, ob_item, ob_size; } tuple_object;
  struct { uint64_t size, ob_item, ob_size; } list_object;
  struct { uint64_t size, used, table, mask; } set_object;
  struct { uint64_t size, ma_keys, ma_values; } dict_object;
  struct { uint64_t size, ob_fval; } float_object;
  struct { uint64_t size, lv_tag, ob_digit; } long_object;
  struct { uint64_t size, ob_size, ob_sval; } bytes_object;
  struct { uint64_t size, state, length, asciiobject_size; } unicode_object;
};

// The mirrors' own shape: 8-byte words, no padding (what the checks in pyframes_layout.cpp
// compare against the interpreter's struct, field by field).
static_assert(offsetof(DebugOffsets313, thread_state) == 152 && offsetof(DebugOffsets313, code_object) == 272);
static_assert(sizeof(DebugOffsets313) == 568);
static_assert(offsetof(DebugOffsets314, thread_state) == 176 && offsetof(DebugOffsets314, code_object) == 312);
static_assert(sizeof(DebugOffsets314) == 648);

/// The line of the instruction at byte offset `addr` of a code object, from its line table
/// (`table`, `n` bytes; `format` 310 for 3.10's co_linetable, 311 for the location table of
/// 3.11 and later) and co_firstlineno; what PyCode_Addr2Line answers: co_firstlineno for a
/// negative offset, -1 for an instruction without a line or an offset past the table.
/// Reads at most `n` bytes of `table`; about 3 ns per table entry up to `addr`. Thread-safe.
int line_for(const uint8_t* table, size_t n, int first_line, int addr, int format) noexcept;

}  // namespace cuw::core::pyframes::detail
