// fakecuda: the generated entry-point table, and a stub for every driver export not implemented.
//
// This file must not include cuda.h: it declares every exported name with one dummy type.
// Each stub is a weak definition, so the real implementation in another file (a strong
// definition) replaces it at link time; what remains answers CUDA_ERROR_NOT_SUPPORTED and
// says so under FAKECUDA_TRACE=1. Thus the library exports exactly the real driver's names
// and cuGetProcAddress can hand out a callable pointer for every one of them.
#include "counter.hpp"

namespace fc {
int stub_called(const char* name) {
  if (trace_level() >= 1) trace("unimplemented entry point %s called -> CUDA_ERROR_NOT_SUPPORTED", name);
  return 801;  // CUDA_ERROR_NOT_SUPPORTED
}
}  // namespace fc

#define FC_EXPORT(n)                                                   \
  extern "C" __attribute__((weak, visibility("default"))) int n() {    \
    static ::fc::CallCounter fc_counter_{#n};                          \
    fc_counter_.hit();                                                 \
    return ::fc::stub_called(#n);                                      \
  }
#include "proc_table.inc"
#undef FC_EXPORT

namespace {
constexpr int FC_PROC_PLAIN = 0;
constexpr int FC_PROC_PTDS = 1;
constexpr int FC_PROC_PTSZ = 2;

#define FC_PROC(base, version, kind, name) {base, version, kind, #name, reinterpret_cast<void*>(&name)},
const fc::RawProc kRows[] = {
#include "proc_table.inc"
};
#undef FC_PROC
}  // namespace

const fc::RawProc* fc::proc_rows(unsigned long* count) {
  *count = sizeof kRows / sizeof kRows[0];
  return kRows;
}
