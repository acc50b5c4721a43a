// Ring attention under mpiexec with 1 to 4 ranks: forward and backward equal single-rank
// attention over the whole sequence (the fused kernel on every rank, same inputs from a shared
// seed) for contiguous and zigzag sharding, causal or not, several piece counts and odd shapes,
// dense and block-sparse layouts (with the steps and transfers no rank needs skipped), flat and
// two-level rings over simulated nodes (each piece crossing each node boundary once), with the
// exchanges serialized as NCCL runs them on a GPU; 16-bit tensors (bfloat16, float16: pieces
// travel in 16 bits, outputs and gradients accumulate over the steps in float); sharding
// helpers; bad input refused on every rank alike, also when only one rank's input is wrong.
#include <mpi.h>

#include <catch2/catch.hpp>

#include <random>

#include "longattn/core/block_sparse_patterns.hpp"
#include "longattn/error.hpp"
#include "longattn/parallel/ring_attention.hpp"
#include "execution_spaces.hpp"
#include "mpi_test_support.hpp"
#include "reference/random.hpp"
#include "reference/tensors.hpp"
#include "reference/test_size.hpp"

namespace {

using longattn::parallel::Communicator;
using longattn::parallel::RingOptions;
using longattn::parallel::Sharding;

using Spaces = longattn::test::MpiTestSpaces;  // MPI on host memory, NCCL on CUDA memory
using longattn::test::Rows;
using longattn::test::Tensor;
using longattn::test::shared_seed;
using longattn::test::sum_over_ranks;
using longattn::test::tolerance;
Communicator world(int ranks_per_node = 0) { return longattn::test::throwing_world(ranks_per_node); }

// Ring forward and backward against the single-rank kernels on the same global inputs; with
// `global_layout`, block-sparse through a plan made from it.
template <class Exec, class T>
void check_ring(const Communicator& comm, int B, std::int64_t N, int H, int D, bool causal, const RingOptions& ring,
                std::uint64_t seed, const longattn::BlockSparseLayout<Exec>* global_layout = nullptr) {
  using Memory = typename Exec::memory_space;
  const Exec exec;
  const int P = comm.size(), me = comm.rank();
  std::mt19937_64 rng(seed);
  auto global = [&] { return longattn::test::to_device<T, Memory>(longattn::test::random_tensor<T>(B, int(N), H, D, rng)); };
  const auto q = global(), k = global(), v = global(), d_o = global();
  longattn::AttentionOptions opts;
  opts.causal = causal;
  using Lse = longattn::accumulate_t<T>;
  Tensor<T, Memory> o("o", B, N, H, D), dq("dq", B, N, H, D), dk("dk", B, N, H, D), dv("dv", B, N, H, D);
  Rows<Lse, Memory> lse("lse", B, H, N);
  if (global_layout) {
    longattn::attention_forward(exec, q, k, v, o, lse, opts, *global_layout);
    longattn::attention_backward(exec, q, k, v, o, d_o, lse, dq, dk, dv, opts, *global_layout);
  } else {
    longattn::attention_forward(exec, q, k, v, o, lse, opts);
    longattn::attention_backward(exec, q, k, v, o, d_o, lse, dq, dk, dv, opts);
  }

  const std::int64_t n = N / P;
  auto local = [&](const Tensor<T, Memory>& g) {
    Tensor<T, Memory> l("local", B, n, H, D);
    longattn::parallel::shard(exec, g, l, P, me, ring.sharding);
    return l;
  };
  const auto ql = local(q), kl = local(k), vl = local(v), dol = local(d_o);
  Tensor<T, Memory> ol("o", B, n, H, D), dql("dq", B, n, H, D), dkl("dk", B, n, H, D), dvl("dv", B, n, H, D);
  Rows<Lse, Memory> lsel("lse", B, H, n);
  if (global_layout) {
    const longattn::parallel::RingPlan<Exec> plan(exec, comm, *global_layout, causal, ring);
    longattn::parallel::ring_attention_forward(exec, plan, longattn::AttentionInputs{ql, kl, vl},
                                               longattn::AttentionOutputs{ol, lsel}, opts);
    longattn::parallel::ring_attention_backward(exec, plan, longattn::AttentionInputs{ql, kl, vl},
                                                longattn::AttentionOutputs{ol, lsel}, dol,
                                                longattn::AttentionGradients{dql, dkl, dvl}, opts);
  } else {
    longattn::parallel::ring_attention_forward(exec, comm, longattn::AttentionInputs{ql, kl, vl},
                                               longattn::AttentionOutputs{ol, lsel}, opts, ring);
    longattn::parallel::ring_attention_backward(exec, comm, longattn::AttentionInputs{ql, kl, vl},
                                                longattn::AttentionOutputs{ol, lsel}, dol,
                                                longattn::AttentionGradients{dql, dkl, dvl}, opts, ring);
  }
  Tensor<T, Memory> o_ring("o ring", B, N, H, D), dq_ring("dq ring", B, N, H, D), dk_ring("dk ring", B, N, H, D),
      dv_ring("dv ring", B, N, H, D);
  Rows<Lse, Memory> lse_ring("lse ring", B, H, N);
  longattn::parallel::unshard(exec, comm, ol, o_ring, ring.sharding);
  longattn::parallel::unshard<2>(exec, comm, lsel, lse_ring, ring.sharding);
  longattn::parallel::unshard(exec, comm, dql, dq_ring, ring.sharding);
  longattn::parallel::unshard(exec, comm, dkl, dk_ring, ring.sharding);
  longattn::parallel::unshard(exec, comm, dvl, dv_ring, ring.sharding);
  using longattn::test::relative_error;
  using longattn::test::to_host;
  // 16 bits: both sides round once at the end, so they differ by a rounding at most.
  CHECK(relative_error(to_host(o_ring), to_host(o)) <= tolerance<T>());
  CHECK(relative_error(to_host(lse_ring), to_host(lse)) <= tolerance<Lse>());
  CHECK(relative_error(to_host(dq_ring), to_host(dq)) <= 4 * tolerance<T>());
  CHECK(relative_error(to_host(dk_ring), to_host(dk)) <= 4 * tolerance<T>());
  CHECK(relative_error(to_host(dv_ring), to_host(dv)) <= 4 * tolerance<T>());
}

}  // namespace

