// fakecuda: CUDA arrays and mipmapped arrays (opaque texture memory), backed by the device arena.
//
// Size rule (what fakecuda_array_bytes reports and what cuMemGetInfo drops by):
//   element = format bytes * NumChannels (the *X1/X2/X4 formats and UNORM_INT_101010_2 carry
//             their own channel count),
//   bytes   = round_up(Width * max(Height,1) * max(Depth,1) * element, 512).
// A mipmapped array takes one arena block of the sum over its levels, each level rounded up to
// 512 on its own; level i has max(1, dim >> i) for every non-zero extent (Width, Height, and
// Depth of a 3D array; the layer count of a layered or cubemap array is not halved).
// Arrays created with CUDA_ARRAY3D_SPARSE or CUDA_ARRAY3D_DEFERRED_MAPPING take no memory (the
// application maps memory into them later), as on the real driver.
//
// Handles are validated against a table, so a stale or foreign handle is
// CUDA_ERROR_INVALID_HANDLE, never a crash. A destroyed array's handle is handed out again by
// a later cuArrayCreate / cuArray3DCreate, the last destroyed first (a driver recycles its
// handles; an interposer must not take a new array for the old one). The level arrays of a mipmapped array belong to it:
// cuArrayDestroy on one is CUDA_ERROR_INVALID_HANDLE; they die with cuMipmappedArrayDestroy.
#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "internal.hpp"  // before fakecuda.h: it sets up cuda.h for the driver side
#include "../fakecuda.h"

