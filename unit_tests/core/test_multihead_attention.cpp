// MultiheadAttention: forward against a naive double composition (projections, rotary
// positions, the reference attention of the spec, LayerNorm, output projection), backward by
// central finite differences of every parameter and input, gradient accumulation, MAGNETO
// initialization, the spec parser and the factory, and bad input. LayerNorm's kernels and the
// rotary embedding on their own against their formulas.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "execution_spaces.hpp"
#include "longattn/core/attention_spec.hpp"
#include "longattn/core/layer_norm.hpp"
#include "longattn/core/multihead_attention.hpp"
#include "longattn/core/rotary.hpp"
#include "reference/attention.hpp"
#include "reference/block_sparse.hpp"
#include "reference/dilated.hpp"
#include "reference/random.hpp"
#include "reference/tensors.hpp"
#include "team_tiles.hpp"

namespace {

using longattn::test::HostRows;
using longattn::test::HostTensor;

using Host3 = Kokkos::View<double***, Kokkos::LayoutRight, Kokkos::HostSpace>;

Host3 random_tokens(int B, int N, int E, std::mt19937_64& rng) {
  Host3 x("x", B, N, E);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  for (std::size_t i = 0; i < x.span(); ++i) x.data()[i] = uniform(rng);
  return x;
}

template <class T, class Memory>
Kokkos::View<T***, Kokkos::LayoutRight, Memory> to_device3(const Host3& host) {
  Kokkos::View<T***, Kokkos::LayoutRight, Memory> device("tokens", host.extent(0), host.extent(1), host.extent(2));
  auto mirror = Kokkos::create_mirror_view(device);
  for (std::size_t i = 0; i < host.span(); ++i) mirror.data()[i] = T(host.data()[i]);
  Kokkos::deep_copy(device, mirror);
  return device;
}

template <class View>
std::vector<double> to_vector(const View& view) {
  auto mirror = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  return std::vector<double>(mirror.data(), mirror.data() + mirror.span());
}

// Rotary embedding from its definition (rotary.hpp), in double: pair (i, i + D/2) of token t turned
// by positions[t] * base^(-2i/D) (std::cos and std::sin reduce the large angles exactly).
void reference_rotary(const HostTensor& x, const std::vector<int>& positions, double base) {
  const int D = x.extent(3);
  for (std::size_t b = 0; b < x.extent(0); ++b)
    for (std::size_t t = 0; t < x.extent(1); ++t)
      for (std::size_t h = 0; h < x.extent(2); ++h)
        for (int i = 0; i < D / 2; ++i) {
          const double angle = positions[t] * std::pow(base, -2.0 * i / D);
          const double x0 = x(b, t, h, i), x1 = x(b, t, h, i + D / 2);
          x(b, t, h, i) = x0 * std::cos(angle) - x1 * std::sin(angle);
          x(b, t, h, i + D / 2) = x1 * std::cos(angle) + x0 * std::sin(angle);
        }
}

// y of the module with parameters `p` (the flat layout of MultiheadAttention) on x, in double,
// step by step from the layer's definition; `positions` for options.rotary (empty: 0 .. N-1).
Host3 reference_module_forward(const Host3& x, const std::vector<double>& p, int H,
                               const longattn::MultiheadAttentionOptions& options,
                               std::vector<int> positions = {}) {
  const int B = x.extent(0), N = x.extent(1), E = x.extent(2), D = E / H;
  const double* w_qkv = p.data();
  const double* b_qkv = w_qkv + 3 * E * E;
  const double* w_out = b_qkv + 3 * E;
  const double* b_out = w_out + E * E;
  const double* gamma = b_out + E;
  const double* beta = gamma + E;
  HostTensor qkv[3] = {HostTensor("q", B, N, H, D), HostTensor("k", B, N, H, D), HostTensor("v", B, N, H, D)};
  for (int i = 0; i < 3; ++i)
    for (int b = 0; b < B; ++b)
      for (int n = 0; n < N; ++n)
        for (int f = 0; f < E; ++f) {
          double sum = b_qkv[i * E + f];
          for (int e = 0; e < E; ++e) sum += x(b, n, e) * w_qkv[(i * E + f) * E + e];
          qkv[i](b, n, f / D, f % D) = sum;
        }
  if (options.rotary) {
    if (positions.empty())
      for (int t = 0; t < N; ++t) positions.push_back(t);
    reference_rotary(qkv[0], positions, options.rotary_base);
    reference_rotary(qkv[1], positions, options.rotary_base);
  }
  HostTensor a("a", B, N, H, D);
  HostRows lse("lse", B, H, N);
  const longattn::AttentionSpec spec =
      longattn::resolve_attention_spec(options.attention, N);
  if (spec.kind == longattn::AttentionSpec::Kind::dilated) {
    longattn::test::reference_dilated_forward(
        qkv[0], qkv[1], qkv[2], a, lse,
        {spec.dilated.segment_lengths, spec.dilated.dilation_rates,
         spec.dilated.mode == longattn::DilatedMode::head_groups, options.causal});
  } else if (spec.kind == longattn::AttentionSpec::Kind::block_sparse) {
    const longattn::BlockSparseConfig& config = spec.block_sparse;
    const int block = 64;
    longattn::test::BlockMask mask(block, 1, 1, N, N);
    if (config.pattern == longattn::BlockSparsePattern::top_k) {
      mask = longattn::test::reference_top_k(qkv[0], qkv[1], block, config.top_k, options.causal);
    } else if (config.pattern == longattn::BlockSparsePattern::random) {  // its draws, checked elsewhere
      longattn::BlockSparseShape shape;
      shape.queries = shape.keys = N;
      bool consistent = false;
      mask = longattn::test::read_layout(
          longattn::random_layout(Kokkos::DefaultHostExecutionSpace(), shape, config.density, config.seed, options.causal),
          consistent);
    } else {
      mask = longattn::test::reference_static_pattern(config, block, N, N, options.causal);
    }
    longattn::test::reference_attention_forward(qkv[0], qkv[1], qkv[2], a, lse, mask.options(options.causal));
  } else {
    longattn::test::reference_attention_forward(qkv[0], qkv[1], qkv[2], a, lse, {0.0, options.causal, 0, 0, {}});
  }
  Host3 y("y", B, N, E);
  std::vector<double> z(E);
  for (int b = 0; b < B; ++b)
    for (int n = 0; n < N; ++n) {
      for (int e = 0; e < E; ++e) z[e] = a(b, n, e / D, e % D);
      if (options.sub_layer_norm) {
        double mean = 0, var = 0;
        for (double v : z) mean += v / E;
        for (double v : z) var += (v - mean) * (v - mean) / E;
        for (int e = 0; e < E; ++e) z[e] = (z[e] - mean) / std::sqrt(var + options.layer_norm_eps) * gamma[e] + beta[e];
      }
      for (int f = 0; f < E; ++f) {
        double sum = b_out[f];
        for (int e = 0; e < E; ++e) sum += z[e] * w_out[f * E + e];
        y(b, n, f) = sum;
      }
    }
  return y;
}

longattn::MultiheadAttentionOptions module_options(const std::string& spec, bool causal, bool layer_norm) {
  longattn::MultiheadAttentionOptions options;
  options.attention = longattn::parse_attention_spec(spec);
  options.causal = causal;
  options.sub_layer_norm = layer_norm;
  options.gamma_init = 0.8;
  options.seed = longattn::test::test_seed();
  return options;
}

// Specs and the token count to run them at (block-sparse patterns need several 64-token blocks).
struct SpecCase {
  const char* spec;
  int tokens;
};
const SpecCase forward_cases[] = {
    {"dense", 29},
    {"dilated:w=8,16;r=1,2", 29},
    {"dilated:w=6,12,24;r=1,2,4;mode=head_groups", 29},
    {"auto", 29},
    {"block_sparse:pattern=local_window;radius=65", 150},
    {"block_sparse:pattern=dilated;rates=2", 150},
    {"block_sparse:pattern=global_local;global=10;radius=1", 150},
    {"block_sparse:pattern=random;density=0.5;seed=3", 150},
    {"block_sparse:pattern=top_k;k=2", 150},
};

template <class Memory>
using Positions = Kokkos::View<int*, Memory>;

template <class Memory>
Positions<Memory> device_positions(const std::vector<int>& positions) {
  Positions<Memory> device("positions", positions.size());
  const auto host = Kokkos::create_mirror_view(device);
  for (std::size_t t = 0; t < positions.size(); ++t) host(t) = positions[t];
  Kokkos::deep_copy(device, host);
  return device;
}

// N consecutive positions from a random start below 2^20: a shard of a long sequence.
std::vector<int> shard_positions(int N, std::mt19937_64& rng) {
  const int first = std::uniform_int_distribution<int>(0, 1 << 20)(rng);
  std::vector<int> positions(N);
  for (int t = 0; t < N; ++t) positions[t] = first + t;
  return positions;
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("MultiheadAttention forward matches the layer computed naively in double",
                        "[core][module]", longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  std::mt19937_64 rng(longattn::test::test_seed());
  const int B = 2, E = 12, H = 3;
  for (const SpecCase& c : forward_cases)
    for (bool causal : {false, true})
      for (bool layer_norm : {true, false}) {
        const char* spec = c.spec;  // lambdas below capture these (structured bindings: C++20)
        const int N = c.tokens;
        INFO(spec << (causal ? " causal" : "") << (layer_norm ? " sub-LayerNorm" : "") << ", seed "
                  << longattn::test::test_seed());
        const auto options = module_options(spec, causal, layer_norm);
        const Host3 x = random_tokens(B, N, E, rng);
        // Largest |y - y_reference| of a module storing and computing in T.
        auto worst_error = [&](auto zero) {
          using T = decltype(zero);
          longattn::MultiheadAttention<TestType, T> module(E, H, options);
          Kokkos::View<T***, Kokkos::LayoutRight, Memory> y("y", B, N, E);
          module.forward(to_device3<T, Memory>(x), y);
          const Host3 y_ref = reference_module_forward(x, to_vector(module.parameters()), H, options);
          const std::vector<double> y_kernel = to_vector(y);
          double worst = 0;
          for (std::size_t i = 0; i < y_ref.span(); ++i) worst = std::max(worst, std::abs(y_kernel[i] - y_ref.data()[i]));
          return worst;
        };
        CHECK(worst_error(0.0) < 1e-12);
        CHECK(worst_error(0.0f) < 1e-4);
        if (std::string(spec).find("top_k") == std::string::npos) {  // top-k scores float or double only
          // 16-bit storage: x, Q, K, V, A, Z and y each rounded once (unit roundoff 2^-8 and 2^-11).
          const double bf16 = worst_error(longattn::bfloat16(0.0)), fp16 = worst_error(longattn::float16(0.0));
          INFO("largest |y - y_reference|: bfloat16 " << bf16 << ", float16 " << fp16);
          CHECK(bf16 < 0.05);
          CHECK(fp16 < 0.006);
        }
      }
}

TEMPLATE_LIST_TEST_CASE("MultiheadAttention backward matches central finite differences", "[core][module]",
                        longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  using Tokens = Kokkos::View<double***, Kokkos::LayoutRight, Memory>;
  std::mt19937_64 rng(longattn::test::test_seed());
  const int E = 8, H = 2;
  const SpecCase cases[] = {{"dense", 11},
                            {"dilated:w=4,8;r=1,2", 11},
                            {"dilated:w=4,8;r=1,2;mode=head_groups", 11},
                            {"block_sparse:pattern=local_window;radius=1", 130},
                            {"block_sparse:pattern=top_k;k=2", 130}};
  for (const SpecCase& c : cases)
    for (bool causal : {false, true})
      for (bool layer_norm : {true, false})
      for (bool rotary : {false, true}) {
        const char* spec = c.spec;
        const int N = c.tokens;
        const int B = N > 64 ? 1 : 2;
        INFO(spec << (causal ? " causal" : "") << (layer_norm ? " sub-LayerNorm" : "") << (rotary ? " rotary" : "")
                  << ", seed " << longattn::test::test_seed());
        auto options = module_options(spec, causal, layer_norm);
        options.rotary = rotary;
        longattn::MultiheadAttention<TestType, double> module(E, H, options);
        // Rotary: positions from a random start, as a context-parallel shard's.
        const auto positions = rotary ? device_positions<Memory>(shard_positions(N, rng)) : Positions<Memory>();
        // Non-zero biases and LayerNorm parameters, so that their gradients' paths are exercised.
        auto parameters = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), module.parameters());
        std::uniform_real_distribution<double> uniform(-0.5, 0.5);
        for (std::size_t i = 3 * E * E; i < parameters.span(); ++i) parameters(i) += uniform(rng);
        Kokkos::deep_copy(module.parameters(), parameters);

        const Host3 r = random_tokens(B, N, E, rng);  // loss = sum(y * r), so dy = r
        Tokens x = to_device3<double, Memory>(random_tokens(B, N, E, rng)), y("y", B, N, E), dx("dx", B, N, E);
        module.forward(x, y, positions);
        module.backward(to_device3<double, Memory>(r), dx);
        const std::vector<double> dx_analytic = to_vector(dx), dp_analytic = to_vector(module.gradients());

        auto loss = [&] {
          module.forward(x, y, positions);
          const std::vector<double> out = to_vector(y);
          double sum = 0;
          for (std::size_t i = 0; i < out.size(); ++i) sum += out[i] * r.data()[i];
          return sum;
        };
        auto worst_error = [&](auto view, const std::vector<double>& analytic) {
          return longattn::test::finite_difference_error(view, loss, [&](std::size_t i) { return analytic[i]; });
        };
        const double dx_error = worst_error(x, dx_analytic), dp_error = worst_error(module.parameters(), dp_analytic);
        INFO("largest |finite difference - analytic|: dx " << dx_error << ", parameters " << dp_error);
        // Rounding in the finite differences grows with the loss, a sum over all tokens.
        const double allowed = 1e-7 * std::max(1.0, B * N / 22.0);
        CHECK(dx_error < allowed);
        CHECK(dp_error < allowed);
      }
}

