// Unit tests: the options table (cuw/options.hpp) and the interposer's parsing of it
// (interposer/src/core/config.cpp): every default parses to what an unset variable means,
// every documented value is accepted, and refusals keep their wording. (A row without a
// binding does not compile: config.cpp's static_asserts.)
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "cuw/options.hpp"
#include "cuw/paths.hpp"
#include "cuw/size.hpp"

using cuw::core::Config;
using cuw::core::load_config;
namespace opt = cuw::options;

namespace {

void clear_all() {
  for (const opt::Option& o : opt::kOptions) ::unsetenv(o.variable);
}

/// load_config() with exactly these variables set; its notes into *notes when given.
Config config_with(const std::vector<std::pair<std::string, std::string>>& vars,
                   std::vector<std::string>* notes = nullptr) {
  clear_all();
  for (const auto& [name, value] : vars) ::setenv(name.c_str(), value.c_str(), 1);
  Config c = load_config(notes);
  clear_all();
  return c;
}

/// The `literal` values of a row's values column.
std::vector<std::string> literals(const std::string& values) {
  std::vector<std::string> out;
  for (size_t open = values.find('`'); open != std::string::npos; open = values.find('`', open + 1)) {
    const size_t close = values.find('`', open + 1);
    REQUIRE(close != std::string::npos);
    out.push_back(values.substr(open + 1, close - open - 1));
    open = close;
  }
  return out;
}

}  // namespace

TEST_CASE("options: each default set explicitly is what the unset variable means", "[options]") {
  const Config unset = config_with({});
  CHECK(unset.errors.empty());
  for (const opt::Option& o : opt::kOptions) {
    INFO(o.variable << "='" << o.default_value << "'");
    const Config given = config_with({{o.variable, o.default_value}});
    CHECK(given.errors.empty());
    CHECK(given == unset);
  }
}

TEST_CASE("options: the defaults reach Config as the table states them", "[options]") {
  const Config c = config_with({});
  CHECK(c.limits.empty());
  CHECK(c.job.empty());
  CHECK(c.job_limit == ~0ULL);
  CHECK_FALSE(c.fail_open);
  CHECK_FALSE(c.meminfo_physical);
  CHECK_FALSE(c.cap_scope_process);
  CHECK(c.pool == cuw::core::PoolKind::off);
  CHECK(c.pool_keep.percent);
  CHECK(c.pool_keep.share == 0.05);
  CHECK(c.pool_idle_ms == 10000);
  CHECK(c.callsites == 0);
  CHECK(c.clock == cuw::fast_clock::Mode::coarse);
  CHECK(c.log_level == 3);  // warn
  CHECK(c.log_file.empty());
  CHECK(c.run_dir == "/dev/shm/cuwarden");
}

TEST_CASE("options: every value the table documents is accepted", "[options]") {
  size_t checked = 0;
  for (const opt::Option& o : opt::kOptions) {
    // A job's cap needs the job.
    std::vector<std::pair<std::string, std::string>> base;
    if (std::string(o.variable) == "CUWARDEN_JOB_LIMIT") base.emplace_back("CUWARDEN_JOB", "t");
    const Config without = config_with(base);
    for (const std::string& value : literals(o.values)) {
      INFO(o.variable << "='" << value << "'");
      auto vars = base;
      vars.emplace_back(o.variable, value);
      const Config c = config_with(vars);
      CHECK(c.errors.empty());
      // It changed something (CUWARDEN_CONFIG=off changes what is read, not a field).
      if (value != o.default_value && std::string(o.variable) != "CUWARDEN_CONFIG") CHECK_FALSE(c == without);
      ++checked;
    }
  }
  CHECK(checked >= 20);
}

