// The fused attention kernels against the naive double-precision reference on fresh random
// data: odd sizes (no extent a multiple of the 64-token block), several head dims, Nq != Nk with
// global offsets, both causal settings, float, double, bfloat16 and float16, strided views, every enabled
// execution space. Gradients also by central finite differences; merge_partial by splitting
// the keys; rows that see no key; bad input.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bf16_dot_products.hpp"
#include "execution_spaces.hpp"
#include "longattn/core/attention.hpp"
#include "longattn/core/convert.hpp"
#include "longattn/core/merge_partial.hpp"
#include "reference/attention.hpp"
#include "reference/random.hpp"
#include "reference/tensors.hpp"
#include "team_tiles.hpp"

namespace {

using longattn::test::HostRows;
using longattn::test::HostTensor;
using longattn::test::random_tensor;
using longattn::test::relative_error;
using longattn::test::to_device;
using longattn::test::to_host;
using longattn::test::gradient_tolerance;
using longattn::test::tolerance;

struct Shape {
  int batch, queries, keys, heads, head_dim;
  std::int64_t query_offset = 0, key_offset = 0;
};

std::string describe(const Shape& s, bool causal) {
  std::ostringstream out;
  out << "B " << s.batch << " Nq " << s.queries << " Nk " << s.keys << " H " << s.heads << " D "
      << s.head_dim << " offsets " << s.query_offset << "/" << s.key_offset << (causal ? " causal" : "")
      << ", seed " << longattn::test::test_seed();
  return out.str();
}

longattn::AttentionOptions options(const Shape& s, bool causal) {
  longattn::AttentionOptions opts;
  opts.causal = causal;
  opts.query_offset = s.query_offset;
  opts.key_offset = s.key_offset;
  return opts;
}

longattn::test::ReferenceOptions reference_options(const Shape& s, bool causal) {
  return {0.0, causal, s.query_offset, s.key_offset, {}};
}

// Both forms of the backward pass (the one-pass form where the head dim allows it; the other tests
// take the automatic choice).
const longattn::BackwardPasses backward_forms[] = {longattn::BackwardPasses::two, longattn::BackwardPasses::one};

const Shape shapes[] = {
    {1, 1, 1, 1, 16},
    {2, 67, 67, 3, 16},
    {1, 130, 130, 2, 32},
    {2, 100, 37, 2, 64, 50, 20},
    {1, 70, 200, 1, 128, 150, 0},
    {1, 65, 129, 2, 20, 0, 64},  // causal: the first 64 queries see no key
    {1, 33, 47, 1, 256, 10, 0},  // the largest head dim
    {2, 5, 70, 2, 3},            // a head dim below every micro-tile
};

// Runs the forward pass and the backward pass in the given form (BackwardPasses::one for a head
// dim it does not take: checks the error instead) against the reference.
template <class ExecSpace, class T, class Tiles = longattn::DefaultTiles>
void check_forward_and_backward(const Shape& s, bool causal, std::mt19937_64& rng,
                                longattn::BackwardPasses passes = longattn::BackwardPasses::automatic) {
  using Memory = typename ExecSpace::memory_space;
  constexpr int team_size = longattn::tiles_for_t<ExecSpace, Tiles>::team_size;
  constexpr int multiple = longattn::attention_one_pass_head_dim_multiple<ExecSpace, T, Tiles>();
  INFO(describe(s, causal) << ", " << longattn::detail::scalar_name<T>() << ", team size " << team_size
                           << ", backward passes " << longattn::to_string(passes));
  const HostTensor q = random_tensor<T>(s.batch, s.queries, s.heads, s.head_dim, rng);
  const HostTensor k = random_tensor<T>(s.batch, s.keys, s.heads, s.head_dim, rng);
  const HostTensor v = random_tensor<T>(s.batch, s.keys, s.heads, s.head_dim, rng);
  const HostTensor d_o = random_tensor<T>(s.batch, s.queries, s.heads, s.head_dim, rng);
  HostTensor o_ref("o", s.batch, s.queries, s.heads, s.head_dim);
  HostRows lse_ref("lse", s.batch, s.heads, s.queries);
  HostTensor dq_ref("dq", s.batch, s.queries, s.heads, s.head_dim);
  HostTensor dk_ref("dk", s.batch, s.keys, s.heads, s.head_dim), dv_ref("dv", s.batch, s.keys, s.heads, s.head_dim);
  const auto ref_opts = reference_options(s, causal);
  longattn::test::reference_attention_forward(q, k, v, o_ref, lse_ref, ref_opts);
  longattn::test::reference_attention_backward(q, k, v, d_o, dq_ref, dk_ref, dv_ref, ref_opts);

  auto qd = to_device<T, Memory>(q), kd = to_device<T, Memory>(k), vd = to_device<T, Memory>(v);
  auto dod = to_device<T, Memory>(d_o);
  Kokkos::View<T****, Memory> o("o", s.batch, s.queries, s.heads, s.head_dim);
  Kokkos::View<longattn::accumulate_t<T>***, Memory> lse("lse", s.batch, s.heads, s.queries);
  Kokkos::View<T****, Memory> dq("dq", s.batch, s.queries, s.heads, s.head_dim);
  Kokkos::View<T****, Memory> dk("dk", s.batch, s.keys, s.heads, s.head_dim), dv("dv", s.batch, s.keys, s.heads, s.head_dim);
  const ExecSpace exec;
  auto opts = options(s, causal);
  opts.backward_passes = passes;
  longattn::attention_forward<Tiles>(exec, qd, kd, vd, o, lse, opts);
  if (passes == longattn::BackwardPasses::one && s.head_dim % multiple != 0) {
    CHECK_THROWS_WITH(longattn::attention_backward<Tiles>(exec, qd, kd, vd, o, dod, lse, dq, dk, dv, opts),
                      Catch::Contains("'opts.backward_passes' is one, expected two or automatic for head dim " +
                                      std::to_string(s.head_dim) + " (the one-pass form takes multiples of " +
                                      std::to_string(multiple) + ")"));
    return;
  }
  longattn::attention_backward<Tiles>(exec, qd, kd, vd, o, dod, lse, dq, dk, dv, opts);
  exec.fence();

  // On tensor cores (TensorCoreTiles on Kokkos::Cuda, for the head dims they take; 16-bit types,
  // float asks for them with allow_tf32 only) P and dS are rounded to the 16-bit type: twice the
  // tolerance, as test_tensor_cores.cpp's.
  const bool tensor_cores =
      longattn::is_half_v<T> &&
      longattn::detail::tensor_cores_compiled<ExecSpace, T, longattn::tiles_for_t<ExecSpace, Tiles>>();
  const double rounding = longattn::test::bf16_product_rounding<T, Memory>();
  const double forward_rounding =
      tensor_cores && longattn::detail::tensor_core::head_dim_supported<T>(s.head_dim, false) ? 2.0 : rounding;
  const double backward_rounding =
      tensor_cores && longattn::detail::tensor_core::head_dim_supported<T>(s.head_dim, true) ? 2.0 : rounding;
  CHECK(relative_error(to_host(o), o_ref) <= forward_rounding * tolerance<T>());
  CHECK(relative_error(to_host(lse), lse_ref) <= forward_rounding * tolerance<T>());
  CHECK(relative_error(to_host(dq), dq_ref) <= backward_rounding * gradient_tolerance<T>());
  CHECK(relative_error(to_host(dk), dk_ref) <= backward_rounding * gradient_tolerance<T>());
  CHECK(relative_error(to_host(dv), dv_ref) <= backward_rounding * gradient_tolerance<T>());
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("attention forward and backward match the double reference", "[core][attention]",
                        longattn::test::ExecutionSpaces) {
  std::mt19937_64 rng(longattn::test::test_seed());
  for (const Shape& s : shapes)
    for (bool causal : {false, true})
      for (auto passes : backward_forms) {
        check_forward_and_backward<TestType, float>(s, causal, rng, passes);
        check_forward_and_backward<TestType, double>(s, causal, rng, passes);
      }
}

// The GPU's shape of the kernels (the forward pass and both backward passes) on the host, teams of
// 2 and 4 threads: every shape, both causal settings, each storage type (bfloat16 on the CPU's
// bf16 dot products where it has them, their products shared out by the team's threads; its
// float path is float's team code).
TEMPLATE_LIST_TEST_CASE("attention in the GPU's tile shape with several threads per team matches the reference",
                        "[core][attention][team_tiles]", longattn::test::TeamTileConfigs) {
  if (!longattn::test::openmp_runs_team_of<TestType>()) return;
#ifdef KOKKOS_ENABLE_OPENMP
  std::mt19937_64 rng(longattn::test::test_seed());
  for (const Shape& s : shapes)
    for (bool causal : {false, true})
      for (auto passes : {longattn::BackwardPasses::two, longattn::BackwardPasses::one}) {
        check_forward_and_backward<Kokkos::OpenMP, float, TestType>(s, causal, rng, passes);
        check_forward_and_backward<Kokkos::OpenMP, double, TestType>(s, causal, rng, passes);
        using longattn::test::Bf16Path;
        for (Bf16Path path : {Bf16Path::dot_products, Bf16Path::tile_products}) {
          if (!longattn::test::available(path)) continue;  // [half] says SKIP
          INFO(longattn::test::to_string(path));
          const longattn::test::Bf16Products use(path);
          check_forward_and_backward<Kokkos::OpenMP, longattn::bfloat16, TestType>(s, causal, rng, passes);
        }
      }
#endif
}

TEST_CASE("a team larger than the execution space can run is a longattn::Error", "[core][attention][errors]") {
  using Exec = Kokkos::DefaultHostExecutionSpace;
  const Kokkos::View<float****, Kokkos::HostSpace> q("q", 1, 70, 1, 8), o("o", 1, 70, 1, 8);
  const Kokkos::View<float***, Kokkos::HostSpace> lse("lse", 1, 1, 70);
  CHECK_THROWS_WITH(longattn::attention_forward<longattn::ThreadTiles<4096>>(Exec(), q, q, q, o, lse),
                    Catch::Contains("'Tiles::team_size' is 4096, expected at most"));
}

// The 16-bit types: inputs rounded to them (the reference sees the rounded values), float
// accumulation, outputs rounded once; lse in float. bfloat16 on a host space runs on each path:
// float values, and where the CPU has them its bf16 tile and dot products (probabilities and dS
// rounded to bf16).
TEMPLATE_LIST_TEST_CASE("bfloat16 and float16 attention match the double reference within their rounding",
                        "[core][attention][half]", longattn::test::ExecutionSpaces) {
  using longattn::test::Bf16Path;
  std::mt19937_64 rng(longattn::test::test_seed());
  const bool host = std::is_same_v<typename TestType::memory_space, Kokkos::HostSpace>;
  for (Bf16Path path : {Bf16Path::float_values, Bf16Path::dot_products, Bf16Path::tile_products}) {
    if (path != Bf16Path::float_values && !host) continue;  // device spaces have one path
    if (!longattn::test::available(path)) {
      WARN(longattn::test::missing(path));
      continue;
    }
    const longattn::test::Bf16Products use(path);
    for (const Shape& s : shapes)
      for (bool causal : {false, true})
        for (auto passes : {longattn::BackwardPasses::two, longattn::BackwardPasses::one}) {
          INFO(longattn::test::to_string(path));
          check_forward_and_backward<TestType, longattn::bfloat16>(s, causal, rng, passes);
          if (path == Bf16Path::float_values) check_forward_and_backward<TestType, longattn::float16>(s, causal, rng, passes);
        }
  }
}

TEMPLATE_LIST_TEST_CASE("output_scale scales o and its gradients; accumulate_gradients adds to them",
                        "[core][attention]", longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  std::mt19937_64 rng(longattn::test::test_seed());
  const Shape s{2, 77, 90, 2, 32, 20, 0};  // a head dim both backward forms take
  const double c = -0.375;
  for (bool causal : {false, true})
    for (auto passes : {longattn::BackwardPasses::two, longattn::BackwardPasses::one}) {
    INFO(describe(s, causal) << ", output_scale " << c << ", backward passes " << longattn::to_string(passes));
    const HostTensor q = random_tensor<double>(2, 77, 2, 32, rng), k = random_tensor<double>(2, 90, 2, 32, rng);
    const HostTensor v = random_tensor<double>(2, 90, 2, 32, rng), d_o = random_tensor<double>(2, 77, 2, 32, rng);
    HostTensor o_ref("o", 2, 77, 2, 32), dq_ref("dq", 2, 77, 2, 32), dk_ref("dk", 2, 90, 2, 32), dv_ref("dv", 2, 90, 2, 32);
    HostRows lse_ref("lse", 2, 2, 77);
    longattn::test::reference_attention_forward(q, k, v, o_ref, lse_ref, reference_options(s, causal));
    longattn::test::reference_attention_backward(q, k, v, d_o, dq_ref, dk_ref, dv_ref, reference_options(s, causal));
    // d(c O) / d(q, k, v) for upstream dO is c times the unscaled gradients; lse is unchanged.
    for (const HostTensor& t : {o_ref, dq_ref, dk_ref, dv_ref})
      for (std::size_t i = 0; i < t.span(); ++i) t.data()[i] *= c;

    auto qd = to_device<double, Memory>(q), kd = to_device<double, Memory>(k), vd = to_device<double, Memory>(v);
    auto dod = to_device<double, Memory>(d_o);
    Kokkos::View<double****, Memory> o("o", 2, 77, 2, 32), dq("dq", 2, 77, 2, 32), dk("dk", 2, 90, 2, 32), dv("dv", 2, 90, 2, 32);
    Kokkos::View<double***, Memory> lse("lse", 2, 2, 77);
    auto opts = options(s, causal);
    opts.output_scale = c;
    opts.backward_passes = passes;
    longattn::attention_forward(TestType(), qd, kd, vd, o, lse, opts);
    longattn::attention_backward(TestType(), qd, kd, vd, o, dod, lse, dq, dk, dv, opts);
    CHECK(relative_error(to_host(o), o_ref) <= tolerance<double>());
    CHECK(relative_error(to_host(lse), lse_ref) <= tolerance<double>());
    CHECK(relative_error(to_host(dq), dq_ref) <= tolerance<double>());
    CHECK(relative_error(to_host(dk), dk_ref) <= tolerance<double>());
    CHECK(relative_error(to_host(dv), dv_ref) <= tolerance<double>());

    opts.accumulate_gradients = true;
    longattn::attention_backward(TestType(), qd, kd, vd, o, dod, lse, dq, dk, dv, opts);
    for (const HostTensor& t : {dq_ref, dk_ref, dv_ref})
      for (std::size_t i = 0; i < t.span(); ++i) t.data()[i] *= 2;
    CHECK(relative_error(to_host(dq), dq_ref) <= tolerance<double>());
    CHECK(relative_error(to_host(dk), dk_ref) <= tolerance<double>());
    CHECK(relative_error(to_host(dv), dv_ref) <= tolerance<double>());
  }
}

TEMPLATE_LIST_TEST_CASE("attention reads and writes strided views without copies", "[core][attention]",
                        longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  using Strided4 = Kokkos::View<float****, Kokkos::LayoutStride, Memory>;
  using Strided3 = Kokkos::View<float***, Kokkos::LayoutStride, Memory>;
  std::mt19937_64 rng(longattn::test::test_seed());
  // Every r-th token from `first` of a longer sequence: a dilated segment, as LongNet takes it.
  const int B = 2, N = 75, H = 2, D = 32, r = 3, first = 1, total = first + r * N + 2;
  const Shape s{B, N, N, H, D, 7, 0};
  for (bool causal : {false, true}) {
    INFO(describe(s, causal));
    HostTensor q_all = random_tensor<float>(B, total, H, D, rng), k_all = random_tensor<float>(B, total, H, D, rng);
    HostTensor v_all = random_tensor<float>(B, total, H, D, rng);
    auto qd = to_device<float, Memory>(q_all), kd = to_device<float, Memory>(k_all), vd = to_device<float, Memory>(v_all);
    Kokkos::View<float****, Memory> o_all("o", B, total, H, D);
    Kokkos::View<float***, Memory> lse_all("lse", B, H, total);
    Kokkos::deep_copy(o_all, 42.0f);
    Kokkos::deep_copy(lse_all, 42.0f);
    auto every_r = [&](auto all) {
      const Kokkos::LayoutStride layout(B, all.stride(0), N, r * all.stride(1), H, all.stride(2), D, all.stride(3));
      return Strided4(all.data() + first * all.stride(1), layout);
    };
    const Strided3 lse(lse_all.data() + first * lse_all.stride(2),
                       Kokkos::LayoutStride(B, lse_all.stride(0), H, lse_all.stride(1), N, r * lse_all.stride(2)));
    longattn::attention_forward(TestType(), every_r(qd), every_r(kd), every_r(vd), every_r(o_all), lse,
                                options(s, causal));
    TestType().fence();

    HostTensor q("q", B, N, H, D), k("k", B, N, H, D), v("v", B, N, H, D), o_ref("o", B, N, H, D);
    HostRows lse_ref("lse", B, H, N);
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < N; ++i)
        for (int h = 0; h < H; ++h)
          for (int d = 0; d < D; ++d) {
            q(b, i, h, d) = q_all(b, first + r * i, h, d);
            k(b, i, h, d) = k_all(b, first + r * i, h, d);
            v(b, i, h, d) = v_all(b, first + r * i, h, d);
          }
    longattn::test::reference_attention_forward(q, k, v, o_ref, lse_ref, reference_options(s, causal));
    const HostTensor o_host = to_host(o_all);
    const HostRows lse_host = to_host(lse_all);
    HostTensor o("o", B, N, H, D);
    HostRows lse_picked("lse", B, H, N);
    bool untouched_elsewhere = true;
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < total; ++t) {
        const bool picked = t >= first && (t - first) % r == 0 && (t - first) / r < N;
        for (int h = 0; h < H; ++h) {
          if (picked) lse_picked(b, h, (t - first) / r) = lse_host(b, h, t);
          else untouched_elsewhere = untouched_elsewhere && lse_host(b, h, t) == 42.0;
          for (int d = 0; d < D; ++d) {
            if (picked) o(b, (t - first) / r, h, d) = o_host(b, t, h, d);
            else untouched_elsewhere = untouched_elsewhere && o_host(b, t, h, d) == 42.0;
          }
        }
      }
    CHECK(untouched_elsewhere);
    CHECK(relative_error(o, o_ref) <= tolerance<float>());
    CHECK(relative_error(lse_picked, lse_ref) <= tolerance<float>());
  }
}