TEST_CASE("shard and unshard move a sequence between global and local tensors", "[parallel][ring][sharding]") {
  const Communicator comm = world();
  const int P = comm.size(), me = comm.rank();
  const std::int64_t N = 4 * P * 3;
  for (const Sharding sharding : {Sharding::contiguous, Sharding::zigzag}) {
    INFO(to_string(sharding));
    Kokkos::View<double****, Kokkos::HostSpace> global("global", 2, N, 3, 2), back("back", 2, N, 3, 2);
    for (std::size_t i = 0; i < global.size(); ++i) global.data()[i] = double(i);
    Kokkos::View<double****, Kokkos::HostSpace> local("local", 2, N / P, 3, 2);
    longattn::parallel::shard(Kokkos::DefaultHostExecutionSpace(), global, local, P, me, sharding);
    const auto segments = longattn::parallel::shard_segments(N, P, me, sharding);
    for (const auto& s : segments)
      for (std::int64_t t = 0; t < s.tokens; ++t) CHECK(local(1, s.local_begin + t, 2, 1) == global(1, s.global_begin + t, 2, 1));
    longattn::parallel::unshard(Kokkos::DefaultHostExecutionSpace(), comm, local, back, sharding);
    bool same = true;
    for (std::size_t i = 0; i < global.size(); ++i) same = same && back.data()[i] == global.data()[i];
    CHECK(same);
  }
  const auto zig = longattn::parallel::shard_segments(8 * P, P, me, Sharding::zigzag);
  REQUIRE(zig.size() == 2);
  CHECK(zig[0].global_begin == 4 * me);
  CHECK(zig[1].global_begin == 4 * (2 * P - 1 - me));
  CHECK_THROWS_WITH(longattn::parallel::shard_segments(100, 4, 0, Sharding::zigzag, 64),
                    Catch::Contains("argument 'tokens' is 100, expected a positive multiple of 512 (4 ranks x 2 chunks x "
                                    "64-token blocks, zigzag sharding)"));
}

