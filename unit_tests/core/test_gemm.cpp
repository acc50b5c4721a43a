// longattn::gemm against the naive double-precision reference: odd sizes, every transpose
// combination, both layouts, float and double, on every enabled execution space; 16-bit storage
// (bfloat16, float16) through gemm(ctx, ...) with C of the same type or float, bfloat16 both through
// float copies and on the CPU's bf16 dot products, through cuBLAS on Kokkos::Cuda; column sums.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "bf16_dot_products.hpp"
#include "execution_spaces.hpp"
#include "longattn/core/attention.hpp"  // detail::scalar_name
#include "longattn/core/gemm.hpp"
#include "reference/gemm.hpp"
#include "reference/random.hpp"
#include "tf32.hpp"

namespace {

// cuBLAS gemm calls so far (CUDA builds), 0 elsewhere.
std::int64_t cublas_gemm_calls() {
#if defined(KOKKOS_ENABLE_CUDA)
  return longattn::detail::cublas_gemm_calls();
#else
  return 0;
#endif
}

// Fills a matrix with uniform values in [-1, 1) and returns a host copy of them.
template <class View>
auto random_values(const View& view, std::mt19937_64& rng) {
  const auto host = Kokkos::create_mirror(Kokkos::HostSpace(), view);
  longattn::test::fill_uniform(host, rng);
  Kokkos::deep_copy(view, host);
  return host;
}

template <class Scalar, class Layout, class ExecSpace>
void check_gemm(const char* trans_a, const char* trans_b, int m, int n, int k, std::mt19937_64& rng) {
  using View = Kokkos::View<Scalar**, Layout, typename ExecSpace::memory_space>;
  const bool ta = trans_a[0] != 'N', tb = trans_b[0] != 'N';
  View a("A", ta ? k : m, ta ? m : k), b("B", tb ? n : k, tb ? k : n), c("C", m, n);
  const auto ha = random_values(a, rng), hb = random_values(b, rng), hc = random_values(c, rng);
  const double alpha = 0.75, beta = -0.5;
  const auto expected = longattn::test::reference_gemm(ta, tb, alpha, ha, hb, beta, hc);

  longattn::gemm(ExecSpace(), trans_a, trans_b, Scalar(alpha), a, b, Scalar(beta), c);
  Kokkos::deep_copy(hc, c);

  // Each entry sums k products of values in [-1, 1): rounding error grows like sqrt(k) eps.
  const double eps = std::is_same<Scalar, float>::value ? 6e-8 : 1.2e-16;
  const double tolerance = 8 * eps * k;
  double worst = 0;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) worst = std::max(worst, std::abs(double(hc(i, j)) - expected[i * n + j]));
  INFO("trans " << trans_a << trans_b << ", m n k = " << m << " " << n << " " << k << ", seed "
                << longattn::test::test_seed());
  CHECK(worst <= tolerance);
}

