// fakecuda: modules and libraries — accepted and empty. The simulated device runs no kernels;
// the runtime still loads (lazily) the fat binaries a program registers, so loading succeeds
// and every symbol lookup in a loaded image answers CUDA_ERROR_NOT_FOUND.
#include "internal.hpp"

#include <set>

namespace {
struct Image {
  int unused = 0;
};
std::mutex g_images_mu;
auto& g_images = *new std::set<Image*>;  // never destroyed

void* new_image() {
  auto* i = new Image;
  std::lock_guard lock(g_images_mu);
  g_images.insert(i);
  return i;
}
CUresult drop_image(void* h) {
  auto* i = static_cast<Image*>(h);
  std::lock_guard lock(g_images_mu);
  if (!g_images.erase(i)) return CUDA_ERROR_INVALID_HANDLE;
  delete i;
  return CUDA_SUCCESS;
}
}  // namespace

using namespace fc;

FC_API CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode* mode) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!mode) return CUDA_ERROR_INVALID_VALUE;
  *mode = CU_MODULE_LAZY_LOADING;  // the default since CUDA 12.2
  return CUDA_SUCCESS;
}

namespace {
CUresult load(CUmodule* module, const void* image) {
  Context* ctx;
  if (CUresult rc = require_context(&ctx)) return rc;
  if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
  *module = static_cast<CUmodule>(new_image());
  return CUDA_SUCCESS;
}
}  // namespace

FC_API CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  FC_ENTER();
  return load(module, image);
}
FC_API CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int numOptions,
                                   CUjit_option* options, void** optionValues) {
  FC_ENTER();
  (void)numOptions;
  (void)options;
  (void)optionValues;
  return load(module, image);
}
FC_API CUresult cuModuleLoadFatBinary(CUmodule* module, const void* fatCubin) {
  FC_ENTER();
  return load(module, fatCubin);
}
FC_API CUresult cuModuleUnload(CUmodule hmod) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  return drop_image(hmod);
}
FC_API CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!hfunc || !hmod || !name) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_ERROR_NOT_FOUND;
}
FC_API CUresult cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option* jitOptions,
                                  void** jitOptionsValues, unsigned int numJitOptions,
                                  CUlibraryOption* libraryOptions, void** libraryOptionValues,
                                  unsigned int numLibraryOptions) {
  FC_ENTER();
  (void)jitOptions;
  (void)jitOptionsValues;
  (void)numJitOptions;
  (void)libraryOptions;
  (void)libraryOptionValues;
  (void)numLibraryOptions;
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!library || !code) return CUDA_ERROR_INVALID_VALUE;
  *library = static_cast<CUlibrary>(new_image());
  return CUDA_SUCCESS;
}
FC_API CUresult cuLibraryUnload(CUlibrary library) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  return drop_image(library);
}
FC_API CUresult cuLibraryGetKernel(CUkernel* pKernel, CUlibrary library, const char* name) {
  FC_ENTER();
  if (!pKernel || !library || !name) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_ERROR_NOT_FOUND;
}
