// cuwarden tests: Catch2's default main, for the suites that need no set-up of their own.
#include "catch2_run.hpp"

int main(int argc, char** argv) { return cuw::testing::run_catch2(argc, argv); }
