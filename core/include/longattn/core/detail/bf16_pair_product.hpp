// The block products of the attention kernels on bf16 dot products (AVX512-BF16's vdpbf16ps:
// 16 float lanes, each adding a.lo * b.lo + a.hi * b.hi of two bf16 pairs: twice the products
// per instruction of a float FMA). The attention kernels take this path for bfloat16 tensors on
// a host space when bf16_dot_products_in_use() (bf16_dot_products.hpp); attention_kernels.hpp
// lays the operands out as each product needs them.
//
// Operands are pairs: a 32-bit word holds two bfloat16 values of consecutive depths 2p and
// 2p + 1, the even one in the low half. C (rows x cols, float) = [C +] alpha sum_p A(r, p) . B[p][c].
// Micro-tile: 4 rows x 64 columns, 16 zmm accumulators over the whole depth; per pair, 4 loads
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
  int a_row_stride, a_pair_stride;  // A(r, p) = a[r * a_row_stride + p * a_pair_stride]
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

// Rows [first_row, end_row) of the product and their share of the prefetches. Needs
// bf16_dot_products_available(); throws longattn::Error in a build without the kernels.
void bf16_pair_product(const Bf16PairProduct& product, int first_row, int end_row);

}  // namespace longattn::detail
