// fakecuda: acceptance program for the driver API, linked directly against the simulated driver.
//   fakecuda_driver                     basic driver-API flow on the default device
//   fakecuda_driver --expect-visible N  checks device count and UUID order under CUDA_VISIBLE_DEVICES
#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fakecuda.h"

#define CHECK(call)                                                                              \
  do {                                                                                           \
    CUresult r_ = (call);                                                                        \
    if (r_ != CUDA_SUCCESS) {                                                                    \
      std::fprintf(stderr, "%s:%d: %s -> %d\n", __FILE__, __LINE__, #call, static_cast<int>(r_)); \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

#define EXPECT(cond)                                                          \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      return 1;                                                               \
    }                                                                         \
  } while (0)

static int visible_mode(int expected) {
  CHECK(cuInit(0));
  int n = -1;
  CHECK(cuDeviceGetCount(&n));
  EXPECT(n == expected);
  // CUWARDEN_FAKE_DEVICES=4, CUDA_VISIBLE_DEVICES=3,GPU-...-000000000001,7,0: physical 3 then 1,
  // and 7 (invalid) ends the list before 0.
  const unsigned char want_last[] = {3, 1};
  for (int i = 0; i < n && i < 2; ++i) {
    CUuuid u;
    CHECK(cuDeviceGetUuid_v2(&u, i));
    EXPECT(static_cast<unsigned char>(u.bytes[15]) == want_last[i]);
  }
  char bus[32];
  CHECK(cuDeviceGetPCIBusId(bus, sizeof bus, 0));
  std::printf("visible devices: %d, device 0 at %s\n", n, bus);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--expect-visible") == 0) return visible_mode(std::atoi(argv[2]));

  CUdeviceptr p = 0;
  EXPECT(cuMemAlloc(&p, 16) == CUDA_ERROR_NOT_INITIALIZED);
  int version = 0;
  CHECK(cuDriverGetVersion(&version));
  EXPECT(version == 13000);
  CHECK(cuInit(0));
  int n = 0;
  CHECK(cuDeviceGetCount(&n));
  EXPECT(n == 1);
  CUdevice dev;
  CHECK(cuDeviceGet(&dev, 0));
  char name[128];
  CHECK(cuDeviceGetName(name, sizeof name, dev));
  EXPECT(std::strcmp(name, "cuwarden simulated GPU") == 0);
  size_t total = 0;
  CHECK(cuDeviceTotalMem(&total, dev));
  EXPECT(total == (size_t{4} << 30));
  EXPECT(cuMemAlloc(&p, 16) == CUDA_ERROR_INVALID_CONTEXT);

  CUcontext ctx;
  CHECK(cuCtxCreate(&ctx, nullptr, 0, dev));
  CHECK(cuMemAlloc(&p, 1000));
  EXPECT(p % 512 == 0);
  std::vector<char> host(1000, 'x'), back(1000, 0);
  CHECK(cuMemcpyHtoD(p, host.data(), host.size()));
  CHECK(cuMemcpyDtoH(back.data(), p, back.size()));
  EXPECT(back == host);
  CUdeviceptr base = 0;
  size_t size = 0;
  CHECK(cuMemGetAddressRange(&base, &size, p + 10));
  EXPECT(base == p && size == 1000);
  unsigned int type = 0;
  CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p));
  EXPECT(type == CU_MEMORYTYPE_DEVICE);
  size_t free_mem = 0;
  CHECK(cuMemGetInfo(&free_mem, &total));
  EXPECT(total - free_mem == 1024);
  EXPECT(fakecuda_live_bytes(0) == 1024);
  CHECK(cuMemFree(p));
  EXPECT(cuMemFree(p) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuCtxDestroy(ctx));
  std::printf("fakecuda driver checks passed\n");
  return 0;
}