TEMPLATE_LIST_TEST_CASE("MultiheadAttention accumulates parameter gradients until zero_gradients",
                        "[core][module]", longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  using Tokens = Kokkos::View<float***, Kokkos::LayoutRight, Memory>;
  std::mt19937_64 rng(longattn::test::test_seed());
  const int B = 1, N = 70, E = 16, H = 2;
  auto module = longattn::make_multihead_attention<TestType, float>("dilated:w=32,64;r=1,2", E, H);
  CHECK(longattn::to_string(module.attention()) == "dilated:w=32,64;r=1,2");
  Tokens x = to_device3<float, Memory>(random_tokens(B, N, E, rng)), y("y", B, N, E), dx("dx", B, N, E);
  Tokens dy = to_device3<float, Memory>(random_tokens(B, N, E, rng));
  module.forward(x, y);
  module.backward(dy, dx);
  const std::vector<double> once = to_vector(module.gradients());
  module.backward(dy, dx);
  const std::vector<double> twice = to_vector(module.gradients());
  double worst = 0, largest = 0;
  for (std::size_t i = 0; i < once.size(); ++i) {
    worst = std::max(worst, std::abs(twice[i] - 2 * once[i]));
    largest = std::max(largest, std::abs(once[i]));
  }
  CHECK(largest > 0);
  CHECK(worst <= 1e-5 * largest);
  module.zero_gradients();
  for (double g : to_vector(module.gradients())) REQUIRE(g == 0);
}