TEST_CASE("options: refused values keep their messages word for word", "[options]") {
  struct Case {
    std::vector<std::pair<std::string, std::string>> vars;
    std::string error;
  };
  const std::vector<Case> cases = {
      {{{"CUWARDEN_ON_ERROR", "maybe"}}, "CUWARDEN_ON_ERROR='maybe': expected 'fail' or 'open'"},
      {{{"CUWARDEN_ON_ERROR", " open"}}, "CUWARDEN_ON_ERROR=' open': expected 'fail' or 'open'"},
      {{{"CUWARDEN_LIMIT", "8X"}},
       "CUWARDEN_LIMIT='8X': unknown unit 'X' in size '8X' (use bytes, K M G T, KiB MiB GiB TiB, kB MB GB TB, or N%)"},
      {{{"CUWARDEN_LIMIT", "0=1G,0=2G"}}, "CUWARDEN_LIMIT='0=1G,0=2G': device 0 given twice in '0=1G,0=2G'"},
      {{{"CUWARDEN_LIMIT", "100"}},
       "CUWARDEN_LIMIT='100': a cap of 100 B ('100') is smaller than any real allocation: give a unit (100G, 100MiB) "
       "or a share (100%); the smallest cap is 1 MiB"},
      {{{"CUWARDEN_JOB", "a/b"}}, "CUWARDEN_JOB='a/b': job names may only hold letters, digits, '.', '_' and '-'"},
      {{{"CUWARDEN_JOB", ".x"}}, "CUWARDEN_JOB='.x': job name starts with '.'"},
      {{{"CUWARDEN_JOB_LIMIT", "1G"}}, "CUWARDEN_JOB_LIMIT='1G': needs CUWARDEN_JOB (the job it caps)"},
      {{{"CUWARDEN_JOB", "t"}, {"CUWARDEN_JOB_LIMIT", "50%"}},
       "CUWARDEN_JOB_LIMIT='50%': job caps take a size (bytes, K/M/G/T), not a share of a device"},
      {{{"CUWARDEN_JOB", "t"}, {"CUWARDEN_JOB_LIMIT", "8X"}},
       "CUWARDEN_JOB_LIMIT='8X': unknown unit 'X' in size '8X' (use bytes, K M G T, KiB MiB GiB TiB, kB MB GB TB)"},
      {{{"CUWARDEN_POOL_KEEP", "5X"}},
       "CUWARDEN_POOL_KEEP='5X': unknown unit 'X' in size '5X' (use bytes, K M G T, KiB MiB GiB TiB, kB MB GB TB, or "
       "N%)"},
      {{{"CUWARDEN_POOL", "fast"}}, "CUWARDEN_POOL='fast': expected off, cache or vmm"},
      {{{"CUWARDEN_POOL_IDLE", "10"}},
       "CUWARDEN_POOL_IDLE='10': expected a duration such as 10s, 500ms or 0 (units ms, s, m)"},
      {{{"CUWARDEN_POOL_IDLE", "-5s"}}, "CUWARDEN_POOL_IDLE='-5s': expected a duration such as 10s, 500ms or 0"},
      {{{"CUWARDEN_POOL_IDLE", "2000m"}}, "CUWARDEN_POOL_IDLE='2000m': at most a day (24h = 1440m)"},
      {{{"CUWARDEN_CALLSITES", "65"}}, "CUWARDEN_CALLSITES='65': expected 0..64"},
      {{{"CUWARDEN_CALLSITES", "-1"}}, "CUWARDEN_CALLSITES='-1': expected 0..64"},
      {{{"CUWARDEN_CALLSITES", "1x"}}, "CUWARDEN_CALLSITES='1x': expected 0..64"},
      {{{"CUWARDEN_CAP_SCOPE", "context"}}, "CUWARDEN_CAP_SCOPE='context': expected 'allocations' or 'process'"},
      {{{"CUWARDEN_MEMINFO", "both"}}, "CUWARDEN_MEMINFO='both': expected 'limit' or 'physical'"},
      {{{"CUWARDEN_CLOCK", "tsc"}}, "CUWARDEN_CLOCK='tsc': expected 'coarse', 'fine' or 'syscall'"},
      {{{"CUWARDEN_LOG", "loud"}}, "CUWARDEN_LOG='loud': expected trace, debug, info, warn, error or off"},
  };
  for (const Case& c : cases) {
    INFO(c.error);
    const Config got = config_with(c.vars);
    REQUIRE(got.errors.size() == 1);
    CHECK(got.errors[0] == c.error);
  }
}

TEST_CASE("options: values accepted beyond the documented ones", "[options]") {
  CHECK(config_with({{"CUWARDEN_CLOCK", "auto"}}).clock == cuw::fast_clock::Mode::fine);  // fine's former name
  CHECK(config_with({{"CUWARDEN_LOG", "critical"}}).log_level == 5);
  CHECK(config_with({{"CUWARDEN_CALLSITES", " 7"}}).callsites == 7);  // strtol's leading blanks and sign
  CHECK(config_with({{"CUWARDEN_CALLSITES", "+7"}}).callsites == 7);
  CHECK(config_with({{"CUWARDEN_RUN_DIR", "/tmp/run//"}}).run_dir == "/tmp/run");
  CHECK(config_with({{"CUWARDEN_RUN_DIR", "/"}}).run_dir == "/");
  // An empty variable is an unset one.
  CHECK(config_with({{"CUWARDEN_POOL", ""}}) == config_with({}));
}

