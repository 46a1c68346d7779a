// cuwarden tests: Catch2 v2's implementation, compiled once and linked into every suite.
// It is the slowest file of the tests to compile (minutes under the sanitizers on 2 cores),
// so suites take it from here instead of defining CATCH_CONFIG_MAIN or CATCH_CONFIG_RUNNER:
// a suite links cuw_catch2_main (Catch2's default main), or cuw_catch2 and defines its own
// main() that calls run_catch2 (catch2_run.hpp).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "catch2_run.hpp"

int cuw::testing::run_catch2(int argc, char** argv) { return Catch::Session().run(argc, argv); }
