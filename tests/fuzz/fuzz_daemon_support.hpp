// cuwarden fuzz support for the daemon's targets (they link cuwardend_core): a Registry on
// a scratch run directory holding one valid ring of this process, with its events drained.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "fuzz_support.hpp"
#include "model/registry.hpp"

namespace cuw::fuzz {

/// The registry the daemon targets answer from: one ring (64 slots, 40 events) named after
/// this process in scratch_dir(), scanned and drained. Aborts if the ring cannot be written.
inline std::unique_ptr<daemon::Registry> registry_with_one_ring() {
  const std::string& dir = scratch_dir();
  const auto pid = static_cast<uint32_t>(getpid());
  const uint64_t start = paths::process_start_time(pid);
  const auto img = make_ring(64, 40, pid, start);
  const std::string path = dir + "/" + paths::ring_file_name(pid, start);
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || write(fd, img.data(), img.size()) != static_cast<ssize_t>(img.size())) std::abort();
  close(fd);
  daemon::RegistryOptions o;
  o.run_dir = dir;
  auto reg = std::make_unique<daemon::Registry>(o, open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC), nullptr);
  reg->scan();
  reg->drain_all();
  return reg;
}

}  // namespace cuw::fuzz
