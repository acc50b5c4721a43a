// How a warp's 32 lanes hold the tiles of the tensor-core kernels: the one place that says it.
//
// Every product is mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 (D = A B + C,
// A 16 x 16, B 16 x 8, C and D 16 x 8 in float), with its operands brought from shared memory by
// ldmatrix.sync.aligned.m8n8.{x4,x4.trans}.shared.b16. A lane is 4 * group + quad_lane (the PTX
// ISA's groupID = lane >> 2 and threadID_in_group = lane % 4). A 32-bit register holds two 16-bit
// values, the lower-indexed one in the low half.
//
//   A (16 x 16, rows m, columns k)  register r: A[m][k], A[m][k + 1] with
//                                    m = group + 8 (r % 2), k = 2 quad_lane + 8 (r / 2)
//   B (16 x 8, rows k, columns n)    register r: B[k][n], B[k + 1][n] with
//                                    k = 2 quad_lane + 8 r, n = group
//   C, D (16 x 8, float)             value i: C[m][n] with m = group + 8 (i / 2), n = 2 quad_lane + i % 2
//
// ldmatrix.x4 loads four 8 x 8 matrices of 16-bit values; lane l gives the address of row l % 8 of
// matrix l / 8 (16 contiguous bytes). Register j of a lane receives matrix j's row `group`, columns
// 2 quad_lane and 2 quad_lane + 1; with .trans, rows 2 quad_lane and 2 quad_lane + 1 of column
// `group` instead. So, for a tile in shared memory with rows of 16-bit values:
//   - an A operand whose rows are the tile's rows (Q, K, V, dO): ldmatrix.x4, matrix j at rows
//     m0 + 8 (j % 2), columns k0 + 8 (j / 2)                                  (a_address)
//   - two B operands (n-tiles) whose columns are the tile's rows (K in S = Q K^T): ldmatrix.x4,
//     matrix j at rows n0 + 8 (j / 2), columns k0 + 8 (j % 2)                 (b_address)
//   - two B operands whose rows are the tile's rows (V in O += P V): ldmatrix.x4.trans, matrix j at
//     rows k0 + 8 (j % 2), columns n0 + 8 (j / 2)                             (b_trans_address)
//   - an A operand whose columns are the tile's rows (dS^T stored, dS needed): ldmatrix.x4.trans,
//     matrix j at rows k0 + 8 (j / 2), columns m0 + 8 (j % 2)                 (a_trans_address)
// An accumulator's value pairs (i = 0, 1 and i = 2, 3) sit where an A operand's registers want them:
// the n-tiles 2 kk and 2 kk + 1 of a 16 x 16 block of C are, packed to 16 bits, the A operand of
// the 16 columns kk (a_from_accumulators), which is how probabilities stay in registers between
// S = Q K^T and O += P V (FlashAttention-2).
//
// Shared-memory tiles are rows of 16-bit values, each row padded by 16 bytes: row r of a tile of
// `columns` values starts at r (2 columns + 16). The 8 rows an ldmatrix phase reads (16 bytes at
// the same column of 8 consecutive rows) then start 4 banks apart and fill the 32 banks once: no
// bank conflict, for any row length that is a multiple of 64 bytes; and every address a lane
// gives is its own base plus a constant, which the instructions take as an immediate offset
// (an XOR swizzle would keep a register per distinct address).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace longattn::detail::tensor_core {

// The 16-bit storage types' tensor-core operand type tags.
enum class Operand { bf16, f16 };

struct Lane {
  int group;      // lane / 4: a row of A and C, a column of B
  int quad_lane;  // lane % 4: a pair of columns of A and C, a pair of rows of B
  KOKKOS_INLINE_FUNCTION explicit Lane(int lane) : group(lane >> 2), quad_lane(lane & 3) {}
};

// C, D: value i of a lane is C[accumulator_row][accumulator_col].
KOKKOS_INLINE_FUNCTION constexpr int accumulator_row(int lane, int i) { return (lane >> 2) + 8 * (i >> 1); }
KOKKOS_INLINE_FUNCTION constexpr int accumulator_col(int lane, int i) { return 2 * (lane & 3) + (i & 1); }

// Chunks of 16 bytes (8 values of 16 bits) per row of a tile of `columns` values.
KOKKOS_INLINE_FUNCTION constexpr int chunks_per_row(int columns) { return columns / 8; }

// Bytes from one row of a tile of `columns` values to the next, and a tile of `rows` rows.
KOKKOS_INLINE_FUNCTION constexpr int row_bytes(int columns) { return 2 * columns + 16; }
KOKKOS_INLINE_FUNCTION constexpr int tile_bytes(int rows, int columns) { return rows * row_bytes(columns); }

// Byte offset of value `column` of row `row` in a tile of `columns` values per row.
KOKKOS_INLINE_FUNCTION constexpr int tile_offset(int row, int column, int columns) {
  return row * row_bytes(columns) + 2 * column;
}

// Where lane `lane` points ldmatrix for the four matrices described at the top, as a byte offset
// into a tile of `columns` values per row.
KOKKOS_INLINE_FUNCTION constexpr int a_address(int lane, int m0, int k0, int columns) {
  return tile_offset(m0 + (lane & 7) + 8 * ((lane >> 3) & 1), k0 + 8 * (lane >> 4), columns);
}
KOKKOS_INLINE_FUNCTION constexpr int b_address(int lane, int n0, int k0, int columns) {
  return tile_offset(n0 + (lane & 7) + 8 * (lane >> 4), k0 + 8 * ((lane >> 3) & 1), columns);
}
KOKKOS_INLINE_FUNCTION constexpr int b_trans_address(int lane, int k0, int n0, int columns) {
  return tile_offset(k0 + (lane & 7) + 8 * ((lane >> 3) & 1), n0 + 8 * (lane >> 4), columns);
}
KOKKOS_INLINE_FUNCTION constexpr int a_trans_address(int lane, int k0, int m0, int columns) {
  return tile_offset(k0 + (lane & 7) + 8 * (lane >> 4), m0 + 8 * ((lane >> 3) & 1), columns);
}

// The A operand of columns [16 kk, 16 kk + 16) of a row block of accumulators c[n-tile][4]
// (probabilities, dS), packed to 16 bits by Warp::pack.
template <class Warp, Operand Type, int Tiles>
KOKKOS_INLINE_FUNCTION void a_from_accumulators(const float (&c)[Tiles][4], int kk, std::uint32_t (&a)[4]) {
  a[0] = Warp::template pack<Type>(c[2 * kk][0], c[2 * kk][1]);
  a[1] = Warp::template pack<Type>(c[2 * kk][2], c[2 * kk][3]);
  a[2] = Warp::template pack<Type>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = Warp::template pack<Type>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

}  // namespace longattn::detail::tensor_core
