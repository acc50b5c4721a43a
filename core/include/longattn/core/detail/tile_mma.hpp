// The one matrix-multiply micro-kernel that every product of the attention kernels (S = K Q^T,
// O += V^T P, the four backward products) runs on, in the micro-tiles of a tile shape
// (attention_tiles.hpp).
#pragma once

#include "longattn/core/detail/pack.hpp"

namespace longattn::detail {

// One micro-tile: C[r][c] = (accumulate ? C[r][c] : 0) + sum_k A(r, k) * B[k][c] for R rows and
// V packs of columns, with A(r, k) = a[r * a_row_stride + k * a_depth_stride] (broadcast) and
// B, C row-major.
template <int R, int V, class T, int W>
KOKKOS_INLINE_FUNCTION void micro_tile_mma(int depth, const T* a, int a_row_stride,
                                           int a_depth_stride, const T* b, int ldb, T* c,
                                           int ldc, bool accumulate) {
  using P = Pack<T, W>;
  P acc[R][V];
  LONGATTN_UNROLL for (int r = 0; r < R; ++r)
    LONGATTN_UNROLL for (int v = 0; v < V; ++v)
      acc[r][v] = accumulate ? P::load(c + r * ldc + v * W) : P::broadcast(T(0));
  for (int k = 0; k < depth; ++k) {
    // Each B pack is loaded once and read R times. Left to itself, GCC 12 with AVX2 tuning folds
    // the load into each of the R FMAs instead: the 2 x 4 tile then issues 10 loads per 8 FMAs,
    // not 6, and the attention kernels ran 1.18-1.25x slower on a Zen 3 core (RESULTS.md).
    P b_k[V];
    LONGATTN_UNROLL for (int v = 0; v < V; ++v) b_k[v] = in_register(P::load(b + k * ldb + v * W));
    LONGATTN_UNROLL for (int r = 0; r < R; ++r) {
      const T a_rk = a[r * a_row_stride + k * a_depth_stride];
      LONGATTN_UNROLL for (int v = 0; v < V; ++v) acc[r][v] = fma(a_rk, b_k[v], acc[r][v]);
    }
  }
  LONGATTN_UNROLL for (int r = 0; r < R; ++r)
    LONGATTN_UNROLL for (int v = 0; v < V; ++v) acc[r][v].store(c + r * ldc + v * W);
}

// Does nothing after a micro-tile.
struct NoHook {
  KOKKOS_INLINE_FUNCTION void operator()(int /*tile*/, int /*tiles*/) const {}
};

// C (rows x cols) = [C +] A (rows x depth) * B (depth x cols), shared by the team. B and C live
// in scratch, row-major with leading dimensions ldb and ldc; cols is a multiple of
// packs * lanes; rows and depth are any count (ragged tiles at the end of a sequence).
// after_tile(tile, tiles) runs after each micro-tile: the kernels spread the prefetches of the
// next block over the product with it, so that they never queue up behind each other.
template <class Shape, class Member, class T, class Hook = NoHook>
KOKKOS_INLINE_FUNCTION void tile_mma(const Member& team, int rows, int cols, int depth,
                                     const T* a, int a_row_stride, int a_depth_stride,
                                     const T* b, int ldb, T* c, int ldc, bool accumulate,
                                     const Hook& after_tile = Hook()) {
  constexpr int R = Shape::rows, V = Shape::packs, W = Shape::lanes;
  const int col_tiles = cols / (V * W);
  const int full_row_tiles = rows / R;
  const int row_tiles = full_row_tiles + rows % R;  // leftover rows one at a time
  const int tiles = row_tiles * col_tiles;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tiles), [&](int tile) {
    const int row_tile = tile / col_tiles;
    const int col = (tile % col_tiles) * V * W;
    if (row_tile < full_row_tiles) {
      const int row = row_tile * R;
      micro_tile_mma<R, V, T, W>(depth, a + row * a_row_stride, a_row_stride, a_depth_stride,
                                 b + col, ldb, c + row * ldc + col, ldc, accumulate);
    } else {
      const int row = full_row_tiles * R + (row_tile - full_row_tiles);
      micro_tile_mma<1, V, T, W>(depth, a + row * a_row_stride, a_row_stride, a_depth_stride,
                                 b + col, ldb, c + row * ldc + col, ldc, accumulate);
    }
    after_tile(tile, tiles);
  });
}

}  // namespace longattn::detail
