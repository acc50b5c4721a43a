#pragma once
// main() of a benchmark under mpiexec: every rank runs each benchmark (they are collective),
// rank 0 reports, the others print nothing.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <vector>

#include "longattn/core/runtime.hpp"
#include "longattn/parallel/placement.hpp"

namespace longattn::bench {

class Silent : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

inline int run_mpi_benchmarks(int argc, char** argv, void (*register_benchmarks)()) {
  parallel::MpiSession mpi(argc, argv);
  ScopeGuard guard(argc, argv, {/*select_blas_kernels=*/true});
  register_benchmarks();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    Silent silent;
    benchmark::RunSpecifiedBenchmarks(&silent);
  }
  benchmark::Shutdown();
  return 0;
}

}  // namespace longattn::bench
