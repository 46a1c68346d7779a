// cuwarden integration tests for `cuwarden fit`: the bisection against a program that needs a
// known amount of memory (fit_alloc.cpp), run under libcuwarden.so on the simulated driver.
// The expected answers are computed from the cap, the unit and the backend's rounding.
#include <catch2/catch.hpp>

#include <dirent.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "cuw/size.hpp"
#include "daemon_test_support.hpp"

using namespace cuwt;

namespace {

constexpr uint64_t kUnit = 1000000;  // bytes per unit: a cap in MiB is no whole number of units

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

/// Entries of a directory but . and ..
std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* e = readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") out.push_back(e->d_name);
    closedir(d);
  }
  return out;
}

/// `cuwarden fit` with the library preloaded on the simulated driver; its private run
/// directory goes under `tmp` (TMPDIR), which the caller can then check is left empty.
CmdResult fit(const TempDir& tmp, std::vector<std::string> options, std::vector<std::string> program_args,
              std::vector<std::string> env = {}) {
  std::vector<std::string> argv = {CUWT_CLI, "fit", "--lib", CUWT_LIB};
  argv.insert(argv.end(), options.begin(), options.end());
  argv.push_back("--");
  argv.push_back(CUWT_FIT_ALLOC);
  argv.insert(argv.end(), program_args.begin(), program_args.end());
  env.push_back("TMPDIR=" + tmp.path);
  env.push_back(std::string("LD_LIBRARY_PATH=") + CUWT_FAKECUDA_DIR);
  return run_cmd(argv, env, 90000);
}

json parse_json(const CmdResult& r) {
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(!r.out.empty());
  return json::parse(r.out);
}

/// What the largest N is when N units cost `cost(N)` bytes against `cap` bytes.
template <class Cost>
uint64_t largest_fitting(uint64_t lo, uint64_t hi, uint64_t cap, Cost cost) {
  uint64_t best = 0;
  for (uint64_t n = lo; n <= hi; ++n)
    if (cost(n) <= cap) best = n;
  return best;
}

uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

/// Every try's outcome agrees with `expected` (the largest that fits), and the search took
/// no more tries than a bisection of [lo, hi] needs.
void check_tries(const json& j, uint64_t expected, uint64_t lo, uint64_t hi) {
  const auto& tries = j["tries"];
  const auto bound = 2 + static_cast<std::size_t>(std::ceil(std::log2(static_cast<double>(hi - lo + 1))));
  CHECK(tries.size() <= bound);
  std::set<uint64_t> seen;
  for (const auto& t : tries) {
    const uint64_t v = t["value"];
    INFO("try " << t.dump());
    CHECK(seen.insert(v).second);  // never the same value twice
    CHECK(v >= lo);
    CHECK(v <= hi);
    CHECK(t["outcome"] == (v <= expected ? "fits" : "does_not_fit"));
    if (v > expected) CHECK(t["refusals"].get<uint64_t>() >= 1);
  }
}

}  // namespace

TEST_CASE("cli.fit_finds_the_largest_value_and_plots_it") {
  TempDir tmp;
  const uint64_t cap = 100ULL << 20;
  // Passthrough: what a cap counts is the bytes asked for.
  const uint64_t expected = largest_fitting(1, 1000, cap, [](uint64_t n) { return n * kUnit; });
  REQUIRE(expected == cap / kUnit);  // 104: not the 100 a MiB-minded guess would give
  const std::string svg = tmp / "plot.svg";
  CmdResult r = fit(tmp, {"--limit", "100M", "--try", "N=1..1000", "--json", "--plot", svg},
                    {"{N}", "--unit", std::to_string(kUnit)});
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.status == 0);
  const json j = parse_json(r);
  CHECK(j["result"] == "found");
  CHECK(j["answer"] == expected);
  CHECK(j["smallest_too_big"] == expected + 1);
  check_tries(j, expected, 1, 1000);
  bool saw_answer = false;
  for (const auto& t : j["tries"]) {
    REQUIRE(t["devices"].size() == 1);
    const auto& d = t["devices"][0];
    CHECK(d["limit_bytes"] == cap);
    CHECK(t["processes"] == 1);
    if (t["outcome"] == "fits") CHECK(d["peak_bytes"] == t["value"].get<uint64_t>() * kUnit);
    else CHECK(d["peak_bytes"] == 0);  // the one allocation was refused: nothing was held
    saw_answer = saw_answer || t["value"] == expected;
  }
  CHECK(saw_answer);
  // The private run directory (with every ring in it) is gone; only the plot is left.
  CHECK(entries(tmp.path) == std::vector<std::string>{"plot.svg"});

  // The plot: well-formed XML, one point per try (one GPU), each titled with its value.
  const std::string script =
      "import sys, xml.etree.ElementTree as E\n"
      "root = E.parse(sys.argv[1]).getroot()\n"
      "assert root.tag == '{http://www.w3.org/2000/svg}svg', root.tag\n"
      "pts = [e for e in root.iter() if 'point' in e.get('class', '').split()]\n"
      "print(len(pts))\n"
      "for p in pts: print(p.find('{http://www.w3.org/2000/svg}title').text.split(':')[0])\n"
      "print(sum(1 for e in root.iter() if 'cap' in e.get('class', '').split()))\n";
  CmdResult py = run_cmd({"/usr/bin/env", "python3", "-c", script, svg});
  INFO("python: " << py.out << py.err);
  REQUIRE(py.status == 0);
  std::string want = std::to_string(j["tries"].size()) + "\n";
  for (const auto& t : j["tries"]) want += "N=" + std::to_string(t["value"].get<uint64_t>()) + "\n";
  want += "1\n";  // one cap line
  CHECK(py.out == want);

  // For people: a line per try, then the answer with its peak in the CLI's units.
  CmdResult h = fit(tmp, {"--limit", "100M", "--try", "N=1..1000"}, {"{N}", "--unit", std::to_string(kUnit)});
  INFO("stdout: " << h.out << "\nstderr: " << h.err);
  CHECK(h.status == 0);
  CHECK(contains(h.out, "Largest N in 1..1000 that fits under --limit 100M:"));
  CHECK(contains(h.out, "does not fit (1 refusal)"));
  CHECK(contains(h.out, "N=" + std::to_string(expected) + " is the largest that fits (peak GPU 0 " +
                            cuw::format_bytes(expected * kUnit) + "); N=" + std::to_string(expected + 1) +
                            " does not fit."));
  std::size_t lines = 0;
  for (std::size_t p = h.out.find(" s  GPU 0 "); p != std::string::npos; p = h.out.find(" s  GPU 0 ", p + 1)) ++lines;
  CHECK(lines == j["tries"].size());
  CHECK(h.err.empty());  // the program's messages (out of memory) are kept out of the way
}