TEMPLATE_LIST_TEST_CASE("ring attention equals single-rank attention: dense, contiguous and zigzag",
                        "[parallel][ring]", Spaces) {
  const Communicator comm = world();
  const std::uint64_t seed = shared_seed();
  const int P = comm.size();
  for (const Sharding sharding : {Sharding::contiguous, Sharding::zigzag})
    for (const bool causal : {false, true})
      for (const int pieces : {1, 2, 0}) {
        RingOptions ring;
        ring.sharding = sharding;
        ring.pieces = pieces;
        // 3 blocks per zigzag chunk (pieces of unequal length), 2 with LONGATTN_TEST_SIZE=small.
        const std::int64_t N = std::int64_t(2) * P * 64 * longattn::test::test_size(3, 2);
        INFO(to_string(sharding) << (causal ? ", causal" : "") << ", pieces " << pieces << ", N " << N << ", seed "
                                 << seed);
        check_ring<TestType, double>(comm, 2, N, longattn::test::test_size(3, 2), 8, causal, ring, seed);
        check_ring<TestType, float>(comm, 1, N, 2, 20, causal, ring, seed + 1);
        if (pieces == 2) check_ring<TestType, longattn::bfloat16>(comm, 1, N, 2, 16, causal, ring, seed + 2);
        if (pieces == 1) check_ring<TestType, longattn::float16>(comm, 1, N, 2, 12, causal, ring, seed + 3);
      }
}

TEMPLATE_LIST_TEST_CASE("ring attention with block-sparse layouts skips what no rank needs",
                        "[parallel][ring][block_sparse]", Spaces) {
  using Exec = TestType;
  const Communicator comm = world();
  const std::uint64_t seed = shared_seed();
  const int P = comm.size();
  const Exec exec;
  const std::int64_t N = std::int64_t(2) * P * 64 * 2;
  longattn::BlockSparseShape shape;
  shape.queries = shape.keys = N;
  shape.heads = 2;
  for (const bool causal : {false, true})
    for (const Sharding sharding : {Sharding::contiguous, Sharding::zigzag}) {
      RingOptions ring;
      ring.sharding = sharding;
      ring.pieces = 2;
      INFO(to_string(sharding) << (causal ? ", causal" : "") << ", seed " << seed);
      const auto window = longattn::local_window_layout(exec, shape, 100, causal);
      check_ring<Exec, double>(comm, 1, N, 2, 8, causal, ring, seed, &window);
      const auto random = longattn::random_layout(exec, shape, 0.3, causal, seed);
      check_ring<Exec, double>(comm, 2, N, 2, 8, causal, ring, seed + 1, &random);
    }
  // A causal local window of 100 tokens over contiguous shards of 256 tokens in 2 pieces: a
  // rank's first piece stays home, its second goes to the next rank only. Dense causal attention
  // sends every piece as far as the last rank: rank r forwards r + 1 pieces per round.
  RingOptions contiguous;
  contiguous.pieces = 2;
  const auto window = longattn::local_window_layout(exec, shape, 100, true);
  const longattn::parallel::RingPlan<Exec> sparse(exec, comm, window, true, contiguous);
  const longattn::parallel::RingPlan<Exec> dense(comm, N, 64, true, contiguous);
  CHECK(sum_over_ranks(dense.pieces_sent()) == std::int64_t(2) * P * (P - 1) / 2);
  CHECK(sum_over_ranks(sparse.pieces_sent()) == P - 1);
  CHECK(sum_over_ranks(sparse.pairs_computed()) == 3 * P - 1);  // own two pieces, and the previous rank's second
}

TEMPLATE_LIST_TEST_CASE("ring attention refuses bad input on every rank alike", "[parallel][ring][errors]", Spaces) {
  using Exec = TestType;
  const Communicator comm = world();
  const int P = comm.size();
  const Exec exec;
  Tensor<float, typename Exec::memory_space> q("q", 1, 100, 1, 8);  // 100 * P tokens: not in 64-token blocks per rank
  Rows<float, typename Exec::memory_space> lse("lse", 1, 1, 100);
  CHECK_THROWS_WITH(longattn::parallel::ring_attention_forward(exec, comm, longattn::AttentionInputs{q, q, q},
                                                               longattn::AttentionOutputs{q, lse}),
                    Catch::Contains("argument 'tokens' is " + std::to_string(100 * P)) &&
                        Catch::Contains("64-token blocks, contiguous sharding"));
  const longattn::parallel::RingPlan<Exec> plan(comm, 128 * P, 64, true);
  Tensor<float, typename Exec::memory_space> a("a", 1, 128, 2, 8), b("b", 1, 128, 2, 8), c("c", 1, 128, 2, 8),
      out("out", 1, 128, 2, 8), short_k("k", 1, 64, 2, 8);
  Rows<float, typename Exec::memory_space> rows("rows", 1, 2, 128);
  longattn::AttentionOptions not_causal;
  CHECK_THROWS_WITH(longattn::parallel::ring_attention_forward(exec, plan, longattn::AttentionInputs{a, b, c},
                                                               longattn::AttentionOutputs{out, rows}, not_causal),
                    Catch::Contains("argument 'opts.causal' is false, expected true (as the plan was made)"));
  longattn::AttentionOptions causal;
  causal.causal = true;
  CHECK_THROWS_WITH(longattn::parallel::ring_attention_forward(exec, plan, longattn::AttentionInputs{a, short_k, c},
                                                               longattn::AttentionOutputs{out, rows}, causal),
                    Catch::Contains("argument 'k's extents' is [1, 64, 2, 8]"));
  RingOptions too_many;
  too_many.pieces = 3;  // 2 blocks per rank
  CHECK_THROWS_WITH(longattn::parallel::RingPlan<Exec>(comm, 128 * P, 64, true, too_many),
                    Catch::Contains("argument 'options.pieces' is 3, expected at most 2"));
}

