// Dilated attention (both modes) against the naive double reference written from the
// definition: fresh random data, odd token counts (short final segments, segments longer than
// the sequence), head counts that do not divide by the rates, both causal settings, float and
// double, every enabled execution space. The reference's gradient is checked by central finite
// differences of the reference's forward, and the kernels' double gradient too; w = N, r = 1
// equals dense attention; invalid configurations throw.
#include <catch2/catch.hpp>

#include <random>
#include <sstream>
#include <string>

#include "bf16_dot_products.hpp"
#include "execution_spaces.hpp"
#include "longattn/core/attention.hpp"
#include "longattn/core/dilated_attention.hpp"
#include "reference/attention.hpp"
#include "reference/dilated.hpp"
#include "reference/random.hpp"
#include "reference/tensors.hpp"
#include "reference/test_size.hpp"
#include "team_tiles.hpp"

namespace {

using longattn::DilatedConfig;
using longattn::DilatedMode;
using longattn::test::HostRows;
using longattn::test::HostTensor;
using longattn::test::random_tensor;
using longattn::test::relative_error;
using longattn::test::to_device;
using longattn::test::to_host;
using longattn::test::gradient_tolerance;
using longattn::test::tolerance;

struct Case {
  int batch, tokens, heads, head_dim;
  std::vector<std::int64_t> w, r;
};

const Case cases[] = {
    {2, 203, 5, 16, {16, 48, 100}, {1, 2, 4}},  // short final segments; 5 heads over offsets mod 4
    {1, 150, 3, 32, {64, 192}, {2, 3}},         // no r = 1 (unselected pairs), a segment longer than N
    {1, 333, 2, 8, {150, 300}, {1, 2}},         // selected runs longer than one 64-token block
    {1, 97, 4, 24, {97}, {1}},                  // one configuration
    {2, 77, 3, 16, {10, 20, 40}, {5, 4, 8}},    // rates above the head count
};

std::string describe(const Case& c, DilatedMode mode, bool causal) {
  std::ostringstream out;
  out << "B " << c.batch << " N " << c.tokens << " H " << c.heads << " D " << c.head_dim << " w";
  for (auto x : c.w) out << " " << x;
  out << " r";
  for (auto x : c.r) out << " " << x;
  out << " " << longattn::to_string(mode) << (causal ? " causal" : "") << ", seed " << longattn::test::test_seed();
  return out.str();
}

longattn::test::ReferenceDilated reference_config(const Case& c, DilatedMode mode, bool causal) {
  return {c.w, c.r, mode == DilatedMode::head_groups, causal};
}

template <class ExecSpace, class T, class Tiles = longattn::DefaultTiles>
void check_against_reference(const Case& c, DilatedMode mode, bool causal, std::mt19937_64& rng) {
  using Memory = typename ExecSpace::memory_space;
  constexpr int team_size = longattn::tiles_for_t<ExecSpace, Tiles>::team_size;
  INFO(describe(c, mode, causal) << ", " << longattn::detail::scalar_name<T>() << ", team size " << team_size);
  const int B = c.batch, N = c.tokens, H = c.heads, D = c.head_dim;
  const HostTensor q = random_tensor<T>(B, N, H, D, rng), k = random_tensor<T>(B, N, H, D, rng);
  const HostTensor v = random_tensor<T>(B, N, H, D, rng), d_o = random_tensor<T>(B, N, H, D, rng);
  HostTensor o_ref("o", B, N, H, D), dq_ref("dq", B, N, H, D), dk_ref("dk", B, N, H, D), dv_ref("dv", B, N, H, D);
  HostRows lse_ref("lse", B, H, N);
  const auto ref = reference_config(c, mode, causal);
  longattn::test::reference_dilated_forward(q, k, v, o_ref, lse_ref, ref);
  longattn::test::reference_dilated_backward(q, k, v, d_o, dq_ref, dk_ref, dv_ref, ref);

  auto qd = to_device<T, Memory>(q), kd = to_device<T, Memory>(k), vd = to_device<T, Memory>(v);
  auto dod = to_device<T, Memory>(d_o);
  Kokkos::View<T****, Memory> o("o", B, N, H, D), dq("dq", B, N, H, D), dk("dk", B, N, H, D), dv("dv", B, N, H, D);
  Kokkos::View<longattn::accumulate_t<T>***, Memory> lse("lse", B, H, N);
  // Stale values everywhere: whatever the pattern leaves unselected must still come out right.
  Kokkos::deep_copy(o, T(7.0));
  Kokkos::deep_copy(lse, 7);
  Kokkos::deep_copy(dq, T(7.0));
  const DilatedConfig config{c.w, c.r, mode};
  longattn::AttentionOptions opts;
  opts.causal = causal;
  const ExecSpace exec;
  longattn::dilated_attention_forward<Tiles>(exec, qd, kd, vd, o, lse, config, opts);
  longattn::dilated_attention_backward<Tiles>(exec, qd, kd, vd, o, dod, lse, dq, dk, dv, config, opts);
  exec.fence();
  // In the 16-bit types o is rounded once per configuration merged into it and a gradient once
  // per pass that adds to it.
  // The bf16 tile and dot products round P and dS too (bf16_product_rounding).
  const double rounds = (longattn::is_half_v<T> ? double(c.w.size()) : 1) *
                        longattn::test::bf16_product_rounding<T, Memory>();
  CHECK(relative_error(to_host(o), o_ref) <= rounds * tolerance<T>());
  CHECK(relative_error(to_host(lse), lse_ref) <= tolerance<T>());
  CHECK(relative_error(to_host(dq), dq_ref) <= rounds * gradient_tolerance<T>());
  CHECK(relative_error(to_host(dk), dk_ref) <= rounds * gradient_tolerance<T>());
  CHECK(relative_error(to_host(dv), dv_ref) <= rounds * gradient_tolerance<T>());

  // accumulate_gradients adds to what dq, dk, dv hold.
  opts.accumulate_gradients = true;
  longattn::dilated_attention_backward<Tiles>(exec, qd, kd, vd, o, dod, lse, dq, dk, dv, config, opts);
  HostTensor twice("2 dk", B, N, H, D);
  for (std::size_t i = 0; i < twice.span(); ++i) twice.data()[i] = 2 * dk_ref.data()[i];
  CHECK(relative_error(to_host(dk), twice) <= (longattn::is_half_v<T> ? 2 * rounds : 1) * gradient_tolerance<T>());
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("dilated attention matches the reference from the definition, both modes",
                        "[core][dilated]", longattn::test::ExecutionSpaces) {
  std::mt19937_64 rng(longattn::test::test_seed());
  for (const Case& c : cases)
    for (DilatedMode mode : {DilatedMode::longnet, DilatedMode::head_groups}) {
      if (mode == DilatedMode::head_groups && std::size_t(c.heads) < c.w.size()) continue;
      for (bool causal : {false, true}) {
        check_against_reference<TestType, float>(c, mode, causal, rng);
        check_against_reference<TestType, double>(c, mode, causal, rng);
        check_against_reference<TestType, longattn::bfloat16>(c, mode, causal, rng);
        check_against_reference<TestType, longattn::float16>(c, mode, causal, rng);
      }
    }
}

// Both modes (merge_partial's kernel included), in the GPU's tile shape with teams of 2 and 4
// threads on the host; float and double (float only with LONGATTN_TEST_SIZE=small).
TEMPLATE_LIST_TEST_CASE("dilated attention in the GPU's tile shape with several threads per team matches the "
                        "reference",
                        "[core][dilated][team_tiles]", longattn::test::TeamTileConfigs) {
  if (!longattn::test::openmp_runs_team_of<TestType>()) return;
#ifdef KOKKOS_ENABLE_OPENMP
  std::mt19937_64 rng(longattn::test::test_seed());
  for (const Case& c : cases)
    for (DilatedMode mode : {DilatedMode::longnet, DilatedMode::head_groups}) {
      if (mode == DilatedMode::head_groups && std::size_t(c.heads) < c.w.size()) continue;
      for (bool causal : {false, true}) {
        check_against_reference<Kokkos::OpenMP, float, TestType>(c, mode, causal, rng);
        if (!longattn::test::small_test_sizes())
          check_against_reference<Kokkos::OpenMP, double, TestType>(c, mode, causal, rng);
      }
    }
#endif
}

TEMPLATE_LIST_TEST_CASE("dilated gradients match central finite differences", "[core][dilated]",
                        longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  std::mt19937_64 rng(longattn::test::test_seed());
  const int B = 1, N = 23, H = 3, D = 4;
  const Case c{B, N, H, D, {4, 8, 16}, {1, 2, 4}};
  for (DilatedMode mode : {DilatedMode::longnet, DilatedMode::head_groups})
    for (bool causal : {false, true}) {
      INFO(describe(c, mode, causal));
      const auto ref = reference_config(c, mode, causal);
      HostTensor q = random_tensor<double>(B, N, H, D, rng), k = random_tensor<double>(B, N, H, D, rng);
      HostTensor v = random_tensor<double>(B, N, H, D, rng);
      const HostTensor d_o = random_tensor<double>(B, N, H, D, rng);
      HostTensor dq_ref("dq", B, N, H, D), dk_ref("dk", B, N, H, D), dv_ref("dv", B, N, H, D);
      longattn::test::reference_dilated_backward(q, k, v, d_o, dq_ref, dk_ref, dv_ref, ref);

      auto qd = to_device<double, Memory>(q), kd = to_device<double, Memory>(k), vd = to_device<double, Memory>(v);
      auto dod = to_device<double, Memory>(d_o);
      Kokkos::View<double****, Memory> o("o", B, N, H, D), dq("dq", B, N, H, D), dk("dk", B, N, H, D), dv("dv", B, N, H, D);
      Kokkos::View<double***, Memory> lse("lse", B, H, N);
      const DilatedConfig config{c.w, c.r, mode};
      longattn::AttentionOptions opts;
      opts.causal = causal;
      longattn::dilated_attention_forward(TestType(), qd, kd, vd, o, lse, config, opts);
      longattn::dilated_attention_backward(TestType(), qd, kd, vd, o, dod, lse, dq, dk, dv, config, opts);
      const HostTensor dq_kernel = to_host(dq), dk_kernel = to_host(dk), dv_kernel = to_host(dv);

      // loss = sum(dO * O) of the reference forward, differentiated numerically.
      HostTensor o_ref("o", B, N, H, D);
      HostRows lse_ref("lse", B, H, N);
      auto loss = [&] {
        longattn::test::reference_dilated_forward(q, k, v, o_ref, lse_ref, ref);
        double sum = 0;
        for (std::size_t i = 0; i < o_ref.span(); ++i) sum += o_ref.data()[i] * d_o.data()[i];
        return sum;
      };
      auto check_gradient = [&](HostTensor& input, const HostTensor& reference, const HostTensor& kernel,
                                const char* name) {
        double worst_reference = 0, worst_kernel = 0;
        const double h = 1e-6;
        for (std::size_t i = 0; i < input.span(); ++i) {
          const double saved = input.data()[i];
          input.data()[i] = saved + h;
          const double up = loss();
          input.data()[i] = saved - h;
          const double down = loss();
          input.data()[i] = saved;
          const double numeric = (up - down) / (2 * h);
          worst_reference = std::max(worst_reference, std::abs(numeric - reference.data()[i]));
          worst_kernel = std::max(worst_kernel, std::abs(numeric - kernel.data()[i]));
        }
        INFO(name << ": largest |finite difference - reference| = " << worst_reference
                  << ", |finite difference - kernel| = " << worst_kernel);
        CHECK(worst_reference < 1e-7);
        CHECK(worst_kernel < 1e-7);
      };
      check_gradient(q, dq_ref, dq_kernel, "dq");
      check_gradient(k, dk_ref, dk_kernel, "dk");
      check_gradient(v, dv_ref, dv_kernel, "dv");
    }
}

TEMPLATE_LIST_TEST_CASE("dilated attention with w = N and r = 1 equals dense attention", "[core][dilated]",
                        longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  std::mt19937_64 rng(longattn::test::test_seed());
  const int B = 2, N = 141, H = 3, D = 32;
  for (bool causal : {false, true}) {
    INFO("N " << N << (causal ? " causal" : "") << ", seed " << longattn::test::test_seed());
    const HostTensor q = random_tensor<float>(B, N, H, D, rng), k = random_tensor<float>(B, N, H, D, rng);
    const HostTensor v = random_tensor<float>(B, N, H, D, rng), d_o = random_tensor<float>(B, N, H, D, rng);
    auto qd = to_device<float, Memory>(q), kd = to_device<float, Memory>(k), vd = to_device<float, Memory>(v);
    auto dod = to_device<float, Memory>(d_o);
    using F4 = Kokkos::View<float****, Memory>;
    using F3 = Kokkos::View<float***, Memory>;
    F4 o("o", B, N, H, D), dq("dq", B, N, H, D), dk("dk", B, N, H, D), dv("dv", B, N, H, D);
    F4 o_dense("o", B, N, H, D), dq_dense("dq", B, N, H, D), dk_dense("dk", B, N, H, D), dv_dense("dv", B, N, H, D);
    F3 lse("lse", B, H, N), lse_dense("lse", B, H, N);
    longattn::AttentionOptions opts;
    opts.causal = causal;
    for (DilatedMode mode : {DilatedMode::longnet, DilatedMode::head_groups}) {
      const DilatedConfig config{{N}, {1}, mode};
      longattn::dilated_attention_forward(TestType(), qd, kd, vd, o, lse, config, opts);
      longattn::dilated_attention_backward(TestType(), qd, kd, vd, o, dod, lse, dq, dk, dv, config, opts);
      longattn::attention_forward(TestType(), qd, kd, vd, o_dense, lse_dense, opts);
      longattn::attention_backward(TestType(), qd, kd, vd, o_dense, dod, lse_dense, dq_dense, dk_dense, dv_dense, opts);
      CHECK(relative_error(to_host(o), to_host(o_dense)) == 0);
      CHECK(relative_error(to_host(lse), to_host(lse_dense)) == 0);
      CHECK(relative_error(to_host(dq), to_host(dq_dense)) == 0);
      CHECK(relative_error(to_host(dk), to_host(dk_dense)) == 0);
      CHECK(relative_error(to_host(dv), to_host(dv_dense)) == 0);
    }
    HostTensor o_ref("o", B, N, H, D);
    HostRows lse_ref("lse", B, H, N);
    longattn::test::reference_attention_forward(q, k, v, o_ref, lse_ref, {0.0, causal, 0, 0, {}});
    CHECK(relative_error(to_host(o), o_ref) <= tolerance<float>());
  }
}

TEST_CASE("dilated attention score counts are linear in N", "[core][dilated]") {
  const DilatedConfig config{{2048, 4096, 8192}, {1, 2, 4}, DilatedMode::longnet};
  // Per head and full segment: (w / r)^2 scores, times the 1 / r of the heads at each offset.
  const double per_token = 2048.0 + 4096.0 / 2 / 2 + 8192.0 / 4 / 4;
  CHECK(longattn::dilated_attention_scores(32768, 8, config, false) == 8 * 32768 * per_token);
  CHECK(longattn::dilated_attention_scores(65536, 8, config, false) ==
        2 * longattn::dilated_attention_scores(32768, 8, config, false));
  const DilatedConfig groups{{2048, 4096, 8192}, {1, 2, 4}, DilatedMode::head_groups};
  // 8 heads in groups of 3, 3, 2: each group its own configuration, 1 / r of the tokens.
  CHECK(longattn::dilated_attention_scores(8192, 8, groups, false) ==
        3.0 * 4 * 2048 * 2048 + 3.0 * 2 * 2048 * 2048 + 2.0 * 2048 * 2048);
  CHECK_THROWS_WITH(longattn::dilated_attention_scores(-1, 8, config, false), Catch::Contains("'tokens' is -1"));
  CHECK_THROWS_WITH(longattn::dilated_attention_scores(8192, 0, config, false), Catch::Contains("'heads' is 0"));
  CHECK_THROWS_WITH(longattn::dilated_attention_workspace_bytes<float>(1, 8192, -8, 64, config),
                    Catch::Contains("'heads' is -8"));
}

TEST_CASE("dilated attention rejects invalid configurations with a longattn::Error", "[core][dilated][errors]") {
  using Host = Kokkos::DefaultHostExecutionSpace;
  using F4 = Kokkos::View<float****, Kokkos::HostSpace>;
  using F3 = Kokkos::View<float***, Kokkos::HostSpace>;
  const Host exec;
  F4 q("q", 1, 40, 2, 8), k("k", 1, 40, 2, 8), v("v", 1, 40, 2, 8), o("o", 1, 40, 2, 8);
  F3 lse("lse", 1, 2, 40);
  auto forward = [&](const DilatedConfig& config) { longattn::dilated_attention_forward(exec, q, k, v, o, lse, config); };
  CHECK_NOTHROW(forward({{8, 16}, {1, 2}, DilatedMode::longnet}));
  CHECK_THROWS_WITH(forward({{8, 16}, {1}, DilatedMode::longnet}),
                    Catch::Contains("'config.dilation_rates.size()' is 1, expected 2 (one rate per segment length)"));
  CHECK_THROWS_WITH(forward({{}, {}, DilatedMode::longnet}),
                    Catch::Contains("'config.segment_lengths.size()' is 0, expected at least one configuration"));
  CHECK_THROWS_WITH(forward({{8, 12}, {1, 5}, DilatedMode::longnet}),
                    Catch::Contains("'config.dilation_rates[1]' is 5, expected a divisor of config.segment_lengths[1] = 12"));
  CHECK_THROWS_WITH(forward({{0}, {1}, DilatedMode::longnet}), Catch::Contains("'config.segment_lengths[0]' is 0"));
  CHECK_THROWS_WITH(forward({{8, -16}, {1, 2}, DilatedMode::longnet}), Catch::Contains("'config.segment_lengths[1]' is -16"));
  CHECK_THROWS_WITH(forward({{8}, {0}, DilatedMode::longnet}), Catch::Contains("'config.dilation_rates[0]' is 0"));
  CHECK_THROWS_WITH(forward({{8}, {-2}, DilatedMode::longnet}), Catch::Contains("'config.dilation_rates[0]' is -2"));
  CHECK_THROWS_WITH(forward({{8, 16, 32}, {1, 2, 4}, DilatedMode::head_groups}),
                    Catch::Contains("'heads' is 2, expected at least 3 (one per configuration in head_groups mode)"));
  CHECK_THROWS_WITH(longattn::dilated_attention_forward(exec, q, F4("k", 1, 30, 2, 8), F4("v", 1, 30, 2, 8), o, lse,
                                                        DilatedConfig{{8}, {1}, DilatedMode::longnet}),
                    Catch::Contains("'k.extent(1)' is 30, expected 40 (q's token count"));
  longattn::AttentionOptions shifted;
  shifted.query_offset = 5;
  CHECK_THROWS_WITH(longattn::dilated_attention_forward(exec, q, k, v, o, lse, DilatedConfig{{8}, {1}, DilatedMode::longnet},
                                                        shifted),
                    Catch::Contains("'opts.query_offset' is 5, expected 0"));
  F4 dq("dq", 1, 40, 2, 8), dk("dk", 1, 40, 2, 8), dv("dv", 1, 40, 2, 8);
  CHECK_THROWS_WITH(longattn::dilated_attention_backward(exec, q, k, v, o, o, lse, dq, dk, dv,
                                                         DilatedConfig{{8, 12}, {1, 5}, DilatedMode::longnet}),
                    Catch::Contains("longattn::dilated_attention_backward"));
  CHECK_THROWS_WITH(longattn::dilated_attention_backward(exec, q, k, v, o, o, lse, dq, dq, dv,
                                                         DilatedConfig{{8}, {1}, DilatedMode::longnet}),
                    Catch::Contains("'dq' is overlapping dk"));
}
