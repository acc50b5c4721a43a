// Example 06: ring attention over the ranks of an MPI job. Every rank makes the same random
// sequence (one seed), keeps its zigzag shard of Q, K, V, and runs causal ring attention forward
// and backward; K/V pieces travel round the ring while the previous one is computed. Each rank
// then checks its shard of O, dQ, dK, dV against single-rank attention on the whole sequence
// (which a real run could not afford: that is why the ring exists).
//   mpiexec -n 2 build/ring_attention_example
#include <Kokkos_Core.hpp>
#include <Kokkos_Random.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "longattn/core/runtime.hpp"
#include "longattn/parallel/placement.hpp"
#include "longattn/parallel/ring_attention.hpp"

using Exec = Kokkos::DefaultHostExecutionSpace;  // the ring exchanges host memory through MPI
using Tensor = Kokkos::View<float****, Kokkos::LayoutRight, Exec::memory_space>;  // [B, N, H, D]
using Rows = Kokkos::View<float***, Kokkos::LayoutRight, Exec::memory_space>;     // [B, H, N]
namespace parallel = longattn::parallel;

// Largest |a - b| over this rank's shard, against the shard of the whole-sequence result.
double shard_difference(const Tensor& local, const Tensor& whole, int ranks, int rank, parallel::Sharding sharding) {
  Tensor expected("expected", local.extent(0), local.extent(1), local.extent(2), local.extent(3));
  parallel::shard(Exec(), whole, expected, ranks, rank, sharding);
  double worst = 0;
  for (std::size_t i = 0; i < local.span(); ++i)
    worst = std::max(worst, std::abs(double(local.data()[i]) - double(expected.data()[i])));
  return worst;
}

int main(int argc, char* argv[]) {
  parallel::MpiSession mpi(argc, argv);  // MPI first, then Kokkos
  longattn::ScopeGuard guard(argc, argv);
  {
    const parallel::Communicator world = parallel::Communicator::world();
    const int P = world.size(), rank = world.rank();
    const int B = 1, H = 4, D = 32, block = longattn::attention_block_size<Exec, float>();
    const std::int64_t N = 2 * P * 2 * block;  // zigzag: 2P chunks of two kernel blocks
    const std::int64_t n = N / P;               // tokens per rank

    // The whole sequence, the same on every rank.
    Kokkos::Random_XorShift64_Pool<Exec> random(2026);
    auto whole = [&](const char* label) {
      Tensor t(std::string(label), B, N, H, D);
      Kokkos::fill_random(t, random, -1.0f, 1.0f);
      return t;
    };
    const Tensor q = whole("q"), k = whole("k"), v = whole("v"), d_o = whole("dO");

    // This rank's shard: chunks rank and 2P-1-rank, so causal work is the same on every rank.
    parallel::RingOptions ring;
    ring.sharding = parallel::Sharding::zigzag;
    auto shard_of = [&](const Tensor& t) {
      Tensor local("local", B, n, H, D);
      parallel::shard(Exec(), t, local, P, rank, ring.sharding);
      return local;
    };
    const Tensor q_local = shard_of(q), k_local = shard_of(k), v_local = shard_of(v), d_o_local = shard_of(d_o);
    Tensor o_local("o", B, n, H, D), dq_local("dq", B, n, H, D), dk_local("dk", B, n, H, D), dv_local("dv", B, n, H, D);
    Rows lse_local("lse", B, H, n);

    // A plan says what each rank holds, computes and sends at every step; reuse it across steps.
    longattn::AttentionOptions opts;
    opts.causal = true;
    const parallel::RingPlan<Exec> plan(world, N, block, opts.causal, ring);
    parallel::ring_attention_forward(Exec(), plan, longattn::AttentionInputs{q_local, k_local, v_local},
                                     longattn::AttentionOutputs{o_local, lse_local}, opts);
    parallel::ring_attention_backward(Exec(), plan, longattn::AttentionInputs{q_local, k_local, v_local},
                                      longattn::AttentionOutputs{o_local, lse_local}, d_o_local,
                                      longattn::AttentionGradients{dq_local, dk_local, dv_local}, opts);

    // What one rank holding everything would compute.
    Tensor o("o whole", B, N, H, D), dq("dq whole", B, N, H, D), dk("dk whole", B, N, H, D), dv("dv whole", B, N, H, D);
    Rows lse("lse whole", B, H, N);
    longattn::attention_forward(Exec(), q, k, v, o, lse, opts);
    longattn::attention_backward(Exec(), q, k, v, o, d_o, lse, dq, dk, dv, opts);
    Exec().fence();
    double worst = 0;
    for (const auto& [local, full] : {std::pair{o_local, o}, std::pair{dq_local, dq}, std::pair{dk_local, dk},
                                      std::pair{dv_local, dv}})
      worst = std::max(worst, shard_difference(local, full, P, rank, ring.sharding));
    MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, world.mpi());

    const auto& timings = plan.timings();
    if (rank == 0) {
      std::printf("%lld tokens over %d ranks (zigzag, causal), %d pieces per rank, %s ring\n", (long long)N, P,
                  plan.rounds(), plan.two_level() ? "two-level" : "flat");
      std::printf("rank 0: computed %.3f s, waited %.3f s, sent %.1f MB\n", timings.compute_seconds,
                  timings.wait_seconds, double(timings.bytes_sent) / 1e6);
      std::printf(worst < 1e-4 ? "ring forward and backward match single-rank attention (max difference %.1e)\n"
                               : "MISMATCH: max difference %.1e\n",
                  worst);
    }
    if (worst >= 1e-4) return 1;
  }
  return 0;
}
