// cuwarden fuzz target: a job file (cuw/job.hpp) as the daemon reads it: its members write it
// freely, so every byte is hostile. The input becomes job-<uid>-fuzz.cwj in a scratch job
// directory, and a fresh JobTable (model/jobs.hpp) takes the daemon's whole path through it:
// scan (stat checks, open, Segment::map_fd, sweep of dead members, view: cap(), members(),
// gpus(), used(), the policy applied to members), then set_limit and view again.
// Invariants: no read or write outside the mapping, no hang (every loop is bounded by
// kMaxMembers / kMaxGpus, whatever high_water says); what view() returns fits the file.
//
// Input: byte 0 = flags (bit 0: stamp the magic, so that the rest is explored; bit 1: keep
// the input's length instead of padding it to file_size(), to reach the size refusal; bit 2:
// give the scan a policy), then the file's bytes (zero-padded to file_size()).
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "cuw/job.hpp"
#include "fuzz_support.hpp"
#include "model/jobs.hpp"
#include "model/policy.hpp"

namespace cd = cuw::daemon;
namespace job = cuw::job;

namespace {

const cd::Policy& policy() {
  static const cd::Policy p = [] {
    std::vector<std::string> errors, warnings;
    auto r = cd::parse_policy("[default]\njob_limit = \"4G\"\nmax_job_limit = \"8G\"\n", "fuzz.toml", &errors, &warnings);
    if (!r) std::abort();
    return *r;
  }();
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > job::file_size() + 1) return 0;
  const uint8_t flags = data[0];
  std::vector<unsigned char> file(data + 1, data + size);
  if (!(flags & 2)) file.resize(job::file_size(), 0);
  if ((flags & 1) && file.size() >= sizeof(uint64_t)) {
    const uint64_t magic = job::kMagic;
    std::memcpy(file.data(), &magic, sizeof magic);
  }
  static const bool quiet = [] {
    spdlog::set_level(spdlog::level::off);  // a line per job found and ended: most of the time otherwise
    return true;
  }();
  (void)quiet;
  static const std::string dir = cuw::fuzz::scratch_dir();
  static const int dirfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0) std::abort();
  const uint32_t uid = static_cast<uint32_t>(getuid());
  const std::string name = job::file_name(uid, "fuzz");
  (void)unlinkat(dirfd, name.c_str(), 0);
  const int fd = openat(dirfd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();
  const bool written = file.empty() || write(fd, file.data(), file.size()) == static_cast<ssize_t>(file.size());
  close(fd);
  if (!written) std::abort();

  cd::JobTable table(4, 0, true);
  cd::JobTable::Dir d;
  d.fd = dirfd;
  d.uid = uid;
  d.names = {name};
  table.scan({d}, (flags & 4) ? &policy() : nullptr, 1'000'000'000);
  for (auto& [key, j] : table.jobs()) {
    cd::JobTable::View v;
    if (!table.view(j, &v)) continue;
    if (v.members.size() > job::kMaxMembers || v.gpus.size() > job::kMaxGpus || v.used.size() != v.gpus.size())
      std::abort();
    for (const auto& g : v.gpus)
      if (g.index < 0 || g.index >= static_cast<int>(job::kMaxGpus)) std::abort();
    if (table.set_limit(j, 1ull << 30, (flags & 8) != 0) < 0) std::abort();  // no fault: the file keeps its size
    if (!table.view(j, &v)) std::abort();
  }
  (void)table.problems();
  (void)unlinkat(dirfd, name.c_str(), 0);
  return 0;
}
