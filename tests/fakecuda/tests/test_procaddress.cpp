// fakecuda unit tests: cuGetProcAddress picks ABI and per-thread variants like the driver.
#include <dlfcn.h>

#include <cstring>
#include <string>

#include "helpers.hpp"

namespace {
void* exported(const char* name) { return dlsym(RTLD_DEFAULT, name); }

void* resolve(const char* name, int version, cuuint64_t flags, CUresult* rc = nullptr,
              CUdriverProcAddressQueryResult* status = nullptr) {
  void* fn = reinterpret_cast<void*>(1);
  CUdriverProcAddressQueryResult st;
  CUresult r = cuGetProcAddress_v2(name, &fn, version, flags, &st);
  if (rc) *rc = r;
  if (status) *status = st;
  return fn;
}
}  // namespace

TEST_CASE("cudaVersion selects the ABI variant", "[procaddress]") {
  CHECK(resolve("cuMemAlloc", 3020, 0) == exported("cuMemAlloc_v2"));
  CHECK(resolve("cuMemAlloc", 13000, 0) == exported("cuMemAlloc_v2"));
  CHECK(resolve("cuMemAlloc", 2000, 0) == exported("cuMemAlloc"));
  CHECK(resolve("cuMemAlloc", 3010, 0) == exported("cuMemAlloc"));
  CHECK(resolve("cuCtxCreate", 12050, 0) == exported("cuCtxCreate_v4"));
  CHECK(resolve("cuCtxCreate", 11040, 0) == exported("cuCtxCreate_v3"));
  CHECK(resolve("cuGetProcAddress", 12000, 0) == exported("cuGetProcAddress_v2"));
  CHECK(resolve("cuGetProcAddress", 11030, 0) == exported("cuGetProcAddress"));
  CHECK(resolve("cuStreamGetCaptureInfo", 12030, 0) == exported("cuStreamGetCaptureInfo_v3"));
  CHECK(resolve("cuEventElapsedTime", 12080, 0) == exported("cuEventElapsedTime_v2"));
}

TEST_CASE("per-thread default stream flag picks _ptds and _ptsz variants", "[procaddress]") {
  const cuuint64_t pt = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  const cuuint64_t legacy = CU_GET_PROC_ADDRESS_LEGACY_STREAM;
  CHECK(resolve("cuMemcpyHtoD", 7000, pt) == exported("cuMemcpyHtoD_v2_ptds"));
  CHECK(resolve("cuMemcpyHtoD", 7000, legacy) == exported("cuMemcpyHtoD_v2"));
  CHECK(resolve("cuMemcpyHtoD", 7000, CU_GET_PROC_ADDRESS_DEFAULT) == exported("cuMemcpyHtoD_v2"));
  CHECK(resolve("cuMemcpyHtoD", 3020, pt) == exported("cuMemcpyHtoD_v2"));  // no pt variant that old
  CHECK(resolve("cuMemAllocAsync", 11020, pt) == exported("cuMemAllocAsync_ptsz"));
  CHECK(resolve("cuMemAllocAsync", 11020, 0) == exported("cuMemAllocAsync"));
  CHECK(resolve("cuStreamBeginCapture", 10010, pt) == exported("cuStreamBeginCapture_v2_ptsz"));
  CHECK(resolve("cuStreamBeginCapture", 10000, pt) == exported("cuStreamBeginCapture_ptsz"));
  CHECK(resolve("cuMemAlloc", 3020, pt) == exported("cuMemAlloc_v2"));  // has none
}

TEST_CASE("unknown names and too-old versions are not found", "[procaddress]") {
  CUresult rc;
  CUdriverProcAddressQueryResult st;
  CHECK(resolve("cuNoSuchFunction", 13000, 0, &rc, &st) == nullptr);
  CHECK(rc == CUDA_ERROR_NOT_FOUND);
  CHECK(st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  CHECK(resolve("cuMemAlloc_v2", 13000, 0, &rc, &st) == nullptr);  // exported names are not base names
  CHECK(st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  CHECK(resolve("cuMemAllocAsync", 11000, 0, &rc, &st) == nullptr);
  CHECK(rc == CUDA_ERROR_NOT_FOUND);
  CHECK(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  void* fn;
  CHECK(cuGetProcAddress_v2("cuMemAlloc", &fn, 13000, 4, nullptr) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("every exported entry point resolves to something callable", "[procaddress]") {
  size_t n = 0;
  const fakecuda_proc_entry* t = fakecuda_proc_table(&n);
  REQUIRE(n > 600);
  bool found = false;
  for (size_t i = 0; i < n; ++i) {
    CHECK(exported(t[i].exported_name) != nullptr);
    if (std::string(t[i].base_name) == "cuMemAlloc" && t[i].version == 3020) {
      found = true;
      CHECK(std::string(t[i].exported_name) == "cuMemAlloc_v2");
      CHECK(t[i].kind == FAKECUDA_PROC_PLAIN);
    }
  }
  CHECK(found);
  // Something the simulation does not implement: a stub that says so.
  using Fn = CUresult (*)(CUarray*, CUarray, unsigned int);
  auto f = reinterpret_cast<Fn>(resolve("cuArrayGetPlane", 13000, 0));
  REQUIRE(f != nullptr);
  CHECK(f(nullptr, nullptr, 0) == CUDA_ERROR_NOT_SUPPORTED);
}