TEMPLATE_LIST_TEST_CASE("attention takes LayoutLeft views (head dim not contiguous)", "[core][attention]",
                        longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  std::mt19937_64 rng(longattn::test::test_seed());
  const Shape s{1, 90, 70, 3, 24};
  INFO(describe(s, true));
  const HostTensor q = random_tensor<double>(1, 90, 3, 24, rng), k = random_tensor<double>(1, 70, 3, 24, rng);
  const HostTensor v = random_tensor<double>(1, 70, 3, 24, rng);
  HostTensor o_ref("o", 1, 90, 3, 24);
  HostRows lse_ref("lse", 1, 3, 90);
  longattn::test::reference_attention_forward(q, k, v, o_ref, lse_ref, reference_options(s, true));
  using Left4 = Kokkos::View<double****, Kokkos::LayoutLeft, Memory>;
  Left4 ql("q", 1, 90, 3, 24), kl("k", 1, 70, 3, 24), vl("v", 1, 70, 3, 24), ol("o", 1, 90, 3, 24);
  Kokkos::deep_copy(ql, to_device<double, Memory>(q));
  Kokkos::deep_copy(kl, to_device<double, Memory>(k));
  Kokkos::deep_copy(vl, to_device<double, Memory>(v));
  Kokkos::View<double***, Kokkos::LayoutLeft, Memory> lse("lse", 1, 3, 90);
  longattn::attention_forward(TestType(), ql, kl, vl, ol, lse, options(s, true));
  CHECK(relative_error(to_host(ol), o_ref) <= tolerance<double>());
  CHECK(relative_error(to_host(lse), lse_ref) <= tolerance<double>());
}

