// Ring attention benchmarks under mpiexec (every rank runs each benchmark once; rank 0 reports):
//
//   BM_Ring/<N>/<causal>/<zigzag>/<backward>   B = 1, H = 8, D = 64, fp32, dense:
//       ring_s          the ring pass (forward, or forward + backward), the slowest rank's
//       single_s        the same per-rank work without communication: this rank's queries
//                       against the whole sequence, as one rank holding all of K and V would
//                       compute them (the ring's ideal)
//       efficiency      single_s / ring_s
//       compute_s       kernels (and packing), the slowest rank; compute_imbalance = slowest /
//                       fastest rank
//       wait_s          time in waits at step ends, the slowest rank: transfers not done yet,
//                       and the partner's slower compute
//       exposed_comm_s  ring_s - compute_s: what communication added to the slowest rank
//       transfers_s     the same transfers alone (no compute in between)
//       overlap_s       transfers_s - exposed_comm_s, at least 0: transfer time hidden by compute
//       MB_sent_per_rank, MB_off_node_per_rank   bytes sent, in all and to other nodes
//       two_level       1 when the ring has two levels (a group over several nodes of equal
//                       size; LONGATTN_RANKS_PER_NODE=2 simulates 2-rank nodes)
//   BM_RingMemory/<N>                          B = 1, H = 1, D = 64, forward + backward:
//       per-rank bytes (local tensors + the default pool's high-water mark during the passes)
//       over half the single-rank bytes (the whole tensors + the backward's Delta workspace)
//
//   OMP_NUM_THREADS=1 mpiexec -n 2 --bind-to core build/test/perf_tests/longattn_bench_ring
//   # 4 ranks as 2 nodes x 2, a check of the method (oversubscribed):
//   OMP_NUM_THREADS=1 LONGATTN_RANKS_PER_NODE=2 mpiexec -n 4 --oversubscribe --bind-to none
//       build/test/perf_tests/longattn_bench_ring --benchmark_filter='N:8192/'
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <Kokkos_Random.hpp>
#include <algorithm>
#include <string>
#include <vector>

#include "mpi_benchmark_main.hpp"
#include "longattn/core/runtime.hpp"
#include "longattn/parallel/placement.hpp"
#include "longattn/parallel/ring_attention.hpp"

namespace {

using Exec = Kokkos::DefaultHostExecutionSpace;  // ring attention exchanges host memory (MPI) for now
using Memory = Exec::memory_space;
using Tensor = Kokkos::View<float****, Kokkos::LayoutRight, Memory>;
using Rows = Kokkos::View<float***, Kokkos::LayoutRight, Memory>;
namespace parallel = longattn::parallel;

double max_over_ranks(double x) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return x;
}
double min_over_ranks(double x) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  return x;
}

// Seconds of f on the slowest rank, all ranks starting together.
template <class F>
double timed(F f) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  f();
  Kokkos::fence();
  return max_over_ranks(MPI_Wtime() - t0);
}

Tensor random_tensor(const char* label, int B, std::int64_t N, int H, int D, std::uint64_t seed) {
  Tensor t(std::string(label), B, N, H, D);
  Kokkos::Random_XorShift64_Pool<Exec> pool(seed);
  Kokkos::fill_random(t, pool, -1.0f, 1.0f);
  return t;
}

// The exchanges of a forward pass (`times` per piece: 2 for a backward pass, whose gradients
// travel too), with no compute in between: the plan's schedule, inner and outer rings.
double transfers_alone(const parallel::RingPlan<Exec>& plan, int B, int H, int D, int times) {
  const auto& comm = plan.group();
  const std::size_t largest = std::size_t(2) * B * plan.largest_piece() * H * D;
  std::vector<float> inner_out(largest), inner_in(largest), outer_out(largest), outer_in(largest);
  auto count = [&](int owner, int c) { return std::size_t(2) * B * plan.piece(owner, c).tokens * H * D; };
  const auto type = parallel::DataType::float32;
  return timed([&] {
    for (int c = 0; c < plan.rounds(); ++c)
      for (int o = 0; o < plan.outer_steps(); ++o)
        for (int t = 0; t < times; ++t) {
          parallel::Request outer_send, outer_receive;
          if (plan.sends_outer(o, c))
            outer_send = comm.isend(outer_out.data(), count(plan.owner_at(o, 0), c), type, plan.next_outer(), 22);
          if (plan.receives_outer(o, c))
            outer_receive = comm.irecv(outer_in.data(), count(plan.owner_at(o + 1, 0), c), type, plan.previous_outer(), 22);
          for (int s = 0; s < plan.inner_steps(); ++s) {
            parallel::Request send, receive;
            if (plan.sends_inner(o, s, c))
              send = comm.isend(inner_out.data(), count(plan.owner_at(o, s), c), type, plan.next_inner(), 21);
            if (plan.receives_inner(o, s, c))
              receive = comm.irecv(inner_in.data(), count(plan.owner_at(o, s + 1), c), type, plan.previous_inner(), 21);
            send.wait();
            receive.wait();
          }
          outer_send.wait();
          outer_receive.wait();
        }
  });
}

