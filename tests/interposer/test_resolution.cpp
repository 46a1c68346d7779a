// Interposer tests: every hooked function is reached by every path into the driver:
// exported symbols, dlsym on a libcuda handle, cuGetProcAddress(_v2) by version and flags,
// and the runtime's entry-point lookup. Counts return to zero after the frees.
#include <dlfcn.h>

#include <cstring>
#include <map>
#include <set>
#include <string>

#include "fakecuda.h"
#include "support.hpp"

using namespace cuwtest;

namespace {

void* libcuda() {
  static void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  REQUIRE(h);
  return h;
}

// Our wrapper for an exported name: what the dynamic linker binds the name to in a
// process with libcuwarden.so preloaded.
void* wrapper_of(const char* exported) {
  void* self = dlopen(nullptr, RTLD_LAZY);
  void* p = dlsym(self, exported);
  REQUIRE(p);
  Dl_info info{};
  REQUIRE(dladdr(p, &info));
  INFO(exported << " resolved into " << (info.dli_fname ? info.dli_fname : "?"));
  REQUIRE(std::string(info.dli_fname).find("libcuwarden") != std::string::npos);
  return p;
}

using alloc_fn = CUresult (*)(CUdeviceptr*, size_t);
using free_fn = CUresult (*)(CUdeviceptr);
using async_alloc_fn = CUresult (*)(CUdeviceptr*, size_t, CUstream);
using async_free_fn = CUresult (*)(CUdeviceptr, CUstream);
using pool_alloc_fn = CUresult (*)(CUdeviceptr*, size_t, CUmemoryPool, CUstream);
using pitch_fn = CUresult (*)(CUdeviceptr*, size_t*, size_t, size_t, unsigned);
using managed_fn = CUresult (*)(CUdeviceptr*, size_t, unsigned);
using create_fn = CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long);
using release_fn = CUresult (*)(CUmemGenericAllocationHandle);
using getinfo_fn = CUresult (*)(size_t*, size_t*);
using totalmem_fn = CUresult (*)(size_t*, CUdevice);
using gpa1_fn = CUresult (*)(const char*, void**, int, cuuint64_t);
using gpa2_fn = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

/// A resolver: name -> function pointer, by one of the four paths.
using Resolver = void* (*)(const char* exported, const char* base, bool per_thread);

void* by_export(const char* exported, const char*, bool) { return wrapper_of(exported); }
void* by_dlsym(const char* exported, const char*, bool) {
  void* p = dlsym(libcuda(), exported);
  REQUIRE(p);
  return p;
}
void* by_getproc_v2(const char*, const char* base, bool per_thread) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult st{};
  REQUIRE(cuGetProcAddress_v2(base, &p, 13000,
                              per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT,
                              &st) == CUDA_SUCCESS);
  REQUIRE(st == CU_GET_PROC_ADDRESS_SUCCESS);
  return p;
}
void* by_getproc_v1(const char*, const char* base, bool per_thread) {
  auto gpa = reinterpret_cast<gpa1_fn>(dlsym(libcuda(), "cuGetProcAddress"));
  REQUIRE(gpa);
  void* p = nullptr;
  REQUIRE(gpa(base, &p, 12000, per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0) == CUDA_SUCCESS);
  return p;
}
// The path the CUDA runtime takes: dlopen + dlsym("cuGetProcAddress_v2"), then lookups.
void* by_runtime_path(const char*, const char* base, bool per_thread) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW);
  REQUIRE(h);
  auto gpa = reinterpret_cast<gpa2_fn>(dlsym(h, "cuGetProcAddress_v2"));
  REQUIRE(gpa);
  void* p = nullptr;
  REQUIRE(gpa(base, &p, 13000, per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0, nullptr) ==
          CUDA_SUCCESS);
  dlclose(h);
  return p;
}

struct Path {
  const char* name;
  Resolver resolve;
};
const Path kPaths[] = {{"exported symbol", by_export},
                       {"dlsym on libcuda", by_dlsym},
                       {"cuGetProcAddress_v2", by_getproc_v2},
                       {"cuGetProcAddress (v1)", by_getproc_v1},
                       {"runtime path (dlsym + cuGetProcAddress_v2)", by_runtime_path}};

using cuwtest::kMiB;

}  // namespace

