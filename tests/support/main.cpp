// Catch2's main lives alone in this file so the test files recompile fast.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