// Gradient memory lent by the caller (options.own_gradients = false, use_gradients): the module
// refuses backward without it, then writes there the gradients an owning module makes.
TEMPLATE_LIST_TEST_CASE("MultiheadAttention writes its gradients into memory the caller lends",
                        "[core][module]", longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  using Tokens = Kokkos::View<float***, Kokkos::LayoutRight, Memory>;
  using Module = longattn::MultiheadAttention<TestType, float>;
  std::mt19937_64 rng(longattn::test::test_seed());
  const int B = 2, N = 37, E = 12, H = 3;
  longattn::MultiheadAttentionOptions options;
  options.causal = true;
  options.seed = rng();
  Module owning(E, H, options);
  options.own_gradients = false;
  Module lent(E, H, options);
  CHECK(lent.gradients().size() == 0);
  Tokens x = to_device3<float, Memory>(random_tokens(B, N, E, rng)), y("y", B, N, E), dx("dx", B, N, E);
  Tokens dy = to_device3<float, Memory>(random_tokens(B, N, E, rng));
  lent.forward(x, y);
  CHECK_THROWS_WITH(lent.backward(dy, dx), Catch::Contains("use_gradients() before backward()"));
  CHECK_THROWS_WITH(lent.use_gradients(typename Module::GradientFlat("short", lent.parameter_count() - 1)),
                    Catch::Contains("argument 'storage' is " + std::to_string(lent.parameter_count() - 1)));
  typename Module::GradientFlat storage("lent", lent.parameter_count());
  lent.use_gradients(storage);
  lent.backward(dy, dx);
  owning.forward(x, y);
  owning.backward(dy, dx);
  CHECK(lent.gradients().data() == storage.data());
  const std::vector<double> from_lent = to_vector(storage), from_owning = to_vector(owning.gradients());
  CHECK(from_lent == from_owning);
  CHECK(std::any_of(from_lent.begin(), from_lent.end(), [](double g) { return g != 0; }));
}

// 16-bit storage (bfloat16, float16) with float sums, statistics and gradients: y, dx and every
// parameter gradient against the double module given the same (rounded) parameters and inputs,
// as normwise relative errors bounded by a few unit roundoffs of the storage type.
TEMPLATE_LIST_TEST_CASE("MultiheadAttention in 16-bit storage follows the double module within its precision",
                        "[core][module][half]", longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  std::mt19937_64 rng(longattn::test::test_seed());
  const int B = 2, E = 16, H = 2;
  const SpecCase cases[] = {{"dense", 45}, {"dilated:w=16,32;r=1,2", 45}, {"block_sparse:pattern=local_window;radius=64", 150}};
  auto relative_error = [](const std::vector<double>& got, const std::vector<double>& want) {
    double difference = 0, norm = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      difference += (got[i] - want[i]) * (got[i] - want[i]);
      norm += want[i] * want[i];
    }
    return std::sqrt(difference / norm);
  };
  auto check = [&](auto zero, double roundoff, const SpecCase& c, bool causal) {
    using T = decltype(zero);
    const int N = c.tokens;
    INFO(c.spec << (causal ? " causal" : "") << ", " << longattn::detail::scalar_name<T>() << ", seed "
                << longattn::test::test_seed());
    const auto options = module_options(c.spec, causal, true);
    longattn::MultiheadAttention<TestType, T> half(E, H, options);
    longattn::MultiheadAttention<TestType, double> exact(E, H, options);
    Kokkos::deep_copy(exact.parameters(), Kokkos::create_mirror_view_and_copy(Memory(), [&] {
                        const std::vector<double> rounded = to_vector(half.parameters());
                        Kokkos::View<double*, Kokkos::HostSpace> host("rounded", rounded.size());
                        for (std::size_t i = 0; i < rounded.size(); ++i) host(i) = rounded[i];
                        return host;
                      }()));
    // Inputs rounded to T once, so both modules see the same values.
    auto rounded = [&](const Host3& values) {
      Host3 r("rounded", values.extent(0), values.extent(1), values.extent(2));
      for (std::size_t i = 0; i < values.span(); ++i) r.data()[i] = double(float(T(values.data()[i])));
      return r;
    };
    const Host3 x = rounded(random_tokens(B, N, E, rng)), dy = rounded(random_tokens(B, N, E, rng));
    Kokkos::View<T***, Kokkos::LayoutRight, Memory> y16("y", B, N, E), dx16("dx", B, N, E);
    Kokkos::View<double***, Kokkos::LayoutRight, Memory> y64("y", B, N, E), dx64("dx", B, N, E);
    const auto x16 = to_device3<T, Memory>(x);
    const auto x64 = to_device3<double, Memory>(x);
    half.forward(x16, y16);
    half.backward(to_device3<T, Memory>(dy), dx16);
    exact.forward(x64, y64);
    exact.backward(to_device3<double, Memory>(dy), dx64);
    const double y_error = relative_error(to_vector(y16), to_vector(y64));
    const double dx_error = relative_error(to_vector(dx16), to_vector(dx64));
    const double gradient_error = relative_error(to_vector(half.gradients()), to_vector(exact.gradients()));
    INFO("relative errors: y " << y_error << ", dx " << dx_error << ", parameter gradients " << gradient_error
                               << " (unit roundoff " << roundoff << ")");
    CHECK(y_error < 2 * roundoff);  // measured: about one unit roundoff for each
    CHECK(dx_error < 3 * roundoff);
    CHECK(gradient_error < 3 * roundoff);
    CHECK(y_error > 0);  // rounding happened: the 16-bit path ran
  };
  for (const SpecCase& c : cases)
    for (bool causal : {false, true}) {
      check(longattn::bfloat16(0.0), 1.0 / 256, c, causal);  // 8 significant bits
      check(longattn::float16(0.0), 1.0 / 2048, c, causal);  // 11
    }
}

