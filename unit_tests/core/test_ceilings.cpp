// The ceiling measurements run, count their work right and reject bad arguments. Their speed
// is not asserted here: targets live in the benchmarks.
#include <catch2/catch.hpp>
#include <cmath>

#include "execution_spaces.hpp"
#include "longattn/core/ceilings.hpp"

TEMPLATE_LIST_TEST_CASE("FMA peak measurement runs on every execution space", "[core][ceilings]",
                        longattn::test::ExecutionSpaces) {
  TestType exec;
  const auto rate = longattn::measure_fma_peak(exec, 0.02);
  CHECK(rate.seconds >= 0.02);
  // Work is counted in whole iterations of 2 * 192 FLOPs per work item.
  const double per_iteration = 2.0 * longattn::detail::FmaChains::kLanes * exec.concurrency();
  CHECK(std::fmod(rate.flops, per_iteration) == 0.0);
  CHECK(rate.gflops() > 0);
}

TEST_CASE("sgemm measurement runs and validates its arguments", "[core][ceilings][errors]") {
  Kokkos::DefaultHostExecutionSpace exec;
  const auto rate = longattn::measure_sgemm(exec, 96, 0.02);
  CHECK(rate.gflops() > 0);
  CHECK(std::fmod(rate.flops, 2.0 * 96 * 96 * 96) == 0.0);
  CHECK_THROWS_WITH(longattn::measure_sgemm(exec, 0, 0.1), Catch::Contains("'n' is 0"));
  CHECK_THROWS_WITH(longattn::measure_fma_peak(exec, -1.0), Catch::Contains("'min_seconds' is -1"));
  CHECK_THROWS_WITH(longattn::run_fma_chains(exec, 0), Catch::Contains("'iterations' is 0"));
}
