// longattn::linear_forward and linear_input_gradient against a naive double reference: with and
// without the bias, the residual and GELU, odd sizes, float, double, bfloat16 and float16, on
// every enabled execution space (on Kokkos::Cuda, 16-bit storage and float with TF32 allowed
// through cuBLASLt's epilogues);
// GELU's derivative against finite differences; bad arguments.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "execution_spaces.hpp"
#include "longattn/core/attention.hpp"  // detail::scalar_name
#include "longattn/core/linear.hpp"
#include "reference/random.hpp"
#include "tf32.hpp"

namespace {

// cuBLASLt matmuls so far (CUDA builds), 0 elsewhere.
std::int64_t cublaslt_calls() {
#if defined(KOKKOS_ENABLE_CUDA)
  return longattn::detail::cublaslt_matmul_calls();
#else
  return 0;
#endif
}

// GELU in cuBLASLt's epilogue or not while it lives.
class CublasLtGelu {
 public:
  explicit CublasLtGelu(bool on) : before_(longattn::cublaslt_gelu_in_use()) { longattn::use_cublaslt_gelu(on); }
  ~CublasLtGelu() { longattn::use_cublaslt_gelu(before_); }
  CublasLtGelu(const CublasLtGelu&) = delete;
  CublasLtGelu& operator=(const CublasLtGelu&) = delete;

 private:
  bool before_;
};

// GELU in double, in its tanh form as written (the library computes u sigmoid(2a)).
double reference_gelu(double u) {
  return 0.5 * u * (1 + std::tanh(std::sqrt(2 / M_PI) * (u + 0.044715 * u * u * u)));
}

// GELU'(u) by central differences of reference_gelu (error about 1e-10 at this step).
double difference_gelu(double u) {
  const double h = 1e-5;
  return (reference_gelu(u + h) - reference_gelu(u - h)) / (2 * h);
}

// The unit roundoff of T's storage: each stored result is off by at most this, relatively.
template <class T>
double unit_roundoff() {
  if constexpr (std::is_same_v<T, longattn::bfloat16>) return 1.0 / 256;
  if constexpr (std::is_same_v<T, longattn::float16>) return 1.0 / 2048;
  if constexpr (std::is_same_v<T, float>) return 6e-8;
  return 1.2e-16;
}

template <class T, class ExecSpace>
struct Case {
  using Memory = typename ExecSpace::memory_space;
  using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, Memory>;
  using Vector = Kokkos::View<T*, Memory>;
  using HostMatrix = typename Matrix::HostMirror;

  static auto random(const Matrix& m, std::mt19937_64& rng) {
    const auto host = Kokkos::create_mirror_view(m);
    longattn::test::fill_uniform(host, rng);
    Kokkos::deep_copy(m, host);
    return host;
  }