TEMPLATE_LIST_TEST_CASE("attention gradients match central finite differences", "[core][attention]",
                        longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  std::mt19937_64 rng(longattn::test::test_seed());
  const Shape s{1, 9, 11, 2, 32, 3, 0};  // a head dim both backward forms take
  for (bool causal : {false, true})
    for (auto passes : {longattn::BackwardPasses::two, longattn::BackwardPasses::one}) {
    INFO(describe(s, causal) << ", backward passes " << longattn::to_string(passes));
    auto opts = options(s, causal);
    opts.backward_passes = passes;
    auto q = to_device<double, Memory>(random_tensor<double>(1, 9, 2, 32, rng));
    auto k = to_device<double, Memory>(random_tensor<double>(1, 11, 2, 32, rng));
    auto v = to_device<double, Memory>(random_tensor<double>(1, 11, 2, 32, rng));
    const HostTensor d_o = random_tensor<double>(1, 9, 2, 32, rng);
    auto dod = to_device<double, Memory>(d_o);
    Kokkos::View<double****, Memory> o("o", 1, 9, 2, 32), dq("dq", 1, 9, 2, 32), dk("dk", 1, 11, 2, 32), dv("dv", 1, 11, 2, 32);
    Kokkos::View<double***, Memory> lse("lse", 1, 2, 9);
    longattn::attention_forward(TestType(), q, k, v, o, lse, opts);
    longattn::attention_backward(TestType(), q, k, v, o, dod, lse, dq, dk, dv, opts);

    // loss = sum(dO * O): its gradient is what attention_backward returns for upstream dO.
    auto loss = [&] {
      longattn::attention_forward(TestType(), q, k, v, o, lse, opts);
      const HostTensor out = to_host(o);
      double sum = 0;
      for (std::size_t i = 0; i < out.span(); ++i) sum += out.data()[i] * d_o.data()[i];
      return sum;
    };
    auto check_gradient = [&](auto input, auto gradient, const char* name) {
      const HostTensor analytic = to_host(gradient);
      const double worst = longattn::test::finite_difference_error(
          input, loss, [&](std::size_t i) { return analytic.data()[i]; });
      INFO(name << ": largest |finite difference - analytic| = " << worst);
      CHECK(worst < 1e-7);
    };
    check_gradient(q, dq, "dq");
    check_gradient(k, dk, "dk");
    check_gradient(v, dv, "dv");
  }
}

// The one-pass form sums dQ in place when dq holds the accumulation type with the head dim
// contiguous, else in a workspace added into dq at the end: here LayoutLeft float dq, with
// accumulate_gradients (the 16-bit tests above take the workspace too); and both forms give the
// same results every time (no atomics).
TEMPLATE_LIST_TEST_CASE("the one-pass backward sums dQ in place or in a workspace, deterministically",
                        "[core][attention]", longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  std::mt19937_64 rng(longattn::test::test_seed());
  const Shape s{2, 90, 70, 3, 64, 30, 0};
  for (bool causal : {false, true}) {
    INFO(describe(s, causal));
    const HostTensor q = random_tensor<float>(2, 90, 3, 64, rng), k = random_tensor<float>(2, 70, 3, 64, rng);
    const HostTensor v = random_tensor<float>(2, 70, 3, 64, rng), d_o = random_tensor<float>(2, 90, 3, 64, rng);
    HostTensor o_ref("o", 2, 90, 3, 64), dq_ref("dq", 2, 90, 3, 64), dk_ref("dk", 2, 70, 3, 64), dv_ref("dv", 2, 70, 3, 64);
    HostRows lse_ref("lse", 2, 3, 90);
    longattn::test::reference_attention_forward(q, k, v, o_ref, lse_ref, reference_options(s, causal));
    longattn::test::reference_attention_backward(q, k, v, d_o, dq_ref, dk_ref, dv_ref, reference_options(s, causal));
    using Left4 = Kokkos::View<float****, Kokkos::LayoutLeft, Memory>;
    Left4 ql("q", 2, 90, 3, 64), kl("k", 2, 70, 3, 64), vl("v", 2, 70, 3, 64), dol("do", 2, 90, 3, 64);
    Kokkos::deep_copy(ql, to_device<float, Memory>(q));
    Kokkos::deep_copy(kl, to_device<float, Memory>(k));
    Kokkos::deep_copy(vl, to_device<float, Memory>(v));
    Kokkos::deep_copy(dol, to_device<float, Memory>(d_o));
    Left4 o("o", 2, 90, 3, 64), dq("dq", 2, 90, 3, 64), dk("dk", 2, 70, 3, 64), dv("dv", 2, 70, 3, 64);
    Kokkos::View<float***, Memory> lse("lse", 2, 3, 90);
    auto opts = options(s, causal);
    opts.backward_passes = longattn::BackwardPasses::one;
    longattn::attention_forward(TestType(), ql, kl, vl, o, lse, opts);
    longattn::attention_backward(TestType(), ql, kl, vl, o, dol, lse, dq, dk, dv, opts);
    CHECK(relative_error(to_host(dq), dq_ref) <= gradient_tolerance<float>());
    CHECK(relative_error(to_host(dk), dk_ref) <= gradient_tolerance<float>());
    const HostTensor dq_once = to_host(dq);
    opts.accumulate_gradients = true;
    longattn::attention_backward(TestType(), ql, kl, vl, o, dol, lse, dq, dk, dv, opts);
    HostTensor dq_twice("dq", 2, 90, 3, 64);
    for (std::size_t i = 0; i < dq_ref.span(); ++i) dq_twice.data()[i] = 2 * dq_ref.data()[i];
    CHECK(relative_error(to_host(dq), dq_twice) <= gradient_tolerance<float>());

    // Each form twice: bitwise the same results.
    opts.accumulate_gradients = false;
    for (auto passes : {longattn::BackwardPasses::two, longattn::BackwardPasses::one}) {
      opts.backward_passes = passes;
      Left4 dq2("dq", 2, 90, 3, 64), dk2("dk", 2, 70, 3, 64), dv2("dv", 2, 70, 3, 64);
      longattn::attention_backward(TestType(), ql, kl, vl, o, dol, lse, dq, dk, dv, opts);
      longattn::attention_backward(TestType(), ql, kl, vl, o, dol, lse, dq2, dk2, dv2, opts);
      bool same = true;
      for (auto [a, b] : {std::pair(to_host(dq), to_host(dq2)), std::pair(to_host(dk), to_host(dk2)),
                          std::pair(to_host(dv), to_host(dv2))})
        for (std::size_t i = 0; i < a.span(); ++i) same = same && a.data()[i] == b.data()[i];
      INFO("backward passes " << longattn::to_string(passes));
      CHECK(same);
    }
  }
}

