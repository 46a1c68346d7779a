// cuwarden interposer core: the interpreter found and its layout chosen (pyframes_interp.hpp):
// the struct offsets of 3.10 to 3.12 by version, those 3.13 and later publish in _PyRuntime.
#include "core/callsites/pyframes_interp.hpp"

#include <dlfcn.h>

#include <cstdio>
#include <cstring>

#include "base/log.hpp"
#include "base/real.hpp"

namespace cuw::core::pyframes::detail {

namespace {

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

}  // namespace

bool probe(Interp& out) noexcept {
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
  out = py;
  log::debug("python frames: Python %u.%u.%u found", major, minor, micro);
  return true;
}

}  // namespace cuw::core::pyframes::detail