namespace fc {
namespace {

struct MipArray;

struct ArrayObj {
  CUDA_ARRAY3D_DESCRIPTOR desc{};  // as created (Height/Depth 0 where the caller gave 0)
  bool from_2d_api = false;        // created by cuArrayCreate (no Depth, no Flags)
  int ordinal = 0;
  uintptr_t block = 0;   // arena block (0: no memory, or owned by a mipmapped array)
  size_t bytes = 0;      // bytes this array takes (a level: its share of the mipmap's block)
  MipArray* owner = nullptr;
  Context* ctx = nullptr;  // created in; the array dies with it (arrays_free_context)
};

struct MipArray {
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  unsigned levels = 0;
  int ordinal = 0;
  uintptr_t block = 0;
  size_t bytes = 0;
  std::vector<ArrayObj*> level_arrays;
  Context* ctx = nullptr;
};

std::mutex g_mu;
auto& g_arrays = *new std::unordered_map<ArrayObj*, bool>;   // never destroyed
auto& g_mipmaps = *new std::unordered_map<MipArray*, bool>;  // never destroyed
auto& g_recycled = *new std::vector<ArrayObj*>;  // destroyed arrays' objects (g_mu); never destroyed

// A fresh array object: a destroyed one's, the last destroyed first, else a new one.
ArrayObj* fresh_array() {
  {
    std::lock_guard lock(g_mu);
    if (!g_recycled.empty()) {
      ArrayObj* a = g_recycled.back();
      g_recycled.pop_back();
      *a = ArrayObj{};
      return a;
    }
  }
  return new ArrayObj;
}

// Gives back a destroyed array's object (not a mipmap's level), for fresh_array().
void recycle_array(ArrayObj* a) {
  std::lock_guard lock(g_mu);
  g_recycled.push_back(a);
}

constexpr size_t kAlign = Arena::kAlign;
size_t round_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Bytes per element, or 0 for a format outside what this driver simulates (planar YUV and
// block-compressed formats) or a channel count that does not fit the format.
size_t element_bytes(CUarray_format f, unsigned channels) {
  auto plain = [&](size_t b) -> size_t { return (channels == 1 || channels == 2 || channels == 4) ? b * channels : 0; };
  auto fixed = [&](size_t b, unsigned c) -> size_t { return channels == c ? b * c : 0; };
  switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return plain(1);
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return plain(2);
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: return plain(4);
    case CU_AD_FORMAT_UNORM_INT8X1:
    case CU_AD_FORMAT_SNORM_INT8X1: return fixed(1, 1);
    case CU_AD_FORMAT_UNORM_INT8X2:
    case CU_AD_FORMAT_SNORM_INT8X2: return fixed(1, 2);
    case CU_AD_FORMAT_UNORM_INT8X4:
    case CU_AD_FORMAT_SNORM_INT8X4: return fixed(1, 4);
    case CU_AD_FORMAT_UNORM_INT16X1:
    case CU_AD_FORMAT_SNORM_INT16X1: return fixed(2, 1);
    case CU_AD_FORMAT_UNORM_INT16X2:
    case CU_AD_FORMAT_SNORM_INT16X2: return fixed(2, 2);
    case CU_AD_FORMAT_UNORM_INT16X4:
    case CU_AD_FORMAT_SNORM_INT16X4: return fixed(2, 4);
    case CU_AD_FORMAT_UNORM_INT_101010_2: return channels == 4 ? 4 : 0;  // 4 channels in 32 bits
    default: return 0;
  }
}

constexpr unsigned kKnownFlags = CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_SURFACE_LDST | CUDA_ARRAY3D_CUBEMAP |
                                 CUDA_ARRAY3D_TEXTURE_GATHER | CUDA_ARRAY3D_DEPTH_TEXTURE |
                                 CUDA_ARRAY3D_COLOR_ATTACHMENT | CUDA_ARRAY3D_SPARSE |
                                 CUDA_ARRAY3D_DEFERRED_MAPPING | CUDA_ARRAY3D_VIDEO_ENCODE_DECODE;

// Validates a descriptor against the documented extents (the H200's texture limits, the same
// figures cuDeviceGetAttribute reports). Returns the bytes of one element, or 0 if invalid.
size_t validate(const CUDA_ARRAY3D_DESCRIPTOR& d) {
  size_t elem = element_bytes(d.Format, d.NumChannels);
  if (!elem || d.Width == 0 || (d.Flags & ~kKnownFlags)) return 0;
  const bool layered = d.Flags & CUDA_ARRAY3D_LAYERED;
  const bool cubemap = d.Flags & CUDA_ARRAY3D_CUBEMAP;
  const size_t w = d.Width, h = d.Height, z = d.Depth;
  if ((d.Flags & CUDA_ARRAY3D_SPARSE) && (d.Flags & CUDA_ARRAY3D_DEFERRED_MAPPING)) return 0;
  if (cubemap) {
    if (w != h || z == 0) return 0;
    if (layered ? (z % 6 != 0 || z > 2046) : z != 6) return 0;
    return w <= 32768 ? elem : 0;
  }
  if (layered) {
    if (z == 0 || z > 2048) return 0;
    if (h == 0) return w <= 32768 ? elem : 0;  // 1D layered
    return (w <= 32768 && h <= 32768) ? elem : 0;
  }
  if ((d.Flags & CUDA_ARRAY3D_TEXTURE_GATHER) && (h == 0 || z != 0)) return 0;  // 2D only
  if (h == 0 && z == 0) return w <= 131072 ? elem : 0;                            // 1D
  if (z == 0) return (w <= 131072 && h <= 65536) ? elem : 0;                      // 2D
  if (h == 0) return 0;                                                           // depth without height
  return (w <= 16384 && h <= 16384 && z <= 16384) ? elem : 0;                     // 3D
}

// Bytes of one array of extents w x h x z (0 = absent) and `elem`-byte elements, rounded; 0 on
// overflow.
size_t extent_bytes(size_t w, size_t h, size_t z, size_t elem) {
  size_t n = w;
  for (size_t f : {std::max<size_t>(h, 1), std::max<size_t>(z, 1), elem}) {
    if (n > SIZE_MAX / f) return 0;
    n *= f;
  }
  if (n > SIZE_MAX - kAlign) return 0;
  return round_up(n);
}

bool takes_memory(const CUDA_ARRAY3D_DESCRIPTOR& d) {
  return !(d.Flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING));
}

// Level `i` of a mipmapped array: every extent halves (at least 1) except the layer count.
CUDA_ARRAY3D_DESCRIPTOR level_desc(const CUDA_ARRAY3D_DESCRIPTOR& d, unsigned i) {
  CUDA_ARRAY3D_DESCRIPTOR l = d;
  auto half = [i](size_t v) { return v == 0 ? size_t{0} : std::max<size_t>(v >> i, 1); };
  l.Width = half(d.Width);
  l.Height = half(d.Height);
  if (!(d.Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP))) l.Depth = half(d.Depth);
  return l;
}

unsigned max_levels(const CUDA_ARRAY3D_DESCRIPTOR& d) {
  size_t m = std::max(d.Width, d.Height);
  if (!(d.Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP))) m = std::max(m, d.Depth);
  unsigned n = 1;
  while (m >>= 1) ++n;
  return n;
}