  // The worst |result - expected| over a matrix, and the largest |expected| (the scale of errors).
  static std::pair<double, double> compare(const Matrix& result, const std::vector<double>& expected) {
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), result);
    double worst = 0, largest = 0;
    for (std::size_t r = 0; r < host.extent(0); ++r)
      for (std::size_t c = 0; c < host.extent(1); ++c) {
        const double e = expected[r * host.extent(1) + c];
        worst = std::isnan(double(host(r, c))) ? INFINITY : std::max(worst, std::abs(double(host(r, c)) - e));
        largest = std::max(largest, std::abs(e));
      }
    return {worst, largest};
  }

  // y = x W^T + b (+ residual; g = GELU(y)) and dx = dy W (*= GELU'(u)) for rows x in -> out.
  static void check(int rows, int in, int out, bool bias, bool residual, bool gelu, std::mt19937_64& rng) {
    Matrix x("x", rows, in), w("w", out, in), y("y", rows, out), r("residual", rows, out), g("g", rows, out);
    Vector b("b", out);
    const auto hx = random(x, rng), hw = random(w, rng), hr = random(r, rng);
    const auto hb = Kokkos::create_mirror_view(b);
    std::uniform_real_distribution<double> uniform(-1.0, 1.0);
    for (int o = 0; o < out; ++o) hb(o) = T(uniform(rng));
    Kokkos::deep_copy(b, hb);
    Kokkos::deep_copy(y, T(std::nanf("")));  // not read: the product and bias overwrite it
    // `magnitude`: the largest sum of the terms' magnitudes, |b| + sum |x w| + |residual|, which
    // bounds every partial result the separate kernels round (they may cancel to a smaller y).
    std::vector<double> pre(std::size_t(rows) * out), post(pre.size());
    double magnitude = 0;
    for (int i = 0; i < rows; ++i)
      for (int o = 0; o < out; ++o) {
        double sum = bias ? double(hb(o)) : 0.0, terms = std::abs(sum);
        for (int k = 0; k < in; ++k) {
          sum += double(hx(i, k)) * double(hw(o, k));
          terms += std::abs(double(hx(i, k)) * double(hw(o, k)));
        }
        if (residual) sum += double(hr(i, o)), terms += std::abs(double(hr(i, o)));
        pre[std::size_t(i) * out + o] = sum;
        post[std::size_t(i) * out + o] = reference_gelu(sum);
        magnitude = std::max(magnitude, terms);
      }
    INFO(longattn::detail::scalar_name<T>() << " rows in out " << rows << " " << in << " " << out << ", bias "
                                            << bias << ", residual " << residual << ", gelu " << gelu << ", seed "
                                            << longattn::test::test_seed());
    const longattn::memory::Pool<Memory> pool;
    const longattn::ExecutionContext<ExecSpace> ctx(ExecSpace(), pool);
    const std::int64_t lt_before = cublaslt_calls();
    longattn::linear_forward(ctx, x, w, bias ? b : Vector(), y, {residual ? r : Matrix(), gelu ? g : Matrix()});
    // On Kokkos::Cuda 16-bit layers whose rows are multiples of 8 elements apart are one cuBLASLt
    // matmul (float ones too where TF32 products are allowed), GELU in it or after it.
    const bool lt_type = longattn::is_half_v<T> || (std::is_same_v<T, float> && longattn::tf32_matmul_allowed());
    const bool on_lt = longattn::test::is_cuda<ExecSpace> && lt_type && out % 8 == 0 && in % 8 == 0;
    if (on_lt) CHECK(cublaslt_calls() == lt_before + 1);
    if (!longattn::test::is_cuda<ExecSpace>) CHECK(cublaslt_calls() == lt_before);
    CHECK(pool.stats().in_use_bytes == 0);

    // Float sums of the products (16-bit ones exact), the bias and residual rounded in at most
    // three times (the separate kernels), each rounding at most u of `magnitude`; GELU's output
    // once more (its slope is under 1.13).
    // GELU is evaluated in accumulate_t<T> (exp, a division): a few of its roundoffs more.
    const double u = unit_roundoff<T>(), eps = unit_roundoff<longattn::accumulate_t<T>>();
    const double products = std::is_same_v<T, float> ? longattn::test::float_product_roundoff<ExecSpace>() : 0.0;
    const double sums = 8 * eps * in + products * in;
    const double y_error = compare(y, pre).first;
    CHECK(y_error <= 3 * u * magnitude + sums);
    if (gelu) {
      const auto [g_error, g_scale] = compare(g, post);
      CHECK(g_error <= 1.13 * (3 * u * magnitude + sums) + u * g_scale + 16 * eps * (g_scale + 1));
    }

    // Backward through the layer into GELU's input: du = (dy W) * GELU'(u), u = y as stored.
    Matrix dy("dy", rows, out), du("du", rows, in), uin("u", rows, in);
    const auto hdy = random(dy, rng), hu = random(uin, rng);
    for (std::size_t i = 0; i < hu.size(); ++i) hu.data()[i] = T(4 * double(hu.data()[i]));  // GELU's curved range
    Kokkos::deep_copy(uin, hu);
    Kokkos::deep_copy(du, T(std::nanf("")));
    std::vector<double> expected(std::size_t(rows) * in);
    for (int i = 0; i < rows; ++i)
      for (int k = 0; k < in; ++k) {
        double sum = 0;
        for (int o = 0; o < out; ++o) sum += double(hdy(i, o)) * double(hw(o, k));
        expected[std::size_t(i) * in + k] = gelu ? sum * difference_gelu(double(hu(i, k))) : sum;
      }
    const std::int64_t lt_backward = cublaslt_calls();
    longattn::linear_input_gradient(ctx, dy, w, du, gelu ? uin : Matrix());
    // GELU's derivative in the epilogue where GELU is; else the matmul is gemm(ctx, ...)'s.
    CHECK(cublaslt_calls() == lt_backward + (on_lt && gelu && longattn::cublaslt_gelu_in_use() ? 1 : 0));
    const auto [d_error, d_scale] = compare(du, expected);
    // dy W rounded once, then times GELU'(u) (at most 1.13, in accumulate_t<T>) rounded again;
    // the reference's derivative by differences is off by about 1e-10.
    CHECK(d_error <= 2 * u * d_scale + 1.13 * (8 * eps + products) * out + 64 * eps * d_scale + 1e-9 * out);
    CHECK(pool.stats().in_use_bytes == 0);
  }

  static void check_all(std::mt19937_64& rng) {
    for (const bool bias : {false, true})
      for (const bool residual : {false, true})
        for (const bool gelu : {false, true}) {
          check(37, 29, 19, bias, residual, gelu, rng);  // odd sizes: the separate kernels everywhere
          check(40, 64, 24, bias, residual, gelu, rng);  // cuBLASLt's shapes on Kokkos::Cuda
        }
    check(1, 1, 1, true, true, true, rng);
  }
};

}  // namespace

