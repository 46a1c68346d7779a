// cuwarden integration tests: Catch2's main for every suite in this folder.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
