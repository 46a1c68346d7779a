// cuwarden integration tests for `cuwarden run --tensors` (and CUWARDEN_TENSORS): each
// framework's switch of the table (cuw/tensors.hpp) reaches the program, a value the user set
// is kept, the pool is chosen, what the mode changes is said once, PyTorch's variable at a
// value other than 1 is warned about, and a bad CUWARDEN_TENSORS runs nothing.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "cuw/tensors.hpp"
#include "daemon_test_support.hpp"

using namespace cuwt;

namespace {

bool has_text(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

size_t occurrences(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size())) ++n;
  return n;
}

/// The variables the mode reads or sets: unset for every run here unless `env` sets them,
/// whatever the environment the tests run in holds.
std::vector<std::string> cleared() {
  std::vector<std::string> v = {"CUWARDEN_TENSORS", "CUWARDEN_POOL", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"};
  for (const cuw::tensors::Switch& s : cuw::tensors::kSwitches) v.push_back(s.variable);
  return v;
}

/// `cuwarden run --lib <empty library> ARGS -- /bin/sh -c SCRIPT` in a clean environment
/// plus `env` ("NAME=value" each).
CmdResult run_tensors(const std::vector<std::string>& args, const std::string& script,
                      const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv = {"/usr/bin/env"};
  for (const std::string& v : cleared()) argv.insert(argv.end(), {"-u", v});
  argv.insert(argv.end(), env.begin(), env.end());
  argv.insert(argv.end(), {CUWT_CLI, "run", "--lib", CUWT_PRELOAD});
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"--", "/bin/sh", "-c", script});
  return run_cmd(argv, {}, 10000);
}

/// What the program sees: one NAME=value (or NAME unset) per line, for every variable the
/// mode may set.
std::string show_script() {
  std::string s;
  for (const std::string& v : cleared())
    s += "if [ -n \"${" + v + "+x}\" ]; then echo " + v + "=\"$" + v + "\"; else echo " + v + " unset; fi; ";
  return s;
}

constexpr const char* kOomLine = "not torch.cuda.OutOfMemoryError";

}  // namespace

TEST_CASE("cli.run_tensors_sets_each_frameworks_switch_and_the_pool") {
  for (const bool by_flag : {true, false}) {
    CmdResult r = by_flag ? run_tensors({"--tensors"}, show_script()) : run_tensors({}, show_script(), {"CUWARDEN_TENSORS=1"});
    const std::string label = by_flag ? "--tensors" : "CUWARDEN_TENSORS=1";
    INFO(label << "\nstdout: " << r.out << "\nstderr: " << r.err);
    REQUIRE(r.status == 0);
    for (const cuw::tensors::Switch& s : cuw::tensors::kSwitches) {
      CHECK(has_text(r.out, std::string(s.variable) + "=" + s.value + "\n"));
      CHECK(occurrences(r.err, "cuwarden run: " + label + " sets " + s.variable + "=" + s.value + " for " +
                                   s.framework + ": ") == 1);
    }
    CHECK(has_text(r.out, std::string("CUWARDEN_POOL=") + cuw::tensors::kPool + "\n"));
    CHECK(has_text(r.out, "CUWARDEN_TENSORS=1\n"));
    CHECK(has_text(r.err, "cuwarden run: " + label + " sets CUWARDEN_POOL=" + cuw::tensors::kPool + " (the pool serves every tensor"));
    // What the mode changes, said once, each thing on its own line, before the program's output.
    CHECK(occurrences(r.err, kOomLine) == 1);
    CHECK(occurrences(r.err, "PyTorch neither frees a cache nor retries") == 1);
    CHECK(occurrences(r.err, "torch.cuda.memory_stats()") == 1);
    CHECK(occurrences(r.err, "'invalid device pointer'") == 1);
    CHECK(occurrences(r.err, "CUDA graph capture") == 1);
    CHECK(occurrences(r.err, "compute-sanitizer") == 1);
    for (size_t at = 0, end; at < r.err.size(); at = end + 1) {
      end = r.err.find('\n', at);
      REQUIRE(end != std::string::npos);  // every line ends
      CHECK(r.err.compare(at, 14, "cuwarden run: ") == 0);
    }
    // No warning about PyTorch's variable: the mode set it to 1.
    CHECK(!has_text(r.err, "PyTorch 2.6 and older"));
  }
}