TEMPLATE_LIST_TEST_CASE("linear_forward and linear_input_gradient match the double reference", "[core][linear]",
                        longattn::test::ExecutionSpaces) {
  std::mt19937_64 rng(longattn::test::test_seed());
  Case<float, TestType>::check_all(rng);
  Case<double, TestType>::check_all(rng);
  for (const bool gelu_epilogue : {false, true}) {
    const CublasLtGelu epilogue(gelu_epilogue);
    Case<longattn::bfloat16, TestType>::check_all(rng);
    Case<longattn::float16, TestType>::check_all(rng);
  }
}

TEMPLATE_LIST_TEST_CASE("float linear layers run on TF32 tensor cores where allowed", "[core][linear]",
                        longattn::test::ExecutionSpaces) {
  const longattn::test::AllowTf32 tf32(true);
  std::mt19937_64 rng(longattn::test::test_seed());
  for (const bool gelu_epilogue : {false, true}) {
    const CublasLtGelu epilogue(gelu_epilogue);
    Case<float, TestType>::check_all(rng);
  }
}

TEST_CASE("GELU's derivative matches finite differences of GELU", "[core][linear]") {
  for (double u = -6; u <= 6; u += 0.03125) {
    INFO("u = " << u);
    CHECK(longattn::gelu_derivative(u) == Approx(difference_gelu(u)).margin(1e-9));
    CHECK(u * longattn::gelu_sigmoid(u) == Approx(reference_gelu(u)).margin(1e-15));
  }
}

TEST_CASE("linear layers reject wrong extents and overlapping outputs with a longattn::Error", "[core][linear][errors]") {
  using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace>;
  using Vector = Kokkos::View<float*, Kokkos::HostSpace>;
  const longattn::memory::Pool<Kokkos::HostSpace> pool;
  const longattn::ExecutionContext<Kokkos::DefaultHostExecutionSpace> ctx(Kokkos::DefaultHostExecutionSpace(), pool);
  Matrix x("x", 5, 3), w("w", 4, 3), y("y", 5, 4), other("other", 5, 4), wrong("wrong", 6, 4);
  Vector b("b", 4), short_b("b", 3);
  CHECK_NOTHROW(longattn::linear_forward(ctx, x, w, b, y, {other, Matrix()}));
  CHECK_THROWS_WITH(longattn::linear_forward(ctx, x, Matrix("w", 4, 2), b, y),
                    Catch::Contains("'w's extents' is [4, 2]") && Catch::Contains("expected [4, 3]"));
  CHECK_THROWS_WITH(longattn::linear_forward(ctx, x, w, b, wrong),
                    Catch::Contains("'y's extents' is [6, 4]") && Catch::Contains("expected [5, 4]"));
  CHECK_THROWS_WITH(longattn::linear_forward(ctx, x, w, short_b, y),
                    Catch::Contains("'bias's extents' is [3]") && Catch::Contains("expected [4]"));
  CHECK_THROWS_WITH(longattn::linear_forward(ctx, x, w, b, y, {wrong, Matrix()}), Catch::Contains("'residual's extents'"));
  CHECK_THROWS_WITH(longattn::linear_forward(ctx, x, w, b, y, {Matrix(), wrong}), Catch::Contains("'gelu's extents'"));
  CHECK_THROWS_WITH(longattn::linear_forward(ctx, x, w, b, y, {y, Matrix()}),
                    Catch::Contains("longattn::linear_forward") && Catch::Contains("'y'"));
  CHECK_THROWS_WITH(longattn::linear_forward(ctx, x, w, b, y, {Matrix(), y}), Catch::Contains("'gelu'"));
  Matrix dy("dy", 5, 4), dx("dx", 5, 3), u("u", 5, 3);
  CHECK_NOTHROW(longattn::linear_input_gradient(ctx, dy, w, dx, u));
  CHECK_THROWS_WITH(longattn::linear_input_gradient(ctx, dy, w, Matrix("dx", 5, 4)),
                    Catch::Contains("longattn::linear_input_gradient") && Catch::Contains("'dx's extents' is [5, 4]"));
  CHECK_THROWS_WITH(longattn::linear_input_gradient(ctx, dy, w, dx, Matrix("u", 4, 3)),
                    Catch::Contains("'gelu_input's extents' is [4, 3]"));
  CHECK_THROWS_WITH(longattn::linear_input_gradient(ctx, dy, w, dx, dx), Catch::Contains("'dx'"));
  CHECK_NOTHROW(longattn::add_into(ctx.exec(), y, other));
  CHECK_THROWS_WITH(longattn::add_into(ctx.exec(), y, wrong), Catch::Contains("longattn::add_into") &&
                                                                  Catch::Contains("'x's extents' is [6, 4]") &&
                                                                  Catch::Contains("expected [5, 4]"));
}
