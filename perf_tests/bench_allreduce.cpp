// All-reduce benchmarks under mpiexec (every rank runs the same benchmarks with fixed
// iteration counts; rank 0 reports):
//
//   BM_AllReduce/<bytes>     float sum, 4 KiB .. 256 MiB; each iteration runs every variant once:
//       MPI_Allreduce          the MPI library's own, on MPI_COMM_WORLD
//       flat                   Communicator::all_reduce
//       hierarchical           Communicator::hierarchical_all_reduce on the real nodes (one node
//                              here: it must fall back, and cost no more)
//       hierarchical_2nodes    the same with the ranks simulated as 2 nodes (4+ ranks)
//   BM_AllReduceNonblocking/<bytes>  MPI_Iallreduce + MPI_Wait, and Communicator::iall_reduce +
//                            wait() (apart from the blocking ones: right after a nonblocking
//                            collective a blocking one runs slower here)
//   BM_GradientSet/<E>       a transformer's 200 gradient tensors averaged over the ranks, E = 16
//                            (64 B to 4 KiB, 0.20 MB: latency-bound), 32 (0.78 MB), 128 (11.4 MB);
//                            each iteration runs:
//       one_by_one             one all_reduce per tensor
//       bucketed               GradientBuckets (25 MiB) over the tensors (copied in and out),
//                              marked ready in backward order (each bucket starts a nonblocking
//                              all-reduce when full), then wait()
//       bucketed_stored        the gradients stored in their buckets (no copies)
//       bucketed_stored_at_end no ready(): wait() reduces every bucket (blocking), as when there
//                              is no backward left to overlap
//       bucketed_stored_1MiB   as bucketed_stored, 1 MiB buckets
//       bucketed_stored_2nodes 25 MiB, hierarchical over simulated 2 nodes (4+ ranks)
//
// Timing: each variant between barriers, the slowest rank's time. The variants of a benchmark
// take turns within every iteration, so a shared machine's drift falls on all of them alike;
// counters give each variant's median (us) and its ratio to the first. busbw = bytes x 2 (P - 1)
// / P / time, what each rank moves in a ring all-reduce (nccl-tests' measure).
//
//   mpiexec -n 2 --bind-to none build/test/perf_tests/longattn_bench_allreduce
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mpi_benchmark_main.hpp"
#include "longattn/core/runtime.hpp"
#include "longattn/parallel/communicator.hpp"
#include "longattn/parallel/gradient_buckets.hpp"
#include "longattn/parallel/placement.hpp"