CUresult create_array(CUarray* out, const CUDA_ARRAY3D_DESCRIPTOR& desc, bool from_2d_api) {
  Context* ctx;
  if (CUresult rc = require_context(&ctx)) return rc;
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  size_t elem = validate(desc);
  if (!elem) return CUDA_ERROR_INVALID_VALUE;
  size_t bytes = extent_bytes(desc.Width, desc.Height, desc.Depth, elem);
  if (!bytes) return CUDA_ERROR_OUT_OF_MEMORY;  // more than any address space holds
  if (CUresult rc = capture_unsafe_call_check()) return rc;
  ArrayObj* a = fresh_array();
  a->desc = desc;
  a->from_2d_api = from_2d_api;
  a->ordinal = ctx->ordinal;
  a->ctx = ctx;
  if (takes_memory(desc)) {
    size_t block = 0;
    if (CUresult rc = device_alloc(device(ctx->ordinal), bytes, &a->block, &block)) {
      recycle_array(a);
      return rc;
    }
    a->bytes = block;
  }
  {
    std::lock_guard lock(g_mu);
    g_arrays[a] = true;
  }
  *out = reinterpret_cast<CUarray>(a);
  return CUDA_SUCCESS;
}

}  // namespace

void arrays_free_context(Context* ctx) {
  std::vector<ArrayObj*> arrays;
  std::vector<MipArray*> mipmaps;
  {
    std::lock_guard lock(g_mu);
    for (auto it = g_mipmaps.begin(); it != g_mipmaps.end();) {
      if (it->first->ctx != ctx) {
        ++it;
        continue;
      }
      for (ArrayObj* l : it->first->level_arrays) g_arrays.erase(l);
      mipmaps.push_back(it->first);
      it = g_mipmaps.erase(it);
    }
    for (auto it = g_arrays.begin(); it != g_arrays.end();) {
      if (it->first->ctx != ctx || it->first->owner) {
        ++it;
        continue;
      }
      arrays.push_back(it->first);
      it = g_arrays.erase(it);
    }
  }
  for (ArrayObj* a : arrays) {
    if (a->block) device_free_block(device(a->ordinal), a->block);
    recycle_array(a);
  }
  for (MipArray* m : mipmaps) {
    if (m->block) device_free_block(device(m->ordinal), m->block);
    for (ArrayObj* l : m->level_arrays) delete l;
    delete m;
  }
}

namespace {

ArrayObj* find_array(CUarray h) {
  auto* a = reinterpret_cast<ArrayObj*>(h);
  std::lock_guard lock(g_mu);
  return g_arrays.count(a) ? a : nullptr;
}

MipArray* find_mipmap(CUmipmappedArray h) {
  auto* m = reinterpret_cast<MipArray*>(h);
  std::lock_guard lock(g_mu);
  return g_mipmaps.count(m) ? m : nullptr;
}

CUDA_ARRAY3D_DESCRIPTOR from_2d(const CUDA_ARRAY_DESCRIPTOR& d) {
  CUDA_ARRAY3D_DESCRIPTOR a{};
  a.Width = d.Width;
  a.Height = d.Height;
  a.Format = d.Format;
  a.NumChannels = d.NumChannels;
  return a;
}

// cuArrayGetDescriptor describes 1D and 2D arrays only.
CUresult get_2d(CUDA_ARRAY_DESCRIPTOR* out, CUarray h) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  ArrayObj* a = find_array(h);
  if (!a) return CUDA_ERROR_INVALID_HANDLE;
  if (a->desc.Depth != 0) return CUDA_ERROR_INVALID_VALUE;
  out->Width = a->desc.Width;
  out->Height = a->desc.Height;
  out->Format = a->desc.Format;
  out->NumChannels = a->desc.NumChannels;
  return CUDA_SUCCESS;
}

CUresult get_3d(CUDA_ARRAY3D_DESCRIPTOR* out, CUarray h) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  ArrayObj* a = find_array(h);
  if (!a) return CUDA_ERROR_INVALID_HANDLE;
  *out = a->desc;
  return CUDA_SUCCESS;
}

bool narrow(size_t v, unsigned int* out) {
  if (v > 0xffffffffu) return false;
  *out = static_cast<unsigned int>(v);
  return true;
}

}  // namespace
}  // namespace fc

using namespace fc;

// ------------------------------------------------------------------ arrays

FC_API CUresult cuArrayCreate_v2(CUarray* pHandle, const CUDA_ARRAY_DESCRIPTOR* pAllocateArray) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!pAllocateArray) return CUDA_ERROR_INVALID_VALUE;
  return create_array(pHandle, from_2d(*pAllocateArray), true);
}

FC_API CUresult cuArrayCreate(CUarray* pHandle, const CUDA_ARRAY_DESCRIPTOR_v1* pAllocateArray) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!pAllocateArray) return CUDA_ERROR_INVALID_VALUE;
  CUDA_ARRAY_DESCRIPTOR d{pAllocateArray->Width, pAllocateArray->Height, pAllocateArray->Format,
                          pAllocateArray->NumChannels};
  return create_array(pHandle, from_2d(d), true);
}