TEMPLATE_LIST_TEST_CASE("head-major copies give the in-place results bit for bit, in the workspace documented",
                        "[core][attention]", longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  constexpr bool host = Kokkos::SpaceAccessibility<TestType, Kokkos::HostSpace>::accessible;
  std::mt19937_64 rng(longattn::test::test_seed());
  const Shape s{2, 130, 77, 3, 64, 60, 0};
  const HostTensor q = random_tensor<float>(2, 130, 3, 64, rng), k = random_tensor<float>(2, 77, 3, 64, rng);
  const HostTensor v = random_tensor<float>(2, 77, 3, 64, rng), d_o = random_tensor<float>(2, 130, 3, 64, rng);
  const auto qd = to_device<float, Memory>(q), kd = to_device<float, Memory>(k), vd = to_device<float, Memory>(v);
  const auto dod = to_device<float, Memory>(d_o);
  const longattn::memory::Pool<Memory> pool;
  const longattn::ExecutionContext<TestType> context(TestType(), pool);
  struct Results {
    HostTensor o, dq, dk, dv;
    HostRows lse;
    std::size_t forward_bytes, backward_bytes;  // the pool's high-water mark in each pass
  };
  auto run = [&](bool copies, bool causal, longattn::BackwardPasses passes) {
    // [B, N, H, D] with the head dim contiguous (a device's default layout is LayoutLeft, whose dq
    // the one-pass form sums in a workspace).
    using Tensor = Kokkos::View<float****, Kokkos::LayoutRight, Memory>;
    Tensor o("o", 2, 130, 3, 64), dq("dq", 2, 130, 3, 64);
    Tensor dk("dk", 2, 77, 3, 64), dv("dv", 2, 77, 3, 64);
    Kokkos::View<float***, Memory> lse("lse", 2, 3, 130);
    auto opts = options(s, causal);
    opts.backward_passes = passes;
    opts.head_major_copies = copies;
    pool.reset_high_water();
    longattn::attention_forward(context, qd, kd, vd, o, lse, opts);
    const std::size_t forward_bytes = pool.stats().in_use_high_water_bytes;
    pool.reset_high_water();
    longattn::attention_backward(context, qd, kd, vd, o, dod, lse, dq, dk, dv, opts);
    TestType().fence();
    return Results{to_host(o), to_host(dq), to_host(dk), to_host(dv), to_host(lse), forward_bytes,
                   pool.stats().in_use_high_water_bytes};
  };
  auto same = [](const auto& a, const auto& b) {
    for (std::size_t i = 0; i < a.span(); ++i)
      if (!(a.data()[i] == b.data()[i])) return false;
    return true;
  };
  const std::size_t tensor_bytes = 2 * 130 * 3 * 64 * sizeof(float), key_bytes = 2 * 77 * 3 * 64 * sizeof(float);
  for (bool causal : {false, true})
    for (auto passes : {longattn::BackwardPasses::two, longattn::BackwardPasses::one}) {
      INFO(describe(s, causal) << ", backward passes " << longattn::to_string(passes));
      const Results in_place = run(false, causal, passes), copied = run(true, causal, passes);
      HostTensor o_ref("o", 2, 130, 3, 64), dq_ref("dq", 2, 130, 3, 64);
      HostTensor dk_ref("dk", 2, 77, 3, 64), dv_ref("dv", 2, 77, 3, 64);
      HostRows lse_ref("lse", 2, 3, 130);
      longattn::test::reference_attention_forward(q, k, v, o_ref, lse_ref, reference_options(s, causal));
      longattn::test::reference_attention_backward(q, k, v, d_o, dq_ref, dk_ref, dv_ref, reference_options(s, causal));
      CHECK(relative_error(copied.o, o_ref) <= tolerance<float>());
      CHECK(relative_error(copied.dq, dq_ref) <= gradient_tolerance<float>());
      CHECK(relative_error(copied.dk, dk_ref) <= gradient_tolerance<float>());
      CHECK(same(copied.o, in_place.o));
      CHECK(same(copied.lse, in_place.lse));
      CHECK(same(copied.dq, in_place.dq));
      CHECK(same(copied.dk, in_place.dk));
      CHECK(same(copied.dv, in_place.dv));
      // Without copies the forward pass allocates nothing. With them (host spaces) it holds K's
      // and V's copies; the backward pass two of its inputs' (Q and dO, or K and V) beside Delta,
      // and in the one-pass form dQ's sums: attention_*_workspace_bytes(), up to the pool's
      // rounding of each block to 4 KiB.
      const std::size_t rounding = 4 * 4096;
      CHECK(in_place.forward_bytes == 0);
      if (host) CHECK(copied.forward_bytes >= 2 * key_bytes);
      CHECK(copied.forward_bytes <= longattn::attention_forward_workspace_bytes<float>(2, 3, 77, 64) + rounding);
      const std::size_t dq_sums = passes == longattn::BackwardPasses::one ? tensor_bytes : 0;
      if (host) CHECK(copied.backward_bytes >= 2 * tensor_bytes + dq_sums);
      CHECK(copied.backward_bytes <=
            longattn::attention_backward_workspace_bytes<float>(2, 3, 130, 64, 77) + rounding);
      CHECK(in_place.backward_bytes < tensor_bytes);
    }
}

// attention_backward_one_pass() is what a memory planner asks; on a host space the one-pass
// form's dQ sums (a third tensor beside two head-major copies) show in the pool's high-water.
TEMPLATE_LIST_TEST_CASE("attention_backward_one_pass says which form attention_backward takes",
                        "[core][attention]", longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  using Tensor = Kokkos::View<float****, Kokkos::LayoutRight, Memory>;
  constexpr bool host = Kokkos::SpaceAccessibility<TestType, Kokkos::HostSpace>::accessible;
  constexpr int multiple = longattn::attention_one_pass_head_dim_multiple<TestType, float>();
  const TestType exec;
  CHECK_FALSE(longattn::attention_backward_one_pass<float>(exec, 2, 3, multiple, longattn::BackwardPasses::two));
  CHECK(longattn::attention_backward_one_pass<float>(exec, 2, 3, multiple, longattn::BackwardPasses::one));
  CHECK_THROWS_WITH(longattn::attention_backward_one_pass<float>(exec, 2, -3, multiple),
                    Catch::Contains("attention_backward_one_pass: argument 'heads' is -3, expected a count >= 0"));
  std::mt19937_64 rng(longattn::test::test_seed());
  const longattn::memory::Pool<Memory> pool;
  const longattn::ExecutionContext<TestType> context(exec, pool);
  const int tokens = 200;
  for (const int head_dim : {multiple, multiple + 2})
    for (const int heads : {2, 3, 64}) {
      const Shape s{1, tokens, tokens, heads, head_dim};
      INFO(describe(s, true));
      const bool one_pass = longattn::attention_backward_one_pass<float>(exec, 1, heads, head_dim);
      if (head_dim % multiple != 0) CHECK_FALSE(one_pass);
      const auto q = to_device<float, Memory>(random_tensor<float>(1, tokens, heads, head_dim, rng));
      const auto k = to_device<float, Memory>(random_tensor<float>(1, tokens, heads, head_dim, rng));
      const auto v = to_device<float, Memory>(random_tensor<float>(1, tokens, heads, head_dim, rng));
      const auto d_o = to_device<float, Memory>(random_tensor<float>(1, tokens, heads, head_dim, rng));
      Tensor o("o", 1, tokens, heads, head_dim), dq("dq", 1, tokens, heads, head_dim);
      Tensor dk("dk", 1, tokens, heads, head_dim), dv("dv", 1, tokens, heads, head_dim);
      Kokkos::View<float***, Memory> lse("lse", 1, heads, tokens);
      const auto opts = options(s, true);
      longattn::attention_forward(context, q, k, v, o, lse, opts);
      pool.reset_high_water();
      longattn::attention_backward(context, q, k, v, o, d_o, lse, dq, dk, dv, opts);
      exec.fence();
      // Two passes hold two copies and Delta (and the pool's rounding); one pass also dQ's sums.
      // A device space reads in place and sums into dq.
      const std::size_t tensor_bytes = std::size_t(tokens) * heads * head_dim * sizeof(float);
      const bool sums_dq = pool.stats().in_use_high_water_bytes >= 3 * tensor_bytes;
      if (host) CHECK(sums_dq == one_pass);
    }
}

TEMPLATE_LIST_TEST_CASE("attention over [K1; K2] equals merge_partial of attention over K1 and over K2",
                        "[core][attention][merge]", longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  std::mt19937_64 rng(longattn::test::test_seed());
  const int B = 2, Nq = 83, Nk = 110, split = 45, H = 2, D = 32;
  const Shape s{B, Nq, Nk, H, D, 60, 0};
  for (bool causal : {false, true}) {
    INFO(describe(s, causal) << ", split at " << split);
    auto q = to_device<float, Memory>(random_tensor<float>(B, Nq, H, D, rng));
    auto k = to_device<float, Memory>(random_tensor<float>(B, Nk, H, D, rng));
    auto v = to_device<float, Memory>(random_tensor<float>(B, Nk, H, D, rng));
    Kokkos::View<float****, Memory> o("o", B, Nq, H, D), o1("o1", B, Nq, H, D), o2("o2", B, Nq, H, D);
    Kokkos::View<float***, Memory> lse("lse", B, H, Nq), lse1("lse1", B, H, Nq), lse2("lse2", B, H, Nq);
    longattn::attention_forward(TestType(), q, k, v, o, lse, options(s, causal));
    // The two key shards are subviews (no copies); the second starts at global position `split`.
    const auto first = std::make_pair(0, split), second = std::make_pair(split, Nk);
    auto opts1 = options(s, causal), opts2 = options(s, causal);
    opts2.key_offset += split;
    longattn::attention_forward(TestType(), q, Kokkos::subview(k, Kokkos::ALL, first, Kokkos::ALL, Kokkos::ALL),
                                Kokkos::subview(v, Kokkos::ALL, first, Kokkos::ALL, Kokkos::ALL), o1, lse1, opts1);
    longattn::attention_forward(TestType(), q, Kokkos::subview(k, Kokkos::ALL, second, Kokkos::ALL, Kokkos::ALL),
                                Kokkos::subview(v, Kokkos::ALL, second, Kokkos::ALL, Kokkos::ALL), o2, lse2, opts2);
    longattn::merge_partial(TestType(), o1, lse1, o2, lse2);
    CHECK(relative_error(to_host(o1), to_host(o)) <= tolerance<float>());
    CHECK(relative_error(to_host(lse1), to_host(lse)) <= tolerance<float>());
  }
}