// Selective recomputation (options.recompute_attention) keeps Q, K, V only and recomputes the
// attention's outputs in backward: y, dx and the gradients are those of the module that keeps
// them, bit for bit (the same kernels on the same inputs), and forward keeps less memory. Two
// backward passes after one forward recompute twice; release_activations() needs a new forward.
TEMPLATE_LIST_TEST_CASE("MultiheadAttention with recompute_attention equals the module that keeps its outputs",
                        "[core][module][recompute]", longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  using Tokens = Kokkos::View<double***, Kokkos::LayoutRight, Memory>;
  std::mt19937_64 rng(longattn::test::test_seed());
  const int E = 16, H = 2;
  const SpecCase cases[] = {{"dense", 37}, {"dilated:w=16,32;r=1,2", 37}, {"block_sparse:pattern=top_k;k=2", 150}};
  for (const SpecCase& c : cases)
    for (bool causal : {false, true}) {
      const int B = 2, N = c.tokens;
      INFO(c.spec << (causal ? " causal" : "") << ", seed " << longattn::test::test_seed());
      const Tokens x = to_device3<double, Memory>(random_tokens(B, N, E, rng));
      const Tokens dy = to_device3<double, Memory>(random_tokens(B, N, E, rng));
      struct Run {
        std::vector<double> y, dx, gradients;
        std::size_t kept_bytes;  // pool bytes held between forward and backward
      };
      auto run = [&](bool recompute, int backward_passes) {
        longattn::memory::PoolOptions labelled;
        labelled.label = recompute ? "recompute" : "keep";
        const longattn::memory::Pool<Memory> pool(labelled);
        auto options = module_options(c.spec, causal, true);
        options.recompute_attention = recompute;
        longattn::MultiheadAttention<TestType, double> module(longattn::ExecutionContext<TestType>(TestType(), pool),
                                                              E, H, options);
        Tokens y("y", B, N, E), dx("dx", B, N, E);
        const std::size_t before = pool.stats().in_use_bytes;
        module.forward(x, y);
        Run r{to_vector(y), {}, {}, pool.stats().in_use_bytes - before};
        CHECK(r.kept_bytes >= module.activation_bytes(B, N));
        for (int i = 0; i < backward_passes; ++i) module.backward(dy, dx);
        r.dx = to_vector(dx);
        r.gradients = to_vector(module.gradients());
        module.release_activations();
        CHECK(pool.stats().in_use_bytes == before);
        CHECK_THROWS_WITH(module.backward(dy, dx), Catch::Contains("expected forward() before backward()"));
        return r;
      };
      for (int passes : {1, 2}) {
        INFO(passes << " backward passes");
        const Run keep = run(false, passes), recompute = run(true, passes);
        CHECK(recompute.y == keep.y);
        CHECK(recompute.dx == keep.dx);
        CHECK(recompute.gradients == keep.gradients);
        const std::size_t outputs = std::size_t(B) * N * (2 * E + H + 2) * sizeof(double);  // A, LSE, Z, statistics
        CHECK(keep.kept_bytes - recompute.kept_bytes >= outputs);
      }
    }
}

// Rotary positions (options.rotary): y against the naive layer with Q and K turned, at a shard's
// positions and at the default 0 .. N-1, in double, float and bfloat16. A score depends on the
// positions only through their differences: every position shifted alike leaves y as it was,
// while the layer without rotary gives another y. (Gradients: the finite-difference test above.)
TEMPLATE_LIST_TEST_CASE("MultiheadAttention with rotary positions matches the naive layer and sees only relative positions",
                        "[core][module][rotary]", longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  std::mt19937_64 rng(longattn::test::test_seed());
  const int B = 2, E = 12, H = 2;  // D = 6: three pairs a head
  const SpecCase cases[] = {{"dense", 29}, {"dilated:w=8,16;r=1,2", 29}, {"block_sparse:pattern=local_window;radius=65", 150}};
  for (const SpecCase& c : cases)
    for (bool causal : {false, true}) {
      const int N = c.tokens;
      INFO(c.spec << (causal ? " causal" : "") << ", seed " << longattn::test::test_seed());
      auto options = module_options(c.spec, causal, true);
      options.rotary = true;
      const Host3 x = random_tokens(B, N, E, rng);
      const std::vector<int> shard = shard_positions(N, rng);
      std::vector<int> shifted = shard;
      for (int& p : shifted) p += 4321;
      // y of a module storing and computing in T, at `positions` (empty: the default).
      auto output = [&](auto zero, const longattn::MultiheadAttentionOptions& o, const std::vector<int>& positions) {
        using T = decltype(zero);
        longattn::MultiheadAttention<TestType, T> module(E, H, o);
        Kokkos::View<T***, Kokkos::LayoutRight, Memory> y("y", B, N, E);
        module.forward(to_device3<T, Memory>(x), y,
                       positions.empty() ? Positions<Memory>() : device_positions<Memory>(positions));
        return std::make_pair(to_vector(y), to_vector(module.parameters()));
      };
      auto largest_difference = [](const std::vector<double>& a, const std::vector<double>& b) {
        double worst = 0;
        for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
        return worst;
      };
      auto worst_error = [&](auto zero, const std::vector<int>& positions) {
        const auto [y, parameters] = output(zero, options, positions);
        const Host3 y_ref = reference_module_forward(x, parameters, H, options, positions);
        return largest_difference(y, std::vector<double>(y_ref.data(), y_ref.data() + y_ref.span()));
      };
      for (const std::vector<int>& positions : {shard, std::vector<int>()}) {
        INFO((positions.empty() ? "default positions" : "positions from " + std::to_string(positions[0])));
        // Double: angles of ~1e6 radians are ~1e-10 apart from the reference's (std::pow against exp).
        CHECK(worst_error(0.0, positions) < 1e-9);
        CHECK(worst_error(0.0f, positions) < 1e-4);
        CHECK(worst_error(longattn::bfloat16(0.0), positions) < 0.05);
      }
      const std::vector<double> y = output(0.0, options, shard).first;
      CHECK(largest_difference(output(0.0, options, shifted).first, y) < 1e-8);  // angles of ~1e6 radians
      auto without = options;
      without.rotary = false;
      CHECK(largest_difference(output(0.0, without, {}).first, y) > 1e-3);
    }
}

