// cuwarden fuzz target: the policy file (model/policy.hpp) as the daemon loads it at start
// and on reload. Root writes it, but sites generate it from user-supplied tables, and a
// parser that crashes on one typo takes the daemon down: every byte is treated as hostile.
// The input is written to a file in a scratch directory and read by load_policy(), the
// daemon's path; what parses is then asked for the root user's policy (NSS lookups, the
// precedence user > group > default) and every value is resolved against a GPU size.
// Invariants: never throws, never crashes or hangs; a refusal always says why.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz_support.hpp"
#include "model/policy.hpp"

namespace cd = cuw::daemon;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1u << 16)) return 0;
  static const std::string path = cuw::fuzz::scratch_dir() + "/policy.toml";
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();
  const bool written = size == 0 || write(fd, data, size) == static_cast<ssize_t>(size);
  close(fd);
  if (!written) std::abort();
  std::vector<std::string> errors, warnings;
  const auto p = cd::load_policy(path, &errors, &warnings);
  if (!p) {
    if (errors.empty()) std::abort();  // a refusal always says why
    return 0;
  }
  if (!errors.empty()) std::abort();  // errors fail the load
  (void)p->empty();
  auto resolve_all = [](const cd::PolicyCaps& c, uint64_t total) {
    for (const auto* v : {&c.limit, &c.max_limit, &c.job_limit, &c.max_job_limit})
      if (*v) {
        (void)(*v)->resolve(total);
        (void)(*v)->str();
      }
  };
  resolve_all(p->defaults, 80ull << 30);
  for (const auto& [k, caps] : p->users) resolve_all(caps, 80ull << 30);
  for (const auto& [k, caps] : p->groups) resolve_all(caps, 1ull << 40);
  const cd::EffectivePolicy& e = p->for_user(0);
  for (const auto* v : {&e.limit, &e.max_limit, &e.job_limit, &e.max_job_limit})
    if (*v) (void)(*v)->resolve(0);
  return 0;
}
