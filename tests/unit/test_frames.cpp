// Unit tests for the frame classes and the call-site presenter (cuw/frames.hpp): built-in
// rules by module and Python path, a site's own rules first, and the printed form of sites
// that share their innermost frames (a helper chain, a Python function called from two
// lines, a backward thread with no user frame).
#include <catch2/catch.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cuw/frames.hpp"

using namespace cuw::frames;

namespace {

Frame native(const std::string& fn, const std::string& module) {
  Frame f;
  f.cls = Rules::builtin().native(module);
  f.text = fn + " (" + where_of(false, module) + ")";
  f.where = where_of(false, module);
  f.function = fn;
  return f;
}

Frame py(const std::string& fn, const std::string& file, int line) {
  Frame f;
  f.python = true;
  f.cls = Rules::builtin().python(file);
  f.text = fn + " (" + file + ":" + std::to_string(line) + ")";
  f.where = where_of(true, file);
  f.function = fn;
  return f;
}

}  // namespace

TEST_CASE("built-in rules classify modules and Python files") {
  const Rules& r = Rules::builtin();
  CHECK(r.native("/usr/lib/libcuwarden.so") == Class::cuwarden);
  CHECK(r.native("/usr/lib/x86_64-linux-gnu/libcuda.so.1") == Class::cuda);
  CHECK(r.native("/venv/lib/python3.12/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12") == Class::cuda);
  CHECK(r.native("/venv/lib/python3.12/site-packages/torch/lib/libc10_cuda.so") == Class::framework);
  CHECK(r.native("/venv/lib/python3.12/site-packages/jaxlib/xla_extension.so") == Class::framework);
  CHECK(r.native("/usr/lib/x86_64-linux-gnu/libc.so.6") == Class::libc);
  CHECK(r.native("/lib64/ld-linux-x86-64.so.2") == Class::libc);
  CHECK(r.native("/usr/bin/python3.12") == Class::interpreter);
  CHECK(r.native("/usr/lib/python3.12/lib-dynload/_ctypes.cpython-312-x86_64-linux-gnu.so") == Class::interpreter);
  CHECK(r.native("/home/me/train") == Class::user);
  CHECK(r.python("/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py") == Class::framework);
  CHECK(r.python("/usr/lib/python3/dist-packages/cupy/_creation/basic.py") == Class::framework);
  CHECK(r.python("/usr/lib/python3.12/threading.py") == Class::interpreter);
  CHECK(r.python("<frozen runpy>") == Class::interpreter);
  CHECK(r.python("/venv/lib/python3.12/site-packages/mylib/model.py") == Class::user);
  CHECK(r.python("/home/me/train.py") == Class::user);
  CHECK(std::string(class_name(Class::cuda)) == "cuda");
  Class c{};
  CHECK((class_from_name("framework", &c) && c == Class::framework));
  CHECK_FALSE(class_from_name("kernel", &c));
}

TEST_CASE("a site's own rules come before the built-in ones") {
  Rules r;
  r.add("/opt/lab/libslab", Class::framework);
  r.add("/opt/lab/py/", Class::framework);
  CHECK(r.native("/opt/lab/libslab.so") == Class::framework);
  CHECK(r.python("/opt/lab/py/alloc.py") == Class::framework);
  CHECK(r.native("/opt/other/libslab.so") == Class::user);
  CHECK(Rules::builtin().native("/opt/lab/libslab.so") == Class::user);
}

TEST_CASE("the head is the innermost user frame, the runtime folded into one line") {
  std::vector<Frame> s = {native("hook", "/lib/libcuwarden.so"), native("cuMemAlloc", "/lib/libcuda.so.1"),
                          native("cudaMalloc", "/lib/libcudart.so.13"), native("alloc_block", "/t/libc10_cuda.so"),
                          native("load", "/home/me/app"), native("main", "/home/me/app")};
  const auto l = label_sites({s});
  REQUIRE(l.size() == 1);
  CHECK(l[0].head == "load (app)");
  CHECK(l[0].head_frame == 4);
  CHECK(l[0].folded_text == "4 frames in libc10_cuda.so, libcudart.so.13, libcuda.so.1, libcuwarden.so");
  CHECK(l[0].folded.size() == 4);
  CHECK(l[0].via.empty());
  CHECK(l[0].one_line() == "load (app)");
}

