// cuwarden interposer core: array sizes (see arrays.hpp).
#include "core/arrays.hpp"

#include "base/real.hpp"

namespace cuw::core {

uint64_t format_bytes(CUarray_format f) {
  switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
      return 4;
    default:
      return 4;
  }
}

uint64_t array_bytes(uint64_t w, uint64_t h, uint64_t d, CUarray_format f, unsigned channels, unsigned levels,
                     unsigned flags) {
  const uint64_t elem = format_bytes(f) * (channels ? channels : 1);
  const bool layers = (flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
  uint64_t total = 0;
  for (unsigned l = 0; l < (levels ? levels : 1); ++l) {
    const uint64_t lw = w ? w : 1, lh = h ? h : 1, ld = d ? d : 1;
    total += (lw * lh * ld * elem + 511) & ~uint64_t{511};
    w = w > 1 ? w / 2 : 1;
    h = h > 1 ? h / 2 : (h ? 1 : 0);
    if (!layers) d = d > 1 ? d / 2 : (d ? 1 : 0);
  }
  return total;
}

bool array_takes_memory(unsigned flags) {
  return (flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)) == 0;
}

CUcontext current_context() {
  using get_fn = CUresult (*)(CUcontext*);
  static auto get = reinterpret_cast<get_fn>(cuw::hook::driver_symbol("cuCtxGetCurrent"));
  CUcontext c = nullptr;
  return get && get(&c) == CUDA_SUCCESS ? c : nullptr;
}

}  // namespace cuw::core
