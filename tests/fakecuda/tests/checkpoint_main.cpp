// fakecuda checkpoint tests: Catch2 main. Gives this process (and the processes it starts) a
// directory of their own before the simulated driver first reads its environment: one device
// of 256 MiB that they share (CUWARDEN_FAKE_DIR), which nothing else on the machine uses.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "catch2_run.hpp"

int main(int argc, char** argv) {
  std::string dir = (std::filesystem::temp_directory_path() / "fakecuda-ckpt-XXXXXX").string();
  if (!mkdtemp(dir.data())) {
    std::perror("mkdtemp");
    return 1;
  }
  setenv("CUWARDEN_FAKE_DIR", dir.c_str(), 1);
  setenv("CUWARDEN_FAKE_DEVICES", "1", 1);
  setenv("CUWARDEN_FAKE_MEMORY", "256M", 1);
  unsetenv("CUWARDEN_FAKE_CONTEXT_MEMORY");
  unsetenv("CUWARDEN_FAKE_UUIDS");
  unsetenv("CUDA_VISIBLE_DEVICES");
  const int rc = cuw::testing::run_catch2(argc, argv);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return rc;
}