TEST_CASE("sites sharing a helper chain are told apart by the frame where they part") {
  auto site = [](const std::string& caller) {
    std::vector<Frame> s = {native("hook", "/lib/libcuwarden.so"), native("cuMemAlloc", "/lib/libcuda.so.1")};
    for (int i = 12; i >= 1; --i) s.push_back(native("helper_" + std::to_string(i), "/home/me/app"));
    s.push_back(native(caller, "/home/me/app"));
    s.push_back(native("main", "/home/me/app"));
    return s;
  };
  const auto l = label_sites({site("load_weights"), site("make_buffers"), site("load_weights")});
  REQUIRE(l.size() == 3);
  for (const Label& x : l) CHECK(x.head == "helper_12 (app)");
  REQUIRE(l[0].via.size() == 1);
  CHECK(l[0].via[0].text == "load_weights (app)");
  CHECK(l[0].via[0].skipped == 11);
  CHECK(l[0].one_line() == "helper_12 (app) < load_weights (app) (+11)");
  CHECK(l[1].one_line() == "helper_12 (app) < make_buffers (app) (+11)");
  // Identical stacks stay identical: the stack ends without another difference.
  CHECK(l[2].one_line() == l[0].one_line());
  // A site alone needs no via frame.
  CHECK(label_sites({site("load_weights")})[0].via.empty());
}

TEST_CASE("unfolded, a site lists the head, the frames inner to it, then its callers") {
  std::vector<Frame> s = {native("hook", "/lib/libcuwarden.so"), native("cuMemAlloc", "/lib/libcuda.so.1")};
  for (int i = 3; i >= 1; --i) s.push_back(native("helper_" + std::to_string(i), "/home/me/app"));
  s.push_back(native("load_weights", "/home/me/app"));
  s.push_back(native("main", "/home/me/app"));
  const auto labels = label_sites({s, [&] {
                                     auto t = s;
                                     t[5] = native("make_buffers", "/home/me/app");
                                     return t;
                                   }()});
  const Label& l = labels[0];
  REQUIRE(l.head_frame == 2);  // helper_3, the innermost user frame
  REQUIRE(l.via.size() == 1);
  const auto u = unfold(s, l);
  using Role = Unfolded::Role;
  std::vector<std::pair<std::size_t, Role>> got;
  for (const Unfolded& x : u) got.emplace_back(x.frame, x.role);
  // Every frame once: the head, the inner ones innermost first, the callers outward, the
  // one that tells the two sites apart as via.
  CHECK(got == std::vector<std::pair<std::size_t, Role>>{{2, Role::head},  {0, Role::inner}, {1, Role::inner},
                                                          {3, Role::outer}, {4, Role::outer}, {5, Role::via},
                                                          {6, Role::outer}});
  // Without a head (a label rebuilt without one): every frame in calling order.
  Label none;
  CHECK(unfold(s, none).size() == s.size());
  CHECK(unfold(s, none).front().role == Role::outer);
}

TEST_CASE("a Python function called from two lines prints both lines") {
  auto site = [](int line) {
    return std::vector<Frame>{native("hook", "/lib/libcuwarden.so"), native("cuMemAlloc", "/lib/libcuda.so.1"),
                              native("ffi_call", "/usr/lib/x86_64-linux-gnu/libffi.so.8"),
                              native("_PyEval_EvalFrameDefault", "/usr/bin/python3.12"),
                              py("alloc", "/home/me/alloc2.py", 5), py("<module>", "/home/me/alloc2.py", line)};
  };
  const auto l = label_sites({site(8), site(9)});
  CHECK(l[0].head == "alloc (/home/me/alloc2.py:5)");
  // ctypes' libffi is called from the Python frames: inner to them, in the fold.
  CHECK(l[0].folded_text == "3 frames in libffi.so.8, libcuda.so.1, libcuwarden.so");
  CHECK(calling_order(site(8)) == std::vector<std::size_t>{0, 1, 2, 4, 5, 3});
  // The calling line is the next frame out: no "(+0)".
  CHECK(l[0].one_line() == "alloc (/home/me/alloc2.py:5) < <module> (/home/me/alloc2.py:8)");
  CHECK(l[1].one_line() == "alloc (/home/me/alloc2.py:5) < <module> (/home/me/alloc2.py:9)");
}

TEST_CASE("a Python user frame leads over framework Python frames and native user frames") {
  std::vector<Frame> s = {native("cudaMalloc", "/lib/libcudart.so.13"), native("my_ext", "/home/me/ext.so"),
                          native("_PyEval_EvalFrameDefault", "/usr/bin/python3.12"),
                          py("forward", "/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py", 125),
                          py("step", "/home/me/train.py", 42)};
  const auto l = label_sites({s});
  CHECK(l[0].head == "step (/home/me/train.py:42)");
  CHECK(l[0].folded_text == "3 frames in torch, ext.so, libcudart.so.13");
}

TEST_CASE("a site with no user frame is named by its backward operator") {
  std::vector<Frame> s = {native("cudaMalloc", "/lib/libcudart.so.13"),
                          native("c10::cuda::CUDACachingAllocator::malloc", "/t/libc10_cuda.so"),
                          native("torch::autograd::generated::MmBackward0::apply", "/t/libtorch_cpu.so"),
                          native("torch::autograd::Engine::thread_main", "/t/libtorch_cpu.so"),
                          native("start_thread", "/lib/libc.so.6")};
  const auto l = label_sites({s});
  CHECK(l[0].head == "(backward) MmBackward0");
  CHECK(l[0].head_frame == 2);
  CHECK(label_sites({{}})[0].head == "(no frames)");
}