TEST_CASE("every hooked allocation function is counted by every resolution path", "[resolution]") {
  make_context();
  touch_interposer();
  CUstream stream = nullptr;
  REQUIRE(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CUmemoryPool pool = nullptr;
  REQUIRE(cuDeviceGetDefaultMemPool(&pool, 0) == CUDA_SUCCESS);

  for (const Path& path : kPaths) {
    SECTION(path.name) {
      const uint64_t allocs_before = dev_counters().alloc_count.load();
      REQUIRE(used() == 0);

      auto alloc = reinterpret_cast<alloc_fn>(path.resolve("cuMemAlloc_v2", "cuMemAlloc", false));
      auto mfree = reinterpret_cast<free_fn>(path.resolve("cuMemFree_v2", "cuMemFree", false));
      CHECK(reinterpret_cast<void*>(alloc) == wrapper_of("cuMemAlloc_v2"));
      CUdeviceptr a = 0;
      REQUIRE(alloc(&a, 3 * kMiB) == CUDA_SUCCESS);
      CHECK(used() == 3 * kMiB);

      auto pitch = reinterpret_cast<pitch_fn>(path.resolve("cuMemAllocPitch_v2", "cuMemAllocPitch", false));
      CUdeviceptr b = 0;
      size_t pitch_bytes = 0;
      REQUIRE(pitch(&b, &pitch_bytes, 1000, 100, 4) == CUDA_SUCCESS);
      CHECK(pitch_bytes >= 1000);
      CHECK(used() == 3 * kMiB + pitch_bytes * 100);

      auto managed = reinterpret_cast<managed_fn>(path.resolve("cuMemAllocManaged", "cuMemAllocManaged", false));
      CUdeviceptr c = 0;
      REQUIRE(managed(&c, kMiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
      const uint64_t sync_total = 4 * kMiB + pitch_bytes * 100;
      CHECK(used() == sync_total);

      for (bool pt : {false, true}) {
        auto aalloc = reinterpret_cast<async_alloc_fn>(
            path.resolve(pt ? "cuMemAllocAsync_ptsz" : "cuMemAllocAsync", "cuMemAllocAsync", pt));
        auto afree = reinterpret_cast<async_free_fn>(
            path.resolve(pt ? "cuMemFreeAsync_ptsz" : "cuMemFreeAsync", "cuMemFreeAsync", pt));
        auto palloc = reinterpret_cast<pool_alloc_fn>(path.resolve(
            pt ? "cuMemAllocFromPoolAsync_ptsz" : "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", pt));
        CHECK(reinterpret_cast<void*>(aalloc) == wrapper_of(pt ? "cuMemAllocAsync_ptsz" : "cuMemAllocAsync"));
        CUdeviceptr d = 0, e = 0;
        REQUIRE(aalloc(&d, 2 * kMiB, stream) == CUDA_SUCCESS);
        REQUIRE(palloc(&e, kMiB, pool, stream) == CUDA_SUCCESS);
        CHECK(used() == sync_total + 3 * kMiB);
        REQUIRE(afree(d, stream) == CUDA_SUCCESS);
        REQUIRE(afree(e, stream) == CUDA_SUCCESS);
        CHECK(used() == sync_total);
      }

      auto create = reinterpret_cast<create_fn>(path.resolve("cuMemCreate", "cuMemCreate", false));
      auto release = reinterpret_cast<release_fn>(path.resolve("cuMemRelease", "cuMemRelease", false));
      CUmemAllocationProp prop{};
      prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
      prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      prop.location.id = 0;
      CUmemGenericAllocationHandle h = 0;
      REQUIRE(create(&h, 4 * kMiB, &prop, 0) == CUDA_SUCCESS);
      CHECK(used() == sync_total + 4 * kMiB);
      REQUIRE(release(h) == CUDA_SUCCESS);
      CHECK(used() == sync_total);

      REQUIRE(mfree(a) == CUDA_SUCCESS);
      REQUIRE(mfree(b) == CUDA_SUCCESS);
      REQUIRE(mfree(c) == CUDA_SUCCESS);
      REQUIRE(cuStreamSynchronize(stream) == CUDA_SUCCESS);
      CHECK(used() == 0);
      CHECK(dev_counters().live_allocations.load() == 0);
      CHECK(dev_counters().alloc_count.load() - allocs_before == 3 + 2 * 2 + 1);
    }
  }
  REQUIRE(cuStreamDestroy(stream) == CUDA_SUCCESS);
}

TEST_CASE("reported sizes are hooked by every path", "[resolution]") {
  make_context();
  touch_interposer();
  const uint64_t cap = dev_counters().limit.load();
  REQUIRE(cap != cuw::ring::kNoLimit);
  for (const Path& path : kPaths) {
    SECTION(path.name) {
      auto getinfo = reinterpret_cast<getinfo_fn>(path.resolve("cuMemGetInfo_v2", "cuMemGetInfo", false));
      auto total = reinterpret_cast<totalmem_fn>(path.resolve("cuDeviceTotalMem_v2", "cuDeviceTotalMem", false));
      size_t f = 0, t = 0, tm = 0;
      REQUIRE(getinfo(&f, &t) == CUDA_SUCCESS);
      CHECK(t == cap);
      CHECK(f == cap - used());
      REQUIRE(total(&tm, 0) == CUDA_SUCCESS);
      CHECK(tm == cap);
    }
  }
}

TEST_CASE("cuGetProcAddress hands back exactly the variant the driver would, for every version and flag",
          "[resolution][procaddress]") {
  make_context();
  touch_interposer();
  std::set<std::string> hooked = {"cuMemAlloc_v2",          "cuMemAllocPitch_v2",      "cuMemAllocManaged",
                                  "cuMemFree_v2",           "cuMemAllocAsync",         "cuMemAllocAsync_ptsz",
                                  "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz", "cuMemFreeAsync",
                                  "cuMemFreeAsync_ptsz",    "cuMemCreate",             "cuMemRelease",
                                  "cuMemGetInfo_v2",        "cuDeviceTotalMem_v2",     "cuGetProcAddress",
                                  "cuGetProcAddress_v2",
                                  // CUWARDEN_POOL=cache: pointer queries, IPC, streams, captures, contexts
                                  "cuMemGetAddressRange_v2", "cuPointerGetAttribute", "cuPointerGetAttributes",
                                  "cuIpcGetMemHandle", "cuStreamCreate", "cuStreamCreateWithPriority",
                                  "cuStreamDestroy_v2", "cuStreamBeginCapture_v2", "cuStreamBeginCapture_v2_ptsz",
                                  "cuStreamBeginCaptureToGraph", "cuStreamBeginCaptureToGraph_ptsz",
                                  "cuStreamEndCapture", "cuStreamEndCapture_ptsz", "cuCtxDestroy_v2",
                                  "cuDevicePrimaryCtxReset_v2",
                                  // through the backend: IPC imports, peer access
                                  "cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle", "cuIpcCloseMemHandle",
                                  "cuCtxEnablePeerAccess", "cuCtxDisablePeerAccess"};
  std::set<std::string> hooked_bases;
  size_t n = 0;
  const fakecuda_proc_entry* table = fakecuda_proc_table(&n);
  REQUIRE(n > 100);
  for (size_t i = 0; i < n; ++i)
    if (hooked.count(table[i].exported_name)) hooked_bases.insert(table[i].base_name);
  CHECK(hooked_bases.size() == 28);  // every hooked base name appears in the driver's table

  int checked = 0, redirected = 0;
  for (size_t i = 0; i < n; ++i) {
    const fakecuda_proc_entry& e = table[i];
    if (!hooked_bases.count(e.base_name)) continue;
    // Ask at the version that introduced this variant and one later, with the matching flag.
    const cuuint64_t flags =
        e.kind == FAKECUDA_PROC_PLAIN ? CU_GET_PROC_ADDRESS_LEGACY_STREAM : CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    // The driver's own answer: the exported variant, found by dlsym (which passes unhooked
    // names through untouched and maps hooked ones to our wrapper).
    void* expected = hooked.count(e.exported_name) ? wrapper_of(e.exported_name) : dlsym(libcuda(), e.exported_name);
    REQUIRE(expected);
    // Is this variant the newest one at e.version for this flag? Only then must it win.
    bool newest = true;
    for (size_t j = 0; j < n; ++j)
      if (j != i && !std::strcmp(table[j].base_name, e.base_name) && table[j].kind == e.kind &&
          table[j].version > e.version)
        newest = false;
    void* got = nullptr;
    CUdriverProcAddressQueryResult st{};
    REQUIRE(cuGetProcAddress_v2(e.base_name, &got, e.version, flags, &st) == CUDA_SUCCESS);
    INFO(e.base_name << " @" << e.version << " kind " << e.kind << " -> expected " << e.exported_name);
    CHECK(got == expected);
    if (newest) {
      void* later = nullptr;
      REQUIRE(cuGetProcAddress_v2(e.base_name, &later, 13000, flags, &st) == CUDA_SUCCESS);
      CHECK(later == expected);
    }
    ++checked;
    if (hooked.count(e.exported_name)) ++redirected;
  }
  CHECK(checked >= 36);
  CHECK(redirected == 36);

  // Names not hooked come back untouched: the driver's own pointer.
  for (const char* base : {"cuCtxGetDevice", "cuEventQuery", "cuStreamSynchronize", "cuDeviceGetName"}) {
    void* got = nullptr;
    REQUIRE(cuGetProcAddress_v2(base, &got, 13000, 0, nullptr) == CUDA_SUCCESS);
    Dl_info info{};
    REQUIRE(dladdr(got, &info));
    CHECK(std::string(info.dli_fname).find("libcuwarden") == std::string::npos);
  }
}

TEST_CASE("dlsym passes through names that are not ours, without recursion", "[resolution]") {
  // Plain libc names through RTLD_DEFAULT and RTLD_NEXT, and an unknown cu* name.
  CHECK(dlsym(RTLD_DEFAULT, "strlen") != nullptr);
  CHECK(dlsym(RTLD_NEXT, "strlen") != nullptr);
  CHECK(dlsym(libcuda(), "cuNoSuchFunction") == nullptr);
  void* real_ctx = dlsym(libcuda(), "cuCtxGetDevice");
  Dl_info info{};
  REQUIRE(dladdr(real_ctx, &info));
  CHECK(std::string(info.dli_fname).find("libcuwarden") == std::string::npos);
}
