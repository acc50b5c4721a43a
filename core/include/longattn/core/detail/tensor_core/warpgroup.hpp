// How a warpgroup holds the tiles of Hopper's wgmma (sm_90a): the warpgroup programs' counterpart
// of fragments.hpp, the one place that says it.
//
// wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}: the 128 threads of a warpgroup (4
// consecutive warps, the first a multiple of 4) compute D (64 x N) += A (64 x 16) B (16 x N) with
// float accumulators, asynchronously: issued, committed as a group, waited for (below).
//   D      warp w of the group holds rows 16 w .. 16 w + 15 as mma.m16n8k16 holds its C, n-tile by
//          n-tile: register i of a lane is D[16 w + accumulator_row(lane, i % 4)]
//          [8 (i / 4) + accumulator_col(lane, i % 4)], in the programs d[i / 4][i % 4] (float
//          d[N / 8][4]): the arrays of the warp-level programs' row tiles, whose softmax and
//          epilogue the warpgroup programs share
//   A      from registers: warp w's rows 16 w .., as mma.m16n8k16's A (fragments.hpp), so the
//          probabilities are a_from_accumulators of their S accumulators as they lie; or from
//          shared memory through a matrix descriptor
//   B      from shared memory through a matrix descriptor, K-major (the 16 k values of a column
//          contiguous) or, with imm-trans-b = 1 (16-bit only), MN-major (a row's N values
//          contiguous)
//
// Shared-memory tiles (Q, K and V): R rows of D 16-bit values as D / 64 panels, panel-major, each
// R rows x 128 bytes (64 values) on a 1024-byte boundary; in a panel, 16-byte chunk c of row r is
// stored at chunk c ^ (r % 8) of the row (the 128-byte swizzle: byte-address bits 4-6 XOR bits
// 7-9, CUTLASS's Swizzle<3,4,3>), so that 8 rows' same chunk fall into distinct banks. cp.async
// writes the chunks (the loader below); no ldmatrix reads these tiles. wgmma reads them through a
// 64-bit descriptor: start address >> 4 (bits 0-13), leading byte offset >> 4 (LBO, bits 16-29),
// stride byte offset >> 4 (SBO, bits 32-45), base offset 0 (bits 49-51; the panels are
// 1024-aligned), layout 1 = 128-byte swizzle (bits 62-63). The address of element (row, k) is
// formed unswizzled from the start, then swizzled:
//   K-major operand (Q as A, K as B in S = Q K^T; rows are M or N):
//     start = the k-step's panel (k0 / 64) + 2 (k0 % 64) bytes; SBO = 1024 (8 rows to the next
//     8); LBO unused (the 16 k values never leave the 128-byte row): row r, value k at
//     start + 1024 (r / 8) + 128 (r % 8) + 2 k
//   MN-major operand (V as B in O += P V, trans-b; rows are k, N = D across the panels):
//     start = row k0 of panel 0; LBO = a panel's bytes (64 n to the next 64), SBO = 1024 (8 k to
//     the next 8): value (k, n) at start + LBO (n / 64) + 1024 (k / 8) + 128 (k % 8) + 2 (n % 64)
//
// Ordering (PTX ISA, wgmma): wgmma.fence before a group's first wgmma and whenever its accumulator
// or A registers were written by other instructions; wgmma.commit_group, then wgmma.wait_group N
// (all but the N latest groups done) before anything reads a group's accumulators or writes
// what it read. wgmma reads shared memory
// through the async proxy: a thread that wrote a tile (cp.async, stores) executes
// fence.proxy.async before the barrier after which a wgmma reads it.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

#include "longattn/core/detail/tensor_core/fragments.hpp"
#include "longattn/core/detail/tensor_core/warp_ops.hpp"

