// GradientReduceScatter (ZeRO 2) under mpiexec: gradients of odd sizes (some with fewer elements
// than ranks, so some pieces are empty) in buckets small enough that several are in flight;
// each rank's pieces equal its slice of the sum over the ranks, accumulated over passes; the
// gradients' memory is overwritten right after ready() without changing the result; in the
// memory of the host's default space and the GPU's; reduced in bfloat16 and float16; and the
// buffers held at once stay within buffer_bytes().
#include <mpi.h>

#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <vector>

#include "longattn/error.hpp"
#include "longattn/parallel/gradient_reduce_scatter.hpp"
#include "execution_spaces.hpp"
#include "mpi_test_support.hpp"

namespace {

using longattn::parallel::Communicator;
using longattn::parallel::GradientReduceScatter;
using longattn::parallel::GradientReduceScatterOptions;
using longattn::parallel::shard_piece;
using longattn::test::throwing_options;

// Multiples of 1/4 in [-2, 2): sums over 4 ranks and 3 passes are exact, in 16 bits too.
double contribution(std::uint64_t seed, int rank, int pass, int gradient, std::size_t i) {
  return longattn::test::exact_contribution(seed, rank, pass, gradient, i, 4);
}

// Runs `passes` passes over gradients of `counts` and checks every piece against the sum.
template <class Exec>
void check_pieces(const Communicator& comm, const GradientReduceScatterOptions& options,
                  const std::vector<std::size_t>& counts, int passes, std::uint64_t seed) {
  using Floats = Kokkos::View<float*, typename Exec::memory_space>;
  const longattn::ExecutionContext<Exec> context;
  GradientReduceScatter<Exec> reduce(context, comm, options);
  std::vector<Floats> pieces;
  for (std::size_t g = 0; g < counts.size(); ++g) {
    pieces.emplace_back("piece", shard_piece(counts[g], comm.size(), comm.rank()).count);
    CHECK(reduce.add(counts[g], pieces.back().data()) == int(g));
  }
  context.pool().reset_high_water();
  const std::size_t before = context.pool().stats().in_use_bytes;
  for (int pass = 0; pass < passes; ++pass) {
    for (std::size_t g = 0; g < counts.size(); ++g) {
      // As a model with per-block gradient memory: the gradient exists only around ready().
      Floats gradient("gradient", counts[g]);
      auto host = Kokkos::create_mirror_view(gradient);
      for (std::size_t e = 0; e < counts[g]; ++e) host(e) = float(contribution(seed, comm.rank(), pass, int(g), e));
      Kokkos::deep_copy(gradient, host);
      reduce.ready(int(g), gradient.data());
      Kokkos::deep_copy(context.exec(), gradient, std::numeric_limits<float>::quiet_NaN());  // reused at once
    }
    reduce.wait();
  }
  // The staged transport's host copies come from this pool too when the memory is the host's
  // (ctest's *_staged runs); on a GPU they are pinned host memory, apart from the device's pool.
  if (comm.transport(context.exec()) != longattn::parallel::Transport::staged)
    CHECK(context.pool().stats().in_use_high_water_bytes - before <= reduce.buffer_bytes());
  bool all_equal = true;
  for (std::size_t g = 0; g < counts.size(); ++g) {
    const auto mine = shard_piece(counts[g], comm.size(), comm.rank());
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), pieces[g]);
    for (std::size_t j = 0; j < mine.count; ++j) {
      double sum = 0;
      for (int pass = 0; pass < passes; ++pass)
        for (int r = 0; r < comm.size(); ++r) sum += contribution(seed, r, pass, int(g), mine.begin + j);
      if (host(j) != float(sum)) {
        UNSCOPED_INFO("gradient " << g << " element " << mine.begin + j << ": " << host(j) << ", expected " << sum);
        all_equal = false;
      }
    }
  }
  CHECK(all_equal);
}

const std::vector<std::size_t> odd_counts{1, 3, 611, 2, 1000, 37, 4099, 5, 64, 129};

}  // namespace

TEMPLATE_LIST_TEST_CASE("each rank gets its pieces of the gradients summed over the ranks, buckets in flight",
                        "[parallel][reduce_scatter]", longattn::test::MpiTestSpaces) {
  using Exec = TestType;
  const std::uint64_t seed = longattn::test::shared_seed();
  INFO("seed " << seed);
  const Communicator comm = Communicator::world(throwing_options(0));
  for (const int in_flight : {1, 2, 3}) {
    for (const std::size_t bucket_bytes : {std::size_t(256), std::size_t(8192), std::size_t(1) << 20}) {
      INFO(in_flight << " in flight, buckets of " << bucket_bytes << " bytes");
      GradientReduceScatterOptions options;
      options.bucket_bytes = bucket_bytes;
      options.buckets_in_flight = in_flight;
      check_pieces<Exec>(comm, options, odd_counts, 3, seed);
    }
  }
}