TEST_CASE("cli.fit_passes_the_pool_on") {
  TempDir tmp;
  const uint64_t cap = 100ULL << 20;
  // What the cache holds for one request (interposer/src/backends/pool/pool.hpp):
  // up to 1 MiB, a 2 MiB slab; above, the request rounded up to 2 MiB, or, when that has no
  // room under the cap, exactly the request rounded up to 512 bytes.
  const auto held = [&](uint64_t n) -> uint64_t {
    const uint64_t b = n * kUnit;
    if (b <= (1ULL << 20)) return 2ULL << 20;
    return round_up(b, 2ULL << 20) <= cap ? round_up(b, 2ULL << 20) : round_up(b, 512);
  };
  const uint64_t expected = largest_fitting(1, 1000, cap, [](uint64_t n) { return round_up(n * kUnit, 512); });
  CmdResult r = fit(tmp, {"--limit", "100M", "--pool", "cache", "--try", "N=1..1000", "--json"},
                    {"{N}", "--unit", std::to_string(kUnit)});
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.status == 0);
  const json j = parse_json(r);
  CHECK(j["answer"] == expected);
  CHECK(j["pool"] == "cache");
  check_tries(j, expected, 1, 1000);
  // The peaks are the pool's, not the requests': the flag reached the program.
  for (const auto& t : j["tries"])
    if (t["outcome"] == "fits") CHECK(t["devices"][0]["peak_bytes"] == held(t["value"].get<uint64_t>()));
  CHECK(j["tries"][0]["devices"][0]["peak_bytes"] == 2 * kMiB);  // N=1: 1e6 bytes from a 2 MiB slab
}

TEST_CASE("cli.fit_stops_at_a_failure_that_is_no_refusal") {
  TempDir tmp;
  // Exit 3 above 700 without allocating: LO fits, HI fails, and the search stops there.
  CmdResult r = fit(tmp, {"--limit", "100M", "--try", "N=1..1000"}, {"{N}", "--fail-above", "700"});
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.status == 1);
  CHECK(contains(r.err,
                 "cuwarden fit: N=1000 failed (exit status 3) with no refusal by the cap, so the search stops "
                 "here. N=1 fits. The end of its standard error:\n    loading the model\n    boom: 1000 above 700\n"));
  CHECK(contains(r.out, "failed (exit status 3)"));
  CHECK(!contains(r.out, "is the largest"));
  CHECK(entries(tmp.path).empty());

  CmdResult j = fit(tmp, {"--limit", "100M", "--try", "N=1..1000", "--json"}, {"{N}", "--fail-above", "700"});
  CHECK(j.status == 1);
  const json d = parse_json(j);
  CHECK(d["result"] == "failed");
  CHECK(d["answer"].is_null());
  CHECK(d["largest_fitting"] == 1);
  CHECK(d["tries"].size() == 2);
  CHECK(d["tries"][1]["exit_status"] == 3);
  CHECK(contains(d["stderr_tail"].get<std::string>(), "boom: 1000 above 700"));

  // A signal with no refusal is a failure too; one after a refusal is "does not fit".
  CmdResult s = fit(tmp, {"--limit", "100M", "--try", "N=1..1000"}, {"{N}", "--crash-above", "500"});
  CHECK(s.status == 1);
  CHECK(contains(s.err, "N=1000 failed (killed by signal 11 (Segmentation fault))"));
  CmdResult a = fit(tmp, {"--limit", "100M", "--try", "N=1..1000", "--json"},
                    {"{N}", "--abort-on-oom", "--unit", std::to_string(kUnit)});
  CHECK(a.status == 0);
  CHECK(parse_json(a)["answer"] == (100ULL << 20) / kUnit);
}