FC_API CUresult cuArray3DCreate_v2(CUarray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* pAllocateArray) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!pAllocateArray) return CUDA_ERROR_INVALID_VALUE;
  return create_array(pHandle, *pAllocateArray, false);
}

FC_API CUresult cuArray3DCreate(CUarray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1* pAllocateArray) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!pAllocateArray) return CUDA_ERROR_INVALID_VALUE;
  CUDA_ARRAY3D_DESCRIPTOR d{pAllocateArray->Width,  pAllocateArray->Height,      pAllocateArray->Depth,
                            pAllocateArray->Format, pAllocateArray->NumChannels, pAllocateArray->Flags};
  return create_array(pHandle, d, false);
}

FC_API CUresult cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR* pArrayDescriptor, CUarray hArray) {
  FC_ENTER();
  return get_2d(pArrayDescriptor, hArray);
}

FC_API CUresult cuArrayGetDescriptor(CUDA_ARRAY_DESCRIPTOR_v1* pArrayDescriptor, CUarray hArray) {
  FC_ENTER();
  if (!pArrayDescriptor) return initialized() ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
  CUDA_ARRAY_DESCRIPTOR d{};
  if (CUresult rc = get_2d(&d, hArray)) return rc;
  CUDA_ARRAY_DESCRIPTOR_v1 o{};
  if (!narrow(d.Width, &o.Width) || !narrow(d.Height, &o.Height)) return CUDA_ERROR_INVALID_VALUE;
  o.Format = d.Format;
  o.NumChannels = d.NumChannels;
  *pArrayDescriptor = o;
  return CUDA_SUCCESS;
}

FC_API CUresult cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR* pArrayDescriptor, CUarray hArray) {
  FC_ENTER();
  return get_3d(pArrayDescriptor, hArray);
}

FC_API CUresult cuArray3DGetDescriptor(CUDA_ARRAY3D_DESCRIPTOR_v1* pArrayDescriptor, CUarray hArray) {
  FC_ENTER();
  if (!pArrayDescriptor) return initialized() ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
  CUDA_ARRAY3D_DESCRIPTOR d{};
  if (CUresult rc = get_3d(&d, hArray)) return rc;
  CUDA_ARRAY3D_DESCRIPTOR_v1 o{};
  if (!narrow(d.Width, &o.Width) || !narrow(d.Height, &o.Height) || !narrow(d.Depth, &o.Depth))
    return CUDA_ERROR_INVALID_VALUE;
  o.Format = d.Format;
  o.NumChannels = d.NumChannels;
  o.Flags = d.Flags;
  *pArrayDescriptor = o;
  return CUDA_SUCCESS;
}

FC_API CUresult cuArrayDestroy(CUarray hArray) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  pause_point("cuArrayDestroy");
  if (CUresult rc = capture_unsafe_call_check()) return rc;
  ArrayObj* a;
  bool known = false;
  {
    std::lock_guard lock(g_mu);
    a = reinterpret_cast<ArrayObj*>(hArray);
    auto it = g_arrays.find(a);
    if (it != g_arrays.end() && !a->owner) {
      g_arrays.erase(it);
      known = true;
    }
  }
  if (!known) {
    pause_point("cuArrayDestroy refused");
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (a->block) device_free_block(device(a->ordinal), a->block);
  recycle_array(a);
  return CUDA_SUCCESS;
}

FC_API CUresult cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* memoryRequirements, CUarray array,
                                             CUdevice device_ordinal) {
  FC_ENTER();
  if (CUresult rc = check_device(device_ordinal)) return rc;
  if (!memoryRequirements) return CUDA_ERROR_INVALID_VALUE;
  ArrayObj* a = find_array(array);
  if (!a) return CUDA_ERROR_INVALID_HANDLE;
  if (!(a->desc.Flags & CUDA_ARRAY3D_DEFERRED_MAPPING)) return CUDA_ERROR_INVALID_VALUE;
  std::memset(memoryRequirements, 0, sizeof *memoryRequirements);
  memoryRequirements->size =
      extent_bytes(a->desc.Width, a->desc.Height, a->desc.Depth, element_bytes(a->desc.Format, a->desc.NumChannels));
  memoryRequirements->alignment = kAlign;
  return CUDA_SUCCESS;
}

// ------------------------------------------------------------------ mipmapped arrays