// A and B of the 16-bit type T, C of CT (T or float), in a context with its own pool: the float
// copies of the operands come from it and go back to it.
// With beta = 0, C starts as NaN: gemm must not read it. Layout applies to A, B and C (LayoutLeft
// gives C a column stride other than 1).
template <class T, class CT, class ExecSpace, class Layout = Kokkos::LayoutRight>
void check_gemm_16bit(const char* trans_a, const char* trans_b, int m, int n, int k, std::mt19937_64& rng,
                      double beta = -0.5) {
  using Memory = typename ExecSpace::memory_space;
  const bool ta = trans_a[0] != 'N', tb = trans_b[0] != 'N';
  Kokkos::View<T**, Layout, Memory> a("A", ta ? k : m, ta ? m : k), b("B", tb ? n : k, tb ? k : n);
  Kokkos::View<CT**, Layout, Memory> c("C", m, n);
  const auto ha = random_values(a, rng), hb = random_values(b, rng);
  const auto hc = random_values(c, rng);  // of another type than A's and B's when CT is float
  const double alpha = 0.75;
  const auto expected = longattn::test::reference_gemm(ta, tb, alpha, ha, hb, beta, hc);  // of the stored values
  if (beta == 0) Kokkos::deep_copy(c, CT(std::nanf("")));
  const longattn::memory::Pool<Memory> pool;
  const std::int64_t cublas_calls = cublas_gemm_calls();
  longattn::gemm(longattn::ExecutionContext<ExecSpace>(ExecSpace(), pool), trans_a, trans_b, float(alpha), a, b,
                 float(beta), c);
  Kokkos::deep_copy(hc, c);
  CHECK(pool.stats().in_use_bytes == 0);
  // On Kokkos::Cuda, cuBLAS where every matrix's rows are contiguous (its workspace from the
  // pool); elsewhere the operands' float copies or packed panels.
  const bool cublas = longattn::test::is_cuda<ExecSpace> && std::is_same_v<Layout, Kokkos::LayoutRight>;
  CHECK((cublas_gemm_calls() > cublas_calls) == cublas);
  CHECK(pool.stats().allocations >= (cublas ? 1u : 2u));
  // Float sums of exact products, then one rounding into C's type (unit roundoff u).
  const double u = std::is_same_v<CT, float> ? 6e-8 : std::is_same_v<CT, longattn::bfloat16> ? 1.0 / 256 : 1.0 / 2048;
  double worst = 0, largest = 0;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      worst = std::max(worst, std::abs(double(hc(i, j)) - expected[std::size_t(i * n + j)]));
      largest = std::max(largest, std::abs(expected[std::size_t(i * n + j)]));
    }
  INFO(longattn::detail::scalar_name<T>() << " A, B; " << longattn::detail::scalar_name<CT>() << " C; trans " << trans_a
                                          << trans_b << ", m n k = " << m << " " << n << " " << k);
  CHECK(worst <= u * largest + 8 * 6e-8 * k);
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("gemm in 16-bit storage sums in float and rounds once", "[core][gemm][half]",
                        longattn::test::ExecutionSpaces) {
  const longattn::test::Bf16Products off(longattn::test::Bf16Path::float_values);  // the portable path (float copies), on every CPU
  std::mt19937_64 rng(longattn::test::test_seed());
  for (const char* ta : {"N", "T"})
    for (const char* tb : {"N", "T"}) {
      check_gemm_16bit<longattn::bfloat16, longattn::bfloat16, TestType>(ta, tb, 37, 29, 53, rng);
      check_gemm_16bit<longattn::bfloat16, float, TestType>(ta, tb, 17, 64, 9, rng);
      check_gemm_16bit<longattn::float16, longattn::float16, TestType>(ta, tb, 31, 1, 45, rng);
      check_gemm_16bit<longattn::float16, float, TestType>(ta, tb, 1, 23, 77, rng);
      // Columns strided (LayoutLeft): float copies everywhere, cuBLAS reads only contiguous rows.
      check_gemm_16bit<longattn::bfloat16, float, TestType, Kokkos::LayoutLeft>(ta, tb, 13, 31, 30, rng);
    }
  // Column sums of a 16-bit matrix into float sums.
  using Memory = typename TestType::memory_space;
  const int rows = 37, cols = 19;
  Kokkos::View<longattn::bfloat16**, Kokkos::LayoutRight, Memory> a("A", rows, cols);
  Kokkos::View<longattn::bfloat16*, Memory> ones("ones", rows);
  Kokkos::View<float*, Memory> sums("sums", cols);
  auto ha = Kokkos::create_mirror_view(a);
  longattn::test::fill_uniform(ha, rng);
  Kokkos::deep_copy(a, ha);
  Kokkos::deep_copy(sums, 0.5f);
  longattn::add_column_sums(TestType(), a, ones, sums);
  const auto result = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), sums);
  for (int c = 0; c < cols; ++c) {
    double expected = 0.5;
    for (int r = 0; r < rows; ++r) expected += double(float(ha(r, c)));
    CHECK(result(c) == Approx(expected).epsilon(0).margin(40 * 6e-8));
  }
}

TEST_CASE("the bf16 dot products' speed is measured once, where the CPU has them", "[core][gemm][half]") {
  const double speedup = longattn::bf16_dot_product_speedup();
  if (!longattn::bf16_dot_products_available()) {
    CHECK(speedup == 0);
    WARN("SKIP: no bf16 dot products on this CPU or build to time");
    return;
  }
  INFO("products per second over the FMA's: " << speedup);
  CHECK(speedup > 0.1);  // 0.5 (Intel Emerald Rapids) to 2 (the instruction does two products per lane)
  CHECK(speedup < 8);
  CHECK(longattn::bf16_dot_product_speedup() == speedup);
}