TEST_CASE("options: several refusals come in table order and leave the defaults", "[options]") {
  const Config c = config_with({{"CUWARDEN_LOG", "loud"},
                                {"CUWARDEN_POOL", "fast"},
                                {"CUWARDEN_ON_ERROR", "maybe"},
                                {"CUWARDEN_CALLSITES", "99"},
                                {"CUWARDEN_CLOCK", "tsc"},
                                {"CUWARDEN_JOB_LIMIT", "2G"}});
  REQUIRE(c.errors.size() == 6);
  CHECK(c.errors[0].rfind("CUWARDEN_ON_ERROR=", 0) == 0);
  CHECK(c.errors[1].rfind("CUWARDEN_JOB_LIMIT=", 0) == 0);
  CHECK(c.errors[2].rfind("CUWARDEN_POOL=", 0) == 0);
  CHECK(c.errors[3].rfind("CUWARDEN_CALLSITES=", 0) == 0);
  CHECK(c.errors[4].rfind("CUWARDEN_CLOCK=", 0) == 0);
  CHECK(c.errors[5].rfind("CUWARDEN_LOG=", 0) == 0);
  Config expected = config_with({});
  expected.errors = c.errors;
  expected.job_limit = 2ULL << 30;  // kept: the missing job is the error
  CHECK(c == expected);
}

TEST_CASE("options: the rows name distinct variables and flags", "[options]") {
  std::set<std::string> variables, flags;
  for (const opt::Option& o : opt::kOptions) {
    CHECK(variables.insert(o.variable).second);
    if (*o.flag) CHECK(flags.insert(o.flag).second);
  }
  CHECK(opt::get(opt::Id::CUWARDEN_LIMIT).variable == std::string("CUWARDEN_LIMIT"));
  CHECK(opt::get(opt::Id::CUWARDEN_RUN_DIR).variable == std::string("CUWARDEN_RUN_DIR"));
}

TEST_CASE("options: pool budgets take sizes, shares and durations", "[options]") {
  const Config a = config_with({{"CUWARDEN_POOL_KEEP", "256M"}, {"CUWARDEN_POOL_IDLE", "500ms"}});
  CHECK(a.errors.empty());
  CHECK_FALSE(a.pool_keep.percent);
  CHECK(a.pool_keep.bytes == 256ULL << 20);
  CHECK(a.pool_idle_ms == 500);
  const Config b = config_with({{"CUWARDEN_POOL_KEEP", "0"}, {"CUWARDEN_POOL_IDLE", "0"}, {"CUWARDEN_POOL", "vmm"}});
  CHECK(b.errors.empty());
  CHECK(b.pool_keep.bytes == 0);
  CHECK(b.pool_idle_ms == 0);
  CHECK(b.pool == cuw::core::PoolKind::vmm);
  CHECK(config_with({{"CUWARDEN_POOL_IDLE", "2m"}}).pool_idle_ms == 120000);
}

namespace {

/// A file holding `text` in a fresh temporary directory; its path.
std::string write_temp(const std::string& text) {
  char tmpl[] = "/tmp/cuw-conf-XXXXXX";
  REQUIRE(::mkdtemp(tmpl));
  const std::string path = std::string(tmpl) + "/process.conf";
  std::FILE* f = std::fopen(path.c_str(), "w");
  REQUIRE(f);
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
  return path;
}

}  // namespace

TEST_CASE("config file: lines and comments and quotes and blanks", "[options][config_file]") {
  std::vector<std::string> errors;
  const auto f = cuw::core::parse_config_text(
      "# a comment\n\n  CUWARDEN_LIMIT = 8G  \r\nCUWARDEN_JOB=\"train\"\nCUWARDEN_LOG='info'\n   # indented\n",
      &errors);
  CHECK(errors.empty());
  CHECK(f.value[static_cast<size_t>(opt::Id::CUWARDEN_LIMIT)] == "8G");
  CHECK(f.line[static_cast<size_t>(opt::Id::CUWARDEN_LIMIT)] == 3);
  CHECK(f.value[static_cast<size_t>(opt::Id::CUWARDEN_JOB)] == "train");
  CHECK(f.value[static_cast<size_t>(opt::Id::CUWARDEN_LOG)] == "info");
  CHECK(f.line[static_cast<size_t>(opt::Id::CUWARDEN_POOL)] == 0);
  // No final newline, an empty text.
  CHECK(cuw::core::parse_config_text("CUWARDEN_POOL=vmm", &errors).value[static_cast<size_t>(opt::Id::CUWARDEN_POOL)] ==
        "vmm");
  CHECK(cuw::core::parse_config_text("", &errors).line[0] == 0);
  CHECK(errors.empty());
}