// The kernel on its own: each pair turned by its position's angles (odd sizes, negative and large
// positions), Rotation::backward undoing Rotation::forward, and bad input.
TEMPLATE_LIST_TEST_CASE("rotary_embedding turns each pair by its position's angles", "[core][module][rotary]",
                        longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  std::mt19937_64 rng(longattn::test::test_seed());
  const int B = 2, N = 7, H = 3, D = 10;
  const double base = 500;
  std::vector<int> positions(N);
  for (int& p : positions) p = std::uniform_int_distribution<int>(-5, 1 << 24)(rng);
  const HostTensor q = longattn::test::random_tensor<double>(B, N, H, D, rng);
  const HostTensor k = longattn::test::random_tensor<double>(B, N, H, D, rng);
  HostTensor q_ref("q", B, N, H, D), k_ref("k", B, N, H, D);
  Kokkos::deep_copy(q_ref, q);
  Kokkos::deep_copy(k_ref, k);
  reference_rotary(q_ref, positions, base);
  reference_rotary(k_ref, positions, base);
  auto check = [&](auto zero, double tolerance) {
    using T = decltype(zero);
    INFO(longattn::detail::scalar_name<T>() << ", seed " << longattn::test::test_seed());
    auto qd = longattn::test::to_device<T, Memory>(q), kd = longattn::test::to_device<T, Memory>(k);
    const auto p = device_positions<Memory>(positions);
    const TestType exec;
    longattn::rotary_embedding(exec, qd, kd, p, base, longattn::Rotation::forward);
    CHECK(longattn::test::relative_error(longattn::test::to_host(qd), q_ref) < tolerance);
    CHECK(longattn::test::relative_error(longattn::test::to_host(kd), k_ref) < tolerance);
    longattn::rotary_embedding(exec, qd, kd, p, base, longattn::Rotation::backward);
    CHECK(longattn::test::relative_error(longattn::test::to_host(qd), q) < tolerance);
    CHECK(longattn::test::relative_error(longattn::test::to_host(kd), k) < tolerance);
  };
  check(0.0, 1e-7);  // the angles of 2^24 radians in double: ~1e-9 apart from std::pow's
  check(0.0f, 1e-6);

  using Heads = Kokkos::View<double****, Kokkos::LayoutRight, Memory>;
  const TestType exec;
  const Heads q6("q", 1, 4, 2, 6), k6("k", 1, 4, 2, 6), odd("odd", 1, 4, 2, 5);
  CHECK_THROWS_WITH(longattn::rotary_embedding(exec, odd, odd, Positions<Memory>("p", 4), base, longattn::Rotation::forward),
                    Catch::Contains("'q.extent(3)' is 5, expected an even head dim"));
  CHECK_THROWS_WITH(longattn::rotary_embedding(exec, q6, k6, Positions<Memory>("p", 4), 1.0, longattn::Rotation::forward),
                    Catch::Contains("'base' is 1, expected a finite number above 1"));
  CHECK_THROWS_WITH(longattn::rotary_embedding(exec, q6, Heads("k", 1, 3, 2, 6), Positions<Memory>("p", 4), base,
                                               longattn::Rotation::forward),
                    Catch::Contains("'k'"));
  CHECK_THROWS_WITH(longattn::rotary_embedding(exec, q6, k6, Positions<Memory>("p", 5), base, longattn::Rotation::forward),
                    Catch::Contains("'positions'"));
}

TEST_CASE("MultiheadAttention initializes as MAGNETO, reproducibly from its seed", "[core][module]") {
  using Host = Kokkos::DefaultHostExecutionSpace;
  const int E = 256, H = 4;
  longattn::MultiheadAttentionOptions options;
  options.gamma_init = 2.0;
  options.seed = 1234;
  longattn::MultiheadAttention<Host, double> module(E, H, options), same(E, H, options);
  CHECK(module.parameter_count() == std::size_t(4 * E * E + 6 * E));
  CHECK(to_vector(module.parameters()) == to_vector(same.parameters()));
  // Sample standard deviation of each projection: gain / sqrt(E) (65,536 samples: within 2%).
  auto stddev = [](const double* p, std::size_t n) {
    double sum = 0, squares = 0;
    for (std::size_t i = 0; i < n; ++i) sum += p[i], squares += p[i] * p[i];
    return std::sqrt(squares / n - (sum / n) * (sum / n));
  };
  const auto w = module.weights();
  const double unit = 1.0 / std::sqrt(double(E));
  CHECK(stddev(w.w_qkv.data(), E * E) == Approx(unit).epsilon(0.02));              // W_q
  CHECK(stddev(w.w_qkv.data() + E * E, E * E) == Approx(unit).epsilon(0.02));      // W_k
  CHECK(stddev(w.w_qkv.data() + 2 * E * E, E * E) == Approx(2 * unit).epsilon(0.02));  // W_v
  CHECK(stddev(w.w_out.data(), E * E) == Approx(2 * unit).epsilon(0.02));
  for (int e = 0; e < 3 * E; ++e) REQUIRE(w.b_qkv(e) == 0);
  for (int e = 0; e < E; ++e) REQUIRE((w.b_out(e) == 0 && w.ln_gamma(e) == 1 && w.ln_beta(e) == 0));
  options.sub_layer_norm = false;
  CHECK(longattn::MultiheadAttention<Host, double>(E, H, options).parameter_count() == std::size_t(4 * E * E + 4 * E));
}

