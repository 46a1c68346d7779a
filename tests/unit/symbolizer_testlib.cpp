// A small shared library for the symbolizer's tests (test_symbolizer.cpp), built twice: with
// DWARF (-g) and without any debug info (-g0, its .symtab kept). The exported getters hand
// out the addresses of C++ functions, whose ELF symbols are mangled.
#include <cstdint>

namespace cuw_symtest {

[[gnu::noinline]] int lib_fn(int x) {
  asm volatile("" ::: "memory");  // keeps a body of its own, distinct from lib_other's
  return x * 3 + 1;
}

[[gnu::noinline]] int lib_other(int x) {
  asm volatile("" ::: "memory");
  return (x ^ 0x55) - 7;
}

}  // namespace cuw_symtest

extern "C" {
[[gnu::visibility("default")]] uintptr_t cuw_symtest_lib_fn() { return reinterpret_cast<uintptr_t>(&cuw_symtest::lib_fn); }
[[gnu::visibility("default")]] uintptr_t cuw_symtest_lib_other() {
  return reinterpret_cast<uintptr_t>(&cuw_symtest::lib_other);
}
}
