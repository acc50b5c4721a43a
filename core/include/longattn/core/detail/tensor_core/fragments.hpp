// How a warp's 32 lanes hold the tiles of the tensor-core kernels: the one place that says it.
//
// Every product is an mma.sync.aligned.row.col.f32 with float accumulators (D = A B + C, A 16 x k,
// B k x 8, C and D 16 x 8), its k set by the storage type S:
//   bfloat16, float16   m16n8k16 .bf16/.f16: a 32-bit register holds two 16-bit values, the
//                       lower-indexed one in the low half
//   float (TF32)        m16n8k8 .tf32: a register holds one value rounded to TF32 (10 mantissa
//                       bits; cvt.rna.tf32.f32)
// Either way a k-step of the product covers 32 bytes of a row of S (mma_k<S> = 32 / sizeof(S)
// values). A lane is 4 * group + quad_lane (the PTX ISA's groupID = lane >> 2 and
// threadID_in_group = lane % 4).
//
//   16-bit A (16 x 16)   register r: A[m][k], A[m][k + 1], m = group + 8 (r % 2), k = 2 quad_lane + 8 (r / 2)
//   16-bit B (16 x 8)    register r: B[k][n], B[k + 1][n], k = 2 quad_lane + 8 r, n = group
//   TF32 A (16 x 8)      register r: A[m][k], m = group + 8 (r % 2), k = quad_lane + 4 (r / 2)
//   TF32 B (8 x 8)       register r: B[k][n], k = quad_lane + 4 r, n = group
//   C, D (16 x 8)        value i: C[m][n], m = group + 8 (i / 2), n = 2 quad_lane + i % 2
//
// ldmatrix.x4 loads four 8 x 8 matrices of 16-bit values (8 rows of 16 bytes); lane l gives the
// address of row l % 8 of matrix l / 8. Register j of a lane receives the 4 bytes at byte
// 4 quad_lane of matrix j's row `group`; with .trans (16-bit only), the 16-bit values of rows
// 2 quad_lane and 2 quad_lane + 1 at column `group`. So, over a tile in shared memory:
//   - an A operand whose rows are the tile's rows (Q, K, V, dO): ldmatrix.x4, matrix j at rows
//     m0 + 8 (j % 2), bytes 16 (j / 2) of the k-step                       (a_from_rows)
//   - the B operands of two n-tiles whose columns are the tile's rows (K in S = Q K^T):
//     ldmatrix.x4, matrix j at rows n0 + 8 (j / 2), bytes 16 (j % 2)         (b_from_rows)
// Both read 16-bit and TF32 operands alike: a TF32 lane's register r is the 4 bytes at
// k = quad_lane + 4 (r / 2), which is what ldmatrix gives it.
//   - the B operands of two n-tiles whose rows are the tile's rows (V in O += P V), and an A
//     operand whose columns are the tile's rows (dS^T stored, dS needed): 16-bit by
//     ldmatrix.x4.trans; TF32 by 32-bit loads, there being no transposing load of 32-bit values
//                                                                           (b_from_columns, a_from_columns)
//   - an A operand from accumulators (probabilities, dS) stays in registers (FlashAttention-2):
//     16-bit, n-tiles 2 kk and 2 kk + 1 packed are the A operand of k-step kk as they lie;
//     TF32, n-tile kk's values are the A operand of k-step kk with its k order permuted: a lane's
//     k = quad_lane holds column 2 quad_lane, k = quad_lane + 4 column 2 quad_lane + 1
//                                                                           (a_from_accumulators)
// A product's A and B must agree on the order of k. The TF32 operands from accumulators and from
// columns take the permuted order (k = quad_lane: row or column 2 quad_lane of the k-step;
// k = quad_lane + 4: 2 quad_lane + 1), those from rows the natural one; the kernels pair rows with
// rows (S = Q K^T, dP = dO V^T) and the others with each other (O += P V, dV += P^T dO,
// dK += dS^T Q, dQ += dS K). 16-bit operands are in the natural order throughout.
//
// Shared-memory tiles are rows of S padded by 16 bytes: row r of a tile of `columns` values
// starts at r (sizeof(S) columns + 16). The 8 rows an ldmatrix phase reads (16 bytes at the same
// column of 8 consecutive rows) then start 4 banks apart and fill the 32 banks once, for any row
// length that is a multiple of 128 bytes; the TF32 column loads (rows 2 quad_lane and
// 2 quad_lane + 1, columns group) fall into banks 8 quad_lane + group (+ 4): no conflict either.
// Every address a lane gives is its own base plus a constant, which the instructions take as an
// immediate offset (an XOR swizzle would keep a register per distinct address).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "longattn/core/half.hpp"

