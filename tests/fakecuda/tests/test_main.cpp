// fakecuda unit tests: Catch2 main. Fixes the simulated machine before the driver first reads
// its environment: two devices of 64 MiB and 32 MiB, all visible.
#define CATCH_CONFIG_RUNNER
#include <cstdlib>

#include <catch2/catch.hpp>

int main(int argc, char** argv) {
  setenv("CUWARDEN_FAKE_DEVICES", "2", 1);
  setenv("CUWARDEN_FAKE_MEMORY", "64M,32M", 1);
  unsetenv("CUWARDEN_FAKE_UUIDS");
  unsetenv("CUDA_VISIBLE_DEVICES");
  return Catch::Session().run(argc, argv);
}