TEST_CASE("cli.fit_says_when_nothing_fits_or_everything_does") {
  TempDir tmp;
  CmdResult none = fit(tmp, {"--limit", "100M", "--try", "N=200..300"}, {"{N}"});
  INFO("stdout: " << none.out << "\nstderr: " << none.err);
  CHECK(none.status == 4);
  CHECK(contains(none.out, "Nothing in 200..300 fits: even N=200 does not fit under --limit 100M (peak GPU 0 0 B)."));
  CmdResult nj = fit(tmp, {"--limit", "100M", "--try", "N=200..300", "--json"}, {"{N}"});
  CHECK(nj.status == 4);
  const json n = parse_json(nj);
  CHECK(n["result"] == "none_fit");
  CHECK(n["tries"].size() == 1);  // LO alone decides it
  CHECK(n["answer"].is_null());

  CmdResult all = fit(tmp, {"--limit", "100M", "--try", "N=1..50", "--json"}, {"{N}"});
  CHECK(all.status == 0);
  const json a = parse_json(all);
  CHECK(a["result"] == "all_fit");
  CHECK(a["answer"] == 50);
  CHECK(a["tries"].size() == 2);  // LO and HI
  CHECK(a["tries"][1]["devices"][0]["peak_bytes"] == 50 * kMiB);
  CmdResult ah = fit(tmp, {"--limit", "100M", "--try", "N=1..50"}, {"{N}"});
  CHECK(ah.status == 0);
  CHECK(contains(ah.out, "N=50, the top of the range, fits (peak GPU 0 50.00 MiB): a larger value may fit too"));
  CHECK(entries(tmp.path).empty());
}

TEST_CASE("cli.fit_reads_every_process_and_device") {
  TempDir tmp;
  // The allocation happens in a forked child, on two GPUs with different caps: the smaller
  // one decides, and each GPU shows its own peak and cap.
  const uint64_t cap0 = 100ULL << 20, cap1 = 50ULL << 20;
  const uint64_t expected = std::min(cap0, cap1) / kUnit;
  CmdResult r =
      fit(tmp, {"--limit", "0=100M,1=50M", "--try", "N=1..1000", "--json"},
          {"{N}", "--unit", std::to_string(kUnit), "--devices", "2", "--in-child"}, {"CUWARDEN_FAKE_DEVICES=2"});
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.status == 0);
  const json j = parse_json(r);
  CHECK(j["answer"] == expected);
  check_tries(j, expected, 1, 1000);
  for (const auto& t : j["tries"]) {
    CHECK(t["processes"] == 1);  // the parent never used CUDA; the child's ring is read
    if (t["value"] != expected) continue;
    REQUIRE(t["devices"].size() == 2);
    CHECK(t["devices"][0]["ordinal"] == 0);
    CHECK(t["devices"][0]["limit_bytes"] == cap0);
    CHECK(t["devices"][0]["peak_bytes"] == expected * kUnit);
    CHECK(t["devices"][1]["ordinal"] == 1);
    CHECK(t["devices"][1]["limit_bytes"] == cap1);
    CHECK(t["devices"][1]["peak_bytes"] == expected * kUnit);
  }
}

TEST_CASE("cli.fit_refuses_bad_arguments") {
  TempDir tmp;
  const auto usage = [&](std::vector<std::string> options, std::vector<std::string> args, const std::string& msg) {
    CmdResult r = fit(tmp, options, args);
    INFO("stderr: " << r.err);
    CHECK(r.status == 2);
    CHECK(contains(r.err, msg));
  };
  usage({"--limit", "100M", "--try", "N=1..10"}, {"5"}, "cuwarden fit: the command never mentions {N}");
  usage({"--limit", "100M", "--try", "N=10..1"}, {"{N}"}, "bad --try 'N=10..1': LO must not be above HI");
  usage({"--limit", "100M", "--try", "N=1-10"}, {"{N}"}, "bad --try 'N=1-10': use NAME=LO..HI");
  usage({"--limit", "100", "--try", "N=1..10"}, {"{N}"}, "cuwarden fit: bad --limit '100'");
  usage({"--limit", "100M", "--try", "N=1..10", "--pool", "big"}, {"{N}"}, "cuwarden fit: bad --pool 'big'");
  usage({"--try", "N=1..10"}, {"{N}"}, "--limit is required");
  CHECK(entries(tmp.path).empty());
}
