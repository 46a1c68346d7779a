// cuwarden tests: Catch2's session, compiled once (impl.cpp) for every suite.
#pragma once

namespace cuw::testing {

// Runs the test cases linked into this program with Catch2's command line; returns what
// Catch::Session::run returns (the number of failed tests, capped at 255).
int run_catch2(int argc, char** argv);

}  // namespace cuw::testing
