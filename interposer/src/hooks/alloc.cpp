// cuwarden interposer hooks: device allocations and their frees (CUDA driver API: Memory
// Management, Stream Ordered Memory Allocator). cuMemAlloc and the stream-ordered pair go to
// the backend; managed, pitched and the program's own pools' allocations to the core.
#include <cuda.h>

#include <cstdint>

#include "backends/start.hpp"
#include "base/real.hpp"
#include "core/record.hpp"
#include "core/tracker.hpp"
#include "cuw/ring.hpp"
#include "hooks/prologue.hpp"

using cuw::backends::with_backend;
using cuw::core::Tracker;
namespace core = cuw::core;
namespace ring = cuw::ring;

// The hot paths of cuMemAlloc_v2 and cuMemFree_v2 (defined right after it, so emitted right
// after it) fit in one 4 KiB page, which is where this alignment starts them (the free's
// rare paths, at its end, may run into the next; tests/interposer/check_hot_page.sh): a
// program that allocates and frees synchronously runs the pair with the driver's work in
// between, which leaves the caches, and after an unmapping the TLB, cold; each page of code
// is one more translation to walk (bench/results/2026-11-30-h200-sync-pair.md). With
// passthrough chosen, its inline allocate is this function's body (backends/start.hpp).
CUW_EXPORT_HOT __attribute__((aligned(4096))) CUresult hook_cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  CUW_PROLOGUE(cuMemAlloc_v2, dptr, bytesize);
  Tracker& t = Tracker::get();
  const core::SiteScope site(t, bytesize);
  const CUresult r = with_backend(t, [&](auto& b) CUW_LAMBDA_INLINE { return b.allocate(t, dptr, bytesize, real); });
  // The driver out of memory: the daemon may make room (backends/after_room.cpp, cold).
  if (__builtin_expect(r == CUDA_ERROR_OUT_OF_MEMORY, 0))
    return cuw::backends::allocate_after_room(t, dptr, bytesize, real);
  return r;
}

// (Right after cuMemAlloc_v2: see there. At a line's start, so that its first line is all its own.)
CUW_EXPORT_HOT __attribute__((aligned(64))) CUresult hook_cuMemFree_v2(CUdeviceptr dptr) {
  CUW_PROLOGUE(cuMemFree_v2, dptr);
  Tracker& t = Tracker::get();
  return with_backend(t, [&](auto& b) CUW_LAMBDA_INLINE { return b.deallocate(t, dptr, real); });
}

CUW_EXPORT CUresult hook_cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  CUW_PROLOGUE(cuMemAllocManaged, dptr, bytesize, flags);
  Tracker& t = Tracker::get();
  const core::SiteScope site(t, bytesize);
  const int ordinal = t.current_device();
  auto attempt = [&] {
    return core::tracked_alloc(t, ring::Api::cuMemAllocManaged, ordinal, false, bytesize, 0, dptr,
                               [&] { return real(dptr, bytesize, flags); });
  };
  // The driver out of memory: the daemon may make room (core/room.hpp), as for cuMemAlloc.
  const CUresult r = core::again_after_room(t, bytesize, attempt(), attempt);
  if (r == CUDA_SUCCESS) core::count_uncarried(t, ordinal, &ring::DeviceSlot::managed_allocs);
  return r;
}

CUW_EXPORT CUresult hook_cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                            unsigned int elem) {
  CUW_PROLOGUE(cuMemAllocPitch_v2, dptr, pitch, width, height, elem);
  Tracker& t = Tracker::get();
  const core::SiteScope site(t);
  const int ordinal = t.current_device();
  // The pitch is only known afterwards: charge an estimate (rows of 512 bytes, the
  // driver's smallest pitch alignment) and settle on the real pitch * height after.
  const uint64_t est = ((static_cast<uint64_t>(width) + 511) & ~uint64_t{511}) * height;
  auto attempt = [&] {
    return core::tracked_alloc(t, ring::Api::cuMemAllocPitch, ordinal, false, est, 0, dptr,
                               [&] { return real(dptr, pitch, width, height, elem); });
  };
  const CUresult r = core::again_after_room(t, est, attempt(), attempt);  // the driver's refusal noted `est`
  if (r == CUDA_SUCCESS && pitch) core::settle_pitch(t, ordinal, *dptr, est, static_cast<uint64_t>(*pitch) * height);
  return r;
}

// The stream-ordered pair: each at a line's start, as cuMemFree_v2.
#define CUW_ASYNC_ALLOC(name)                                                                               \
  CUW_EXPORT_HOT __attribute__((aligned(64))) CUresult hook_##name(CUdeviceptr* dptr, size_t bytesize,    \
                                                                    CUstream stream) {                    \
    CUW_PROLOGUE(name, dptr, bytesize, stream);                                                             \
    Tracker& t = Tracker::get();                                                                            \
    const core::SiteScope site(t, bytesize);                                                                \
    const CUresult r = with_backend(                                                                        \
        t, [&](auto& b) CUW_LAMBDA_INLINE { return b.allocate_async(t, dptr, bytesize, stream, real); }); \
    if (__builtin_expect(r == CUDA_ERROR_OUT_OF_MEMORY, 0))                                                 \
      return cuw::backends::allocate_async_after_room(t, dptr, bytesize, stream, real);                    \
    return r;                                                                                               \
  }
CUW_ASYNC_ALLOC(cuMemAllocAsync)
CUW_ASYNC_ALLOC(cuMemAllocAsync_ptsz)
#undef CUW_ASYNC_ALLOC

// The program's own pool: never a backend's. The driver out of memory, after the pool gave
// back what it kept: the daemon may make room, as for cuMemAllocAsync.
#define CUW_POOL_ALLOC(name)                                                                                 \
  CUW_EXPORT_HOT CUresult hook_##name(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream stream) { \
    CUW_PROLOGUE(name, dptr, bytesize, pool, stream);                                                        \
    Tracker& t = Tracker::get();                                                                             \
    const core::SiteScope site(t, bytesize);                                                                 \
    auto attempt = [&] {                                                                                     \
      return core::tracked_alloc_async(t, ring::Api::cuMemAllocFromPoolAsync, pool, stream, bytesize, dptr, \
                                       [&] { return real(dptr, bytesize, pool, stream); });                  \
    };                                                                                                       \
    return core::again_after_room(t, bytesize, attempt(), attempt);                                          \
  }
CUW_POOL_ALLOC(cuMemAllocFromPoolAsync)
CUW_POOL_ALLOC(cuMemAllocFromPoolAsync_ptsz)
#undef CUW_POOL_ALLOC

#define CUW_ASYNC_FREE(name, per_thread)                                                                          \
  CUW_EXPORT_HOT __attribute__((aligned(64))) CUresult hook_##name(CUdeviceptr dptr, CUstream stream) {         \
    CUW_PROLOGUE(name, dptr, stream);                                                                             \
    Tracker& t = Tracker::get();                                                                                  \
    return with_backend(                                                                                          \
        t, [&](auto& b) CUW_LAMBDA_INLINE { return b.deallocate_async(t, dptr, stream, per_thread, real); }); \
  }
CUW_ASYNC_FREE(cuMemFreeAsync, false)
CUW_ASYNC_FREE(cuMemFreeAsync_ptsz, true)
#undef CUW_ASYNC_FREE
