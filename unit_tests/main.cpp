// Catch2 runner for the unit tests: Kokkos (and MPI for the parallel tests) around the session,
// which catch_session.cpp runs.
#include "longattn/core/runtime.hpp"
#if LONGATTN_TEST_WITH_MPI
#include "longattn/parallel/placement.hpp"
#endif

namespace longattn::test {
int run_catch_session(int argc, char* argv[]);
}

int main(int argc, char* argv[]) {
#if LONGATTN_TEST_WITH_MPI
  longattn::parallel::MpiSession mpi(argc, argv);
#endif
  longattn::ScopeGuard guard(argc, argv, {/*select_blas_kernels=*/true});
  return longattn::test::run_catch_session(argc, argv);
}
