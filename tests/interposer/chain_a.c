/* Interposer tests: an interposer-like library loaded before chain_b. Its lookup of
 * RTLD_NEXT must find chain_b's definitions, not its own, also through our dlsym hook. */
#define _GNU_SOURCE
#include <dlfcn.h>

int cuWtChainTarget(void) { return 1; }
int xwt_chain_target(void) { return 1; }
/* The barrier keeps the lookups from being tail calls: RTLD_NEXT is relative to the
 * caller of dlsym, which must be this library. */
void* cuwt_lookup_next(const char* name) {
  void* r = dlsym(RTLD_NEXT, name);
  __asm__ volatile("" : "+r"(r));
  return r;
}
void* cuwt_lookup_next_v(const char* name) {
  void* r = dlvsym(RTLD_NEXT, name, "CUWT_1");
  __asm__ volatile("" : "+r"(r));
  return r;
}
