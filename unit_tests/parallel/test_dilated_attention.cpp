// Distributed dilated attention under mpiexec with 1 to 4 ranks: forward and backward equal core
// dilated attention over the whole sequence (same inputs from a shared seed), both modes, causal
// or not, with segments inside a shard (computed locally), spanning a few ranks, the whole
// sequence and longer than it, in double and (gathers and scatters in 16 bits) bfloat16;
// configurations the shards cannot carry and ranks that disagree
// are refused on every rank alike.
#include <mpi.h>

#include <catch2/catch.hpp>

#include <random>
#include <string>

#include "longattn/error.hpp"
#include "longattn/parallel/dilated_attention.hpp"
#include "longattn/parallel/sharding.hpp"
#include "execution_spaces.hpp"
#include "mpi_test_support.hpp"
#include "reference/random.hpp"
#include "reference/tensors.hpp"

namespace {

using longattn::DilatedConfig;
using longattn::DilatedMode;
using longattn::parallel::Communicator;

using Spaces = longattn::test::MpiTestSpaces;  // MPI on host memory, NCCL on CUDA memory
using longattn::test::Rows;
using longattn::test::Tensor;
using longattn::test::shared_seed;
using longattn::test::sum_over_ranks;
using longattn::test::tolerance;
Communicator world(int ranks_per_node = 0) { return longattn::test::throwing_world(ranks_per_node); }

template <class Exec, class T>
void check_dilated(const Communicator& comm, int B, std::int64_t N, int H, int D, const DilatedConfig& config,
                   bool causal, std::uint64_t seed) {
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
  longattn::dilated_attention_forward(exec, q, k, v, o, lse, config, opts);
  longattn::dilated_attention_backward(exec, q, k, v, o, d_o, lse, dq, dk, dv, config, opts);

  const std::int64_t S = N / P;
  using longattn::parallel::Sharding;
  auto local = [&](const Tensor<T, Memory>& g) {
    Tensor<T, Memory> l("local", B, S, H, D);
    longattn::parallel::shard(exec, g, l, P, me, Sharding::contiguous);
    return l;
  };
  const auto ql = local(q), kl = local(k), vl = local(v), dol = local(d_o);
  Tensor<T, Memory> ol("o", B, S, H, D), dql("dq", B, S, H, D), dkl("dk", B, S, H, D), dvl("dv", B, S, H, D);
  Rows<Lse, Memory> lsel("lse", B, H, S);
  longattn::parallel::dilated_attention_forward(exec, comm, longattn::AttentionInputs{ql, kl, vl},
                                                longattn::AttentionOutputs{ol, lsel}, config, opts);
  longattn::parallel::dilated_attention_backward(exec, comm, longattn::AttentionInputs{ql, kl, vl},
                                                 longattn::AttentionOutputs{ol, lsel}, dol,
                                                 longattn::AttentionGradients{dql, dkl, dvl}, config, opts);
  Tensor<T, Memory> o_all("o all", B, N, H, D), dq_all("dq all", B, N, H, D), dk_all("dk all", B, N, H, D),
      dv_all("dv all", B, N, H, D);
  Rows<Lse, Memory> lse_all("lse all", B, H, N);
  longattn::parallel::unshard(exec, comm, ol, o_all, Sharding::contiguous);
  longattn::parallel::unshard<2>(exec, comm, lsel, lse_all, Sharding::contiguous);
  longattn::parallel::unshard(exec, comm, dql, dq_all, Sharding::contiguous);
  longattn::parallel::unshard(exec, comm, dkl, dk_all, Sharding::contiguous);
  longattn::parallel::unshard(exec, comm, dvl, dv_all, Sharding::contiguous);
  using longattn::test::relative_error;
  using longattn::test::to_host;
  CHECK(relative_error(to_host(o_all), to_host(o)) <= tolerance<T>());
  CHECK(relative_error(to_host(lse_all), to_host(lse)) <= tolerance<Lse>());
  CHECK(relative_error(to_host(dq_all), to_host(dq)) <= 4 * tolerance<T>());
  CHECK(relative_error(to_host(dk_all), to_host(dk)) <= 4 * tolerance<T>());
  CHECK(relative_error(to_host(dv_all), to_host(dv)) <= 4 * tolerance<T>());
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("distributed dilated attention equals dilated attention over the whole sequence",
                        "[parallel][dilated]", Spaces) {
  const Communicator comm = world();
  const std::uint64_t seed = shared_seed();
  const int P = comm.size();
  const std::int64_t S = 24, N = S * P;
  // Local segments (S / 2, S), the whole sequence (spanning every rank), two shards (P even), and
  // one longer than the sequence; rates that divide S.
  std::vector<DilatedConfig> configs = {{{S / 2, S, N}, {1, 2, 4}, DilatedMode::longnet},
                                        {{2 * N}, {3}, DilatedMode::longnet},
                                        {{S, N}, {3, 2}, DilatedMode::head_groups}};
  if (P % 2 == 0) configs.push_back({{S, 2 * S}, {2, 3}, DilatedMode::longnet});
  for (const DilatedConfig& config : configs)
    for (const bool causal : {false, true}) {
      std::string lengths;
      for (std::size_t i = 0; i < config.segment_lengths.size(); ++i)
        lengths += " (" + std::to_string(config.segment_lengths[i]) + ", " + std::to_string(config.dilation_rates[i]) + ")";
      INFO(to_string(config.mode) << lengths << (causal ? ", causal" : "") << ", " << P << " ranks, seed " << seed);
      check_dilated<TestType, double>(comm, 2, N, 4, 8, config, causal, seed);
      check_dilated<TestType, float>(comm, 1, N, 3, 16, config, causal, seed + 1);
      check_dilated<TestType, longattn::bfloat16>(comm, 1, N, 2, 16, config, causal, seed + 2);
    }
}

TEMPLATE_LIST_TEST_CASE("distributed dilated attention refuses what the shards cannot carry, on every rank",
                        "[parallel][dilated][errors]", Spaces) {
  using Exec = TestType;
  const Communicator comm = world();
  const int P = comm.size(), me = comm.rank();
  if (!longattn::test::several_ranks()) return;  // one rank computes every configuration locally
  const Exec exec;
  const std::int64_t S = 24, N = S * P;
  Tensor<float, typename Exec::memory_space> x("x", 1, S, 2, 8), out("out", 1, S, 2, 8);
  Rows<float, typename Exec::memory_space> lse("lse", 1, 2, S);
  const DilatedConfig straddling{{36}, {1}, DilatedMode::longnet};  // neither divides nor spans whole shards
  CHECK_THROWS_WITH(longattn::parallel::dilated_attention_forward(exec, comm, longattn::AttentionInputs{x, x, x},
                                                                  longattn::AttentionOutputs{out, lse}, straddling),
                    Catch::Contains("argument 'config.segment_lengths[0]' is 36, expected a divisor of the 24 tokens "
                                    "per rank (computed locally)"));
  const DilatedConfig uneven_rate{{N}, {16}, DilatedMode::longnet};  // 16 does not divide 24
  if (N % 16 == 0)
    CHECK_THROWS_WITH(longattn::parallel::dilated_attention_forward(exec, comm, longattn::AttentionInputs{x, x, x},
                                                                    longattn::AttentionOutputs{out, lse}, uneven_rate),
                      Catch::Contains("argument 'config.dilation_rates[0]' is 16, expected a divisor of the 24 tokens "
                                      "per rank"));
  // One rank's shard differs: every rank fails.
  const std::int64_t mine = me == 0 ? 48 : 24;
  Tensor<float, typename Exec::memory_space> y("y", 1, mine, 2, 8), y_out("y out", 1, mine, 2, 8);
  Rows<float, typename Exec::memory_space> rows("rows", 1, 2, mine);
  const DilatedConfig whole{{4096}, {2}, DilatedMode::longnet};  // one segment, valid for both shard sizes
  CHECK_THROWS_WITH(longattn::parallel::dilated_attention_forward(exec, comm, longattn::AttentionInputs{y, y, y},
                                                                  longattn::AttentionOutputs{y_out, rows}, whole),
                    Catch::Contains("argument 'q.extent(1) (tokens per rank)' differs between ranks (from 24 to 48)"));
  // One rank's configuration differs.
  const DilatedConfig differing{{me == 0 ? S : N}, {2}, DilatedMode::longnet};
  CHECK_THROWS_WITH(longattn::parallel::dilated_attention_forward(exec, comm, longattn::AttentionInputs{x, x, x},
                                                                  longattn::AttentionOutputs{out, lse}, differing),
                    Catch::Contains("argument 'config.segment_lengths' differs between ranks"));
}