namespace {

using longattn::parallel::Communicator;
using longattn::parallel::CommunicatorOptions;
using longattn::parallel::DataType;
using longattn::parallel::ReduceOp;

int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

bool two_nodes_possible() { return world_size() >= 4 && world_size() % 2 == 0; }

Communicator communicator(bool two_nodes) {
  CommunicatorOptions options;
  if (two_nodes) options.ranks_per_node = world_size() / 2;
  return Communicator::world(options);
}

struct Variant {
  std::string name;
  std::function<void()> run;
  std::vector<double> seconds;
};

// Every iteration runs each variant once, between barriers; the time of a run is the slowest
// rank's. Reports each variant's median and its ratio to the first variant's.
void interleave(benchmark::State& state, std::vector<Variant>& variants) {
  for (auto _ : state) {
    double total = 0;
    for (Variant& v : variants) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      v.run();
      double elapsed = MPI_Wtime() - t0;
      MPI_Allreduce(MPI_IN_PLACE, &elapsed, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      v.seconds.push_back(elapsed);
      total += elapsed;
    }
    state.SetIterationTime(total);
  }
  auto median = [](std::vector<double> s) {
    std::nth_element(s.begin(), s.begin() + std::ptrdiff_t(s.size() / 2), s.end());
    return s[s.size() / 2];
  };
  const double first = median(variants.front().seconds);
  for (const Variant& v : variants) {
    const double m = median(v.seconds);
    state.counters[v.name + "_us"] = m * 1e6;
    if (&v != &variants.front()) state.counters[v.name + "_ratio"] = m / first;
  }
  state.counters["ranks"] = world_size();
}

void BM_AllReduce(benchmark::State& state) {
  const auto bytes = std::size_t(state.range(0));
  const std::size_t count = bytes / sizeof(float);
  const int P = world_size();
  const Communicator flat = communicator(false);
  const Communicator two_nodes = communicator(two_nodes_possible());
  std::vector<float> send(count, 1.0f), recv(count, 0.0f);
  std::vector<Variant> variants = {
      {"MPI_Allreduce", [&] { MPI_Allreduce(send.data(), recv.data(), int(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); }, {}},
      {"flat", [&] { flat.all_reduce(send.data(), recv.data(), count, DataType::float32, ReduceOp::sum); }, {}},
      {"hierarchical",
       [&] { flat.hierarchical_all_reduce(send.data(), recv.data(), count, DataType::float32, ReduceOp::sum); }, {}}};
  if (two_nodes_possible())
    variants.push_back({"hierarchical_2nodes", [&] {
                          two_nodes.hierarchical_all_reduce(send.data(), recv.data(), count, DataType::float32,
                                                            ReduceOp::sum);
                        }, {}});
  interleave(state, variants);
  if (recv[count - 1] != float(P)) state.SkipWithError("wrong result");
  state.counters["busbw_GBps_MPI"] = double(bytes) * 2.0 * (P - 1) / P / (state.counters["MPI_Allreduce_us"] * 1e-6) / 1e9;
}

// Nonblocking all-reduces apart: on this machine a blocking collective right after a
// nonblocking one runs slower, so the two kinds do not share a benchmark.
void BM_AllReduceNonblocking(benchmark::State& state) {
  const auto bytes = std::size_t(state.range(0));
  const std::size_t count = bytes / sizeof(float);
  const Communicator flat = communicator(false);
  std::vector<float> send(count, 1.0f), recv(count, 0.0f);
  std::vector<Variant> variants = {
      {"MPI_Iallreduce", [&] {
         MPI_Request request;
         MPI_Iallreduce(send.data(), recv.data(), int(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &request);
         MPI_Wait(&request, MPI_STATUS_IGNORE);
       }, {}},
      {"iall_reduce", [&] {
         flat.iall_reduce(send.data(), recv.data(), count, DataType::float32, ReduceOp::sum).wait();
       }, {}}};
  interleave(state, variants);
  if (recv[count - 1] != float(world_size())) state.SkipWithError("wrong result");
}

// A byte-level decoder-only transformer's gradients as separate tensors: 14 blocks of 14
// (LayerNorm weight and bias, QKV weight and bias, MAGNETO's sub-LayerNorm weight and bias,
// output projection weight and bias, LayerNorm weight and bias, MLP up and down weights and
// biases), the embedding, the final LayerNorm, the LM head: 200 tensors. E = 16: 64 B to 16 KiB
// (the embeddings; the blocks' tensors up to 4 KiB), 0.20 MB; E = 32: 128 B to 32 KiB, 0.78 MB;
// E = 128: 512 B to 256 KiB, 11.4 MB.
std::vector<std::size_t> gradient_set(std::size_t E) {
  const std::size_t V = 256;
  std::vector<std::size_t> counts = {V * E};
  for (int layer = 0; layer < 14; ++layer)
    for (const std::size_t n : {E, E, 3 * E * E, 3 * E, E, E, E * E, E, E, E, 4 * E * E, 4 * E, 4 * E * E, E})
      counts.push_back(n);
  counts.push_back(E);
  counts.push_back(E);
  counts.push_back(V * E);
  return counts;
}

void BM_GradientSet(benchmark::State& state) {
  const std::vector<std::size_t> counts = gradient_set(std::size_t(state.range(0)));
  std::vector<std::vector<float>> gradients;
  std::size_t total = 0;
  for (const std::size_t c : counts) {
    gradients.emplace_back(c, 1.0f);
    total += c;
  }
  const Communicator flat = communicator(false);
  const Communicator two_nodes = communicator(two_nodes_possible());
  // kept: the gradients above, copied in and out; stored: gradients living in their buckets.
  auto make_buckets = [&](const Communicator& comm, std::size_t bucket_bytes, bool hierarchical, bool stored) {
    longattn::parallel::GradientBucketOptions options;
    options.bucket_bytes = bucket_bytes;
    options.hierarchical = hierarchical;
    auto b = std::make_unique<longattn::parallel::GradientBuckets<>>(comm, options);
    for (auto& g : gradients) {
      if (stored) Kokkos::deep_copy(b->add<float>(g.size()), 1.0f);
      else b->add(g.data(), g.size());
    }
    return b;
  };
  const std::size_t MiB = std::size_t(1) << 20;
  auto kept = make_buckets(flat, 25 * MiB, false, false);
  auto stored = make_buckets(flat, 25 * MiB, false, true);
  auto stored_1mib = make_buckets(flat, MiB, false, true);
  auto stored_hierarchical = make_buckets(two_nodes, 25 * MiB, true, true);
  auto step = [&](longattn::parallel::GradientBuckets<>& b) {  // backward marks them ready as it goes
    for (std::size_t i = 0; i < b.gradients(); ++i) b.ready(int(i));
    b.wait();
  };
  std::vector<Variant> variants = {
      {"one_by_one", [&] {
         for (auto& g : gradients) flat.all_reduce(g.data(), g.data(), g.size(), DataType::float32, ReduceOp::average);
       }, {}},
      {"bucketed", [&] { step(*kept); }, {}},
      {"bucketed_stored", [&] { step(*stored); }, {}},
      {"bucketed_stored_at_end", [&] { stored->wait(); }, {}},
      {"bucketed_stored_1MiB", [&] { step(*stored_1mib); }, {}}};
  if (two_nodes_possible()) variants.push_back({"bucketed_stored_2nodes", [&] { step(*stored_hierarchical); }, {}});
  interleave(state, variants);
  if (gradients.back().back() != 1.0f) state.SkipWithError("wrong result");
  state.counters["tensors"] = double(counts.size());
  state.counters["MB"] = double(total * sizeof(float)) / 1e6;
}

// Fixed iteration counts (every rank must run the same), about 256 MiB moved per variant.
void register_benchmarks() {
  for (const auto& [name, function] : {std::pair{"BM_AllReduce", BM_AllReduce},
                                       std::pair{"BM_AllReduceNonblocking", BM_AllReduceNonblocking}})
    for (std::int64_t bytes = 4 << 10; bytes <= (std::int64_t(256) << 20); bytes *= 4)
      benchmark::RegisterBenchmark(name, function)
          ->Arg(bytes)
          ->Iterations(std::clamp<std::int64_t>((std::int64_t(256) << 20) / bytes, 5, 1000))
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
  for (const std::int64_t E : {16, 32, 128})
    benchmark::RegisterBenchmark("BM_GradientSet", BM_GradientSet)
        ->Arg(E)
        ->Iterations(E == 128 ? 100 : 400)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) { return longattn::bench::run_mpi_benchmarks(argc, argv, register_benchmarks); }
