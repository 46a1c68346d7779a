// fakecuda: cuGetProcAddress / cuGetProcAddress_v2 — resolving like the driver does.
//
// `symbol` is a base name ("cuMemAlloc"); `cudaVersion` picks the ABI variant: the newest one
// introduced at or before that version (cuMemAlloc: 2000 -> cuMemAlloc, 3020 -> cuMemAlloc_v2);
// CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM prefers the _ptds / _ptsz variant where one
// exists at that version; DEFAULT and LEGACY_STREAM pick the plain ones. A known name with no
// variant that old: CUDA_ERROR_NOT_FOUND + CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT; an unknown
// name: CUDA_ERROR_NOT_FOUND + CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND; *pfn is NULL in both cases.
// The table (proc_table.inc) is generated from cudaTypedefs.h by gen_proc_table.py.
#include <cstring>
#include <string>
#include <unordered_map>

#include "internal.hpp"  // before fakecuda.h: it sets up cuda.h for the driver side
#include "../fakecuda.h"

namespace {

struct Index {
  std::unordered_map<std::string, std::vector<const fc::RawProc*>> by_base;
  std::vector<fakecuda_proc_entry> public_rows;
};

const Index& index() {
  static const Index& idx = *[] {
    auto* i_ptr = new Index;  // never destroyed: cuGetProcAddress may run during exit
    Index& i = *i_ptr;
    unsigned long n = 0;
    const fc::RawProc* rows = fc::proc_rows(&n);
    for (unsigned long k = 0; k < n; ++k) {
      i.by_base[rows[k].base].push_back(&rows[k]);
      i.public_rows.push_back({rows[k].base, rows[k].version, rows[k].kind, rows[k].name});
    }
    return i_ptr;
  }();
  return idx;
}

CUresult lookup(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status) {
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  const cuuint64_t known = CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  if (flags & ~known) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  const auto& idx = index();
  auto it = idx.by_base.find(symbol);
  if (it == idx.by_base.end()) {
    if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (fc::trace_level() >= 1) fc::trace("cuGetProcAddress(\"%s\", %d): unknown symbol", symbol, cudaVersion);
    return CUDA_ERROR_NOT_FOUND;
  }
  bool want_pt = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  const fc::RawProc* plain = nullptr;
  const fc::RawProc* pt = nullptr;
  for (const fc::RawProc* r : it->second) {
    if (r->version > cudaVersion) continue;
    const fc::RawProc*& slot = r->kind == 0 ? plain : pt;
    if (!slot || r->version > slot->version) slot = r;
  }
  const fc::RawProc* pick = want_pt && pt ? pt : plain;
  if (!pick) {
    if (status) *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    if (fc::trace_level() >= 1) fc::trace("cuGetProcAddress(\"%s\", %d): version not sufficient", symbol, cudaVersion);
    return CUDA_ERROR_NOT_FOUND;
  }
  *pfn = pick->fn;
  if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

}  // namespace

FC_API CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  FC_ENTER();
  return lookup(symbol, pfn, cudaVersion, flags, nullptr);
}

FC_API CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult* symbolStatus) {
  FC_ENTER();
  return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

FC_API const fakecuda_proc_entry* fakecuda_proc_table(size_t* count) {
  const auto& idx = index();
  if (count) *count = idx.public_rows.size();
  return idx.public_rows.data();
}