namespace longattn::detail::tensor_core {

// The tensor-core operand types.
enum class Operand { bf16, f16, tf32 };

// The operand type of a storage type.
template <class S>
inline constexpr Operand operand_of = std::is_same_v<std::remove_const_t<S>, bfloat16>  ? Operand::bf16
                                      : std::is_same_v<std::remove_const_t<S>, float16> ? Operand::f16
                                                                                         : Operand::tf32;

// The k of a product step: 32 bytes of S.
template <class S>
inline constexpr int mma_k = 32 / int(sizeof(S));

struct Lane {
  int group;      // lane / 4: a row of A and C, a column of B
  int quad_lane;  // lane % 4
  KOKKOS_INLINE_FUNCTION explicit Lane(int lane) : group(lane >> 2), quad_lane(lane & 3) {}
};

// C, D: value i of a lane is C[accumulator_row][accumulator_col].
KOKKOS_INLINE_FUNCTION constexpr int accumulator_row(int lane, int i) { return (lane >> 2) + 8 * (i >> 1); }
KOKKOS_INLINE_FUNCTION constexpr int accumulator_col(int lane, int i) { return 2 * (lane & 3) + (i & 1); }

// Values of S in a chunk of 16 bytes, and chunks per row of a tile of `columns` values.
template <class S>
inline constexpr int chunk_values = 16 / int(sizeof(S));
template <class S>
KOKKOS_INLINE_FUNCTION constexpr int chunks_per_row(int columns) {
  return columns / chunk_values<S>;
}

// Bytes from one row of a tile of `columns` values of S to the next, and a tile of `rows` rows.
template <class S>
KOKKOS_INLINE_FUNCTION constexpr int row_bytes(int columns) {
  return int(sizeof(S)) * columns + 16;
}
template <class S>
KOKKOS_INLINE_FUNCTION constexpr int tile_bytes(int rows, int columns) {
  return rows * row_bytes<S>(columns);
}

// Byte offset of value `column` of row `row` in a tile of `columns` values of S per row.
template <class S>
KOKKOS_INLINE_FUNCTION constexpr int tile_offset(int row, int column, int columns) {
  return row * row_bytes<S>(columns) + int(sizeof(S)) * column;
}

// Where lane `lane` points ldmatrix, as a byte offset into a tile of `columns` values of S per
// row: the four matrices of an A operand (rows m0.., the k-step from column k0), of two B
// operands (rows n0.. are the n-tiles' columns), and (16-bit) of two B operands and an A operand
// read transposed (rows k0.. are k).
template <class S>
KOKKOS_INLINE_FUNCTION constexpr int a_address(int lane, int m0, int k0, int columns) {
  return tile_offset<S>(m0 + (lane & 7) + 8 * ((lane >> 3) & 1), k0 + chunk_values<S> * (lane >> 4), columns);
}
template <class S>
KOKKOS_INLINE_FUNCTION constexpr int b_address(int lane, int n0, int k0, int columns) {
  return tile_offset<S>(n0 + (lane & 7) + 8 * (lane >> 4), k0 + chunk_values<S> * ((lane >> 3) & 1), columns);
}
template <class S>
KOKKOS_INLINE_FUNCTION constexpr int b_trans_address(int lane, int k0, int n0, int columns) {
  static_assert(sizeof(S) == 2, "ldmatrix.trans moves 16-bit values");
  return tile_offset<S>(k0 + (lane & 7) + 8 * ((lane >> 3) & 1), n0 + 8 * (lane >> 4), columns);
}
template <class S>
KOKKOS_INLINE_FUNCTION constexpr int a_trans_address(int lane, int k0, int m0, int columns) {
  static_assert(sizeof(S) == 2, "ldmatrix.trans moves 16-bit values");
  return tile_offset<S>(k0 + (lane & 7) + 8 * (lane >> 4), m0 + 8 * ((lane >> 3) & 1), columns);
}

// The A operand of rows m0 .. m0 + 15 and the k-step from column k0 of a tile whose rows are m.
template <class Warp, class S>
KOKKOS_INLINE_FUNCTION void a_from_rows(std::uint32_t (&a)[4], const char* tile, int lane, int m0, int k0,
                                        int columns) {
  Warp::ldmatrix_x4(a, tile + a_address<S>(lane, m0, k0, columns));
}

// The B operands of n-tiles n0 (b[0], b[1]) and n0 + 8 (b[2], b[3]), the k-step from column k0,
// of a tile whose rows are n.
template <class Warp, class S>
KOKKOS_INLINE_FUNCTION void b_from_rows(std::uint32_t (&b)[4], const char* tile, int lane, int n0, int k0,
                                        int columns) {
  Warp::ldmatrix_x4(b, tile + b_address<S>(lane, n0, k0, columns));
}

// TF32 operands by columns: w[r][h] = the value at row k0 + 2 quad_lane + r (k = quad_lane + 4 r
// in the permuted order), column c0 + group + 8 h, of a tile of 32-bit values.
template <class Warp, class S>
KOKKOS_INLINE_FUNCTION void tf32_column_words(std::uint32_t (&w)[2][2], const char* tile, int lane, int k0, int c0,
                                              int columns) {
  const Lane at(lane);
  const char* base = tile + tile_offset<S>(k0 + 2 * at.quad_lane, c0 + at.group, columns);
  w[0][0] = Warp::template load_shared<std::uint32_t>(base);
  w[0][1] = Warp::template load_shared<std::uint32_t>(base + tile_offset<S>(0, 8, columns));
  w[1][0] = Warp::template load_shared<std::uint32_t>(base + tile_offset<S>(1, 0, columns));
  w[1][1] = Warp::template load_shared<std::uint32_t>(base + tile_offset<S>(1, 8, columns));
}

// The B operands of n-tiles n0 (b[0], b[1]) and n0 + 8 (b[2], b[3]), the k-step of rows k0 ..
// k0 + mma_k - 1, of a tile whose rows are k (TF32: in the permuted k order).
template <class Warp, class S>
KOKKOS_INLINE_FUNCTION void b_from_columns(std::uint32_t (&b)[4], const char* tile, int lane, int k0, int n0,
                                           int columns) {
  if constexpr (sizeof(S) == 2) {
    Warp::ldmatrix_x4_trans(b, tile + b_trans_address<S>(lane, k0, n0, columns));
  } else {
    std::uint32_t w[2][2];
    tf32_column_words<Warp, S>(w, tile, lane, k0, n0, columns);
    b[0] = w[0][0];  // n-tile n0: k = quad_lane, quad_lane + 4
    b[1] = w[1][0];
    b[2] = w[0][1];  // n-tile n0 + 8
    b[3] = w[1][1];
  }
}

// The A operand of rows m0 .. m0 + 15, the k-step of rows k0 .. k0 + mma_k - 1, of a tile whose
// rows are k and columns m (TF32: in the permuted k order).
template <class Warp, class S>
KOKKOS_INLINE_FUNCTION void a_from_columns(std::uint32_t (&a)[4], const char* tile, int lane, int k0, int m0,
                                           int columns) {
  if constexpr (sizeof(S) == 2) {
    Warp::ldmatrix_x4_trans(a, tile + a_trans_address<S>(lane, k0, m0, columns));
  } else {
    std::uint32_t w[2][2];
    tf32_column_words<Warp, S>(w, tile, lane, k0, m0, columns);
    a[0] = w[0][0];  // rows m0 + group, m0 + group + 8 at k = quad_lane; then at k = quad_lane + 4
    a[1] = w[0][1];
    a[2] = w[1][0];
    a[3] = w[1][1];
  }
}

// The A operand of k-step kk (columns [mma_k kk, mma_k (kk + 1))) of a row block of accumulators
// c[n-tile][4] (probabilities, dS): 16-bit, packed by Warp::pack; TF32, rounded by Warp::tf32, in
// the permuted k order.
template <class Warp, class S, int Tiles>
KOKKOS_INLINE_FUNCTION void a_from_accumulators(const float (&c)[Tiles][4], int kk, std::uint32_t (&a)[4]) {
  if constexpr (sizeof(S) == 2) {
    constexpr Operand type = operand_of<S>;
    a[0] = Warp::template pack<type>(c[2 * kk][0], c[2 * kk][1]);
    a[1] = Warp::template pack<type>(c[2 * kk][2], c[2 * kk][3]);
    a[2] = Warp::template pack<type>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[3] = Warp::template pack<type>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
  } else {
    a[0] = Warp::tf32(c[kk][0]);
    a[1] = Warp::tf32(c[kk][2]);
    a[2] = Warp::tf32(c[kk][1]);
    a[3] = Warp::tf32(c[kk][3]);
  }
}

// Accumulator (n, i) of the block whose A operands a_from_accumulators made, as the operand holds
// it (rounded to S or to TF32).
template <class S, int Steps>
KOKKOS_INLINE_FUNCTION float operand_value(const std::uint32_t (&a)[Steps][4], int n, int i) {
  if constexpr (sizeof(S) == 2) {
    const std::uint32_t word = a[n / 2][2 * (n % 2) + i / 2];
    return float(S::from_bits(std::uint16_t(i % 2 == 0 ? word & 0xffffu : word >> 16)));
  } else {
    float value;
    const std::uint32_t word = a[n][2 * (i % 2) + i / 2];
    memcpy(&value, &word, sizeof value);
    return value;
  }
}

// d += a b on the tensor cores, the instruction of S.
template <class Warp, class S>
KOKKOS_INLINE_FUNCTION void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  Warp::template mma<operand_of<S>>(d, a, b0, b1);
}

}  // namespace longattn::detail::tensor_core
