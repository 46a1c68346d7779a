// fakenvml unit tests: Catch2 main. Fixes the simulated machine before the driver first reads
// its environment: three physical devices of 64, 32 and 16 MiB, the second with a UUID of its
// own, and CUDA_VISIBLE_DEVICES=2,0 (CUDA ordinal 0 = physical 2, ordinal 1 = physical 0,
// physical 1 hidden from CUDA but not from NVML).
#include <cstdlib>

#include "catch2_run.hpp"

int main(int argc, char** argv) {
  setenv("CUWARDEN_FAKE_DEVICES", "3", 1);
  setenv("CUWARDEN_FAKE_MEMORY", "64M,32M,16M", 1);
  setenv("CUWARDEN_FAKE_UUIDS", ",GPU-12345678-9abc-def0-1234-56789abcdef0", 1);
  setenv("CUWARDEN_FAKE_NAME", "NVIDIA H200", 1);
  setenv("CUDA_VISIBLE_DEVICES", "2,0", 1);
  unsetenv("CUWARDEN_FAKE_DRIVER_VERSION");
  return cuw::testing::run_catch2(argc, argv);
}
