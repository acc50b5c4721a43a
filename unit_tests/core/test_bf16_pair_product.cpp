// The attention kernels' bf16 block products (detail/bf16_pair_product.hpp) on each path the CPU
// has (tile products, dot products) against a double reference: rows, columns and pairs on and
// off the kernels' tile edges (16 and 32 rows or columns, 16 pairs, 64 columns), both layouts of A
// (pairs along its rows, as the Q and K rows; pairs down its columns, as V's row pairs), alpha 1
// (the tile kernel then keeps whole blocks of C in its tiles) or not, accumulation or not, and a
// part of the rows as a team's thread takes it. The operands' padding holds
// NaN, so that a read past the operands shows in C; C outside the rows and columns must not change.
// The tile products also run after other code on the thread configured the tiles otherwise or
// released them.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "bf16_dot_products.hpp"
#include "longattn/core/detail/amx_tile_config.hpp"
#include "longattn/core/detail/bf16_pair_product.hpp"
#include "longattn/core/half.hpp"
#include "reference/random.hpp"

#ifdef LONGATTN_AMX_TILE_CONFIG
#include <immintrin.h>
#endif

namespace {

using longattn::test::Bf16Path;

constexpr std::uint32_t nan_pair = 0x7fc07fc0u;  // two quiet bf16 NaNs

struct Case {
  int rows, cols, pairs;
  bool a_pairs_down_columns;
  float alpha;
  bool accumulate;
  int first_row, end_row;
};

double low(std::uint32_t pair) { return double(longattn::bfloat16::from_bits(std::uint16_t(pair))); }
double high(std::uint32_t pair) { return double(longattn::bfloat16::from_bits(std::uint16_t(pair >> 16))); }

void check(const Case& x, std::mt19937_64& rng) {
  INFO("rows " << x.rows << ", cols " << x.cols << ", pairs " << x.pairs << ", A's pairs "
               << (x.a_pairs_down_columns ? "down its columns" : "along its rows") << ", alpha " << x.alpha
               << (x.accumulate ? ", accumulated" : "") << ", rows [" << x.first_row << ", " << x.end_row << ")");
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  auto random_pair = [&] {
    return std::uint32_t(longattn::bfloat16(uniform(rng)).bits) | std::uint32_t(longattn::bfloat16(uniform(rng)).bits) << 16;
  };
  // Strides past the operands' widths; the words between them NaN.
  const int a_row_stride = x.a_pairs_down_columns ? 1 : x.pairs + 3;
  const int a_pair_stride = x.a_pairs_down_columns ? x.rows + 5 : 1;
  const int ldb = x.cols + 7, ldc = x.cols + 2;
  std::vector<std::uint32_t> a(std::size_t(x.a_pairs_down_columns ? x.pairs * a_pair_stride : x.rows * a_row_stride), nan_pair);
  std::vector<std::uint32_t> b(std::size_t(x.pairs) * ldb, nan_pair);
  auto a_at = [&](int r, int p) -> std::uint32_t& { return a[std::size_t(r) * a_row_stride + std::size_t(p) * a_pair_stride]; };
  for (int r = 0; r < x.rows; ++r)
    for (int p = 0; p < x.pairs; ++p) a_at(r, p) = random_pair();
  for (int p = 0; p < x.pairs; ++p)
    for (int c = 0; c < x.cols; ++c) b[std::size_t(p) * ldb + c] = random_pair();
  std::vector<float> c(std::size_t(x.rows) * ldc);
  for (float& value : c) value = uniform(rng);
  const std::vector<float> before = c;

  longattn::detail::bf16_pair_product({a.data(), a_row_stride, a_pair_stride, b.data(), ldb, c.data(), ldc, x.rows,
                                       x.cols, x.pairs, x.alpha, x.accumulate},
                                      x.first_row, x.end_row);

  int wrong = 0, changed = 0;
  for (int r = 0; r < x.rows; ++r)
    for (int col = 0; col < ldc; ++col) {
      const std::size_t at = std::size_t(r) * ldc + col;
      if (r < x.first_row || r >= x.end_row || col >= x.cols) {
        changed += c[at] != before[at];
        continue;
      }
      double sum = 0, magnitude = 0;
      for (int p = 0; p < x.pairs; ++p) {
        const std::uint32_t u = a_at(r, p), v = b[std::size_t(p) * ldb + col];
        sum += low(u) * low(v) + high(u) * high(v);
        magnitude += std::abs(low(u) * low(v)) + std::abs(high(u) * high(v));
      }
      const double start = x.accumulate ? double(before[at]) : 0.0;
      const double expected = start + double(x.alpha) * sum;
      // Products exact in float, 2 pairs' worth of float additions each, then alpha and C.
      const double bound = (2.0 * x.pairs + 3) * 6e-8 * (std::abs(double(x.alpha)) * magnitude + std::abs(start));
      wrong += !(std::abs(double(c[at]) - expected) <= bound);
    }
  CHECK(wrong == 0);
  CHECK(changed == 0);
}

#ifdef LONGATTN_AMX_TILE_CONFIG
__attribute__((target("amx-tile"))) void release_tiles() { _tile_release(); }
#endif

}  // namespace

TEST_CASE("the bf16 tile products run after other code configured the tiles otherwise or released them",
          "[core][attention][half]") {
#ifdef LONGATTN_AMX_TILE_CONFIG
  if (!longattn::test::available(Bf16Path::tile_products)) {
    WARN("SKIP: " << longattn::test::missing(Bf16Path::tile_products));
    return;
  }
  std::mt19937_64 rng(longattn::test::test_seed());
  const longattn::test::Bf16Products use(Bf16Path::tile_products);
  for (bool released : {false, true})
    for (bool down_columns : {false, true})
      for (float alpha : {1.0f, -0.375f}) {
        INFO((released ? "tiles released" : "tiles configured as 8 rows of 32 bytes") << " before the product");
        check({45, 70, 33, down_columns, alpha, true, 0, 45}, rng);  // configures the tiles as the kernel wants
        // What another AMX user might leave on the thread: no tiles, or 8 tiles of 8 rows of 32 bytes.
        released ? release_tiles() : longattn::detail::load_amx_tile_config(longattn::detail::amx_tile_config(8, 8, 32));
        check({45, 70, 33, down_columns, alpha, true, 0, 45}, rng);
      }
#else
  WARN("SKIP: no AMX intrinsics in this compiler's build of the tests");
#endif
}

TEST_CASE("the bf16 block products match the double reference on every path the CPU has",
          "[core][attention][half]") {
  std::mt19937_64 rng(longattn::test::test_seed());
  for (Bf16Path path : {Bf16Path::tile_products, Bf16Path::dot_products}) {
    if (!longattn::test::available(path)) {
      WARN(longattn::test::missing(path));
      continue;
    }
    INFO(longattn::test::to_string(path));
    const longattn::test::Bf16Products use(path);
    for (int rows : {1, 17, 32, 45, 70})
      for (int cols : {1, 16, 31, 64, 70})
        for (int pairs : {1, 15, 16, 33})
          for (bool down_columns : {false, true}) {
            check({rows, cols, pairs, down_columns, 1.0f, true, 0, rows}, rng);
            check({rows, cols, pairs, down_columns, 1.0f, false, 0, rows - rows / 3}, rng);
            check({rows, cols, pairs, down_columns, -0.375f, false, rows / 4, rows - rows / 3}, rng);
            check({rows, cols, pairs, down_columns, 0.5f, true, rows / 4, rows}, rng);
          }
  }
}