TEMPLATE_LIST_TEST_CASE("gemm of bfloat16 on the CPU's bf16 dot products matches the reference",
                        "[core][gemm][half]", longattn::test::ExecutionSpaces) {
  if (!longattn::bf16_dot_products_available() ||
      !std::is_same_v<typename TestType::memory_space, Kokkos::HostSpace>) {
    WARN("SKIP: bf16 dot products need a host space on a CPU with AVX512-BF16 (this build or CPU has none)");
    return;
  }
  const longattn::test::Bf16Products on(longattn::test::Bf16Path::dot_products);
  REQUIRE(longattn::bf16_dot_products_in_use());
  std::mt19937_64 rng(longattn::test::test_seed());
  using longattn::bfloat16;
  for (const char* ta : {"N", "T"})
    for (const char* tb : {"N", "T"}) {
      // Edges in both directions, an odd depth, several row blocks (8 panels of 12 rows each)
      // and column panels (32 columns), depth 1, one row; C strided (LayoutLeft); beta = 0.
      check_gemm_16bit<bfloat16, bfloat16, TestType>(ta, tb, 203, 75, 37, rng);
      check_gemm_16bit<bfloat16, float, TestType>(ta, tb, 12 * 8 + 1, 64, 128, rng);
      check_gemm_16bit<bfloat16, float, TestType>(ta, tb, 1, 33, 1, rng);
      check_gemm_16bit<bfloat16, bfloat16, TestType, Kokkos::LayoutLeft>(ta, tb, 29, 41, 19, rng);
      check_gemm_16bit<bfloat16, float, TestType, Kokkos::LayoutLeft>(ta, tb, 13, 31, 300, rng, 0.0);
      check_gemm_16bit<bfloat16, bfloat16, TestType>(ta, tb, 40, 70, 66, rng, 0.0);
    }
}

TEMPLATE_LIST_TEST_CASE("gemm matches the double reference", "[core][gemm]", longattn::test::ExecutionSpaces) {
  std::mt19937_64 rng(longattn::test::test_seed());
  for (const char* ta : {"N", "T"})
    for (const char* tb : {"N", "T"}) {
      check_gemm<float, Kokkos::LayoutLeft, TestType>(ta, tb, 37, 29, 53, rng);
      check_gemm<float, Kokkos::LayoutRight, TestType>(ta, tb, 17, 64, 9, rng);
      check_gemm<double, Kokkos::LayoutLeft, TestType>(ta, tb, 31, 1, 45, rng);
      check_gemm<double, Kokkos::LayoutRight, TestType>(ta, tb, 1, 23, 77, rng);
    }
}

TEMPLATE_LIST_TEST_CASE("float gemm(ctx, ...) runs on TF32 tensor cores where allowed", "[core][gemm]",
                        longattn::test::ExecutionSpaces) {
  using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, typename TestType::memory_space>;
  std::mt19937_64 rng(longattn::test::test_seed());
  for (const bool allowed : {false, true}) {
    const longattn::test::AllowTf32 tf32(allowed);
    CHECK(longattn::tf32_matmul_allowed() == allowed);
    const int m = 37, n = 24, k = 53;
    Matrix a("A", m, k), b("B", n, k), c("C", m, n);
    const auto ha = random_values(a, rng), hb = random_values(b, rng), hc = random_values(c, rng);
    const auto expected = longattn::test::reference_gemm(false, true, 0.75, ha, hb, -0.5, hc);
    const longattn::memory::Pool<typename TestType::memory_space> pool;
    const std::int64_t cublas_calls = cublas_gemm_calls();
    longattn::gemm(longattn::ExecutionContext<TestType>(TestType(), pool), "N", "T", 0.75f, a, b, -0.5f, c);
    Kokkos::deep_copy(hc, c);
    // cuBLAS on Kokkos::Cuda where allowed; Kokkos Kernels' float gemm otherwise and elsewhere.
    CHECK((cublas_gemm_calls() > cublas_calls) == (allowed && longattn::test::is_cuda<TestType>));
    CHECK(pool.stats().in_use_bytes == 0);
    double worst = 0;
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) worst = std::max(worst, std::abs(double(hc(i, j)) - expected[std::size_t(i * n + j)]));
    INFO("TF32 allowed " << allowed << ", seed " << longattn::test::test_seed());
    // k products of values in [-1, 1), each off by the product's roundoff, summed in float.
    CHECK(worst <= 0.75 * k * longattn::test::float_product_roundoff<TestType>() + 8 * 6e-8 * k);
  }
}