TEMPLATE_LIST_TEST_CASE("16-bit partial results merged into a float accumulator round once, at the end",
                        "[core][attention][merge][half]", longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  using longattn::bfloat16;
  const TestType exec;
  std::mt19937_64 rng(longattn::test::test_seed());
  const int B = 1, Nq = 67, Nk = 150, H = 2, D = 24, shards = 3;
  for (bool causal : {false, true}) {
    const Shape s{B, Nq, Nk, H, D, 90, 0};
    INFO(describe(s, causal) << ", " << shards << " key shards");
    const auto q = to_device<bfloat16, Memory>(random_tensor<bfloat16>(B, Nq, H, D, rng));
    const auto k = to_device<bfloat16, Memory>(random_tensor<bfloat16>(B, Nk, H, D, rng));
    const auto v = to_device<bfloat16, Memory>(random_tensor<bfloat16>(B, Nk, H, D, rng));
    Kokkos::View<bfloat16****, Memory> o("o", B, Nq, H, D), part("part", B, Nq, H, D), o16("o16", B, Nq, H, D);
    Kokkos::View<float****, Memory> wide("wide", B, Nq, H, D);
    Kokkos::View<float***, Memory> lse("lse", B, H, Nq), lse_part("lse part", B, H, Nq), lse_all("lse all", B, H, Nq);
    longattn::attention_forward(exec, q, k, v, o, lse, options(s, causal));
    Kokkos::deep_copy(lse_all, -std::numeric_limits<float>::infinity());
    for (int i = 0; i < shards; ++i) {  // 50 keys each: the first shard is all some causal rows see
      const auto keys = std::make_pair(50 * i, 50 * (i + 1));
      auto opts = options(s, causal);
      opts.key_offset += 50 * i;
      longattn::attention_forward(exec, q, Kokkos::subview(k, Kokkos::ALL, keys, Kokkos::ALL, Kokkos::ALL),
                                  Kokkos::subview(v, Kokkos::ALL, keys, Kokkos::ALL, Kokkos::ALL), part, lse_part, opts);
      longattn::merge_partial(exec, wide, lse_all, part, lse_part);
    }
    longattn::convert(exec, wide, o16);
    exec.fence();
    CHECK(relative_error(to_host(o16), to_host(o)) <= tolerance<bfloat16>());
    CHECK(relative_error(to_host(lse_all), to_host(lse)) <= tolerance<float>());
  }
  // o holds o_part's type or, for a 16-bit part, float.
  Kokkos::View<double****, Memory> o64("o64", 1, 4, 1, 8);
  Kokkos::View<float****, Memory> o32("o32", 1, 4, 1, 8);
  Kokkos::View<double***, Memory> lse64("lse64", 1, 1, 4);
  Kokkos::View<float***, Memory> lse32("lse32", 1, 1, 4);
  CHECK_THROWS_WITH(longattn::merge_partial(exec, o32, lse64, o64, lse64),
                    Catch::Contains("'o's value type' is float, expected double (o_part's)"));
  Kokkos::View<bfloat16****, Memory> part16("part16", 1, 4, 1, 8);
  CHECK_THROWS_WITH(longattn::merge_partial(exec, o64, lse32, part16, lse32),
                    Catch::Contains("'o's value type' is double, expected bfloat16 (o_part's) or float"));
}

TEMPLATE_LIST_TEST_CASE("convert changes value types element by element, any rank and layout",
                        "[core][convert][half]", longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  const TestType exec;
  // Every float16 bit pattern that is a number: to float and back is the identity; to bfloat16
  // and back to float16 rounds once (to nearest even), as the scalar conversion does.
  Kokkos::View<longattn::float16*, Memory> halves("halves", 65536), back("back", 65536);
  Kokkos::View<float*, Memory> floats("floats", 65536);
  Kokkos::View<longattn::bfloat16*, Memory> brains("brains", 65536);
  auto host = Kokkos::create_mirror_view(halves);
  for (std::uint32_t b = 0; b < 65536; ++b) host(b) = longattn::float16::from_bits(std::uint16_t(b));
  Kokkos::deep_copy(halves, host);
  longattn::convert(exec, halves, floats);
  longattn::convert(exec, floats, back);
  longattn::convert(exec, halves, brains);
  const auto same = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), back);
  const auto as_float = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), floats);
  const auto as_brain = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), brains);
  bool identity = true, rounded = true;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    if (std::isnan(float(host(b)))) continue;
    identity = identity && same(b).bits == host(b).bits && as_float(b) == float(host(b));
    rounded = rounded && as_brain(b).bits == longattn::bfloat16(float(host(b))).bits;
  }
  CHECK(identity);
  CHECK(rounded);
  // Rank 4, a token range of a larger view (strided, not contiguous) into a contiguous view.
  Kokkos::View<double****, Memory> wide("wide", 2, 10, 3, 4);
  Kokkos::View<float****, Memory> narrow("narrow", 2, 5, 3, 4);
  auto wide_host = Kokkos::create_mirror_view(wide);
  for (std::size_t i = 0; i < wide.size(); ++i) wide_host.data()[i] = 0.1 * double(i) - 7;
  Kokkos::deep_copy(wide, wide_host);
  longattn::convert(exec, Kokkos::subview(wide, Kokkos::ALL, std::make_pair(3, 8), Kokkos::ALL, Kokkos::ALL), narrow);
  const auto narrow_host = to_host(narrow);
  bool copied = true;
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 5; ++t)
      for (int h = 0; h < 3; ++h)
        for (int d = 0; d < 4; ++d) copied = copied && narrow_host(b, t, h, d) == float(wide_host(b, t + 3, h, d));
  CHECK(copied);
  CHECK_THROWS_WITH(longattn::convert(exec, wide, narrow),
                    Catch::Contains("argument 'to's extents' is [2, 5, 3, 4], expected [2, 10, 3, 4] (the extents of from)"));
}

TEMPLATE_LIST_TEST_CASE("accumulate_output continues the softmax in the kernel: [K1; K2] in two passes",
                        "[core][attention][merge]", longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  std::mt19937_64 rng(longattn::test::test_seed());
  const int B = 2, Nq = 83, Nk = 150, split = 70, H = 3, D = 16;
  const Shape s{B, Nq, Nk, H, D, 40, 0};  // causal: queries 0..29 see nothing of K2 (from 70)
  for (bool causal : {false, true})
    for (bool second_first : {false, true})
      for (bool start_empty : {false, true}) {
        INFO(describe(s, causal) << ", split at " << split << (second_first ? ", K2 first" : "")
                                 << (start_empty ? ", both passes accumulate from o = 0, lse = -inf" : ""));
        for (const double output_scale : {1.0, 0.5}) {
          auto q = to_device<double, Memory>(random_tensor<double>(B, Nq, H, D, rng));
          auto k = to_device<double, Memory>(random_tensor<double>(B, Nk, H, D, rng));
          auto v = to_device<double, Memory>(random_tensor<double>(B, Nk, H, D, rng));
          Kokkos::View<double****, Memory> o("o", B, Nq, H, D), o_acc("o acc", B, Nq, H, D);
          Kokkos::View<double***, Memory> lse("lse", B, H, Nq), lse_acc("lse acc", B, H, Nq);
          auto opts = options(s, causal);
          opts.output_scale = output_scale;
          longattn::attention_forward(TestType(), q, k, v, o, lse, opts);
          std::pair<int, int> parts[2] = {{0, split}, {split, Nk}};
          if (second_first) std::swap(parts[0], parts[1]);
          if (start_empty) {
            Kokkos::deep_copy(o_acc, 0.0);
            Kokkos::deep_copy(lse_acc, -std::numeric_limits<double>::infinity());
          }
          for (int pass = 0; pass < 2; ++pass) {
            auto pass_opts = opts;
            pass_opts.key_offset += parts[pass].first;
            pass_opts.accumulate_output = start_empty || pass == 1;
            longattn::attention_forward(TestType(), q, Kokkos::subview(k, Kokkos::ALL, parts[pass], Kokkos::ALL, Kokkos::ALL),
                                        Kokkos::subview(v, Kokkos::ALL, parts[pass], Kokkos::ALL, Kokkos::ALL), o_acc,
                                        lse_acc, pass_opts);
          }
          CHECK(relative_error(to_host(o_acc), to_host(o)) <= 1e-12);
          CHECK(relative_error(to_host(lse_acc), to_host(lse)) <= 1e-12);
        }
      }
  auto q = to_device<float, Memory>(random_tensor<float>(1, 8, 1, 16, rng));
  Kokkos::View<float****, Memory> o("o", 1, 8, 1, 16);
  Kokkos::View<float***, Memory> lse("lse", 1, 1, 8);
  longattn::AttentionOptions zero_scale;
  zero_scale.accumulate_output = true;
  zero_scale.output_scale = 0;
  CHECK_THROWS_WITH(longattn::attention_forward(TestType(), q, q, q, o, lse, zero_scale),
                    Catch::Contains("argument 'opts.output_scale' is 0, expected a non-zero scale with accumulate_output"));
}