TEST_CASE("attention specs parse, print and resolve; bad specs throw a longattn::Error", "[core][module][errors]") {
  using longattn::parse_attention_spec;
  using Kind = longattn::AttentionSpec::Kind;
  CHECK(parse_attention_spec("dense").kind == Kind::dense);
  CHECK(parse_attention_spec(" auto ").kind == Kind::automatic);
  const auto dilated = parse_attention_spec("dilated:w=2048,4096,8192;r=1,2,4");
  CHECK(dilated.kind == Kind::dilated);
  CHECK(dilated.dilated.segment_lengths == std::vector<std::int64_t>{2048, 4096, 8192});
  CHECK(dilated.dilated.dilation_rates == std::vector<std::int64_t>{1, 2, 4});
  CHECK(dilated.dilated.mode == longattn::DilatedMode::longnet);
  const std::string groups = "dilated:w=16,32;r=2,4;mode=head_groups";
  CHECK(longattn::to_string(parse_attention_spec(groups)) == groups);
  CHECK(parse_attention_spec("dilated: r=1 ; w=8 ; mode=longnet").dilated.segment_lengths[0] == 8);

  // auto: dense up to 8192 tokens, then LongNet's geometric configuration up to a segment >= N.
  const auto automatic = parse_attention_spec("auto");
  CHECK(longattn::resolve_attention_spec(automatic, 8192).kind == Kind::dense);
  const auto long_sequence = longattn::resolve_attention_spec(automatic, 20000);
  CHECK(long_sequence.kind == Kind::dilated);
  CHECK(long_sequence.dilated.segment_lengths == std::vector<std::int64_t>{2048, 4096, 8192, 16384, 32768});
  CHECK(long_sequence.dilated.dilation_rates == std::vector<std::int64_t>{1, 2, 4, 8, 16});

  // block_sparse: every pattern prints back as parsed (random with its seed).
  for (const std::string text :
       {"block_sparse:pattern=full", "block_sparse:pattern=local_window;radius=512",
        "block_sparse:pattern=dilated;rates=1,2,4", "block_sparse:pattern=global_local;global=64;radius=256",
        "block_sparse:pattern=random;density=0.1;seed=7", "block_sparse:pattern=top_k;k=8"}) {
    const auto parsed = parse_attention_spec(text);
    CHECK(parsed.kind == Kind::block_sparse);
    CHECK(longattn::to_string(parsed) == text);
  }
  const auto window = parse_attention_spec(" block_sparse: radius = 96 ; pattern = local_window ");
  CHECK(window.block_sparse.pattern == longattn::BlockSparsePattern::local_window);
  CHECK(window.block_sparse.radius == 96);
  CHECK(parse_attention_spec("block_sparse:pattern=random;density=0.25").block_sparse.seed == 0);
  CHECK(longattn::resolve_attention_spec(window, 100000).kind == Kind::block_sparse);

  CHECK_THROWS_WITH(parse_attention_spec("sparse"),
                    Catch::Contains("argument 'spec' is \"sparse\", expected dense, auto, dilated:"));
  CHECK_THROWS_WITH(parse_attention_spec("block_sparse:pattern=local"),
                    Catch::Contains("(\"pattern=local\" is not one of its fields, or repeats one)"));
  CHECK_THROWS_WITH(parse_attention_spec("block_sparse:radius=5"), Catch::Contains("(pattern= is needed)"));
  CHECK_THROWS_WITH(parse_attention_spec("block_sparse:pattern=local_window"),
                    Catch::Contains("(pattern=local_window needs radius=)"));
  CHECK_THROWS_WITH(parse_attention_spec("block_sparse:pattern=top_k;k=4;radius=3"),
                    Catch::Contains("(pattern=top_k takes no radius=)"));
  CHECK_THROWS_WITH(parse_attention_spec("block_sparse:pattern=top_k;k=4;k=5"), Catch::Contains("\"k=5\" is not one of its fields, or repeats one"));
  CHECK_THROWS_WITH(parse_attention_spec("block_sparse:pattern=top_k;k=0"), Catch::Contains("'top_k' is 0, expected at least 1"));
  CHECK_THROWS_WITH(parse_attention_spec("block_sparse:pattern=random;density=2"), Catch::Contains("'density' is 2"));
  CHECK_THROWS_WITH(parse_attention_spec("block_sparse:pattern=random;density=0.1x"), Catch::Contains("density= as a number (\"0.1x\" is not one)"));
  CHECK_THROWS_WITH(parse_attention_spec("block_sparse:pattern=random;density=0.1;seed=-1"), Catch::Contains("seed= as a non-negative integer"));
  CHECK_THROWS_WITH(parse_attention_spec("block_sparse:pattern=dilated;rates=1,0"), Catch::Contains("'rates[1]' is 0"));
  CHECK_THROWS_WITH(parse_attention_spec("block_sparse:pattern=global_local;global=-1;radius=2"), Catch::Contains("'global_tokens' is -1"));
  CHECK_THROWS_WITH(parse_attention_spec("dilated:w=8,16"), Catch::Contains("both w= and r= are needed"));
  CHECK_THROWS_WITH(parse_attention_spec("dilated:w=8,x;r=1,2"), Catch::Contains("(\"x\" is not one)"));
  CHECK_THROWS_WITH(parse_attention_spec("dilated:w=8;r=1;mode=fast"),
                    Catch::Contains("(\"mode=fast\" is not one of its fields, or repeats one)"));
  CHECK_THROWS_WITH(parse_attention_spec("dilated:w=8;w=8;r=1"), Catch::Contains("\"w=8\" is not one of its fields, or repeats one"));
  CHECK_THROWS_WITH(parse_attention_spec("dilated:w=8;r=3"),
                    Catch::Contains("'config.dilation_rates[0]' is 3, expected a divisor of config.segment_lengths[0] = 8"));
  CHECK_THROWS_WITH(parse_attention_spec("dilated:w=8,16;r=1"), Catch::Contains("'config.dilation_rates.size()' is 1"));
}

