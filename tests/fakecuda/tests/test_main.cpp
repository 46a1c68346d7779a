// fakecuda unit tests: Catch2 main. Fixes the simulated machine before the driver first reads
// its environment: two devices of 64 MiB and 32 MiB, all visible.
#include <cstdlib>

#include "catch2_run.hpp"

int main(int argc, char** argv) {
  setenv("CUWARDEN_FAKE_DEVICES", "2", 1);
  setenv("CUWARDEN_FAKE_MEMORY", "64M,32M", 1);
  unsetenv("CUWARDEN_FAKE_UUIDS");
  unsetenv("CUDA_VISIBLE_DEVICES");
  return cuw::testing::run_catch2(argc, argv);
}
