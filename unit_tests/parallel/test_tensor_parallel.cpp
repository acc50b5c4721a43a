// Tensor parallelism under mpiexec: a MultiheadAttention split over the world (each rank H / P
// heads, column-parallel W_qkv, row-parallel W_out, the sub-LayerNorm's statistics summed over the
// ranks) computes what the whole layer computes on one rank - its output, the input's gradient
// and its part of every parameter gradient - in double, causal and not, with odd sizes (head dim
// 5, 37 tokens); with sequence parallelism each rank given its tokens computes its tokens of
// the output and the input's gradient (36 tokens); FeatureSplit's parts put back together give
// the whole tensor. Needs 2 or more ranks dividing 12 heads (2, 3, 4; SKIP otherwise).
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "longattn/core/multihead_attention.hpp"
#include "longattn/parallel/tensor_parallel.hpp"
#include "execution_spaces.hpp"
#include "mpi_test_support.hpp"

namespace {

using Spaces = longattn::test::MpiTestSpaces;

template <class View>
std::vector<double> host_values(const View& view) {
  std::vector<double> out(view.size());
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = double(host.data()[i]);
  return out;
}

// Largest |a - b| relative to max(1, |b|).
double max_error(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(1.0, std::abs(b[i])));
  return worst;
}

}  // namespace

TEST_CASE("FeatureSplit's parts put back together are the whole tensor", "[parallel][tensor_parallel]") {
  using longattn::FeatureSplit;
  for (const FeatureSplit split : {FeatureSplit::by_rows(6, 5, 3), FeatureSplit::by_columns(5, 6),
                                   FeatureSplit::whole(7)}) {
    std::vector<int> whole(split.whole_count()), back(whole.size(), -1);
    for (std::size_t i = 0; i < whole.size(); ++i) whole[i] = int(i);
    for (int p = 0; p < 3; ++p) {
      std::vector<int> part(split.part_count(3));
      split.extract(3, p, whole.data(), part.data());
      split.insert(3, p, part.data(), back.data());
      if (split.along == FeatureSplit::Along::columns) CHECK(part[0] == 2 * p);  // row 0's columns [2p, 2p + 2)
      if (split.along == FeatureSplit::Along::rows) CHECK(part[0] == 10 * p);    // block 0's rows [2p, 2p + 2)
    }
    CHECK(back == whole);
  }
  CHECK_THROWS_WITH(FeatureSplit::by_rows(5, 2).extract(2, 0, (const int*)nullptr, (int*)nullptr),
                    Catch::Contains("argument 'part' is 0, expected one of 2 parts that cut the tensor evenly"));
}