TEST_CASE("MultiheadAttention rejects bad input with a longattn::Error", "[core][module][errors]") {
  using Host = Kokkos::DefaultHostExecutionSpace;
  using Module = longattn::MultiheadAttention<Host, float>;
  using Tokens = Module::Tokens;
  CHECK_THROWS_WITH(Module(10, 3), Catch::Contains("'embed_dim' is 10, expected a positive multiple of heads = 3"));
  CHECK_THROWS_WITH(Module(8, 0), Catch::Contains("'heads' is 0, expected at least 1"));
  CHECK_THROWS_WITH(Module(1024, 2), Catch::Contains("'embed_dim / heads' is 512, expected a head dim of at most 256"));
  CHECK_THROWS_WITH(longattn::make_multihead_attention<Host>("dilated:w=8,16,32;r=1,2,4;mode=head_groups", 8, 2),
                    Catch::Contains("'heads' is 2, expected at least 3 (one per configuration in head_groups mode)"));
  longattn::MultiheadAttentionOptions bad_eps;
  bad_eps.layer_norm_eps = 0;
  CHECK_THROWS_WITH(Module(8, 2, bad_eps), Catch::Contains("'options.layer_norm_eps' is 0"));

  Module module(8, 2);
  Tokens x("x", 2, 5, 8), y("y", 2, 5, 8), dx("dx", 2, 5, 8);
  CHECK_THROWS_WITH(module.backward(y, dx), Catch::Contains("expected forward() before backward()"));
  CHECK_THROWS_WITH(module.forward(Tokens("x", 2, 5, 6), y), Catch::Contains("'x's extents' is [2, 5, 6], expected [2, 5, 8]"));
  CHECK_THROWS_WITH(module.forward(x, Tokens("y", 2, 4, 8)), Catch::Contains("'y's extents' is [2, 4, 8], expected [2, 5, 8]"));
  CHECK_THROWS_WITH(module.forward(Tokens("x", 2, 0, 8), Tokens("y", 2, 0, 8)), Catch::Contains("'x's extents' is [2, 0, 8]"));
  CHECK_THROWS_WITH(module.forward(x, x), Catch::Contains("argument 'y' is overlapping x"));
  module.forward(x, y);
  CHECK_THROWS_WITH(module.backward(Tokens("dy", 1, 5, 8), dx), Catch::Contains("'dy's extents' is [1, 5, 8], expected [2, 5, 8]"));
  CHECK_THROWS_WITH(module.backward(y, x), Catch::Contains("argument 'dx' is overlapping x (of the forward pass)"));
  CHECK_NOTHROW(module.backward(y, dx));
  CHECK_THROWS_WITH(module.activation_bytes(-1, 5), Catch::Contains("'batch' is -1, expected a count >= 0"));
  CHECK_THROWS_WITH(module.forward(x, y, Positions<Kokkos::HostSpace>("p", 5)),
                    Catch::Contains("'positions' is a view of 5, expected none without options.rotary"));

  longattn::MultiheadAttentionOptions rotary;
  rotary.rotary = true;
  CHECK_THROWS_WITH(Module(6, 2, rotary), Catch::Contains("'embed_dim / heads' is 3, expected an even head dim with options.rotary"));
  rotary.rotary_base = 0.5;
  CHECK_THROWS_WITH(Module(8, 2, rotary), Catch::Contains("'options.rotary_base' is 0.5, expected a finite number above 1"));
  rotary.rotary_base = longattn::rotary_default_base;
  Module turning(8, 2, rotary);
  CHECK_THROWS_WITH(turning.forward(x, y, Positions<Kokkos::HostSpace>("p", 4)), Catch::Contains("'positions'"));
  CHECK_NOTHROW(turning.forward(x, y, Positions<Kokkos::HostSpace>("p", 5)));
}

// LayerNorm's kernels against the formulas in double: y = x_hat gamma + beta with x_hat =
// (x - mean) rstd; dx = rstd (g - mean(g) - x_hat mean(g x_hat)) for g = dy gamma; dgamma and
// dbeta add sum_r dy x_hat and sum_r dy to what they hold. Row-major and column-major (strided)
// matrices, odd sizes. With a residual, the fused forms: x += residual before the norm (x the
// rounded sum after it), dx = the norm's dx + residual_dx.
namespace {

template <class ExecSpace, class T, class Layout>
void check_layer_norm(int rows, int E, std::mt19937_64& rng, bool residual) {
  using Memory = typename ExecSpace::memory_space;
  using Matrix = Kokkos::View<T**, Layout, Memory>;
  using Vector = Kokkos::View<T*, Memory>;
  INFO("rows " << rows << " E " << E << (std::is_same_v<Layout, Kokkos::LayoutLeft> ? " column-major" : "") << ", "
               << longattn::detail::scalar_name<T>() << (residual ? ", with residuals" : "") << ", seed "
               << longattn::test::test_seed());
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  // Fills a view with random values and returns a host copy of them (a copy even when the view
  // is in host memory: dgamma and dbeta change).
  auto random_values = [&](auto view) {
    auto host = Kokkos::create_mirror(Kokkos::HostSpace(), view);
    for (std::size_t i = 0; i < host.span(); ++i) host.data()[i] = T(uniform(rng));
    Kokkos::deep_copy(view, host);
    return host;
  };
  const Matrix x("x", rows, E), dy("dy", rows, E), y("y", rows, E), dx("dx", rows, E);
  const Matrix x_residual("x_residual", rows, E), dx_residual("dx_residual", rows, E);
  const Vector gamma("gamma", E), beta("beta", E), dgamma("dgamma", E), dbeta("dbeta", E);
  const Vector mean("mean", rows), rstd("rstd", rows);
  auto xh = random_values(x);
  const auto dyh = random_values(dy), xrh = random_values(x_residual), dxrh = random_values(dx_residual);
  const auto gh = random_values(gamma), bh = random_values(beta), dgh = random_values(dgamma), dbh = random_values(dbeta);
  const double eps = 1e-5;
  const ExecSpace exec;
  if (residual) {
    longattn::residual_layer_norm_forward(exec, x, x_residual, gamma, beta, eps, y, mean, rstd);
    longattn::residual_layer_norm_backward(exec, dy, x, gamma, mean, rstd, dx_residual, dx, dgamma, dbeta);
    const auto x_out = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
    for (int r = 0; r < rows; ++r)
      for (int e = 0; e < E; ++e) {
        INFO("x(" << r << ", " << e << ")");
        REQUIRE(x_out(r, e) == T(xh(r, e) + xrh(r, e)));
        xh(r, e) = x_out(r, e);  // the norm's input from here on
      }
  } else {
    longattn::layer_norm_forward(exec, x, gamma, beta, eps, y, mean, rstd);
    longattn::layer_norm_backward(exec, dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
  }
  exec.fence();

  const auto y_out = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  const auto dx_out = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dx);
  const auto dg_out = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dgamma);
  const auto db_out = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dbeta);
  const double tol = std::is_same_v<T, float> ? 2e-5 : 1e-12;
  double y_err = 0, dx_err = 0, dg_err = 0, db_err = 0;
  std::vector<double> dg_ref(E), db_ref(E);
  for (int e = 0; e < E; ++e) dg_ref[e] = dgh(e), db_ref[e] = dbh(e);
  for (int r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int e = 0; e < E; ++e) mu += xh(r, e);
    mu /= E;
    for (int e = 0; e < E; ++e) var += (xh(r, e) - mu) * (xh(r, e) - mu);
    const double rs = 1 / std::sqrt(var / E + eps);
    double mean_g = 0, mean_gx = 0;
    for (int e = 0; e < E; ++e) {
      const double x_hat = (xh(r, e) - mu) * rs, g = dyh(r, e) * gh(e);
      y_err = std::max(y_err, std::abs(y_out(r, e) - (x_hat * gh(e) + bh(e))));
      mean_g += g / E;
      mean_gx += g * x_hat / E;
      dg_ref[e] += dyh(r, e) * x_hat;
      db_ref[e] += dyh(r, e);
    }
    for (int e = 0; e < E; ++e) {
      const double x_hat = (xh(r, e) - mu) * rs, g = dyh(r, e) * gh(e);
      const double around = residual ? double(dxrh(r, e)) : 0.0;  // through the residual connection
      dx_err = std::max(dx_err, std::abs(dx_out(r, e) - (rs * (g - mean_g - x_hat * mean_gx) + around)));
    }
  }
  for (int e = 0; e < E; ++e) {
    dg_err = std::max(dg_err, std::abs(dg_out(e) - dg_ref[e]) / std::max(1.0, std::abs(dg_ref[e])));
    db_err = std::max(db_err, std::abs(db_out(e) - db_ref[e]) / std::max(1.0, std::abs(db_ref[e])));
  }
  CHECK(y_err <= tol);
  CHECK(dx_err <= 10 * tol);  // dx carries rstd and two row means
  CHECK(dg_err <= tol * rows);
  CHECK(db_err <= tol * rows);
}