namespace longattn::detail::tensor_core {

inline constexpr int warpgroup_threads = 128;
inline constexpr int panel_values = 64;          // 16-bit values a panel row holds: 128 bytes
inline constexpr std::size_t swizzle_bytes = 1024;  // 8 rows of 128 bytes: the swizzle's period

// Bytes of a panel and of a swizzled tile of `rows` rows of `columns` 16-bit values.
KOKKOS_INLINE_FUNCTION constexpr int panel_bytes(int rows) { return 128 * rows; }
KOKKOS_INLINE_FUNCTION constexpr int swizzled_tile_bytes(int rows, int columns) {
  return columns / panel_values * panel_bytes(rows);
}

// Byte offset of 16-byte chunk `chunk` (8 values) of row `row` in a swizzled tile of `rows` rows.
KOKKOS_INLINE_FUNCTION constexpr int swizzled_chunk_offset(int row, int chunk, int rows) {
  return chunk / 8 * panel_bytes(rows) + 128 * row + 16 * ((chunk % 8) ^ (row % 8));
}

// A matrix descriptor of a 128-byte-swizzled operand at shared-memory address `address`.
KOKKOS_INLINE_FUNCTION constexpr std::uint64_t matrix_descriptor(std::uint32_t address, int leading_bytes,
                                                                 int stride_bytes) {
  return std::uint64_t((address & 0x3ffffu) >> 4) | std::uint64_t(leading_bytes >> 4 & 0x3fff) << 16 |
         std::uint64_t(stride_bytes >> 4 & 0x3fff) << 32 | std::uint64_t(1) << 62;
}

// The descriptor of a K-major operand: rows m0 .. m0 + 63 (A) or n0 .. n0 + N - 1 (B; m0 = n0) of
// a swizzled tile at shared-memory address `tile` of `rows` rows, the k-step from value k0.
KOKKOS_INLINE_FUNCTION constexpr std::uint64_t k_major_descriptor(std::uint32_t tile, int rows, int m0, int k0) {
  return matrix_descriptor(tile + std::uint32_t(k0 / panel_values * panel_bytes(rows) + 128 * m0 +
                                                2 * (k0 % panel_values)),
                           16, int(swizzle_bytes));
}

// The descriptor of an MN-major operand: the k-step of rows k0 .. k0 + 15 of a swizzled tile at
// `tile` of `rows` rows, all its columns the N of the product.
KOKKOS_INLINE_FUNCTION constexpr std::uint64_t mn_major_descriptor(std::uint32_t tile, int rows, int k0) {
  return matrix_descriptor(tile + std::uint32_t(128 * k0), panel_bytes(rows), int(swizzle_bytes));
}

// Copies rows [0, Rows) from `first_row` (rows token_stride apart; a row of D values) into a
// swizzled [Rows][D] tile, the Threads threads taking chunks in turn; rows from `count` on are
// zeros. Asynchronous, as load_tile (tiles.hpp): cp_async_wait_all, fence_proxy_async and a
// barrier before a wgmma reads it.
template <class Warp, int Rows, int D, int Threads, class S>
KOKKOS_INLINE_FUNCTION void load_swizzled_tile(char* tile, const S* first_row, std::int64_t token_stride, int count,
                                               int thread) {
  static_assert(sizeof(S) == 2, "the warpgroup programs take 16-bit tiles");
  constexpr int chunks = chunks_per_row<S>(D), rows_per_step = Threads / chunks;
  static_assert(Threads % chunks == 0 && Rows % rows_per_step == 0, "every thread copies the same chunk of its rows");
  const int chunk = thread % chunks;
  int row = thread / chunks;
  const S* source = first_row + row * token_stride + chunk * chunk_values<S>;
  LONGATTN_WARP_UNROLL
  for (int n = 0; n < Rows / rows_per_step; ++n, row += rows_per_step, source += rows_per_step * token_stride) {
    const bool inside = row < count;
    Warp::cp_async_16(tile + swizzled_chunk_offset(row, chunk, Rows), inside ? source : first_row, inside);
  }
}

}  // namespace longattn::detail::tensor_core
