// cuwarden fuzz target: the interposer's environment parsing (interposer/src/core/config.cpp,
// compiled in). The input is split at NUL bytes into the values of the CUWARDEN_*
// variables, in the order of the options table (cuw/options.hpp); an empty piece unsets the
// variable.
// The whole input is also parsed as a config file's text (CUWARDEN_CONFIG).
// Invariants: load_config() and parse_config_text() never crash or throw; every accepted value
// is in range; a value kept from the file came from a line the text has.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/config.hpp"
#include "cuw/job.hpp"
#include "cuw/options.hpp"

extern char** environ;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  // The environment is this input's variables only, in arrays the harness owns: setenv()
  // keeps every value it was ever given (getenv's pointers must stay valid), which grew a
  // 30-minute run past 2 GB.
  static std::vector<std::string> vars;
  static std::vector<char*> env;
  vars.clear();
  size_t pos = 0;
  for (const cuw::options::Option& o : cuw::options::kOptions) {
    size_t end = in.find('\0', pos);
    if (end == std::string::npos) end = in.size();
    const std::string value = pos < in.size() ? in.substr(pos, end - pos) : std::string();
    if (!value.empty()) vars.push_back(std::string(o.variable) + "=" + value);
    pos = end + 1;
  }
  env.clear();
  for (std::string& v : vars) env.push_back(v.data());
  env.push_back(nullptr);
  environ = env.data();
  const cuw::core::Config c = cuw::core::load_config();
  if (c.run_dir.empty()) std::abort();  // an unset variable takes the table's default
  if (c.callsites < 0 || c.callsites > 64) std::abort();
  if (c.log_level < 0 || c.log_level > 6) std::abort();
  if (c.job.size() > 63 && c.errors.empty()) std::abort();
  if (!cuw::options::is_literal(cuw::options::Id::CUWARDEN_POOL, cuw::core::pool_name(c.pool))) std::abort();  // a backend of the table
  if (c.pool_idle_ms > 86400000u) std::abort();  // at most a day
  if (!c.job.empty() && !cuw::job::valid_job_name(c.job, nullptr)) std::abort();  // a kept job name is valid
  if (c.job_limit != ~0ULL && c.job.empty() && c.errors.empty()) std::abort();  // a job cap needs a job
  for (const auto& l : c.limits)
    for (const auto& [ordinal, spec] : l.per_device)
      if (ordinal < 0 || ordinal > 63) std::abort();
  std::vector<std::string> errors;
  const cuw::core::FileValues f = cuw::core::parse_config_text(in, &errors);
  if (f.value.size() != cuw::options::kCount || f.line.size() != cuw::options::kCount) std::abort();
  for (std::size_t i = 0; i < cuw::options::kCount; ++i) {
    if (f.line[i] < 0 || (f.line[i] == 0 && !f.value[i].empty())) std::abort();
    if (f.value[i].find('\n') != std::string::npos || f.value[i].size() > in.size()) std::abort();
  }
  return 0;
}
