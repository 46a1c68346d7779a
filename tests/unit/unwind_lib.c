/* Unit tests of the stack walk: a shared library built with -O2 -fomit-frame-pointer; the
 * outer function reaches the inner one through the library's PLT (default visibility, -fPIC:
 * interposable, so neither inlined nor called directly). */
typedef int (*cuwt_cb)(void*);

__attribute__((noinline)) int cuwt_lib_inner(cuwt_cb cb, void* arg) {
  volatile char pad[56];
  pad[0] = 1;
  int r = cb(arg);
  __asm__ volatile("" ::: "memory");
  return r + pad[0] - 1;
}

__attribute__((noinline)) int cuwt_lib_outer(cuwt_cb cb, void* arg) {
  int r = cuwt_lib_inner(cb, arg);
  __asm__ volatile("" ::: "memory");
  return r;
}