TEMPLATE_LIST_TEST_CASE("queries that see no key get o = 0, lse = -inf and zero gradients, never NaN",
                        "[core][attention][merge]", longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  std::mt19937_64 rng(longattn::test::test_seed());
  // Causal, keys start at global position 100: queries 0..99 see nothing.
  const int Nq = 130, Nk = 70, H = 2, D = 16;
  const Shape s{1, Nq, Nk, H, D, 0, 100};
  INFO(describe(s, true));
  auto q = to_device<float, Memory>(random_tensor<float>(1, Nq, H, D, rng));
  auto k = to_device<float, Memory>(random_tensor<float>(1, Nk, H, D, rng));
  auto v = to_device<float, Memory>(random_tensor<float>(1, Nk, H, D, rng));
  auto d_o = to_device<float, Memory>(random_tensor<float>(1, Nq, H, D, rng));
  Kokkos::View<float****, Memory> o("o", 1, Nq, H, D), dq("dq", 1, Nq, H, D), dk("dk", 1, Nk, H, D), dv("dv", 1, Nk, H, D);
  Kokkos::View<float***, Memory> lse("lse", 1, H, Nq);
  longattn::attention_forward(TestType(), q, k, v, o, lse, options(s, true));
  longattn::attention_backward(TestType(), q, k, v, o, d_o, lse, dq, dk, dv, options(s, true));
  const HostTensor o_h = to_host(o), dq_h = to_host(dq), dk_h = to_host(dk), dv_h = to_host(dv);
  const HostRows lse_h = to_host(lse);
  bool masked_rows_empty = true, finite = true;
  for (int h = 0; h < H; ++h)
    for (int i = 0; i < Nq; ++i) {
      if (i < 100) masked_rows_empty = masked_rows_empty && lse_h(0, h, i) == -std::numeric_limits<double>::infinity();
      else finite = finite && std::isfinite(lse_h(0, h, i));
      for (int d = 0; d < D; ++d) {
        if (i < 100) masked_rows_empty = masked_rows_empty && o_h(0, i, h, d) == 0 && dq_h(0, i, h, d) == 0;
        finite = finite && std::isfinite(o_h(0, i, h, d)) && std::isfinite(dq_h(0, i, h, d));
      }
    }
  for (std::size_t i = 0; i < dk_h.span(); ++i) finite = finite && std::isfinite(dk_h.data()[i]) && std::isfinite(dv_h.data()[i]);
  CHECK(masked_rows_empty);
  CHECK(finite);

  // Merging two results that both saw nothing keeps o and lse; merging with a real one takes it.
  Kokkos::View<float****, Memory> o_copy("o copy", 1, Nq, H, D);
  Kokkos::View<float***, Memory> lse_copy("lse copy", 1, H, Nq);
  Kokkos::deep_copy(o_copy, o);
  Kokkos::deep_copy(lse_copy, lse);
  longattn::merge_partial(TestType(), o_copy, lse_copy, o, lse);
  const HostTensor merged = to_host(o_copy);
  const HostRows merged_lse = to_host(lse_copy);
  bool empty_stays_empty = true, merged_finite = true;
  for (int h = 0; h < H; ++h)
    for (int i = 0; i < Nq; ++i) {
      if (i < 100) empty_stays_empty = empty_stays_empty && merged_lse(0, h, i) == -std::numeric_limits<double>::infinity();
      for (int d = 0; d < D; ++d) merged_finite = merged_finite && std::isfinite(merged(0, i, h, d));
      if (i < 100)
        for (int d = 0; d < D; ++d) empty_stays_empty = empty_stays_empty && merged(0, i, h, d) == 0;
    }
  CHECK(empty_stays_empty);
  CHECK(merged_finite);
  // Self-merge of a visible row: same o, lse + log 2.
  CHECK(relative_error(merged, o_h) <= tolerance<float>());
  CHECK(std::abs(merged_lse(0, 1, 120) - (lse_h(0, 1, 120) + std::log(2.0))) < 1e-5);
}

