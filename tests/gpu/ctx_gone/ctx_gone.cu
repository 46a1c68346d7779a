// cuwarden GPU test: memory the driver frees with a context stops counting against the cap.
// Run under a 4 GiB cap (tests/gpu/ctx_gone.sh): holds 3 GiB, is refused 2 GiB more, then
// loses the 3 GiB with its context, three ways, and must get 3 GiB again each time:
//   reset    cudaMalloc, cudaDeviceReset (the primary context's reset)
//   destroy  cuCtxCreate, cuMemAlloc, cuCtxDestroy
//   release  cuDevicePrimaryCtxRetain, cuMemAlloc, cuDevicePrimaryCtxRelease (the last
//            reference; the runtime is not used in this process)
// and the same with CUDA arrays (handles, remembered with their context):
//   array_reset    cudaMallocArray (32768 x 6144 float4), cudaDeviceReset
//   array_destroy  cuCtxCreate, cuArray3DCreate (16384 x 16384 x 3 float), cuCtxDestroy
//   array_release  cuDevicePrimaryCtxRetain, cuArray3DCreate, the last release; then the
//                  primary made active again (the same handle and ID? "same_handle",
//                  "same_id": recorded, not judged) holds a new 3 GiB array that counts
//                  (2 GiB more refused)
// Prints one JSON line; exit 0 when every step answered as expected, 1 otherwise.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace {
constexpr size_t kGiB = 1ULL << 30;
std::string steps;
bool ok = true;
void step(const char* what, bool good) {
  steps += std::string(steps.empty() ? "" : ",") + "\"" + what + "\":" + (good ? "true" : "false");
  ok = ok && good;
}
/// A 3D array of `gib` layers of 16384 x 16384 floats: `gib` GiB.
CUDA_ARRAY3D_DESCRIPTOR float_layers(size_t gib) {
  CUDA_ARRAY3D_DESCRIPTOR d{};
  d.Width = 16384;
  d.Height = 16384;
  d.Depth = gib;
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 1;
  return d;
}
}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "reset") {
    void *a = nullptr, *b = nullptr;
    step("hold_3g", cudaMalloc(&a, 3 * kGiB) == cudaSuccess);
    step("refused_2g_more", cudaMalloc(&b, 2 * kGiB) == cudaErrorMemoryAllocation);
    cudaGetLastError();
    step("reset", cudaDeviceReset() == cudaSuccess);
    step("3g_again", cudaMalloc(&b, 3 * kGiB) == cudaSuccess);
    step("freed", cudaFree(b) == cudaSuccess);
  } else if (mode == "destroy" || mode == "release") {
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    CUdeviceptr a = 0, b = 0;
    step("init", cuInit(0) == CUDA_SUCCESS && cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
    if (mode == "destroy") {
      CUctxCreateParams* params = nullptr;
      step("create", cuCtxCreate(&ctx, params, 0, dev) == CUDA_SUCCESS);
    } else {
      step("retain", cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS && cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    }
    step("hold_3g", cuMemAlloc(&a, 3 * kGiB) == CUDA_SUCCESS);
    step("refused_2g_more", cuMemAlloc(&b, 2 * kGiB) == CUDA_ERROR_OUT_OF_MEMORY);
    if (mode == "destroy") {
      step("destroy", cuCtxDestroy(ctx) == CUDA_SUCCESS);
    } else {
      step("release", cuDevicePrimaryCtxRelease(dev) == CUDA_SUCCESS);
      unsigned flags = 0;
      int active = 1;
      step("inactive", cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS && !active);
    }
    step("retain_again", cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS && cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    step("3g_again", cuMemAlloc(&b, 3 * kGiB) == CUDA_SUCCESS);
    step("freed", cuMemFree(b) == CUDA_SUCCESS);
  } else if (mode == "array_reset") {
    const cudaChannelFormatDesc f4 = cudaCreateChannelDesc<float4>();
    cudaArray_t a = nullptr, b = nullptr;
    step("hold_3g", cudaMallocArray(&a, &f4, 32768, 6144) == cudaSuccess);  // 3 GiB
    step("refused_2g_more", cudaMallocArray(&b, &f4, 32768, 4096) == cudaErrorMemoryAllocation);
    cudaGetLastError();
    step("reset", cudaDeviceReset() == cudaSuccess);
    step("3g_again", cudaMallocArray(&b, &f4, 32768, 6144) == cudaSuccess);
    step("freed", cudaFreeArray(b) == cudaSuccess);
  } else if (mode == "array_destroy") {
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    CUarray a = nullptr, b = nullptr;
    const CUDA_ARRAY3D_DESCRIPTOR d = float_layers(3), more = float_layers(2);
    step("init", cuInit(0) == CUDA_SUCCESS && cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
    CUctxCreateParams* params = nullptr;
    step("create", cuCtxCreate(&ctx, params, 0, dev) == CUDA_SUCCESS);
    step("hold_3g", cuArray3DCreate(&a, &d) == CUDA_SUCCESS);
    step("refused_2g_more", cuArray3DCreate(&b, &more) == CUDA_ERROR_OUT_OF_MEMORY);
    step("destroy", cuCtxDestroy(ctx) == CUDA_SUCCESS);
    step("retain_again", cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS && cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    step("3g_again", cuArray3DCreate(&b, &d) == CUDA_SUCCESS);
    step("freed", cuArrayDestroy(b) == CUDA_SUCCESS);
  } else if (mode == "array_release") {
    CUdevice dev = 0;
    CUcontext ctx = nullptr, again = nullptr;
    CUarray a = nullptr, b = nullptr;
    const CUDA_ARRAY3D_DESCRIPTOR d = float_layers(3), more = float_layers(2);
    step("init", cuInit(0) == CUDA_SUCCESS && cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
    step("retain", cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS && cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    unsigned long long id_before = 0;
    if (cuCtxGetId(ctx, &id_before) != CUDA_SUCCESS) id_before = 0;
    step("hold_3g", cuArray3DCreate(&a, &d) == CUDA_SUCCESS);
    step("refused_2g_more", cuArray3DCreate(&b, &more) == CUDA_ERROR_OUT_OF_MEMORY);
    step("release", cuDevicePrimaryCtxRelease(dev) == CUDA_SUCCESS);
    unsigned flags = 0;
    int active = 1;
    step("inactive", cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS && !active);
    step("retain_again", cuDevicePrimaryCtxRetain(&again, dev) == CUDA_SUCCESS && cuCtxSetCurrent(again) == CUDA_SUCCESS);
    // Facts, not judged: whether the primary made active again has its old handle, and its old ID.
    steps += std::string(",\"same_handle\":") + (again == ctx ? "true" : "false");
    unsigned long long id_again = 0;
    if (cuCtxGetId(again, &id_again) == CUDA_SUCCESS && id_before != 0)
      steps += std::string(",\"same_id\":") + (id_again == id_before ? "true" : "false");
    step("3g_again", cuArray3DCreate(&b, &d) == CUDA_SUCCESS);
    CUarray c = nullptr;
    step("refused_2g_more_again", cuArray3DCreate(&c, &more) == CUDA_ERROR_OUT_OF_MEMORY);
    step("freed", cuArrayDestroy(b) == CUDA_SUCCESS);
  } else {
    std::fprintf(stderr, "usage: ctx_gone reset|destroy|release|array_reset|array_destroy|array_release\n");
    return 2;
  }
  std::printf("{\"mode\":\"%s\",%s,\"ok\":%s}\n", mode.c_str(), steps.c_str(), ok ? "true" : "false");
  return ok ? 0 : 1;
}
