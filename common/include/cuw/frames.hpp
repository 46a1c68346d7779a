// cuwarden common: what a call site's frames are (the user's code, a framework, the CUDA
// runtime and driver, the interpreter, libc and the loader, cuwarden itself) and how a site is
// shown to a person from them. One table and one presenter, shared by every view of the daemon
// and CLI and by the interposer's out-of-memory paragraph, so that a site reads the same
// everywhere.
//
// Why a presenter at all: under a framework every stack's innermost frames are the same
// (cudart, the framework's allocator), so the innermost frames say nothing. A site's printed
// form is its innermost frame of the user's code (a Python frame first where there is one),
// then the frames inner to it folded into one line ("8 frames in libc10_cuda.so,
// libcudart.so.13"), then, while that form equals another site's, the innermost frame where the
// two stacks differ with the count of frames skipped to reach it, repeated until the form is
// unique or the stacks end.
//
// How to add a built-in rule: one line in kBuiltin (frames.cpp): which paths it matches
// (native module, Python file or both), how (the file's base name starts with it, or the path
// contains it) and the class. A site names its own framework in a rules file the daemon reads
// (Rules::add); the interposer uses the built-in rules only.
//
// Pure functions of their arguments; thread-safe. No hot path: they allocate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cuw::frames {

/// What code a frame is. The order is stable (JSON writes the name, not the number).
enum class Class : uint8_t { user, framework, cuda, interpreter, libc, cuwarden };
inline constexpr std::size_t kClassCount = 6;

/// "user", "framework", "cuda", "interpreter", "libc", "cuwarden".
const char* class_name(Class c) noexcept;
/// The class named `name` (as class_name writes it); false when none is.
bool class_from_name(std::string_view name, Class* out) noexcept;

/// The classification rules: a site's own (Rules::add, checked first, in the order added)
/// then the built-in ones; what no rule matches is the user's code.
class Rules {
 public:
  /// The built-in rules only (a static, built once; thread-safe).
  static const Rules& builtin();
  /// A site's rule: a native module path or Python file path containing `path_part` is of
  /// class `cls`. An empty `path_part` is ignored.
  void add(std::string path_part, Class cls);
  /// How many site rules were added.
  std::size_t site_rules() const noexcept { return site_.size(); }
  /// The class of a native frame in module `module_path` (the ELF file's path; empty when
  /// unknown: then libc's class is not guessed, it is the user's).
  Class native(std::string_view module_path) const noexcept;
  /// The class of a Python frame in file `file` (as the code object names it).
  Class python(std::string_view file) const noexcept;

 private:
  struct SiteRule {
    std::string part;
    Class cls;
  };
  std::vector<SiteRule> site_;
};

/// One frame as the presenter needs it.
struct Frame {
  bool python = false;
  Class cls = Class::user;
  std::string text;      ///< how it prints: "step (train.py:42)", "alloc_block (CUDACachingAllocator.cpp:1120)"
  std::string where;     ///< what the fold line names: a module's base name, a Python package or file
  std::string function;  ///< for naming a site without user frames by its operator; may be empty
};

/// A frame inner to the head, beyond it: where two sites' stacks part.
struct Via {
  std::size_t frame = 0;    ///< index into the site's frames (as given to label_sites)
  std::size_t skipped = 0;  ///< frames between the previous printed frame and this one
  std::string text;
};

/// A site's printed form.
struct Label {
  /// The head: the innermost user frame (a Python one first), or, without any, the
  /// innermost framework frame naming an operator ("(backward) MmBackward0"), else the
  /// innermost frame; "(no frames)" for an empty stack.
  std::string head;
  long head_frame = -1;               ///< its index into the site's frames; -1: none
  std::vector<std::size_t> folded;    ///< indices of the frames inner to the head, innermost first
  std::string folded_text;            ///< "8 frames in libc10_cuda.so, libcudart.so.13"; empty: none
  std::vector<Via> via;               ///< frames that tell it from sites with the same head
  /// head, then each via as " < TEXT (+N)" (N frames skipped): one line.
  std::string one_line() const;
};

/// Labels for `sites` (each innermost first as a snapshot holds them: native frames, then
/// the Python frames), in the same order. Sites are told apart only from each other: the
/// via frames are added while a label's text equals another one's in `sites`.
std::vector<Label> label_sites(const std::vector<std::vector<Frame>>& sites);

/// A site's frame indices in calling order, innermost first: its native frames up to the
/// interpreter's first (the framework and runtime frames Python code called), then its
/// Python frames, then the rest of its native frames (the interpreter and what runs it).
std::vector<std::size_t> calling_order(const std::vector<Frame>& frames);

/// One line of a site's unfolded form: a frame and what it is to the site's label.
struct Unfolded {
  enum class Role : uint8_t {
    head,   ///< the label's head frame
    inner,  ///< a frame inner to the head (one the fold line counts)
    outer,  ///< a frame outward of the head
    via,    ///< a frame outward of the head that tells the site apart (Label::via)
  };
  std::size_t frame = 0;  ///< index into the site's frames
  Role role = Role::outer;
};

/// Every frame of a site as the unfolded views list them (`cuwarden snapshot --full`, `top`'s
/// unfolded call sites): the head, the frames inner to it (innermost first), then the rest in
/// calling order, outward. Reads `l.head_frame` and the `frame` of `l.via` only, so that a
/// view holding a snapshot's JSON can rebuild them; a head_frame out of range: none is the
/// head, every frame is listed in calling order.
std::vector<Unfolded> unfold(const std::vector<Frame>& frames, const Label& l);

/// The fold line's name for a native module path (its base name) or a Python file (the
/// package under site-packages or dist-packages, else the file's base name).
std::string where_of(bool python, std::string_view path);

}  // namespace cuw::frames