TEST_CASE("config file: malformed lines keep their messages word for word", "[options][config_file]") {
  std::vector<std::string> errors;
  using namespace std::string_literals;
  cuw::core::parse_config_text(
      "CUWARDEN_LIMIT\nLIMIT=8G\nCUWARDEN_CONFIG=/x\nCUWARDEN_LIMIT=1G\nCUWARDEN_LIMIT=2G\nCUWARDEN_JOB=a\0b\n"s,
      &errors);
  REQUIRE(errors.size() == 5);
  CHECK(errors[0] == "line 1: expected CUWARDEN_NAME=value");
  CHECK(errors[1] == "line 2: 'LIMIT' is not a CUWARDEN_ variable");
  CHECK(errors[2] == "line 3: CUWARDEN_CONFIG names the file; it cannot be set inside it");
  CHECK(errors[3] == "line 5: CUWARDEN_LIMIT is already set on line 4");
  CHECK(errors[4] == "line 6: holds a NUL byte");
}

TEST_CASE("config file: fills what the environment leaves unset, and a lower cap is the environment's",
          "[options][config_file]") {
  const std::string path =
      write_temp("CUWARDEN_LIMIT=64M\nCUWARDEN_JOB=from-file\nCUWARDEN_JOB_LIMIT=1G\nCUWARDEN_POOL=cache\n");
  const Config file_only = config_with({{"CUWARDEN_CONFIG", path}});
  CHECK(file_only.errors.empty());
  REQUIRE(file_only.limits.size() == 1);
  REQUIRE(file_only.limits[0].all);
  CHECK(file_only.limits[0].all->bytes == 64ULL << 20);
  CHECK(file_only.job == "from-file");
  CHECK(file_only.job_limit == 1ULL << 30);
  CHECK(file_only.pool == cuw::core::PoolKind::cache);

  std::vector<std::string> notes;
  const Config both =
      config_with({{"CUWARDEN_CONFIG", path}, {"CUWARDEN_LIMIT", "32M"}, {"CUWARDEN_POOL", "off"}}, &notes);
  CHECK(both.errors.empty());
  CHECK(notes.empty());
  CHECK(cuw::lowest_cap(both.limits, 0, 0) == 32ULL << 20);  // a lower cap is the environment's to give
  CHECK(both.pool == cuw::core::PoolKind::off);
  CHECK(both.job == "from-file");  // not in the environment: the file's

  // A job cap from the environment for a job named in the file.
  const std::string job_only = write_temp("CUWARDEN_JOB=j\n");
  const Config mixed = config_with({{"CUWARDEN_CONFIG", job_only}, {"CUWARDEN_JOB_LIMIT", "2G"}});
  CHECK(mixed.errors.empty());
  CHECK(mixed.job_limit == 2ULL << 30);

  // `off` reads nothing; the default path, missing, is no error (this test's machine has none).
  CHECK(config_with({{"CUWARDEN_CONFIG", "off"}}) == config_with({}));
}