TEST_CASE("cli.run_tensors_keeps_what_the_user_set") {
  // A framework's variable: kept, and said.
  CmdResult r = run_tensors({"--tensors"}, show_script(), {"XLA_PYTHON_CLIENT_ALLOCATOR=bfc", "TF_GPU_ALLOCATOR=cuda_malloc"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(has_text(r.out, "XLA_PYTHON_CLIENT_ALLOCATOR=bfc\n"));
  CHECK(has_text(r.err, "--tensors keeps XLA_PYTHON_CLIENT_ALLOCATOR='bfc' the environment sets, not platform (JAX)"));
  CHECK(has_text(r.err, "--tensors keeps TF_GPU_ALLOCATOR=cuda_malloc, already set, for TensorFlow"));
  CHECK(!has_text(r.err, "sets XLA_PYTHON_CLIENT_ALLOCATOR"));
  CHECK(has_text(r.out, "PYTORCH_NO_CUDA_MEMORY_CACHING=1\n"));  // the others still set
  // The pool: --pool, then CUWARDEN_POOL, then the mode's.
  r = run_tensors({"--tensors", "--pool", "vmm"}, show_script());
  CHECK(has_text(r.out, "CUWARDEN_POOL=vmm\n"));
  CHECK(has_text(r.err, "--tensors uses the pool --pool vmm chose"));
  r = run_tensors({"--tensors"}, show_script(), {"CUWARDEN_POOL=vmm"});
  CHECK(has_text(r.out, "CUWARDEN_POOL=vmm\n"));
  CHECK(has_text(r.err, "--tensors keeps CUWARDEN_POOL=vmm the environment sets"));
  r = run_tensors({"--tensors"}, show_script(), {"CUWARDEN_POOL=off"});
  CHECK(has_text(r.out, "CUWARDEN_POOL=off\n"));
  CHECK(has_text(r.err, "every tensor is a driver allocation and free"));
  // PyTorch's cudaMallocAsync backend does not read the switch: said.
  r = run_tensors({"--tensors"}, "true", {"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False,backend:cudaMallocAsync"});
  CHECK(r.status == 0);
  CHECK(has_text(r.err, "PYTORCH_CUDA_ALLOC_CONF chooses PyTorch's cudaMallocAsync backend, which ignores "
                        "PYTORCH_NO_CUDA_MEMORY_CACHING"));
}

TEST_CASE("cli.run_warns_of_pytorch_no_caching_at_a_value_other_than_1") {
  // With or without the mode: "0" turns the cache off in PyTorch 2.6 and older, keeps it in 2.7.
  for (const std::string value : {"0", "", "false", "yes"}) {
    CmdResult r = run_tensors({}, show_script(), {"PYTORCH_NO_CUDA_MEMORY_CACHING=" + value});
    INFO("'" << value << "': " << r.err);
    CHECK(r.status == 0);
    CHECK(has_text(r.out, "PYTORCH_NO_CUDA_MEMORY_CACHING=" + value + "\n"));  // never changed
    CHECK(occurrences(r.err, "cuwarden run: PYTORCH_NO_CUDA_MEMORY_CACHING='" + value +
                                 "' is in the environment: PyTorch 2.6 and older turn their memory cache off for "
                                 "any value, 0 and empty too; 2.7 and later only for 1") == 1);
    CHECK(!has_text(r.err, kOomLine));  // the mode is off: nothing else is said
    r = run_tensors({"--tensors"}, show_script(), {"PYTORCH_NO_CUDA_MEMORY_CACHING=" + value});
    CHECK(has_text(r.out, "PYTORCH_NO_CUDA_MEMORY_CACHING=" + value + "\n"));
    CHECK(has_text(r.err, "--tensors keeps PYTORCH_NO_CUDA_MEMORY_CACHING='" + value + "' the environment sets, not 1"));
    CHECK(occurrences(r.err, "PyTorch 2.6 and older") == 1);
  }
  CmdResult one = run_tensors({}, "true", {"PYTORCH_NO_CUDA_MEMORY_CACHING=1"});
  CHECK(one.status == 0);
  CHECK(one.err.empty());
}

TEST_CASE("cli.run_tensors_off_sets_nothing") {
  for (const std::vector<std::string>& env :
       {std::vector<std::string>{}, {"CUWARDEN_TENSORS=0"}, {"CUWARDEN_TENSORS="}}) {
    CmdResult r = run_tensors({}, show_script(), env);
    INFO((env.empty() ? "unset" : env[0]) << ": " << r.out << r.err);
    CHECK(r.status == 0);
    for (const cuw::tensors::Switch& s : cuw::tensors::kSwitches) CHECK(has_text(r.out, std::string(s.variable) + " unset\n"));
    CHECK(has_text(r.out, "CUWARDEN_POOL unset\n"));
    CHECK(r.err.empty());
  }
}

TEST_CASE("cli.run_refuses_a_bad_cuwarden_tensors_and_runs_nothing") {
  for (const std::string bad : {"yes", "2", "true", " 1", "on"}) {
    for (const bool flag : {false, true}) {
      CmdResult r = run_tensors(flag ? std::vector<std::string>{"--tensors"} : std::vector<std::string>{},
                                "echo RAN", {"CUWARDEN_TENSORS=" + bad});
      INFO("'" << bad << "' " << flag << ": " << r.err);
      CHECK(r.status == 2);
      CHECK(r.out.empty());  // nothing ran
      CHECK(r.err == "cuwarden run: bad CUWARDEN_TENSORS='" + bad +
                         "': use 1 (every tensor through cuwarden's pool, as --tensors) or 0 (off)\n");
    }
  }
}

TEST_CASE("cli.run_help_lists_the_framework_switches") {
  CmdResult r = run_cmd({CUWT_CLI, "run", "--help"});
  REQUIRE(r.status == 0);
  CHECK(has_text(r.out, "--tensors"));
  CHECK(has_text(r.out, "CUWARDEN_TENSORS=1"));
  for (const cuw::tensors::Switch& s : cuw::tensors::kSwitches)
    CHECK(has_text(r.out, std::string("\n  ") + s.variable + "=" + s.value + " for " + s.framework + ": "));
  CHECK(has_text(r.out, std::string("CUWARDEN_POOL=") + cuw::tensors::kPool + " unless --pool"));
}

TEST_CASE("cli.run_tensors_gives_the_program_the_pool_on_the_simulated_driver") {
  TempDir dir;
  ::mkdir((dir / "run").c_str(), 0755);
  Daemon d(dir);
  const std::string cli_path = CUWT_CLI, lib = CUWT_LIB, loop = CUWT_ALLOC_LOOP;
  std::string unset;
  for (const std::string& v : cleared()) unset += " -u " + v;
  // The library itself (not the empty one): it reads the variables the run set, and a ring the
  // daemon shows. The daemon listening keeps the ring of the exited process for it.
  CmdResult r = run_cmd({"/bin/sh", "-c",
                         "printf 'alloc 1\\nfree\\nalloc 3\\n' | /usr/bin/env" + unset + " " + cli_path +
                             " run --lib " + lib + " --tensors -- " + loop},
                        {"LD_LIBRARY_PATH=" + std::string(CUWT_FAKECUDA_DIR), "CUWARDEN_FAKE_DEVICES=1",
                         "CUWARDEN_FAKE_MEMORY=8G", "CUWARDEN_RUN_DIR=" + d.run_dir, "CUWARDEN_SOCKET=" + d.socket},
                        20000);
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  REQUIRE(r.out.rfind("ready ", 0) == 0);
  CHECK(has_text(r.out, "\nok\nfreed 1\nok\n"));
  CHECK(has_text(r.err, std::string("--tensors sets CUWARDEN_POOL=") + cuw::tensors::kPool));
  const uint32_t pid = static_cast<uint32_t>(std::stoul(r.out.substr(6)));
  json p;
  REQUIRE(wait_until([&] { return !(p = d.process(pid)).is_null(); }));
  CHECK(p["pool"] == cuw::tensors::kPool);
}