void BM_Ring(benchmark::State& state) {
  const std::int64_t N = state.range(0);
  const bool causal = state.range(1) != 0, backward = state.range(3) != 0;
  const int B = 1, H = 8, D = 64;
  const parallel::Communicator comm = parallel::Communicator::world();
  const int P = comm.size(), me = comm.rank();
  parallel::RingOptions ring;
  ring.sharding = state.range(2) ? parallel::Sharding::zigzag : parallel::Sharding::contiguous;
  const parallel::RingPlan<Exec> plan(comm, N, longattn::attention_block_size<Exec, float>(), causal, ring);
  const std::int64_t n = N / P;
  longattn::AttentionOptions opts;
  opts.causal = causal;

  const Tensor q = random_tensor("q", B, n, H, D, 1 + me), k = random_tensor("k", B, n, H, D, 11 + me),
               v = random_tensor("v", B, n, H, D, 21 + me), d_o = random_tensor("dO", B, n, H, D, 31 + me);
  Tensor o("o", B, n, H, D), dq("dq", B, n, H, D), dk("dk", B, n, H, D), dv("dv", B, n, H, D);
  Rows lse("lse", B, H, n);
  // The ideal: the same queries against the whole sequence on this rank, no communication.
  const Tensor k_all = random_tensor("K", B, N, H, D, 41), v_all = random_tensor("V", B, N, H, D, 51);
  Tensor dk_all("dK", B, N, H, D), dv_all("dV", B, N, H, D);
  const auto segments = plan.segments();

  double ring_s = 0, single_s = 0;
  for (auto _ : state) {
    plan.reset_timings();
    ring_s = timed([&] {
      parallel::ring_attention_forward(Exec(), plan, longattn::AttentionInputs{q, k, v},
                                       longattn::AttentionOutputs{o, lse}, opts);
      if (backward)
        parallel::ring_attention_backward(Exec(), plan, longattn::AttentionInputs{q, k, v},
                                          longattn::AttentionOutputs{o, lse}, d_o,
                                          longattn::AttentionGradients{dq, dk, dv}, opts);
    });
    single_s = timed([&] {
      for (const auto& s : segments) {
        auto seg_opts = opts;
        seg_opts.query_offset = s.global_begin;
        const auto q_seg = parallel::detail::token_range<1>(q, s.local_begin, s.tokens);
        const auto o_seg = parallel::detail::token_range<1>(o, s.local_begin, s.tokens);
        const auto lse_seg = parallel::detail::token_range<2>(lse, s.local_begin, s.tokens);
        longattn::attention_forward(Exec(), q_seg, k_all, v_all, o_seg, lse_seg, seg_opts);
        if (backward) {
          seg_opts.accumulate_gradients = true;
          longattn::attention_backward(Exec(), q_seg, k_all, v_all, o_seg,
                                       parallel::detail::token_range<1>(d_o, s.local_begin, s.tokens), lse_seg,
                                       parallel::detail::token_range<1>(dq, s.local_begin, s.tokens), dk_all, dv_all,
                                       seg_opts);
        }
      }
    });
    state.SetIterationTime(ring_s);
  }
  const auto& t = plan.timings();
  const double transfers = transfers_alone(plan, B, H, D, backward ? 2 : 1);
  const double compute = max_over_ranks(t.compute_seconds);
  const double exposed = std::max(0.0, ring_s - compute);
  state.counters["ranks"] = P;
  state.counters["ring_s"] = ring_s;
  state.counters["single_s"] = single_s;
  state.counters["efficiency"] = single_s / ring_s;
  state.counters["compute_s"] = compute;
  state.counters["compute_imbalance"] = compute / min_over_ranks(t.compute_seconds);
  state.counters["wait_s"] = max_over_ranks(t.wait_seconds);
  state.counters["exposed_comm_s"] = exposed;
  state.counters["transfers_s"] = transfers;
  state.counters["overlap_s"] = std::max(0.0, transfers - exposed);
  state.counters["MB_sent_per_rank"] = max_over_ranks(double(t.bytes_sent)) / 1e6;
  state.counters["MB_off_node_per_rank"] = max_over_ranks(double(t.bytes_sent_off_node)) / 1e6;
  state.counters["two_level"] = plan.two_level();
}

