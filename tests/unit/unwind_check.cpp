// Unit tests of the call sites' stack walk: the comparison (unwind_check.hpp).
#include "unwind_check.hpp"

#include <dlfcn.h>

#include <cstdio>
#include <cstring>

namespace unwind = cuw::core::unwind;

__attribute__((noinline)) int take(Job* job) {
  const int n = job->fn(job->out->frames, Capture::kMax);
  job->out->n = n;
  __asm__ volatile("" ::: "memory");  // not a tail call: this frame is the same for both
  return n < 0 ? 0 : 1;
}

__attribute__((noinline)) int walk_or_backtrace(void** out, int max) {
  int n = unwind::walk(out, max);
  if (n == unwind::kFallback) n = backtrace(out, max);
  __asm__ volatile("" ::: "memory");  // not a tail call: backtrace() sees this frame
  return n;
}

std::vector<void*> frames_of(const Capture& c) {
  if (c.n <= 0) return {};
  return std::vector<void*>(c.frames, c.frames + c.n);
}

std::vector<void*> reference(const Capture& c) {
  std::vector<void*> v = frames_of(c);
  while (!v.empty()) {
    Dl_info info{};
    if (!dladdr(v.front(), &info) || !info.dli_fname || !std::strstr(info.dli_fname, "san.so")) break;
    v.erase(v.begin());
  }
  return v;
}

std::string describe(const std::vector<void*>& v) {
  std::string s;
  for (void* p : v) {
    Dl_info info{};
    char line[256];
    if (dladdr(p, &info) && info.dli_sname)
      std::snprintf(line, sizeof line, "  %p %s+%#lx\n", p, info.dli_sname,
                    static_cast<unsigned long>(static_cast<char*>(p) - static_cast<char*>(info.dli_saddr)));
    else
      std::snprintf(line, sizeof line, "  %p (%s)\n", p, info.dli_fname ? info.dli_fname : "?");
    s += line;
  }
  return s;
}

void require_same(const Capture* c) {
  const std::vector<void*> fast = frames_of(c[0]), slow = reference(c[1]);
  INFO("walk (" << c[0].n << "):\n" << describe(fast) << "backtrace:\n" << describe(slow));
  REQUIRE(c[0].n != unwind::kFallback);
  REQUIRE(fast.size() >= 4);
  REQUIRE(fast == slow);
}

cuw::core::unwind::Stats walk_across_an_unload(int* frames_after) {
  void* h = dlopen(CUWT_UNWIND_DL, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(h != nullptr);
  using call_fn = int (*)(int (*)(void*), void*);
  auto call = reinterpret_cast<call_fn>(dlsym(h, "cuwt_dl_call"));
  REQUIRE(call != nullptr);
  Capture c[2];
  both([call](Job* j) { call([](void* a) { return chain_nofp(static_cast<Job*>(a)); }, j); }, c);
  require_same(c);
  const cuw::core::unwind::Stats before = cuw::core::unwind::stats();
  REQUIRE(dlclose(h) == 0);
  both([](Job* j) { cuwt_lib_outer([](void* a) { return chain_fp(static_cast<Job*>(a)); }, j); }, c);
  require_same(c);
  if (frames_after) *frames_after = c[0].n;
  return before;
}