TEMPLATE_TEST_CASE("gradients reduce-scattered in 16 bits give the exact sums", "[parallel][reduce_scatter][half]",
                   longattn::bfloat16, longattn::float16) {
  const std::uint64_t seed = longattn::test::shared_seed();
  INFO("seed " << seed);
  const Communicator comm = Communicator::world(throwing_options(0));
  GradientReduceScatterOptions options;
  options.bucket_bytes = 2048;
  options.reduce_type = longattn::parallel::data_type_of<TestType>();
  // Contributions are multiples of 1/4 in [-2, 2): their sums over 4 ranks are exact in 16 bits.
  check_pieces<Kokkos::DefaultHostExecutionSpace>(comm, options, odd_counts, 1, seed);
}

TEST_CASE("ZeRO's pieces cover a tensor once, in rank order", "[parallel][reduce_scatter]") {
  for (const std::size_t count : {std::size_t(1), std::size_t(5), std::size_t(12), std::size_t(13)})
    for (const int ranks : {1, 2, 3, 4, 7}) {
      std::size_t next = 0;
      for (int r = 0; r < ranks; ++r) {
        const auto piece = shard_piece(count, ranks, r);
        CHECK(piece.size == (count + std::size_t(ranks) - 1) / std::size_t(ranks));
        CHECK(piece.begin == next);
        CHECK(piece.count <= piece.size);
        next = piece.begin + piece.count;
      }
      CHECK(next == count);
    }
  CHECK_THROWS_WITH(shard_piece(5, 0, 0), Catch::Contains("argument 'ranks' is 0, expected at least 1"));
  CHECK_THROWS_WITH(shard_piece(5, 2, 2), Catch::Contains("argument 'rank' is 2, expected a rank from 0 to 1"));
}

TEST_CASE("GradientReduceScatter refuses bad input", "[parallel][reduce_scatter][errors]") {
  const Communicator comm = Communicator::world(throwing_options(0));
  GradientReduceScatterOptions none;
  none.buckets_in_flight = 0;
  CHECK_THROWS_WITH(GradientReduceScatter<>(longattn::ExecutionContext<Kokkos::DefaultHostExecutionSpace>(), comm, none),
                    Catch::Contains("argument 'options.buckets_in_flight' is 0, expected at least 1"));
  GradientReduceScatterOptions integers;
  integers.reduce_type = longattn::parallel::DataType::int32;
  CHECK_THROWS_WITH(GradientReduceScatter<>(longattn::ExecutionContext<Kokkos::DefaultHostExecutionSpace>(), comm, integers),
                    Catch::Contains("argument 'options.reduce_type' is int32, expected float32, bfloat16 or float16"));
  GradientReduceScatter<> reduce(longattn::ExecutionContext<Kokkos::DefaultHostExecutionSpace>(), comm);
  std::vector<float> gradient(40), piece(40);
  CHECK_THROWS_WITH(reduce.add(0, piece.data()), Catch::Contains("argument 'count' is 0, expected at least one element"));
  CHECK_THROWS_WITH(reduce.add(40, nullptr), Catch::Contains("argument 'piece' is nullptr"));
  reduce.add(40, piece.data());
  reduce.add(40, piece.data());
  CHECK_THROWS_WITH(reduce.ready(2, gradient.data()), Catch::Contains("argument 'index' is 2, expected a gradient from 0 to 1"));
  CHECK_THROWS_WITH(reduce.ready(0, nullptr), Catch::Contains("argument 'data' is nullptr"));
  reduce.ready(0, gradient.data());
  CHECK_THROWS_WITH(reduce.ready(0, gradient.data()), Catch::Contains("argument 'index' is 0, expected a gradient not yet ready"));
  CHECK_THROWS_WITH(reduce.add(40, piece.data()), Catch::Contains("expected every gradient added before the first ready()"));
  CHECK_THROWS_WITH(reduce.wait(), Catch::Contains("argument 'gradient 1' is not ready"));
  reduce.ready(1, gradient.data());
  reduce.wait();
}
