/* Unit tests of the stack walk: a library the test loads and unloads (dlopen, dlclose). */
typedef int (*cuwt_cb)(void*);

__attribute__((noinline)) int cuwt_dl_call(cuwt_cb cb, void* arg) {
  volatile char pad[24];
  pad[0] = 1;
  int r = cb(arg);
  __asm__ volatile("" ::: "memory");
  return r + pad[0] - 1;
}
