// Catch2 runner for the unit tests: Kokkos (and MPI for the parallel tests) around the session.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "longattn/core/runtime.hpp"
#if LONGATTN_TEST_WITH_MPI
#include "longattn/parallel/placement.hpp"
#endif

int main(int argc, char* argv[]) {
#if LONGATTN_TEST_WITH_MPI
  longattn::parallel::MpiSession mpi(argc, argv);
#endif
  longattn::ScopeGuard guard(argc, argv, {/*select_blas_kernels=*/true});
  return Catch::Session().run(argc, argv);
}
