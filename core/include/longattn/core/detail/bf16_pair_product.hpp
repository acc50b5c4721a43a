// The block products of the attention kernels on the CPU's bf16 products. The attention kernels
// take this path for bfloat16 tensors on a host space when bf16_tile_products_in_use() or
// bf16_dot_products_in_use() (bf16_dot_products.hpp); attention_kernels.hpp lays the operands
// out as each product needs them.
//
// Operands are pairs: a 32-bit word holds two bfloat16 values of consecutive depths 2p and
// 2p + 1, the even one in the low half. C (rows x cols, float) = [C +] alpha sum_p A(r, p) . B[p][c].
//
// On tile products (AMX-BF16, src/bf16_tile_products.cpp), where in use: a tdpbf16ps adds to a
// 16 x 16 float tile the products of an A tile (16 rows x 16 pairs, each row 64 bytes) and a B
// tile (16 pairs x 16 columns: B[p][c] as it lies, the layout the instruction wants). Micro-kernel:
// C 32 rows x 32 columns in 4 tiles, per 16 pairs 2 A and 2 B tile loads and 4 tdpbf16ps
// (65536 FLOPs). B is read in place; A in place where its pairs lie along its rows, else a strip
// of 32 rows is copied out first (transposed 16 x 16 words at a time where its pairs run down
// its columns: then a_row_stride must be 1); tiles at the edges are zero-padded copies. With
// alpha 1 a whole block of C is loaded into the tiles (or zeroed) and stored from them.
//
// On dot products (AVX512-BF16's vdpbf16ps: 16 float lanes, each adding a.lo * b.lo + a.hi *
// b.hi of two bf16 pairs: twice the products per instruction of a float FMA), otherwise:
// micro-tile 4 rows x 64 columns, 16 zmm accumulators over the whole depth; per pair, 4 loads
// of B, 4 broadcasts of A, 16 dot-product instructions (2048 FLOPs). Rows left over at the end
// run one at a time; columns past a multiple of 64 are masked off.
#pragma once

#include <cstddef>
#include <cstdint>

namespace longattn::detail {

inline constexpr int bf16_pair_tile_rows = 4;
inline constexpr int bf16_pair_tile_cols = 64;  // columns of a micro-tile: 4 zmm of floats

struct Bf16PairProduct {
  const std::uint32_t* a;
  int a_row_stride, a_pair_stride;  // A(r, p) = a[r * a_row_stride + p * a_pair_stride]; one of them 1
  const std::uint32_t* b;
  int ldb;  // B[p][c] = b[p * ldb + c]
  float* c;
  std::ptrdiff_t ldc;  // C[r][c] = c[r * ldc + c]
  int rows, cols, pairs;
  float alpha;
  bool accumulate;
  // Rows of memory to prefetch while the product runs (the kernels' next block), spread over
  // the row tiles: `prefetch_rows` rows of `prefetch_row_bytes`, `prefetch_stride` bytes apart.
  const char* prefetch = nullptr;
  std::ptrdiff_t prefetch_stride = 0;
  int prefetch_rows = 0, prefetch_row_bytes = 0;
};

// Rows [first_row, end_row) of the product and their share of the prefetches, on tile products
// where in use, else on dot products. Needs one of them available; throws longattn::Error in a
// build without the kernels.
void bf16_pair_product(const Bf16PairProduct& product, int first_row, int end_row);
// The same on tile products (bf16_tile_products_available()).
void bf16_tile_pair_product(const Bf16PairProduct& product, int first_row, int end_row);

// Part `part` of `parts` of the prefetches of rows [first_row, end_row) (both kernels spread
// them over their row tiles).
inline void bf16_prefetch_part(const Bf16PairProduct& x, int first_row, int end_row, int part, int parts) {
  const int first = x.rows > 0 ? int(std::int64_t(first_row) * x.prefetch_rows / x.rows) : 0;
  const int end = x.rows > 0 ? int(std::int64_t(end_row) * x.prefetch_rows / x.rows) : 0;
  const int begin_row = first + part * (end - first) / parts, end_row_of_part = first + (part + 1) * (end - first) / parts;
  for (int j = begin_row; j < end_row_of_part; ++j)
    for (int byte = 0; byte < x.prefetch_row_bytes; byte += 64)
      __builtin_prefetch(x.prefetch + std::ptrdiff_t(j) * x.prefetch_stride + byte, 0, 3);
}

}  // namespace longattn::detail
