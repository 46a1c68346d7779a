// cuwarden daemon view: a minimal Python pickle writer (protocol 4), for the snapshot that
// PyTorch's memory tools read (snapshot_views.hpp, snapshot_pytorch).
//
// Why our own: the only reader that matters besides CPython is memory_viz's own unpickler
// (torch/utils/viz/MemoryViz.js), which knows a short list of opcodes. This writer emits only
// opcodes from that list (PROTO, EMPTY_DICT, EMPTY_LIST, MARK, SETITEMS, APPENDS, BININT1,
// BININT2, BININT, LONG1, SHORT_BINUNICODE, BINUNICODE, BINFLOAT, NONE, NEWTRUE, NEWFALSE,
// TUPLE2, STOP), no memo and no frames, and, like CPython's pickler, puts at most 1000 items
// in one APPENDS or SETITEMS: the viewer spreads each batch into a JavaScript call's
// arguments, which a trace of 100,000 entries in one batch would overflow.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cuw::daemon::pickle {

/// Values written in order, containers opened and closed around their items; a dict's items
/// are key, value, key, value... Not thread-safe (one writer per thread); no exceptions
/// beyond std::bad_alloc. Misuse (closing what is not open, finishing with a container
/// open) throws std::logic_error: a bug in the caller, never a matter of input.
class Writer {
 public:
  Writer();
  void none();
  void boolean(bool v);
  /// Any int64: BININT1 / BININT2 / BININT where they fit (as CPython picks them), else LONG1.
  void integer(int64_t v);
  /// Any uint64 (values above INT64_MAX as a 9-byte LONG1).
  void uinteger(uint64_t v);
  void real(double v);
  /// UTF-8 text; invalid sequences become U+FFFD (CPython's unpickler refuses invalid UTF-8,
  /// and the text comes from another process's memory).
  void str(std::string_view v);
  /// A tuple of two ints (PyTorch's segment_pool_id).
  void pair(int64_t a, int64_t b);
  void begin_dict();
  void end_dict();
  void begin_list();
  void end_list();
  /// The pickle's bytes; the writer is spent.
  std::string finish();

 private:
  struct Open {
    bool dict;
    std::size_t batch;  ///< values written since the batch's MARK (0: no MARK yet)
  };
  void before_value();
  void after_value();
  void flush(Open& o);
  std::string out_;
  std::vector<Open> open_;
};

/// `s` with every invalid UTF-8 sequence (and an overlong or surrogate one) replaced by U+FFFD.
std::string valid_utf8(std::string_view s);

}  // namespace cuw::daemon::pickle