void BM_RingMemory(benchmark::State& state) {
  const std::int64_t N = state.range(0);
  const int B = 1, H = 1, D = 64;
  const parallel::Communicator comm = parallel::Communicator::world();
  const int P = comm.size(), me = comm.rank();
  const parallel::RingPlan<Exec> plan(comm, N, longattn::attention_block_size<Exec, float>(), false);
  const std::int64_t n = N / P;
  const Tensor q = random_tensor("q", B, n, H, D, 1 + me), k = random_tensor("k", B, n, H, D, 11 + me),
               v = random_tensor("v", B, n, H, D, 21 + me), d_o = random_tensor("dO", B, n, H, D, 31 + me);
  Tensor o("o", B, n, H, D), dq("dq", B, n, H, D), dk("dk", B, n, H, D), dv("dv", B, n, H, D);
  Rows lse("lse", B, H, n);
  auto& pool = longattn::memory::default_pool<Memory>();
  double high_water = 0;
  for (auto _ : state) {
    const std::size_t before = pool.stats().in_use_bytes;
    pool.reset_high_water();
    const double seconds = timed([&] {
      parallel::ring_attention_forward(Exec(), plan, longattn::AttentionInputs{q, k, v},
                                       longattn::AttentionOutputs{o, lse});
      parallel::ring_attention_backward(Exec(), plan, longattn::AttentionInputs{q, k, v},
                                        longattn::AttentionOutputs{o, lse}, d_o,
                                        longattn::AttentionGradients{dq, dk, dv});
    });
    high_water = max_over_ranks(double(pool.stats().in_use_high_water_bytes - before));
    state.SetIterationTime(seconds);
  }
  const double tensor = double(B) * H * D * sizeof(float), row = double(B) * H * sizeof(float);
  const double per_rank = 8 * tensor * double(n) + row * double(n) + high_water;
  // One rank's attention_backward: its Delta, a row per token (float dq sums in place).
  const double single = 8 * tensor * double(N) + row * double(N) + row * double(N);
  state.counters["ranks"] = P;
  state.counters["per_rank_MB"] = per_rank / 1e6;
  state.counters["ring_buffers_MB"] = high_water / 1e6;
  state.counters["single_rank_MB"] = single / 1e6;
  state.counters["per_rank_over_half_single"] = per_rank / (single / P);
}

void register_benchmarks() {
  // {N, causal, zigzag, backward}
  // 8K: quick, and what 4 oversubscribed ranks can afford (a check of the method, not a figure).
  for (const auto& args : std::vector<std::vector<std::int64_t>>{{8192, 0, 0, 1},
                                                                 {8192, 1, 0, 0},
                                                                 {8192, 1, 1, 0},
                                                                 {32768, 0, 0, 0},
                                                                 {32768, 0, 0, 1},
                                                                 {32768, 1, 0, 0},
                                                                 {32768, 1, 1, 0},
                                                                 {32768, 1, 1, 1}})
    benchmark::RegisterBenchmark("BM_Ring", BM_Ring)
        ->Args(args)
        ->ArgNames({"N", "causal", "zigzag", "backward"})
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kSecond);
  benchmark::RegisterBenchmark("BM_RingMemory", BM_RingMemory)
      ->Arg(65536)
      ->ArgName("N")
      ->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kSecond);
}

}  // namespace

int main(int argc, char** argv) { return longattn::bench::run_mpi_benchmarks(argc, argv, register_benchmarks); }
