// cuwarden daemon model: the checkpoint API by dlopen (see checkpoint_driver.hpp). Its
// argument structs are declared here from cuda.h's public ABI: the daemon builds without it.
#include "model/checkpoint_driver.hpp"

#include <dlfcn.h>

#include <cstdint>
#include <type_traits>

#include <fmt/format.h>

namespace cuw::daemon {

namespace {
struct LockArgs {  // CUcheckpointLockArgs
  unsigned timeout_ms;
  unsigned reserved0;
  uint64_t reserved1[7];
};
struct Reserved8 {  // CUcheckpointCheckpointArgs, CUcheckpointUnlockArgs
  uint64_t reserved[8];
};
struct RestoreArgs {  // CUcheckpointRestoreArgs
  void* gpu_pairs;
  unsigned gpu_pairs_count;
  char reserved[52 - sizeof(void*)];
  uint64_t reserved1;
};
static_assert(sizeof(LockArgs) == 64 && sizeof(Reserved8) == 64 && sizeof(RestoreArgs) == 64);
static_assert(sizeof(CheckpointDriver::GpuPair) == 32, "CUcheckpointGpuPair: two CUuuid");
constexpr int kCudaVersion = 12080;  // the API appeared in CUDA 12.8's driver (570)
}  // namespace

struct CheckpointDriver::Api {
  int (*get_proc)(const char*, void**, int, uint64_t, int*) = nullptr;  // cuGetProcAddress_v2
  int (*init)(unsigned) = nullptr;
  int (*error_name)(int, const char**) = nullptr;
  int (*lock)(int, LockArgs*) = nullptr;
  int (*checkpoint)(int, Reserved8*) = nullptr;
  int (*restore)(int, RestoreArgs*) = nullptr;
  int (*unlock)(int, Reserved8*) = nullptr;
  int (*state)(int, int*) = nullptr;
};

CheckpointDriver::CheckpointDriver(bool enabled, const std::string& path) {
  if (!enabled) {
    why_ = "the checkpoint API is off";
    return;
  }
  handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    why_ = fmt::format("no CUDA driver ({} did not load)", path);
    return;
  }
  api_ = new Api();
  api_->get_proc = reinterpret_cast<decltype(api_->get_proc)>(dlsym(handle_, "cuGetProcAddress_v2"));
  if (!api_->get_proc) {
    why_ = "the CUDA driver has no cuGetProcAddress_v2 (driver 570 or later is needed)";
    return;
  }
  auto resolve = [&](auto& fn, const char* name) {
    void* p = nullptr;
    int status = 0;
    if (api_->get_proc(name, &p, kCudaVersion, 0, &status) != 0 || !p) return false;
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    return true;
  };
  if (!resolve(api_->init, "cuInit")) {
    why_ = "the CUDA driver has no cuInit";
    return;
  }
  if (const int r = api_->init(0); r != 0) {
    why_ = fmt::format("cuInit failed ({})", r);
    return;
  }
  resolve(api_->error_name, "cuGetErrorName");
  if (!resolve(api_->lock, "cuCheckpointProcessLock") || !resolve(api_->checkpoint, "cuCheckpointProcessCheckpoint") ||
      !resolve(api_->restore, "cuCheckpointProcessRestore") || !resolve(api_->unlock, "cuCheckpointProcessUnlock") ||
      !resolve(api_->state, "cuCheckpointProcessGetState")) {
    why_ = "this CUDA driver has no checkpoint API (driver 570 or later is needed)";
    return;
  }
  ok_ = true;
}

CheckpointDriver::~CheckpointDriver() {
  delete api_;
  // The driver stays loaded: its threads may outlive an unload.
}

int CheckpointDriver::lock(uint32_t pid, uint32_t timeout_ms) {
  std::lock_guard lk(mu_);
  LockArgs a{};
  a.timeout_ms = timeout_ms;
  return api_->lock(static_cast<int>(pid), &a);
}

int CheckpointDriver::checkpoint(uint32_t pid) {
  std::lock_guard lk(mu_);
  Reserved8 a{};
  return api_->checkpoint(static_cast<int>(pid), &a);
}

int CheckpointDriver::restore(uint32_t pid, const std::vector<GpuPair>& pairs) {
  std::lock_guard lk(mu_);
  RestoreArgs a{};
  std::vector<GpuPair> copy(pairs);  // the driver's argument is not const
  if (!copy.empty()) {
    a.gpu_pairs = copy.data();
    a.gpu_pairs_count = static_cast<unsigned>(copy.size());
  }
  return api_->restore(static_cast<int>(pid), &a);
}

int CheckpointDriver::unlock(uint32_t pid) {
  std::lock_guard lk(mu_);
  Reserved8 a{};
  return api_->unlock(static_cast<int>(pid), &a);
}

CheckpointDriver::ProcState CheckpointDriver::state(uint32_t pid) {
  std::lock_guard lk(mu_);
  int s = -1;
  if (api_->state(static_cast<int>(pid), &s) != 0) return ProcState::unknown;
  return s >= 0 && s <= 3 ? static_cast<ProcState>(s) : ProcState::unknown;
}

std::string CheckpointDriver::error_text(int result) {
  const char* name = nullptr;
  if (api_ && api_->error_name && api_->error_name(result, &name) == 0 && name) return fmt::format("{} ({})", name, result);
  return fmt::format("CUresult {}", result);
}

}  // namespace cuw::daemon