TEST_CASE("config file: its caps are ceilings the environment may only lower", "[options][config_file]") {
  const std::string path = write_temp(
      "CUWARDEN_LIMIT=64M\nCUWARDEN_JOB=j\nCUWARDEN_JOB_LIMIT=1G\nCUWARDEN_CAP_SCOPE=process\nCUWARDEN_ON_ERROR=fail\n");
  // A raise of each is refused, said once naming the site's value, and the site's applies.
  std::vector<std::string> notes;
  const Config raised = config_with({{"CUWARDEN_CONFIG", path},
                                     {"CUWARDEN_LIMIT", "8G"},
                                     {"CUWARDEN_JOB_LIMIT", "64G"},
                                     {"CUWARDEN_CAP_SCOPE", "allocations"},
                                     {"CUWARDEN_ON_ERROR", "open"}},
                                    &notes);
  CHECK(raised.errors.empty());
  CHECK(cuw::lowest_cap(raised.limits, 0, 0) == 64ULL << 20);
  CHECK(cuw::lowest_cap(raised.limits, 3, 0) == 64ULL << 20);
  CHECK(raised.job_limit == 1ULL << 30);
  CHECK(raised.cap_scope_process);
  CHECK_FALSE(raised.fail_open);
  REQUIRE(notes.size() == 4);
  CHECK(notes[0] == "CUWARDEN_ON_ERROR='open' is refused: " + path +
                               " line 5 sets 'fail', which the environment may make stricter, never looser; "
                               "'fail' applies");
  CHECK(notes[1] == "CUWARDEN_LIMIT='8G' is refused: " + path +
                               " line 1 sets '64M', a ceiling the environment may only lower; the lower applies");
  CHECK(notes[2].rfind("CUWARDEN_JOB_LIMIT='64G' is refused: " + path + " line 3 sets '1G'", 0) == 0);
  CHECK(notes[3].rfind("CUWARDEN_CAP_SCOPE='allocations' is refused: " + path + " line 4", 0) == 0);

  // Lower (or as strict) is the environment's to choose, and says nothing; per device too.
  const Config lowered =
      config_with({{"CUWARDEN_CONFIG", path}, {"CUWARDEN_LIMIT", "0=16M"}, {"CUWARDEN_JOB_LIMIT", "512M"}}, &notes);
  CHECK(lowered.errors.empty());
  CHECK(notes.empty());
  CHECK(cuw::lowest_cap(lowered.limits, 0, 0) == 16ULL << 20);
  CHECK(cuw::lowest_cap(lowered.limits, 1, 0) == 64ULL << 20);  // the site's, where the environment said nothing
  CHECK(lowered.job_limit == 512ULL << 20);
  // A raise on one device of several is one.
  const Config per_device = config_with({{"CUWARDEN_CONFIG", path}, {"CUWARDEN_LIMIT", "0=16M,1=1G"}}, &notes);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].rfind("CUWARDEN_LIMIT='0=16M,1=1G' is refused", 0) == 0);
  CHECK(cuw::lowest_cap(per_device.limits, 1, 0) == 64ULL << 20);

  // A bad site value under a good environment value is still the site's error.
  const std::string bad = write_temp("CUWARDEN_LIMIT=lots\n");
  const Config c = config_with({{"CUWARDEN_CONFIG", bad}, {"CUWARDEN_LIMIT", "1G"}});
  REQUIRE(c.errors.size() == 1);
  CHECK(c.errors[0].rfind("CUWARDEN_LIMIT='lots' (" + bad + " line 1): ", 0) == 0);
}

TEST_CASE("config file: a bad file is one clear line each", "[options][config_file]") {
  const std::string missing = "/tmp/cuw-no-such-dir/process.conf";
  Config c = config_with({{"CUWARDEN_CONFIG", missing}});
  REQUIRE(c.errors.size() == 1);
  CHECK(c.errors[0] == "CUWARDEN_CONFIG='" + missing + "': cannot open: No such file or directory");

  c = config_with({{"CUWARDEN_CONFIG", "/tmp"}});
  REQUIRE(c.errors.size() == 1);
  CHECK(c.errors[0] == "CUWARDEN_CONFIG='/tmp': not a regular file");

  const std::string big = write_temp(std::string(cuw::core::kMaxConfigFile + 1, '#'));
  c = config_with({{"CUWARDEN_CONFIG", big}});
  REQUIRE(c.errors.size() == 1);
  CHECK(c.errors[0] == "CUWARDEN_CONFIG='" + big + "': larger than 64 KiB");

  const std::string bad = write_temp("CUWARDEN_LIMIT=lots\nCUWARDEN_POOL fast\n");
  c = config_with({{"CUWARDEN_CONFIG", bad}});
  REQUIRE(c.errors.size() == 2);
  CHECK(c.errors[0] == "CUWARDEN_CONFIG='" + bad + "': line 2: expected CUWARDEN_NAME=value");
  CHECK(c.errors[1].rfind("CUWARDEN_LIMIT='lots' (" + bad + " line 1): ", 0) == 0);
  CHECK(c.limits.empty());

  // A bad value in the file is no error when the environment sets the variable, unless it is
  // a ceiling (a cap the site gives cannot hold unread).
  CHECK(config_with({{"CUWARDEN_CONFIG", bad}, {"CUWARDEN_LIMIT", "1G"}}).errors.size() == 2);
  const std::string bad_pool = write_temp("CUWARDEN_POOL=fast\n");
  CHECK(config_with({{"CUWARDEN_CONFIG", bad_pool}, {"CUWARDEN_POOL", "cache"}}).errors.empty());
}
