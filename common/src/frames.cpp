// cuwarden common: frame classes and the call-site presenter (see cuw/frames.hpp).
#include "cuw/frames.hpp"

#include <algorithm>
#include <cctype>
#include <map>

namespace cuw::frames {

namespace {

enum class Applies : uint8_t { native, python, both };
enum class How : uint8_t { base_starts, path_contains };

struct Builtin {
  Applies applies;
  How how;
  const char* pattern;
  Class cls;
};

// Checked in order; the first match wins. A framework's libraries under its own wheel
// (site-packages/torch/lib/libc10_cuda.so) match by their base name before the path rule
// for the package, and NVIDIA's wheels (site-packages/nvidia/cuda_runtime/lib) are the
// CUDA runtime, not a framework.
constexpr Builtin kBuiltin[] = {
    // cuwarden itself
    {Applies::native, How::base_starts, "libcuwarden", Class::cuwarden},
    // the CUDA runtime, driver and NVIDIA's libraries
    {Applies::native, How::base_starts, "libcuda.", Class::cuda},
    {Applies::native, How::base_starts, "libcudart", Class::cuda},
    {Applies::native, How::base_starts, "libcublas", Class::cuda},
    {Applies::native, How::base_starts, "libcudnn", Class::cuda},
    {Applies::native, How::base_starts, "libcufft", Class::cuda},
    {Applies::native, How::base_starts, "libcurand", Class::cuda},
    {Applies::native, How::base_starts, "libcusparse", Class::cuda},
    {Applies::native, How::base_starts, "libcusolver", Class::cuda},
    {Applies::native, How::base_starts, "libnccl", Class::cuda},
    {Applies::native, How::base_starts, "libnvrtc", Class::cuda},
    {Applies::native, How::base_starts, "libnvJitLink", Class::cuda},
    {Applies::native, How::base_starts, "libcupti", Class::cuda},
    {Applies::native, How::path_contains, "/site-packages/nvidia/", Class::cuda},
    {Applies::native, How::path_contains, "/dist-packages/nvidia/", Class::cuda},
    {Applies::native, How::path_contains, "/cuda/lib64/", Class::cuda},
    // frameworks: PyTorch, JAX (XLA), CuPy, TensorFlow; their libraries and packages
    {Applies::native, How::base_starts, "libc10", Class::framework},
    {Applies::native, How::base_starts, "libtorch", Class::framework},
    {Applies::native, How::base_starts, "libshm", Class::framework},
    {Applies::native, How::base_starts, "libtensorflow", Class::framework},
    {Applies::native, How::base_starts, "libxla", Class::framework},
    {Applies::native, How::base_starts, "libjax", Class::framework},
    {Applies::native, How::base_starts, "libcupy", Class::framework},
    {Applies::both, How::path_contains, "/torch/", Class::framework},
    {Applies::both, How::path_contains, "/jax/", Class::framework},
    {Applies::both, How::path_contains, "/jaxlib/", Class::framework},
    {Applies::both, How::path_contains, "/jax_plugins/", Class::framework},
    {Applies::both, How::path_contains, "/cupy/", Class::framework},
    {Applies::both, How::path_contains, "/cupy_backends/", Class::framework},
    {Applies::both, How::path_contains, "/tensorflow/", Class::framework},
    {Applies::both, How::path_contains, "/keras/", Class::framework},
    // the interpreter: the binary, libpython, its extension modules and standard library
    {Applies::native, How::base_starts, "python", Class::interpreter},
    {Applies::native, How::base_starts, "libpython", Class::interpreter},
    {Applies::native, How::base_starts, "libffi", Class::interpreter},
    {Applies::native, How::path_contains, "/lib-dynload/", Class::interpreter},
    {Applies::python, How::base_starts, "<frozen", Class::interpreter},
    {Applies::python, How::path_contains, "/lib/python3", Class::interpreter},
    // libc and the loader, and the C++ runtime beside them
    {Applies::native, How::base_starts, "libc.", Class::libc},
    {Applies::native, How::base_starts, "libc-", Class::libc},
    {Applies::native, How::base_starts, "ld-linux", Class::libc},
    {Applies::native, How::base_starts, "ld-musl", Class::libc},
    {Applies::native, How::base_starts, "libpthread", Class::libc},
    {Applies::native, How::base_starts, "libdl.", Class::libc},
    {Applies::native, How::base_starts, "libm.", Class::libc},
    {Applies::native, How::base_starts, "libstdc++", Class::libc},
    {Applies::native, How::base_starts, "libgcc_s", Class::libc},
};

constexpr const char* kNames[kClassCount] = {"user", "framework", "cuda", "interpreter", "libc", "cuwarden"};

std::string_view base(std::string_view path) {
  const auto slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

Class classify(bool python, std::string_view path) {
  // A standard-library path inside a virtual environment's site-packages is a package, not
  // the interpreter's: checked below by the framework rules first, then left to the user.
  const bool in_packages =
      path.find("/site-packages/") != std::string_view::npos || path.find("/dist-packages/") != std::string_view::npos;
  const std::string_view b = base(path);
  for (const Builtin& r : kBuiltin) {
    if (r.applies == (python ? Applies::native : Applies::python)) continue;
    const bool hit = r.how == How::base_starts ? b.substr(0, std::char_traits<char>::length(r.pattern)) == r.pattern
                                               : path.find(r.pattern) != std::string_view::npos;
    if (!hit) continue;
    if (r.cls == Class::interpreter && python && in_packages) continue;
    return r.cls;
  }
  return Class::user;
}

/// The identifier in `fn` that names a framework's operator (a C++ class name of an autograd
/// node: "MmBackward0" in "torch::autograd::generated::MmBackward0::apply"); empty: none.
std::string backward_operator(std::string_view fn) {
  std::size_t i = 0;
  std::string found;
  while (i < fn.size()) {
    std::size_t j = i;
    while (j < fn.size() && (std::isalnum(static_cast<unsigned char>(fn[j])) || fn[j] == '_')) ++j;
    if (j > i) {
      const std::string_view tok = fn.substr(i, j - i);
      if (tok.find("Backward") != std::string_view::npos && tok != "Backward") found = std::string(tok);
      i = j;
    } else {
      ++i;
    }
  }
  return found;
}

}  // namespace

const char* class_name(Class c) noexcept {
  const auto i = static_cast<std::size_t>(c);
  return i < kClassCount ? kNames[i] : "user";
}

bool class_from_name(std::string_view name, Class* out) noexcept {
  for (std::size_t i = 0; i < kClassCount; ++i)
    if (name == kNames[i]) {
      *out = static_cast<Class>(i);
      return true;
    }
  return false;
}

const Rules& Rules::builtin() {
  static const Rules r;
  return r;
}

void Rules::add(std::string path_part, Class cls) {
  if (!path_part.empty()) site_.push_back(SiteRule{std::move(path_part), cls});
}

Class Rules::native(std::string_view module_path) const noexcept {
  for (const SiteRule& r : site_)
    if (module_path.find(r.part) != std::string_view::npos) return r.cls;
  if (module_path.empty()) return Class::user;
  return classify(false, module_path);
}

Class Rules::python(std::string_view file) const noexcept {
  for (const SiteRule& r : site_)
    if (file.find(r.part) != std::string_view::npos) return r.cls;
  return classify(true, file);
}

std::string where_of(bool python, std::string_view path) {
  if (python) {
    for (std::string_view dir : {"/site-packages/", "/dist-packages/"}) {
      const auto at = path.find(dir);
      if (at == std::string_view::npos) continue;
      std::string_view rest = path.substr(at + dir.size());
      const auto slash = rest.find('/');
      if (slash != std::string_view::npos) rest = rest.substr(0, slash);
      return std::string(rest);
    }
  }
  return std::string(base(path));
}

std::string Label::one_line() const {
  std::string s = head;
  for (const Via& v : via) s += " < " + v.text + (v.skipped ? " (+" + std::to_string(v.skipped) + ")" : "");
  return s;
}

std::vector<std::size_t> calling_order(const std::vector<Frame>& f) {
  std::vector<std::size_t> native, python;
  for (std::size_t i = 0; i < f.size(); ++i) (f[i].python ? python : native).push_back(i);
  if (python.empty()) return native;
  // The Python frames run in the evaluator (the python binary or libpython): they go just
  // inside its first frame. Interpreter frames inner to it (libffi and _ctypes under a ctypes
  // call, numba's and cuda-python's way to the driver) are called from them.
  const auto evaluator = [&](const Frame& x) {
    return x.cls == Class::interpreter && (x.where.rfind("python", 0) == 0 || x.where.rfind("libpython", 0) == 0);
  };
  std::size_t n = 0;
  while (n < native.size() && !evaluator(f[native[n]])) ++n;
  if (n == native.size()) {  // no evaluator frame seen: before the first interpreter frame
    n = 0;
    while (n < native.size() && f[native[n]].cls != Class::interpreter) ++n;
  }
  std::vector<std::size_t> out(native.begin(), native.begin() + static_cast<std::ptrdiff_t>(n));
  out.insert(out.end(), python.begin(), python.end());
  out.insert(out.end(), native.begin() + static_cast<std::ptrdiff_t>(n), native.end());
  return out;
}

std::vector<Unfolded> unfold(const std::vector<Frame>& frames, const Label& l) {
  const std::vector<std::size_t> order = calling_order(frames);
  std::vector<bool> via(frames.size(), false);
  for (const Via& v : l.via)
    if (v.frame < frames.size()) via[v.frame] = true;
  const auto head = std::find(order.begin(), order.end(), static_cast<std::size_t>(l.head_frame));
  std::vector<Unfolded> out;
  out.reserve(order.size());
  if (l.head_frame >= 0 && head != order.end()) {
    out.push_back({*head, Unfolded::Role::head});
    for (auto it = order.begin(); it != head; ++it) out.push_back({*it, Unfolded::Role::inner});
  }
  for (auto it = head == order.end() ? order.begin() : head + 1; it != order.end(); ++it)
    out.push_back({*it, via[*it] ? Unfolded::Role::via : Unfolded::Role::outer});
  return out;
}

namespace {

struct Work {
  std::vector<std::size_t> order;  ///< calling_order()
  long head_pos = -1;              ///< the head's position in `order`
  long last_pos = -1;              ///< the last printed frame's position
};

void choose_head(const std::vector<Frame>& f, Work* w, Label* l) {
  const auto& o = w->order;
  long pos = -1;
  for (std::size_t i = 0; i < o.size() && pos < 0; ++i)
    if (f[o[i]].python && f[o[i]].cls == Class::user) pos = static_cast<long>(i);
  for (std::size_t i = 0; i < o.size() && pos < 0; ++i)
    if (f[o[i]].cls == Class::user) pos = static_cast<long>(i);
  std::string name;
  if (pos < 0) {  // no user frame: a framework's own thread (PyTorch's backward)
    for (std::size_t i = 0; i < o.size() && pos < 0; ++i)
      if (f[o[i]].cls == Class::framework)
        if (std::string op = backward_operator(f[o[i]].function); !op.empty()) {
          pos = static_cast<long>(i);
          name = "(backward) " + op;
        }
    for (std::size_t i = 0; i < o.size() && pos < 0; ++i)
      if (f[o[i]].cls == Class::framework) pos = static_cast<long>(i);
    for (std::size_t i = 0; i < o.size() && pos < 0; ++i)
      if (f[o[i]].cls != Class::cuwarden) pos = static_cast<long>(i);
    if (pos < 0 && !o.empty()) pos = 0;
  }
  w->head_pos = w->last_pos = pos;
  if (pos < 0) {
    l->head = "(no frames)";
    return;
  }
  l->head_frame = static_cast<long>(o[static_cast<std::size_t>(pos)]);
  l->head = name.empty() ? f[o[static_cast<std::size_t>(pos)]].text : name;
  std::vector<std::string> wheres;
  for (long i = 0; i < pos; ++i) l->folded.push_back(o[static_cast<std::size_t>(i)]);
  // Named outermost first: the order a person reads the calls in, from their own code down.
  for (long i = pos - 1; i >= 0; --i) {
    const Frame& fr = f[o[static_cast<std::size_t>(i)]];
    if (!fr.where.empty() && std::find(wheres.begin(), wheres.end(), fr.where) == wheres.end()) wheres.push_back(fr.where);
  }
  if (pos > 0) {
    l->folded_text = std::to_string(pos) + (pos == 1 ? " frame" : " frames");
    for (std::size_t i = 0; i < wheres.size(); ++i) l->folded_text += (i ? ", " : " in ") + wheres[i];
  }
}

}  // namespace

std::vector<Label> label_sites(const std::vector<std::vector<Frame>>& sites) {
  std::vector<Label> labels(sites.size());
  std::vector<Work> work(sites.size());
  std::size_t longest = 0;
  for (std::size_t i = 0; i < sites.size(); ++i) {
    work[i].order = calling_order(sites[i]);
    longest = std::max(longest, work[i].order.size());
    choose_head(sites[i], &work[i], &labels[i]);
  }
  // Offsets from the head to look at for a difference: outward first (the callers: which
  // of the user's calls went through the shared chain), then inward (the framework's path).
  std::vector<long> offsets;
  for (std::size_t k = 1; k <= longest; ++k) offsets.push_back(static_cast<long>(k));
  for (std::size_t k = 1; k <= longest; ++k) offsets.push_back(-static_cast<long>(k));
  std::vector<std::size_t> cursor(sites.size(), 0);
  auto at = [&](std::size_t i, long off) -> const Frame* {
    if (work[i].head_pos < 0) return nullptr;
    const long p = work[i].head_pos + off;
    if (p < 0 || p >= static_cast<long>(work[i].order.size())) return nullptr;
    return &sites[i][work[i].order[static_cast<std::size_t>(p)]];
  };
  for (bool changed = true; changed;) {
    changed = false;
    std::map<std::string, std::vector<std::size_t>> groups;
    for (std::size_t i = 0; i < sites.size(); ++i) groups[labels[i].one_line()].push_back(i);
    for (const auto& [text, g] : groups) {
      if (g.size() < 2) continue;
      std::size_t start = 0;
      bool told = false;
      for (std::size_t i : g) start = std::max(start, cursor[i]);
      for (std::size_t oi = start; oi < offsets.size(); ++oi) {
        const long off = offsets[oi];
        bool differ = false, any = false;
        const Frame* first = at(g.front(), off);
        for (std::size_t i : g) {
          const Frame* f = at(i, off);
          any |= f != nullptr;
          if ((f == nullptr) != (first == nullptr) || (f && f->text != first->text)) differ = true;
        }
        if (!any) {
          if (off > 0) oi = offsets.size() / 2 - 1;  // every stack ended outward: look inward
          else break;
          continue;
        }
        if (!differ) continue;
        for (std::size_t i : g) {
          cursor[i] = oi + 1;
          const Frame* f = at(i, off);
          if (!f) continue;
          const long pos = work[i].head_pos + off;
          const long gap = pos > work[i].last_pos ? pos - work[i].last_pos - 1 : work[i].last_pos - pos - 1;
          labels[i].via.push_back(
              Via{work[i].order[static_cast<std::size_t>(pos)], static_cast<std::size_t>(std::max(0L, gap)), f->text});
          work[i].last_pos = pos;
        }
        changed = told = true;
        break;
      }
      if (!told)
        for (std::size_t i : g) cursor[i] = offsets.size();
    }
  }
  return labels;
}

}  // namespace cuw::frames