namespace {

// Inputs in [-1, 1) times `scale`, rounded through T (the reference sees the kernel's inputs).
template <class T>
HostTensor scaled_tensor(int b, int n, int h, int d, double scale, std::mt19937_64& rng) {
  HostTensor t = random_tensor<T>(b, n, h, d, rng);
  for (std::size_t i = 0; i < t.span(); ++i) t.data()[i] = static_cast<double>(static_cast<T>(t.data()[i] * scale));
  return t;
}

// q and k of magnitude `qk_scale`, v of `v_scale`, d_o of `d_o_scale`, with `softmax_scale` (0: 1 /
// sqrt(D)): forward and backward against the double reference, with check_finite on (which
// must pass). Tolerances grow with the logits: a score L carries a rounding of eps x L in the
// exponent (forward), and the gradients of a saturated softmax are differences of nearly equal
// terms (dP - Delta) times the softmax scale (backward). With 16-bit o (Delta from the rounded
// o) that difference loses the type's precision entirely: a saturated softmax's gradients in
// bfloat16 or float16 are not checked here, as FlashAttention's are not.
template <class ExecSpace, class T>
void check_extreme(const Shape& s, bool causal, double qk_scale, double v_scale, double d_o_scale,
                   double softmax_scale, std::mt19937_64& rng) {
  using Memory = typename ExecSpace::memory_space;
  INFO(describe(s, causal) << ", " << longattn::detail::scalar_name<T>() << ", q and k x " << qk_scale << ", v x "
                           << v_scale << ", softmax scale " << softmax_scale);
  const HostTensor q = scaled_tensor<T>(s.batch, s.queries, s.heads, s.head_dim, qk_scale, rng);
  const HostTensor k = scaled_tensor<T>(s.batch, s.keys, s.heads, s.head_dim, qk_scale, rng);
  const HostTensor v = scaled_tensor<T>(s.batch, s.keys, s.heads, s.head_dim, v_scale, rng);
  const HostTensor d_o = scaled_tensor<T>(s.batch, s.queries, s.heads, s.head_dim, d_o_scale, rng);
  HostTensor o_ref("o", s.batch, s.queries, s.heads, s.head_dim), dq_ref("dq", s.batch, s.queries, s.heads, s.head_dim);
  HostTensor dk_ref("dk", s.batch, s.keys, s.heads, s.head_dim), dv_ref("dv", s.batch, s.keys, s.heads, s.head_dim);
  HostRows lse_ref("lse", s.batch, s.heads, s.queries);
  longattn::test::ReferenceOptions ref_opts = reference_options(s, causal);
  ref_opts.scale = softmax_scale;
  longattn::test::reference_attention_forward(q, k, v, o_ref, lse_ref, ref_opts);
  longattn::test::reference_attention_backward(q, k, v, d_o, dq_ref, dk_ref, dv_ref, ref_opts);

  longattn::AttentionOptions opts = options(s, causal);
  if (softmax_scale != 0) opts.softmax_scale = softmax_scale;
  opts.check_finite = true;
  auto qd = to_device<T, Memory>(q), kd = to_device<T, Memory>(k), vd = to_device<T, Memory>(v);
  auto dod = to_device<T, Memory>(d_o);
  Kokkos::View<T****, Memory> o("o", s.batch, s.queries, s.heads, s.head_dim), dq("dq", s.batch, s.queries, s.heads, s.head_dim);
  Kokkos::View<T****, Memory> dk("dk", s.batch, s.keys, s.heads, s.head_dim), dv("dv", s.batch, s.keys, s.heads, s.head_dim);
  Kokkos::View<longattn::accumulate_t<T>***, Memory> lse("lse", s.batch, s.heads, s.queries);
  const ExecSpace exec;
  longattn::attention_forward(exec, qd, kd, vd, o, lse, opts);
  longattn::attention_backward(exec, qd, kd, vd, o, dod, lse, dq, dk, dv, opts);
  const double scale = softmax_scale != 0 ? std::abs(softmax_scale) : 1 / std::sqrt(double(s.head_dim));
  const double logits = s.head_dim * scale * qk_scale * qk_scale;
  const double forward_tolerance = longattn::test::bf16_product_rounding<T, Memory>() * tolerance<T>() +
                                   4 * double(std::numeric_limits<longattn::accumulate_t<T>>::epsilon()) * logits;
  // 16-bit: 2x (measured up to 1.3x).
  const double backward_tolerance = (longattn::is_half_v<T> ? 2 : 1) * gradient_tolerance<T>() * std::max(1.0, scale);
  CHECK(relative_error(to_host(o), o_ref) <= forward_tolerance);
  CHECK(relative_error(to_host(lse), lse_ref) <= forward_tolerance);
  CHECK(relative_error(to_host(dq), dq_ref) <= backward_tolerance);
  CHECK(relative_error(to_host(dk), dk_ref) <= backward_tolerance);
  CHECK(relative_error(to_host(dv), dv_ref) <= backward_tolerance);
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("extreme values: logits of 1e4, 16-bit range limits, rows that see no key, against the reference",
                        "[core][attention][extreme]", longattn::test::ExecutionSpaces) {
  using longattn::bfloat16;
  using longattn::float16;
  std::mt19937_64 rng(longattn::test::test_seed());
  const Shape shapes[] = {{2, 67, 75, 2, 16, 8, 0}, {1, 70, 70, 1, 16, 0, 64}};  // the second: 64 rows see no key
  for (const Shape& s : shapes)
    for (const bool causal : {false, true}) {
      check_extreme<TestType, float>(s, causal, 1, 1, 1, 2e3, rng);    // |logits| up to ~1e4
      check_extreme<TestType, double>(s, causal, 1, 1, 1, -2e3, rng);  // -1e4: the softmax flips
      // v at float16's largest finite and 0.3% of bfloat16's (Nk x max|v| inside float); d_o small
      // enough that the true gradients fit the type (larger ones are reported: the next case).
      // Not on the second shape: its rows that see 1 to 6 keys are nearly saturated softmaxes,
      // whose 16-bit gradients lose the type's precision (above), extreme values or not.
      if (&s != &shapes[0]) continue;
      check_extreme<TestType, float16>(s, causal, 1, 65504, 0x1p-12, 0, rng);
      check_extreme<TestType, bfloat16>(s, causal, 1, 1e36, 0x1p-12, 0, rng);
    }
}

TEMPLATE_LIST_TEST_CASE("check_finite names a non-finite input or an overflow: tensor, index, value",
                        "[core][attention][extreme][errors]", longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  using longattn::bfloat16;
  std::mt19937_64 rng(longattn::test::test_seed());
  const int B = 2, N = 67, H = 2, D = 16;
  auto q = to_device<float, Memory>(random_tensor<float>(B, N, H, D, rng));
  auto k = to_device<float, Memory>(random_tensor<float>(B, N, H, D, rng));
  auto v = to_device<float, Memory>(random_tensor<float>(B, N, H, D, rng));
  auto d_o = to_device<float, Memory>(random_tensor<float>(B, N, H, D, rng));
  Kokkos::View<float****, Memory> o("o", B, N, H, D), dq("dq", B, N, H, D), dk("dk", B, N, H, D), dv("dv", B, N, H, D);
  Kokkos::View<float***, Memory> lse("lse", B, H, N);
  longattn::AttentionOptions opts;
  opts.causal = true;
  opts.check_finite = true;
  const TestType exec;
  const double inf = std::numeric_limits<double>::infinity();
  // One bad value at an index, the call refused naming it; then the value restored.
  auto with = [&](const auto& view, int b, int n, int h, int d, double value, auto&& call) {
    const auto element = Kokkos::subview(view, b, n, h, d);
    float saved = 0;
    Kokkos::deep_copy(saved, element);
    Kokkos::deep_copy(element, float(value));
    call();
    Kokkos::deep_copy(element, saved);
  };
  auto forward = [&] { longattn::attention_forward(exec, q, k, v, o, lse, opts); };
  auto backward = [&] { longattn::attention_backward(exec, q, k, v, o, d_o, lse, dq, dk, dv, opts); };
  with(q, 1, 5, 1, 3, std::nan(""), [&] {
    CHECK_THROWS_WITH(forward(), Catch::Contains("attention_forward: argument 'q' is nan at [1, 5, 1, 3], expected finite values"));
  });
  with(k, 0, 66, 0, 15, inf, [&] { CHECK_THROWS_WITH(forward(), Catch::Contains("argument 'k' is inf at [0, 66, 0, 15]")); });
  with(v, 1, 0, 1, 0, -inf, [&] { CHECK_THROWS_WITH(forward(), Catch::Contains("argument 'v' is -inf at [1, 0, 1, 0]")); });
  forward();
  with(d_o, 0, 10, 1, 7, std::nan(""), [&] {
    CHECK_THROWS_WITH(backward(), Catch::Contains("attention_backward: argument 'd_o' is nan at [0, 10, 1, 7]"));
  });
  backward();

  // Finite inputs the accumulation cannot take: q and k at float16's largest (scores of ~1e10,
  // each rounded by ~1e3 in the exponent), bfloat16's near 3e38 (scores past float's range),
  // v whose sums over keys pass float's range.
  auto big = [&](auto type, double scale) {
    using T = decltype(type);
    return to_device<T, Memory>(scaled_tensor<T>(1, 20, 1, 16, scale, rng));
  };
  using longattn::float16;
  auto qh = big(float16(), 65504), kh = big(float16(), 65504), vh = big(float16(), 1);
  Kokkos::View<float16****, Memory> oh("o", 1, 20, 1, 16);
  Kokkos::View<float***, Memory> lseb("lse", 1, 1, 20);
  CHECK_THROWS_WITH(longattn::attention_forward(exec, qh, kh, vh, oh, lseb, opts),
                    Catch::Contains("argument 'q and k' is max |q| 6") &&
                        Catch::Contains("expected scores that float, the accumulation type, resolves"));
  auto qb = big(bfloat16(), 3e38), kb = big(bfloat16(), 3e38), vb = big(bfloat16(), 1);
  Kokkos::View<bfloat16****, Memory> ob("o", 1, 20, 1, 16);
  CHECK_THROWS_WITH(longattn::attention_forward(exec, qb, kb, vb, ob, lseb, opts),
                    Catch::Contains("argument 'q and k' is max |q| ") && Catch::Contains("must stay at most 1"));
  auto qs = big(bfloat16(), 1), ks = big(bfloat16(), 1), vs = big(bfloat16(), 3e38);
  CHECK_THROWS_WITH(longattn::attention_forward(exec, qs, ks, vs, ob, lseb, opts),
                    Catch::Contains("argument 'v' is max |v| ") && Catch::Contains("sums over keys inside float"));
  // Gradients whose true values pass float16's range: the backward pass names the first one.
  auto d_oh = big(float16(), 65504);
  auto qm = big(float16(), 1), km = big(float16(), 1), vm = big(float16(), 65504);
  Kokkos::View<float16****, Memory> dqh("dq", 1, 20, 1, 16), dkh("dk", 1, 20, 1, 16), dvh("dv", 1, 20, 1, 16);
  longattn::attention_forward(exec, qm, km, vm, oh, lseb, opts);
  CHECK_THROWS_WITH(longattn::attention_backward(exec, qm, km, vm, oh, d_oh, lseb, dqh, dkh, dvh, opts),
                    Catch::Contains("argument 'd") &&
                        Catch::Contains("passed the range of float16 (the output type) or of float"));
  // Without the check every score overflows: each row comes out NaN (a score of +inf) or as a
  // row that saw no key (all -inf), never a finite wrong number.
  opts.check_finite = false;
  longattn::attention_forward(exec, qb, kb, vb, ob, lseb, opts);
  const HostRows lse_h = to_host(lseb);
  int finite_rows = 0;
  for (int i = 0; i < 20; ++i) finite_rows += std::isfinite(lse_h(0, 0, i)) ? 1 : 0;
  CHECK(finite_rows == 0);
}

TEST_CASE("attention rejects bad input with a longattn::Error naming the argument", "[core][attention][errors]") {
  using Host = Kokkos::DefaultHostExecutionSpace;
  using F4 = Kokkos::View<float****, Kokkos::HostSpace>;
  using F3 = Kokkos::View<float***, Kokkos::HostSpace>;
  const Host exec;
  F4 q("q", 1, 10, 2, 16), k("k", 1, 12, 2, 16), v("v", 1, 12, 2, 16), o("o", 1, 10, 2, 16);
  F3 lse("lse", 1, 2, 10);
  CHECK_NOTHROW(longattn::attention_forward(exec, q, k, v, o, lse));

  F4 k_heads("k", 1, 12, 3, 16);
  CHECK_THROWS_WITH(longattn::attention_forward(exec, q, k_heads, v, o, lse),
                    Catch::Contains("argument 'k's extents' is [1, 12, 3, 16], expected [1, 12, 2, 16]"));
  CHECK_THROWS_WITH(longattn::attention_forward(exec, q, k, F4("v", 1, 11, 2, 16), o, lse),
                    Catch::Contains("'v's extents'"));
  CHECK_THROWS_WITH(longattn::attention_forward(exec, q, k, v, o, F3("lse", 1, 10, 2)),
                    Catch::Contains("'lse's extents' is [1, 10, 2], expected [1, 2, 10]"));
  Kokkos::View<double****, Kokkos::HostSpace> v_double("v", 1, 12, 2, 16);
  CHECK_THROWS_WITH(longattn::attention_forward(exec, q, k, v_double, o, lse),
                    Catch::Contains("'v's value type' is double, expected float"));
  F4 wide("q", 1, 10, 2, 300), wide_k("k", 1, 12, 2, 300);
  CHECK_THROWS_WITH(longattn::attention_forward(exec, wide, wide_k, F4("v", 1, 12, 2, 300), F4("o", 1, 10, 2, 300), lse),
                    Catch::Contains("'q.extent(3)' is 300, expected a head dim of at most 256"));
  CHECK_THROWS_WITH(longattn::attention_forward(exec, F4("q", 1, 0, 2, 16), k, v, F4("o", 1, 0, 2, 16), F3("lse", 1, 2, 0)),
                    Catch::Contains("'q.extent(1)' is 0"));
  CHECK_THROWS_WITH(longattn::attention_forward(exec, q, F4("k", 1, 0, 2, 16), F4("v", 1, 0, 2, 16), o, lse),
                    Catch::Contains("'k.extent(1)' is 0"));
  longattn::AttentionOptions nan_scale;
  nan_scale.softmax_scale = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(longattn::attention_forward(exec, q, k, v, o, lse, nan_scale),
                    Catch::Contains("'opts.softmax_scale' is nan, expected a finite number"));
  longattn::AttentionOptions inf_scale;
  inf_scale.softmax_scale = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH(longattn::attention_forward(exec, q, k, v, o, lse, inf_scale), Catch::Contains("'opts.softmax_scale' is inf"));
  longattn::AttentionOptions nan_output_scale;
  nan_output_scale.output_scale = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(longattn::attention_forward(exec, q, k, v, o, lse, nan_output_scale),
                    Catch::Contains("'opts.output_scale' is nan, expected a finite number"));
  CHECK_THROWS_WITH(longattn::attention_forward(exec, q, k, v, q, lse),
                    Catch::Contains("argument 'o' is overlapping q"));
  F4 q_same_shape_as_k("q", 1, 12, 2, 16);
  CHECK_THROWS_WITH(longattn::attention_forward(exec, q_same_shape_as_k, k, v, v, F3("lse", 1, 2, 12)),
                    Catch::Contains("argument 'o' is overlapping v"));
  longattn::DenseBlocks wrong_blocks;
  wrong_blocks.block = 48;
  wrong_blocks.queries = 10;
  wrong_blocks.keys = 12;
  CHECK_THROWS_WITH(longattn::attention_forward(exec, q, k, v, o, lse, {}, wrong_blocks),
                    Catch::Contains("'blocks.block_size()' is 48"));

  F4 dq("dq", 1, 10, 2, 16), dk("dk", 1, 12, 2, 16), dv("dv", 1, 12, 2, 16), d_o("do", 1, 10, 2, 16);
  CHECK_NOTHROW(longattn::attention_backward(exec, q, k, v, o, d_o, lse, dq, dk, dv));
  CHECK_THROWS_WITH(longattn::attention_backward(exec, q, k, v, o, d_o, lse, dq, dk, dk),
                    Catch::Contains("argument 'dk' is overlapping dv"));
  CHECK_THROWS_WITH(longattn::attention_backward(exec, q, k, v, o, d_o, lse, q, dk, dv),
                    Catch::Contains("argument 'dq' is overlapping q"));
  CHECK_THROWS_WITH(longattn::attention_backward(exec, q, k, v, o, F4("do", 1, 10, 2, 8), lse, dq, dk, dv),
                    Catch::Contains("'d_o's extents' is [1, 10, 2, 8], expected [1, 10, 2, 16]"));
  CHECK_THROWS_WITH(longattn::attention_backward(exec, q, k, v, o, d_o, lse, dq, F4("dk", 1, 10, 2, 16), dv),
                    Catch::Contains("'dk's extents'"));

  using B4 = Kokkos::View<longattn::bfloat16****, Kokkos::HostSpace>;
  B4 q16("q", 1, 10, 2, 16), k16("k", 1, 12, 2, 16), v16("v", 1, 12, 2, 16), o16("o", 1, 10, 2, 16);
  CHECK_NOTHROW(longattn::attention_forward(exec, q16, k16, v16, o16, lse));
  CHECK_THROWS_WITH(longattn::attention_forward(exec, q16, k16, v16, o16, Kokkos::View<longattn::bfloat16***, Kokkos::HostSpace>("lse", 1, 2, 10)),
                    Catch::Contains("'lse's value type' is bfloat16, expected float (the value type of q's bfloat16 accumulation)"));
  CHECK_THROWS_WITH(longattn::attention_forward(exec, q16, k16, v, o16, lse),
                    Catch::Contains("'v's value type' is float, expected bfloat16"));
  CHECK_THROWS_WITH(longattn::attention_forward(exec, Kokkos::View<int****, Kokkos::HostSpace>("q", 1, 10, 2, 16), k, v, o, lse),
                    Catch::Contains("expected float, double, bfloat16 or float16"));

  CHECK_THROWS_WITH(longattn::attention_forward_workspace_bytes<float>(1, 2, -12, 16),
                    Catch::Contains("attention_forward_workspace_bytes: argument 'keys' is -12, expected a count >= 0"));
  CHECK_THROWS_WITH(longattn::attention_forward_workspace_bytes<float>(-1, 2, 12, 16), Catch::Contains("'batch' is -1"));
  CHECK_THROWS_WITH(longattn::attention_backward_workspace_bytes<float>(1, 2, 10, -16),
                    Catch::Contains("attention_backward_workspace_bytes: argument 'head_dim' is -16, expected a count >= 0"));
  CHECK_THROWS_WITH(longattn::attention_backward_workspace_bytes<float>(1, 2, 10, 16, -1), Catch::Contains("'keys' is -1"));
  CHECK(longattn::attention_forward_workspace_bytes<float>(0, 2, 12, 16) == 0);

  CHECK_THROWS_WITH(longattn::merge_partial(exec, o, lse, o, lse), Catch::Contains("argument 'o' is overlapping o_part"));
  CHECK_THROWS_WITH(longattn::merge_partial(exec, o, lse, F4("part", 1, 10, 2, 8), F3("lse", 1, 2, 10)),
                    Catch::Contains("'o_part's extents'"));
}

// The kernels' exp2 (detail/pack.hpp) on the host's SIMD width and on one lane, against
// std::exp2 in double: every float in [-2, 0] with a 2^-20 step, a grid down to -160, and the
// special values the softmax feeds it (-inf for a masked score, NaN).
template <int W>
void check_exp2_lanes() {
  using P = longattn::detail::Pack<float, W>;
  double worst = 0;
  auto check = [&](float x) {
    const float got = longattn::detail::exp2(P::broadcast(x))[W - 1];
    const double want = std::exp2(double(x));
    if (x >= -126) {
      const double error = std::abs(got - want) / want;
      worst = std::max(worst, error);
      if (error > 2.5e-7) FAIL("exp2(" << x << ") = " << got << ", expected " << want);
    } else {
      if (!(std::abs(got - want) <= 0x1p-126)) FAIL("exp2(" << x << ") = " << got << ", expected " << want);
      if (x <= -151 && got != 0) FAIL("exp2(" << x << ") = " << got << ", expected exactly 0");
    }
  };
  for (int step = 0; step <= (2 << 20); ++step) check(-float(step) * 0x1p-20f);
  for (int step = 0; step <= 160 * 1000; ++step) check(-float(step) / 1000);
  INFO("lanes " << W << ", worst relative error " << worst);
  CHECK(worst < 2.5e-7);
  CHECK(longattn::detail::exp2(P::broadcast(-std::numeric_limits<float>::infinity()))[0] == 0.0f);
  CHECK(std::isnan(longattn::detail::exp2(P::broadcast(std::numeric_limits<float>::quiet_NaN()))[0]));
}

TEST_CASE("the kernels' exp2 is within 2.5e-7 of exp2, 0 below -151, NaN for NaN", "[core][attention]") {
  check_exp2_lanes<longattn::detail::host_simd_bytes / 4>();
  check_exp2_lanes<1>();
}

// The bf16 path's rounding of float lanes (detail/pack.hpp), both ways, against bfloat16(float)
// lane by lane: random bit patterns (every exponent, NaN, infinity, subnormals), ties to even
// and odd, and the limits. AVX512-BF16's instruction (compiled into 16-lane float packs) takes
// subnormal inputs as zero of their sign; elsewhere both ways are the integer rounding.
template <int W>
void check_bf16_rounding(longattn::detail::Bf16Rounding rounding) {
  using P = longattn::detail::Pack<float, W>;
  bool by_instruction = false;
#ifdef LONGATTN_AVX512_PACKS
  by_instruction = W == 16 && rounding == longattn::detail::Bf16Rounding::avx512_bf16;
#endif
  auto expected = [&](std::uint32_t bits) -> std::uint32_t {
    const bool subnormal = (bits & 0x7f800000u) == 0 && (bits & 0x7fffffu) != 0;
    if (by_instruction && subnormal) return (bits >> 16) & 0x8000u;
    float x;
    std::memcpy(&x, &bits, sizeof x);
    return longattn::detail::bfloat16_bits(x);
  };
  std::vector<std::uint32_t> inputs = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu, 0xff7fffffu,
                                       0x00800000u, 0x007fffffu, 0x80000001u, 0x7fc00000u, 0x7f800001u, 0xffa00000u,
                                       0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, 0x3f800000u, 0x7f7f8000u};
  std::mt19937 random(20261204);
  for (int n = 0; n < (1 << 18); ++n) inputs.push_back(std::uint32_t(random()));
  for (int n = 0; n < (1 << 14); ++n) inputs.push_back((std::uint32_t(random()) & 0xffff0000u) | 0x8000u);  // ties
  while (inputs.size() % (2 * W) != 0) inputs.push_back(0x3f800000u);

  std::vector<float> values(inputs.size());
  std::memcpy(values.data(), inputs.data(), inputs.size() * sizeof(float));
  std::uint32_t pairs[W], in_order[W];
  int wrong = 0;
  for (std::size_t first = 0; first < inputs.size(); first += 2 * W) {
    const P a = P::load(values.data() + first), b = P::load(values.data() + first + W);
    store_bf16_pairs(a, b, pairs, rounding);
    store_bf16_in_order(a, b, in_order, rounding);
    for (int l = 0; l < W; ++l) {
      const std::uint32_t pair = expected(inputs[first + l]) | expected(inputs[first + W + l]) << 16;
      const std::uint32_t ordered = expected(inputs[first + 2 * l]) | expected(inputs[first + 2 * l + 1]) << 16;
      if ((pairs[l] != pair || in_order[l] != ordered) && ++wrong <= 5)
        FAIL_CHECK("lanes " << W << ", inputs 0x" << std::hex << inputs[first + l] << ", 0x" << inputs[first + W + l]
                            << ", 0x" << inputs[first + 2 * l] << ", 0x" << inputs[first + 2 * l + 1] << ": pair 0x"
                            << pairs[l] << " (expected 0x" << pair << "), in order 0x" << in_order[l] << " (expected 0x"
                            << ordered << ")");
    }
  }
  CHECK(wrong == 0);
}

TEST_CASE("the bf16 path rounds float to bf16 as bfloat16(float), in integers and by AVX512-BF16", "[core][attention]") {
  using longattn::detail::Bf16Rounding;
  constexpr int W = longattn::detail::host_simd_bytes / 4;
  check_bf16_rounding<W>(Bf16Rounding::integer);
  check_bf16_rounding<1>(Bf16Rounding::integer);
  if (longattn::bf16_dot_products_available())
    check_bf16_rounding<W>(Bf16Rounding::avx512_bf16);
  else
    WARN("SKIP: the rounding by AVX512-BF16's instruction needs a CPU with it (this CPU or build has none)");
}