FC_API CUresult cuMipmappedArrayCreate(CUmipmappedArray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* pMipmappedArrayDesc,
                                       unsigned int numMipmapLevels) {
  FC_ENTER();
  Context* ctx;
  if (CUresult rc = require_context(&ctx)) return rc;
  if (!pHandle || !pMipmappedArrayDesc) return CUDA_ERROR_INVALID_VALUE;
  const CUDA_ARRAY3D_DESCRIPTOR& desc = *pMipmappedArrayDesc;
  size_t elem = validate(desc);
  if (!elem || numMipmapLevels == 0 || numMipmapLevels > max_levels(desc)) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = capture_unsafe_call_check()) return rc;
  auto* m = new MipArray;
  m->desc = desc;
  m->levels = numMipmapLevels;
  m->ordinal = ctx->ordinal;
  m->ctx = ctx;
  size_t total = 0;
  for (unsigned i = 0; i < numMipmapLevels; ++i) {
    auto* l = new ArrayObj;
    l->desc = level_desc(desc, i);
    l->ordinal = ctx->ordinal;
    l->owner = m;
    l->bytes = takes_memory(desc) ? extent_bytes(l->desc.Width, l->desc.Height, l->desc.Depth, elem) : 0;
    if (takes_memory(desc) && (!l->bytes || total > SIZE_MAX - l->bytes)) total = SIZE_MAX;
    else if (total != SIZE_MAX) total += l->bytes;
    m->level_arrays.push_back(l);
  }
  auto discard = [m] {
    for (ArrayObj* l : m->level_arrays) delete l;
    delete m;
  };
  if (total == SIZE_MAX) {
    discard();
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (total) {
    size_t block = 0;
    if (CUresult rc = device_alloc(device(ctx->ordinal), total, &m->block, &block)) {
      discard();
      return rc;
    }
    m->bytes = block;
  }
  {
    std::lock_guard lock(g_mu);
    g_mipmaps[m] = true;
    for (ArrayObj* l : m->level_arrays) g_arrays[l] = true;
  }
  *pHandle = reinterpret_cast<CUmipmappedArray>(m);
  return CUDA_SUCCESS;
}

FC_API CUresult cuMipmappedArrayGetLevel(CUarray* pLevelArray, CUmipmappedArray hMipmappedArray, unsigned int level) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!pLevelArray) return CUDA_ERROR_INVALID_VALUE;
  MipArray* m = find_mipmap(hMipmappedArray);
  if (!m) return CUDA_ERROR_INVALID_HANDLE;
  if (level >= m->levels) return CUDA_ERROR_INVALID_VALUE;
  *pLevelArray = reinterpret_cast<CUarray>(m->level_arrays[level]);
  return CUDA_SUCCESS;
}

FC_API CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (CUresult rc = capture_unsafe_call_check()) return rc;
  MipArray* m;
  {
    std::lock_guard lock(g_mu);
    m = reinterpret_cast<MipArray*>(hMipmappedArray);
    auto it = g_mipmaps.find(m);
    if (it == g_mipmaps.end()) return CUDA_ERROR_INVALID_HANDLE;
    g_mipmaps.erase(it);
    for (ArrayObj* l : m->level_arrays) g_arrays.erase(l);
  }
  if (m->block) device_free_block(device(m->ordinal), m->block);
  for (ArrayObj* l : m->level_arrays) delete l;
  delete m;
  return CUDA_SUCCESS;
}

FC_API CUresult cuMipmappedArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* memoryRequirements,
                                                      CUmipmappedArray mipmap, CUdevice device_ordinal) {
  FC_ENTER();
  if (CUresult rc = check_device(device_ordinal)) return rc;
  if (!memoryRequirements) return CUDA_ERROR_INVALID_VALUE;
  MipArray* m = find_mipmap(mipmap);
  if (!m) return CUDA_ERROR_INVALID_HANDLE;
  if (!(m->desc.Flags & CUDA_ARRAY3D_DEFERRED_MAPPING)) return CUDA_ERROR_INVALID_VALUE;
  size_t elem = element_bytes(m->desc.Format, m->desc.NumChannels);
  size_t total = 0;
  for (ArrayObj* l : m->level_arrays) total += extent_bytes(l->desc.Width, l->desc.Height, l->desc.Depth, elem);
  std::memset(memoryRequirements, 0, sizeof *memoryRequirements);
  memoryRequirements->size = total;
  memoryRequirements->alignment = kAlign;
  return CUDA_SUCCESS;
}

// ------------------------------------------------------------------ test API

FC_API size_t fakecuda_array_bytes(CUarray array) {
  ArrayObj* a = find_array(array);
  return a ? a->bytes : 0;
}

FC_API size_t fakecuda_mipmapped_array_bytes(CUmipmappedArray array) {
  MipArray* m = find_mipmap(array);
  return m ? m->bytes : 0;
}
