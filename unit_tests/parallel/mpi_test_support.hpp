#pragma once
// What the MPI tests of the attention layers share: one seed for every rank, the world with
// errors thrown (every rank makes the same calls, so every rank throws) and optionally
// simulated nodes, sums over ranks, and the tensor types.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <catch2/catch.hpp>
#include <cstdint>

#include "longattn/parallel/communicator.hpp"
#include "reference/random.hpp"

namespace longattn::test {

// Rank 0's seed on every rank: all ranks build the same global inputs.
inline std::uint64_t shared_seed() {
  std::uint64_t seed = test_seed();
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  return seed;
}

// Errors thrown instead of aborting the job; ranks_per_node > 0 simulates nodes of that many
// consecutive ranks.
inline parallel::CommunicatorOptions throwing_options(int ranks_per_node = 0) {
  parallel::CommunicatorOptions options;
  options.on_error = parallel::ErrorPolicy::throw_error;
  options.ranks_per_node = ranks_per_node;
  return options;
}

inline parallel::Communicator throwing_world(int ranks_per_node = 0) {
  return parallel::Communicator::world(throwing_options(ranks_per_node));
}

// Says SKIP (and the case checks nothing) when the world has one rank; ctest runs these tests
// at 2 and 4 ranks too.
inline bool several_ranks() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) return true;
  WARN("SKIP: needs 2 or more MPI ranks, the world has 1 (ctest's parallel_np2 to parallel_np4 run it)");
  return false;
}

inline std::int64_t sum_over_ranks(std::int64_t mine) {
  MPI_Allreduce(MPI_IN_PLACE, &mine, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return mine;
}

template <class T, class Memory>
using Tensor = Kokkos::View<T****, Kokkos::LayoutRight, Memory>;  // [B, N, H, D]
template <class T, class Memory>
using Rows = Kokkos::View<T***, Kokkos::LayoutRight, Memory>;     // [B, H, N]

// A multiple of 1/4 in [-2^(bits-3), 2^(bits-3)) from what rank, step, gradient and element it
// is: sums over a few ranks are exact in float, and in bfloat16 while bits + log2(terms) <= 8.
inline double exact_contribution(std::uint64_t seed, int rank, int step, int gradient, std::size_t i, int bits = 6) {
  std::uint64_t h = seed + std::uint64_t(rank) * 1000003u + std::uint64_t(step) * 7919u + std::uint64_t(gradient) * 104729u + i;
  h ^= h >> 31;
  h *= 0x9e3779b97f4a7c15ull;
  return double(std::int64_t(h >> (64 - bits)) - (std::int64_t(1) << (bits - 1))) / 4.0;
}

}  // namespace longattn::test
