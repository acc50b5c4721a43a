#pragma once
// The [team_tiles] tests: the GPU's tile shape (ThreadTiles: one lane per thread, the team's
// threads sharing out every product's micro-tiles, barriers between stages) in teams of 2 and 4
// threads on Kokkos::OpenMP, against the same references as the host's own shape. CTest's
// core_team_tiles runs them with 4 OpenMP threads (oversubscribed on small machines), and CI
// once more under ThreadSanitizer, where a missing team barrier shows as a race on scratch.
#include <Kokkos_Core.hpp>

#include <catch2/catch.hpp>

#include <tuple>

#include "longattn/core/attention_tiles.hpp"

namespace longattn::test {

using TeamTileConfigs = std::tuple<longattn::ThreadTiles<2>, longattn::ThreadTiles<4>>;

// Whether Kokkos::OpenMP is enabled and has threads for a team of Tiles; says SKIP otherwise.
template <class Tiles>
bool openmp_runs_team_of() {
#ifdef KOKKOS_ENABLE_OPENMP
  const int threads = Kokkos::OpenMP().concurrency();
  if (threads >= Tiles::team_size) return true;
  WARN("SKIP: a team of " << Tiles::team_size << " threads needs OMP_NUM_THREADS >= " << Tiles::team_size
                          << "; this run has " << threads);
#else
  WARN("SKIP: the team tile tests run on Kokkos::OpenMP, which this build does not enable");
#endif
  return false;
}

}  // namespace longattn::test
