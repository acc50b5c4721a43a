// gemm of bfloat16 A and B on the host's bf16 dot-product instructions (AVX512-BF16's
// vdpbf16ps: 16 float lanes, each adding two products of bf16 pairs per instruction, twice the
// products of a float FMA), selected at run time by the CPU's features. gemm(ctx, ...) calls it for
// bfloat16 operands on a host execution space when bf16_dot_products_in_use() (gemm.hpp); otherwise 16-bit
// operands go through float copies and the float BLAS (gemm.hpp).
//
// Shape (BLIS-like, one level): op(A) is packed into panels of MR = 12 rows and op(B) into
// panels of NR = 32 columns, both as consecutive k-pairs (the instruction's operand layout; an
// odd depth ends with a zero), from the caller's pool. A micro-tile of 12 x 32 floats lives in
// 24 zmm accumulators over the whole depth: per k-pair, two 32-column rows of B and twelve
// broadcast A pairs, 24 instructions, 1536 FLOPs. Work items are blocks of 8 row panels
// against one column panel (the B panel is reused from L1 by the 8), run as a parallel_for on
// the caller's instance. C (bfloat16 or float, any strides) gets alpha * sum + beta * C, rounded
// once; with beta = 0, C is not read.
//
// The instruction treats bf16 subnormal inputs as zero (products of subnormals are lost; the
// float path keeps them). Compiled for x86-64 with GCC or Clang, not under nvcc: elsewhere
// bf16_dot_products_available() is false.
#pragma once

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "longattn/checks.hpp"
#include "longattn/core/execution_context.hpp"
#include "longattn/core/half.hpp"
#include "longattn/error.hpp"

namespace longattn::detail {

inline constexpr int bf16_gemm_mr = 12;            // rows of a micro-tile, of an A panel
inline constexpr int bf16_gemm_nr = 32;            // columns of a micro-tile, of a B panel
inline constexpr int bf16_gemm_block_panels = 8;   // row panels per work item

// op(X) as strides: element (outer, depth) at data[outer * outer_stride + depth * depth_stride];
// outer runs over op(A)'s rows or op(B)'s columns.
struct Bf16Operand {
  const bfloat16* data;
  std::ptrdiff_t outer_stride, depth_stride;
  int outer, depth;
};

// C's element (i, j) at data[i * row_stride + j * col_stride], of bfloat16 or float.
struct Bf16GemmOutput {
  void* data;
  bool bf16;
  std::ptrdiff_t row_stride, col_stride;
  int rows, cols;
  float alpha, beta;
};

// Elements of one packed panel of `width` (MR or NR) outer indices.
inline std::size_t bf16_panel_elements(int width, int depth) { return std::size_t(width) * 2 * ((depth + 1) / 2); }

// Packs outer indices [first, first + width) of `op` into `panel` (zeros past op.outer, op.depth).
void pack_bf16_panel(const Bf16Operand& op, int first, int width, bfloat16* panel);

// The micro-tiles of row panels [first_row_panel, first_row_panel + row_panels) against
// column panel `column_panel`, written into C.
void bf16_gemm_block(const bfloat16* packed_a, const bfloat16* packed_b, int depth, int first_row_panel,
                     int row_panels, int column_panel, const Bf16GemmOutput& c);

// C = alpha op(A) op(B) + beta C for bfloat16 A, B on a host space's instance, C of bfloat16 or
// float; shapes checked by the caller (gemm). Needs bf16_dot_products_in_use().
template <class ExecSpace, class AView, class BView, class CView>
void bf16_dot_product_gemm(const ExecutionContext<ExecSpace>& ctx, bool trans_a, bool trans_b, float alpha,
                           const AView& a, const BView& b, float beta, const CView& c) {
  using Memory = typename ExecSpace::memory_space;
  constexpr int mr = bf16_gemm_mr, nr = bf16_gemm_nr, block = bf16_gemm_block_panels;
  const std::size_t depth_extent = trans_a ? a.extent(0) : a.extent(1);
  for (const std::size_t extent : {c.extent(0), c.extent(1), depth_extent})
    require(extent <= std::size_t(std::numeric_limits<int>::max()), "longattn::gemm (bf16 dot products)",
            "a matrix extent", extent, "at most 2^31 - 1");
  const int m = int(c.extent(0)), n = int(c.extent(1)), depth = int(depth_extent);
  if (m == 0 || n == 0) return;
  const Bf16Operand op_a{a.data(), std::ptrdiff_t(trans_a ? a.stride(1) : a.stride(0)),
                         std::ptrdiff_t(trans_a ? a.stride(0) : a.stride(1)), m, depth};
  const Bf16Operand op_b{b.data(), std::ptrdiff_t(trans_b ? b.stride(0) : b.stride(1)),
                         std::ptrdiff_t(trans_b ? b.stride(1) : b.stride(0)), n, depth};
  const Bf16GemmOutput out{static_cast<void*>(c.data()), std::is_same_v<scalar_of<CView>, bfloat16>,
                           std::ptrdiff_t(c.stride(0)), std::ptrdiff_t(c.stride(1)), m, n, alpha, beta};
  const int row_panels = (m + mr - 1) / mr, column_panels = (n + nr - 1) / nr;
  const std::size_t a_panel = bf16_panel_elements(mr, depth), b_panel = bf16_panel_elements(nr, depth);
  using Packed = Kokkos::View<bfloat16*, Memory>;
  const memory::CategoryScope scope(memory::Category::transient_copies);
  const auto packed_a = ctx.template allocate<Packed>(a_panel * std::size_t(row_panels));
  const auto packed_b = ctx.template allocate<Packed>(b_panel * std::size_t(column_panels));
  bfloat16* const pa = packed_a.data();
  bfloat16* const pb = packed_b.data();
  using Range = Kokkos::RangePolicy<ExecSpace>;
  Kokkos::parallel_for(
      "longattn::gemm(bf16 pack)", Range(ctx.exec(), 0, row_panels + column_panels), [=](int p) {
        if (p < row_panels)
          pack_bf16_panel(op_a, p * mr, mr, pa + a_panel * std::size_t(p));
        else
          pack_bf16_panel(op_b, (p - row_panels) * nr, nr, pb + b_panel * std::size_t(p - row_panels));
      });
  const int row_blocks = (row_panels + block - 1) / block;
  Kokkos::parallel_for(
      "longattn::gemm(bf16 dot products)", Range(ctx.exec(), 0, row_blocks * column_panels), [=](int item) {
        const int first = (item / column_panels) * block;
        bf16_gemm_block(pa, pb, depth, first, std::min(block, row_panels - first), item % column_panels, out);
      });
  ctx.exec().fence();  // the packed panels go back to the pool here
}

}  // namespace longattn::detail