template <class ExecSpace>
void check_layer_norms() {
  std::mt19937_64 rng(longattn::test::test_seed());
  for (const auto& [rows, E] : {std::pair{1, 1}, std::pair{37, 19}, std::pair{130, 256}})
    for (const bool residual : {false, true}) {
      check_layer_norm<ExecSpace, float, Kokkos::LayoutRight>(rows, E, rng, residual);
      check_layer_norm<ExecSpace, double, Kokkos::LayoutRight>(rows, E, rng, residual);
      check_layer_norm<ExecSpace, double, Kokkos::LayoutLeft>(rows, E, rng, residual);
    }
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("layer_norm_forward and layer_norm_backward match their formulas", "[core][module]",
                        longattn::test::ExecutionSpaces) {
  check_layer_norms<TestType>();
}

// LayerNorm has no team: one thread per row (per column for the parameter gradients) is the
// GPU's configuration and the host's alike. Here on the team tests' 4 OpenMP threads, so that
// ThreadSanitizer runs it too.
TEST_CASE("layer_norm on 4 OpenMP threads matches its formulas", "[core][module][team_tiles]") {
  if (!longattn::test::openmp_runs_team_of<longattn::ThreadTiles<4>>()) return;
#ifdef KOKKOS_ENABLE_OPENMP
  check_layer_norms<Kokkos::OpenMP>();
#endif
}

TEST_CASE("layer_norm_forward and layer_norm_backward reject mismatched shapes", "[core][module][errors]") {
  using Host = Kokkos::DefaultHostExecutionSpace;
  using M = Kokkos::View<float**, Kokkos::HostSpace>;
  using V = Kokkos::View<float*, Kokkos::HostSpace>;
  const Host exec;
  M x("x", 6, 8), y("y", 6, 8), dx("dx", 6, 8);
  V gamma("gamma", 8), beta("beta", 8), mean("mean", 6), rstd("rstd", 6);
  CHECK_NOTHROW(longattn::layer_norm_forward(exec, x, gamma, beta, 1e-5, y, mean, rstd));
  CHECK_THROWS_WITH(longattn::layer_norm_forward(exec, x, V("gamma", 7), beta, 1e-5, y, mean, rstd),
                    Catch::Contains("'gamma's extents' is [7], expected [8] ([E] of x)"));
  CHECK_THROWS_WITH(longattn::layer_norm_forward(exec, x, gamma, beta, 1e-5, M("y", 5, 8), mean, rstd),
                    Catch::Contains("'y's extents' is [5, 8], expected [6, 8]"));
  CHECK_THROWS_WITH(longattn::layer_norm_forward(exec, x, gamma, beta, 0.0, y, mean, rstd),
                    Catch::Contains("'eps' is 0, expected a positive finite number"));
  CHECK_THROWS_WITH(longattn::layer_norm_backward(exec, y, x, gamma, V("mean", 5), rstd, dx, gamma, beta),
                    Catch::Contains("'mean's extents' is [5], expected [6]"));
  CHECK_THROWS_WITH(longattn::layer_norm_backward(exec, y, x, gamma, mean, rstd, y, gamma, beta),
                    Catch::Contains("argument 'dx' is overlapping dy"));
  CHECK_NOTHROW(longattn::residual_layer_norm_forward(exec, x, dx, gamma, beta, 1e-5, y, mean, rstd));
  CHECK_THROWS_WITH(longattn::residual_layer_norm_forward(exec, x, M("r", 6, 7), gamma, beta, 1e-5, y, mean, rstd),
                    Catch::Contains("'residual's extents' is [6, 7], expected [6, 8] (the extents of x)"));
  CHECK_THROWS_WITH(longattn::residual_layer_norm_forward(exec, x, x, gamma, beta, 1e-5, y, mean, rstd),
                    Catch::Contains("argument 'residual' is overlapping x"));
  CHECK_THROWS_WITH(longattn::residual_layer_norm_forward(exec, x, y, gamma, beta, 1e-5, y, mean, rstd),
                    Catch::Contains("argument 'y' is overlapping residual"));
  CHECK_NOTHROW(longattn::residual_layer_norm_backward(exec, y, x, gamma, mean, rstd, x, dx, gamma, beta));
  CHECK_THROWS_WITH(longattn::residual_layer_norm_backward(exec, y, x, gamma, mean, rstd, M("r", 5, 8), dx, gamma, beta),
                    Catch::Contains("'residual's extents' is [5, 8], expected [6, 8]"));
  CHECK_THROWS_WITH(longattn::residual_layer_norm_backward(exec, y, x, gamma, mean, rstd, dx, dx, gamma, beta),
                    Catch::Contains("argument 'dx' is overlapping residual"));
}