TEMPLATE_LIST_TEST_CASE("a MultiheadAttention split over the ranks computes the whole layer's output and gradients",
                        "[parallel][tensor_parallel]", Spaces) {
  using Exec = TestType;
  using T = double;
  using Module = longattn::MultiheadAttention<Exec, T>;
  const auto world = longattn::test::throwing_world();
  const int P = world.size(), H = 12, D = 5, E = H * D, B = 2;
  if (P == 1 || H % P != 0) {
    WARN("SKIP: needs 2, 3 or 4 MPI ranks (a divisor of 12 heads), the world has " << P);
    return;
  }
  const bool causal = GENERATE(false, true), sequence_parallel = GENERATE(false, true);
  const int N = sequence_parallel ? 36 : 37, S = sequence_parallel ? N / P : N;  // S: this rank's tokens
  INFO("causal " << causal << ", sequence parallel " << sequence_parallel << ", " << P << " ranks");
  longattn::MultiheadAttentionOptions options;
  options.causal = causal;
  options.gamma_init = 1.3;
  options.seed = longattn::test::shared_seed();
  const longattn::ExecutionContext<Exec> context;
  Module whole(context, E, H, options);
  const auto features = std::make_shared<longattn::parallel::TensorParallelGroup<Exec>>(world);
  options.sequence_parallel = sequence_parallel;
  Module part(context, E, H, options, features);
  REQUIRE(part.sequence_parallel() == sequence_parallel);
  REQUIRE(part.local_heads() == H / P);
  REQUIRE(part.parameter_count() < whole.parameter_count());

  std::mt19937_64 rng(options.seed + 1);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto random_tokens = [&] {
    typename Module::Tokens t("tokens", B, N, E);
    const auto host = Kokkos::create_mirror_view(t);
    for (std::size_t i = 0; i < host.size(); ++i) host.data()[i] = normal(rng);
    Kokkos::deep_copy(t, host);
    return t;
  };
  const auto x = random_tokens(), dy = random_tokens();
  // This rank's tokens [first, first + S) of each sequence (all of them without the split).
  const int first = sequence_parallel ? world.rank() * S : 0;
  auto mine = [&](const typename Module::Tokens& all) {
    typename Module::Tokens part_tokens("mine", B, S, E);
    Kokkos::deep_copy(part_tokens, Kokkos::subview(all, Kokkos::ALL, std::make_pair(first, first + S), Kokkos::ALL));
    return part_tokens;
  };
  typename Module::Tokens y_whole("y", B, N, E), y_part("y", B, S, E), dx_whole("dx", B, N, E), dx_part("dx", B, S, E);
  whole.forward(x, y_whole);
  whole.backward(dy, dx_whole);
  part.forward(mine(x), y_part);
  part.backward(mine(dy), dx_part);
  context.exec().fence();
  CHECK(max_error(host_values(y_part), host_values(mine(y_whole))) < 1e-12);
  CHECK(max_error(host_values(dx_part), host_values(mine(dx_whole))) < 1e-12);

  // This rank's part of each whole tensor: the weights (as initialized) and the gradients.
  const auto splits = part.feature_splits();
  auto check_part = [&](const char* name, const longattn::FeatureSplit& split, const auto& mine, const auto& all) {
    INFO(name);
    const std::vector<double> whole_values = host_values(all);
    std::vector<double> expected(split.part_count(P));
    split.extract(P, world.rank(), whole_values.data(), expected.data());
    CHECK(max_error(host_values(mine), expected) < 1e-12);
  };
  const auto& w = part.weights();
  const auto& g = part.weight_gradients();
  check_part("w_qkv", splits.w_qkv, w.w_qkv, whole.weights().w_qkv);
  check_part("w_out", splits.w_out, w.w_out, whole.weights().w_out);
  check_part("dW_qkv", splits.w_qkv, g.w_qkv, whole.weight_gradients().w_qkv);
  check_part("db_qkv", splits.b_qkv, g.b_qkv, whole.weight_gradients().b_qkv);
  check_part("dW_out", splits.w_out, g.w_out, whole.weight_gradients().w_out);
  check_part("db_out", splits.b_out, g.b_out, whole.weight_gradients().b_out);
  check_part("dgamma", splits.ln_gamma, g.ln_gamma, whole.weight_gradients().ln_gamma);
  check_part("dbeta", splits.ln_beta, g.ln_beta, whole.weight_gradients().ln_beta);
}

TEST_CASE("the sequence-parallel moves refuse shards and wholes that do not fit", "[parallel][tensor_parallel][errors]") {
  using Exec = Kokkos::DefaultHostExecutionSpace;
  using Tokens = Kokkos::View<float***, Kokkos::LayoutRight, Kokkos::HostSpace>;
  const auto world = longattn::test::throwing_world();
  const longattn::parallel::TensorParallelGroup<Exec> group(world);
  const longattn::ExecutionContext<Exec> context;
  const int P = world.size();
  const Tokens shard("shard", 2, 3, 4), wrong("whole", 2, 3 * P + 1, 4);
  const std::string expected = "argument 'whole's extents' is [2, " + std::to_string(3 * P + 1) +
                               ", 4], expected [B, P s, C] = [2, " + std::to_string(3 * P) + ", 4]";
  CHECK_THROWS_WITH(longattn::gather_sequence(context, group, shard, wrong), Catch::Contains(expected));
  CHECK_THROWS_WITH(longattn::reduce_scatter_sequence(context, group, wrong, shard), Catch::Contains(expected));
}

TEST_CASE("a MultiheadAttention refuses a tensor-parallel group that does not divide its heads",
          "[parallel][tensor_parallel][errors]") {
  using Exec = Kokkos::DefaultHostExecutionSpace;
  const auto world = longattn::test::throwing_world();
  if (world.size() == 1) {
    WARN("SKIP: needs 2 or more MPI ranks, the world has 1");
    return;
  }
  const auto features = std::make_shared<longattn::parallel::TensorParallelGroup<Exec>>(world);
  const int heads = world.size() + 1;
  CHECK_THROWS_WITH((longattn::MultiheadAttention<Exec, float>({}, 4 * heads, heads, {}, features)),
                    Catch::Contains("argument 'heads' is " + std::to_string(heads) + ", expected a multiple of the " +
                                    std::to_string(world.size()) + " ranks of the tensor-parallel group"));
  longattn::MultiheadAttentionOptions dilated;
  dilated.attention = longattn::parse_attention_spec("dilated:w=16;r=2");
  const int two_each = 2 * world.size();
  CHECK_THROWS_WITH((longattn::MultiheadAttention<Exec, float>({}, 4 * two_each, two_each, dilated, features)),
                    Catch::Contains("expected dense or block-sparse attention under tensor parallelism"));
}
