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
// 7-9, CUTLASS's Swizzle<3,4,3>), so that 8 rows' same chunk fall into distinct banks. The copy
// engine writes them (below); no ldmatrix reads these tiles. wgmma reads them through a
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
//
// Tiles by the tensor copy engine (TMA, cp.async.bulk.tensor): a [batch][tokens][heads][D] 16-bit
// tensor is described to it as four dimensions, innermost first (D, tokens, heads, batch; a
// TileMap below, which the launchers turn into the GPU's CUtensorMap); one copy brings a box of
// 64 values (one panel's 128 bytes) x box_rows tokens of one head and batch into box_rows rows of
// 128 bytes, swizzled as above (the copy engine's 128-byte swizzle is the same function of the
// address), zeros where the box leaves the tensor. A D-wide tile is D / 64 copies, panel by panel.
// A copy completes on an mbarrier (a 64-bit object in shared memory: an arrival count and a byte
// count per phase): its issuer announces the bytes (mbarrier.arrive.expect_tx), the copies count
// them down, and the phase completes when both reach zero; a thread waits for a phase by its
// parity (mbarrier.try_wait.parity), which also makes the copied bytes visible to it and to the
// wgmma it then issues (the copy engine writes through the async proxy: no fence.proxy.async).
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

// The warpgroup's products, issued (not committed or waited for), S the 16-bit type:
// acc (64 x N) += A B^T over the D columns of two swizzled tiles, both K-major: A rows m0 .. m0 + 63
// of an [a_rows][D] tile, B the N rows of an [N][D] tile (S = Q K^T, S^T = K Q^T, dP^T = V dO^T).
template <class Warp, class S, int D, int N>
KOKKOS_INLINE_FUNCTION void issue_rows_times_rows(float (&acc)[N / 8][4], std::uint32_t a_tile, int a_rows, int m0,
                                                  std::uint32_t b_tile) {
  LONGATTN_WARP_UNROLL
  for (int kk = 0; kk < D / 16; ++kk)
    Warp::template wgmma<operand_of<S>, N>(acc, k_major_descriptor(a_tile, a_rows, m0, 16 * kk),
                                           k_major_descriptor(b_tile, N, 0, 16 * kk));
}
// acc (64 x N) += A B: A 64 x K operands in registers (a k-step of 16 each), B the K rows of a
// swizzled [K][N] tile as the MN-major operand (O += P V, dV += P^T dO, dK += dS^T Q).
template <class Warp, class S, int N, int Steps>
KOKKOS_INLINE_FUNCTION void issue_operands_times_rows(float (&acc)[N / 8][4], const std::uint32_t (&a)[Steps][4],
                                                      std::uint32_t b_tile) {
  LONGATTN_WARP_UNROLL
  for (int kk = 0; kk < Steps; ++kk)
    Warp::template wgmma<operand_of<S>, N>(acc, a[kk], mn_major_descriptor(b_tile, 16 * Steps, 16 * kk));
}

// A 16-bit [batch][tokens][heads][D] tensor as the copy engine sees it: extents and byte strides
// innermost first (D, tokens, heads, batch), boxes of 64 values x box_rows tokens.
struct TileMap {
  const void* data = nullptr;
  std::int64_t extents[4] = {};
  std::int64_t strides[4] = {};  // bytes; strides[0] = 2 (the values of a row contiguous)
  int box_rows = 0;
};

}  // namespace longattn::detail::tensor_core
