// longattn::gemm against the naive double-precision reference: odd sizes, every transpose
// combination, both layouts, float and double, on every enabled execution space.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "execution_spaces.hpp"
#include "longattn/core/gemm.hpp"
#include "reference/gemm.hpp"
#include "reference/random.hpp"

namespace {

template <class Scalar, class Layout, class ExecSpace>
void check_gemm(const char* trans_a, const char* trans_b, int m, int n, int k, std::mt19937_64& rng) {
  using View = Kokkos::View<Scalar**, Layout, typename ExecSpace::memory_space>;
  const bool ta = trans_a[0] != 'N', tb = trans_b[0] != 'N';
  View a("A", ta ? k : m, ta ? m : k), b("B", tb ? n : k, tb ? k : n), c("C", m, n);
  auto ha = Kokkos::create_mirror_view(a), hb = Kokkos::create_mirror_view(b), hc = Kokkos::create_mirror_view(c);
  longattn::test::fill_uniform(ha, rng);
  longattn::test::fill_uniform(hb, rng);
  longattn::test::fill_uniform(hc, rng);
  Kokkos::deep_copy(a, ha);
  Kokkos::deep_copy(b, hb);
  Kokkos::deep_copy(c, hc);
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

}  // namespace

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