TEMPLATE_LIST_TEST_CASE("two-level ring over simulated nodes equals single-rank attention", "[parallel][ring][two_level]",
                        Spaces) {
  using Exec = TestType;
  const std::uint64_t seed = shared_seed();
  const int P = world().size();
  for (const int ranks_per_node : {1, 2}) {
    if (P % ranks_per_node != 0) continue;
    const Communicator comm = world(ranks_per_node);
    const int nodes = P / ranks_per_node;
    RingOptions ring;
    ring.topology = longattn::parallel::RingTopology::two_level;
    ring.pieces = 2;
    const std::int64_t N = std::int64_t(2) * P * 64 * 2;
    for (const Sharding sharding : {Sharding::contiguous, Sharding::zigzag})
      for (const bool causal : {false, true}) {
        ring.sharding = sharding;
        INFO(nodes << " nodes x " << ranks_per_node << ", " << to_string(sharding) << (causal ? ", causal" : "")
                   << ", seed " << seed);
        check_ring<Exec, double>(comm, 2, N, 2, 8, causal, ring, seed);
        longattn::BlockSparseShape shape;
        shape.queries = shape.keys = N;
        shape.heads = 2;
        const auto window = longattn::local_window_layout(Exec(), shape, 100, causal);
        check_ring<Exec, double>(comm, 1, N, 2, 8, causal, ring, seed + 1, &window);
        check_ring<Exec, longattn::bfloat16>(comm, 1, N, 2, 8, causal, ring, seed + 2);  // totals home in float
      }

    // Traffic between nodes, dense and not causal (every piece goes everywhere): the two-level
    // ring carries each piece over nodes - 1 boundaries; the flat ring over nodes - 1 or nodes
    // (a piece whose owner is not first on its node crosses the boundary into it too).
    const int B = 1, H = 2, D = 8;
    const std::int64_t local = 256;
    Tensor<float, typename Exec::memory_space> q("q", B, local, H, D), o("o", B, local, H, D);
    Rows<float, typename Exec::memory_space> lse("lse", B, H, local);
    std::int64_t crossings[2] = {0, 0};
    for (const auto topology : {longattn::parallel::RingTopology::two_level, longattn::parallel::RingTopology::flat}) {
      RingOptions options;
      options.pieces = 1;
      options.topology = topology;
      const longattn::parallel::RingPlan<Exec> plan(comm, local * P, 64, false, options);
      CHECK(plan.two_level() == (topology == longattn::parallel::RingTopology::two_level && nodes > 1 && ranks_per_node > 1));
      longattn::parallel::ring_attention_forward(Exec(), plan, longattn::AttentionInputs{q, q, q},
                                                 longattn::AttentionOutputs{o, lse});
      const std::int64_t piece_bytes = std::int64_t(2) * B * local * H * D * sizeof(float);
      crossings[topology == longattn::parallel::RingTopology::flat] = sum_over_ranks(plan.timings().bytes_sent_off_node) / piece_bytes;
      CHECK(sum_over_ranks(plan.timings().bytes_sent) == std::int64_t(P) * (P - 1) * piece_bytes);
    }
    INFO(nodes << " nodes x " << ranks_per_node);
    CHECK(crossings[0] == std::int64_t(P) * (nodes - 1));
    const std::int64_t not_first = ranks_per_node > 1 && nodes > 1 ? std::int64_t(nodes) * (ranks_per_node - 1) : 0;
    CHECK(crossings[1] == std::int64_t(P) * (nodes - 1) + not_first);
  }
  // Nodes of different sizes (3 ranks as 2 + 1): no two-level ring; automatic falls back to flat.
  if (P == 3) {
    const Communicator uneven = world(2);
    RingOptions two_level;
    two_level.topology = longattn::parallel::RingTopology::two_level;
    CHECK_THROWS_WITH(longattn::parallel::RingPlan<Exec>(uneven, 128 * P, 64, false, two_level),
                      Catch::Contains("argument 'options.topology' is two_level, expected flat or automatic"));
    const longattn::parallel::RingPlan<Exec> automatic(uneven, 128 * P, 64, false);
    CHECK(automatic.outer_steps() == 1);
    CHECK(automatic.inner_steps() == 3);
  }
}