TEST_CASE("gemm rejects mismatched shapes with a longattn::Error naming the argument", "[core][gemm][errors]") {
  Kokkos::View<float**, Kokkos::LayoutLeft, Kokkos::HostSpace> a("A", 5, 3), b("B", 3, 4), c("C", 5, 4), wrong("W", 7, 4);
  CHECK_NOTHROW(longattn::gemm(Kokkos::DefaultHostExecutionSpace(), "N", "N", 1.0f, a, b, 0.0f, c));
  CHECK_THROWS_WITH(longattn::gemm(Kokkos::DefaultHostExecutionSpace(), "N", "N", 1.0f, a, b, 0.0f, wrong),
                    Catch::Contains("'C.extent(0)' is 7") && Catch::Contains("expected 5"));
  CHECK_THROWS_WITH(longattn::gemm(Kokkos::DefaultHostExecutionSpace(), "N", "T", 1.0f, a, b, 0.0f, c),
                    Catch::Contains("B's inner extent") && Catch::Contains("is 4") && Catch::Contains("expected 3"));
  CHECK_THROWS_WITH(longattn::gemm(Kokkos::DefaultHostExecutionSpace(), "X", "N", 1.0f, a, b, 0.0f, c),
                    Catch::Contains("'trans_a' is X"));
  CHECK_THROWS_AS(longattn::gemm(Kokkos::DefaultHostExecutionSpace(), "N", "N", 1.0f, a, a, 0.0f, c), longattn::Error);
}

TEMPLATE_LIST_TEST_CASE("add_column_sums adds each column's sum", "[core][gemm]", longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  std::mt19937_64 rng(longattn::test::test_seed());
  const int rows = 37, cols = 19;
  Kokkos::View<double**, Kokkos::LayoutRight, Memory> a("A", rows, cols);
  Kokkos::View<double*, Memory> ones("ones", rows + 3), sums("sums", cols);  // ones may be longer
  auto ha = Kokkos::create_mirror_view(a);
  auto hs = Kokkos::create_mirror_view(sums);
  longattn::test::fill_uniform(ha, rng);
  std::uniform_real_distribution<double> uniform(-1, 1);
  for (int c = 0; c < cols; ++c) hs(c) = uniform(rng);  // sums accumulate into what is there
  Kokkos::deep_copy(a, ha);
  Kokkos::deep_copy(sums, hs);
  Kokkos::deep_copy(ones, 1.0);
  std::vector<double> expected(cols);  // before the call: on the host, hs is sums itself
  for (int c = 0; c < cols; ++c) {
    expected[std::size_t(c)] = hs(c);
    for (int r = 0; r < rows; ++r) expected[std::size_t(c)] += ha(r, c);
  }
  longattn::add_column_sums(TestType(), a, ones, sums);
  const auto result = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), sums);
  // 38 terms in [-1, 1): the rounding error is absolute (a sum may cancel to near 0), about 38 eps.
  for (int c = 0; c < cols; ++c) CHECK(result(c) == Approx(expected[std::size_t(c)]).epsilon(0).margin(1e-13));
  const Kokkos::View<double*, Memory> wrong("wrong", cols + 1);
  CHECK_THROWS_WITH(longattn::add_column_sums(TestType(), a, ones, wrong),
                    Catch::Contains("'sums.extent(0)' is 20") && Catch::Contains("the columns of a, 19"));
  CHECK_THROWS_WITH(longattn::add_column_sums(TestType(), a, wrong, sums),
                    Catch::Contains("'ones.extent(0)' is 20") && Catch::Contains("at least the rows of a, 37"));
}
