// Catch2's implementation, the slowest file of the tests to compile: built once here and linked
// into both runners (main.cpp, with and without MPI), which call run_catch_session.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

namespace longattn::test {

int run_catch_session(int argc, char* argv[]) { return Catch::Session().run(argc, argv); }

}  // namespace longattn::test