// On CUDA memory the ring's exchanges are NCCL groups that run one after the other on one
// stream, their messages paired by order. Host exchanges pair messages by order too, and
// serialized they also run one after the other: the GPU's schedule, run here. A message started
// in a different exchange than its partner would hang, two messages between the same ranks in a
// different order would mix up data.
TEMPLATE_LIST_TEST_CASE("ring attention runs with its exchanges serialized, as on an NCCL stream",
                        "[parallel][ring][serialized]", Spaces) {
  using Exec = TestType;
  const std::uint64_t seed = shared_seed();
  const int P = world().size();
  for (const int ranks_per_node : {0, 2}) {  // flat; two levels at 4 ranks (2 nodes x 2)
    auto options = longattn::test::throwing_options(ranks_per_node);
    options.serialize_exchanges = true;
    const Communicator comm = Communicator::world(options);
    const std::int64_t N = std::int64_t(2) * P * 64 * 2;
    longattn::BlockSparseShape shape;
    shape.queries = shape.keys = N;
    shape.heads = 2;
    for (const Sharding sharding : {Sharding::contiguous, Sharding::zigzag})
      for (const bool causal : {false, true}) {
        RingOptions ring;
        ring.sharding = sharding;
        ring.pieces = 2;
        INFO(comm.nodes() << " nodes, " << to_string(sharding) << (causal ? ", causal" : "") << ", seed " << seed);
        check_ring<Exec, double>(comm, 1, N, 2, 8, causal, ring, seed);
        const auto window = longattn::local_window_layout(Exec(), shape, 100, causal);
        check_ring<Exec, double>(comm, 1, N, 2, 8, causal, ring, seed + 1, &window);
        check_ring<Exec, longattn::bfloat16>(comm, 1, N, 2, 8, causal, ring, seed + 2);  // totals home in float
      }
  }
}

TEMPLATE_LIST_TEST_CASE("ring attention fails on every rank when one rank's input differs", "[parallel][ring][errors]",
                        Spaces) {
  using Exec = TestType;
  const Communicator comm = world();
  const int P = comm.size(), me = comm.rank();
  if (!longattn::test::several_ranks()) return;
  const Exec exec;
  // Rank 0 brings 192 tokens, the others 128: the plans would differ.
  const std::int64_t local = me == 0 ? 192 : 128;
  Tensor<float, typename Exec::memory_space> x("x", 1, local, 1, 8);
  Rows<float, typename Exec::memory_space> lse("lse", 1, 1, local);
  CHECK_THROWS_WITH(longattn::parallel::ring_attention_forward(exec, comm, longattn::AttentionInputs{x, x, x},
                                                               longattn::AttentionOutputs{x, lse}),
                    Catch::Contains("argument 'tokens' differs between ranks (from " + std::to_string(128 * P) +
                                    " to " + std::to_string(192 * P) + ")"));
  // The same plan everywhere, but the last rank's k is short: every rank fails, naming that rank.
  const longattn::parallel::RingPlan<Exec> plan(comm, 128 * P, 64, false);
  Tensor<float, typename Exec::memory_space> a("a", 1, 128, 1, 8), out("out", 1, 128, 1, 8),
      k("k", 1, me == P - 1 ? 64 : 128, 1, 8);
  Rows<float, typename Exec::memory_space> rows("rows", 1, 1, 128);
  const std::string prefix = me == P - 1 ? "" : "rank " + std::to_string(P - 1) + ": ";
  CHECK_THROWS_WITH(longattn::parallel::ring_attention_forward(exec, plan, longattn::AttentionInputs{a, k, a},
                                                               longattn::AttentionOutputs{out, rows}),
                    Catch::Contains(prefix + "argument 'k's extents' is [1, 64, 1, 8]"));
}
