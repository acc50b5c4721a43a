// The forward pass on tensor cores (FlashAttention-2's structure), one CTA per (batch, head, pair
// of 64-query blocks):
//
//   CTA     128 query rows in 8 / R warps; warp w owns R row tiles of 16 query rows, rows
//           16 R w .. 16 R (w + 1) - 1 of the pair (the first half of the warps the first query
//           block, the second half the second). R = 2 (4 warps, FlashAttention-2's shape) at
//           D = 64 and at 16-bit D = 128: each K or V fragment a warp loads from shared memory
//           feeds two mma, which halves the shared-memory reads per product (one tile: 256 bytes
//           of B operand per m16n8k16, 2 of the 4 cycles an SM's tensor cores take for it). At
//           D = 128 its 255 registers hold without spills only with S = Q K^T's k-steps a loop
//           (unrolled: 52 bytes of spill stores, ptxas sm_90) and P V's k-steps outermost (each
//           step's probabilities packed as it starts, so that S's registers free as P V goes).
//           R = 1 (8 warps) for float D = 128, whose 132 KiB of tiles allow one CTA an SM, and
//           at D = 256, where two tiles' O accumulators do not fit.
//   shared  Q [128][D], K [64][D], V [64][D] of the storage type, rows padded (fragments.hpp):
//           16-bit D = 64: 36 KiB, 128: 68 KiB, 256: 132 KiB; float (TF32) D = 64: 68 KiB,
//           128: 132 KiB (256 would take 260)
//   loop    over the union of the two query blocks' key blocks (a block pattern's lists), each
//           warp computing only for the blocks its query block visits:
//             wait K (float: round it to TF32); barrier; cp.async V
//                                                    (V lands while S and the softmax run)
//             S = Q K^T        mma: A = Q rows (ldmatrix), B = K rows (ldmatrix)
//             scale, mask, online softmax on the accumulators (rows reduced over the quad)
//             wait V (float: round); barrier; cp.async next K   (K lands while P V runs)
//             O += P V         A = P from the S accumulators (registers), B = V (ldmatrix.trans;
//                              TF32: 32-bit loads)
//   end     O / l through the warp's own Q rows in shared memory, 16-byte stores; LSE
//
// Per thread and row tile: O accumulators D / 2 floats, S 32 floats, the running max and sum of
// its 2 rows.
// Scores are in log2 units (scale * log2(e)); a key is masked when past the sequence or, causal,
// when its global position follows the query's (each row's visible keys of a block are a prefix). Everything AttentionOptions asks of the forward
// pass is here: output_scale, accumulate_output (the softmax continues from o and lse), offsets.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "longattn/core/detail/tensor_core/fragments.hpp"
#include "longattn/core/detail/tensor_core/tiles.hpp"
#include "longattn/kokkos_compat.hpp"

namespace longattn::detail::tensor_core {

template <class S>
struct ForwardArguments {
  Tensor<const S> q, k, v;
  Tensor<S> o;
  Rows<float> lse;
  int batch = 0, heads = 0, queries = 0, keys = 0;
  std::int64_t query_offset = 0, key_offset = 0;
  bool causal = false;
  float scale_log2 = 0;  // softmax scale * log2(e)
  float output_scale = 1;
  bool accumulate = false;  // continue the softmax of the (o, lse) already there
};

template <class Warp, class S, int D, class Pattern>
struct ForwardProgram {
  static_assert(D == 64 || D == 128 || (D == 256 && sizeof(S) == 2), "head dims 64, 128 (16-bit also 256)");
  static constexpr int L = block_tokens;
  static constexpr int query_rows = 2 * L;
  static constexpr int row_tiles = D == 64 || (D == 128 && sizeof(S) == 2) ? 2 : 1;  // R above
  static constexpr int warps = query_rows / (16 * row_tiles), threads = 32 * warps;
  // Two CTAs an SM with two row tiles (4 warps, up to 255 registers a thread: 232-255 used),
  // else one (8 warps, 200-255 registers).
  static constexpr int min_ctas_per_sm = row_tiles == 2 ? 2 : 1;
  static constexpr std::size_t q_bytes = tile_bytes<S>(query_rows, D), kv_bytes = tile_bytes<S>(L, D);
  static constexpr std::size_t shared_bytes = q_bytes + 2 * kv_bytes;
  static_assert(shared_bytes <= max_shared_bytes, "the tiles fit an H100's shared memory");

  ForwardArguments<S> args;
  Pattern pattern;

  KOKKOS_INLINE_FUNCTION int query_block_pairs() const { return (pattern.query_blocks() + 1) / 2; }
  int ctas() const { return args.batch * args.heads * query_block_pairs(); }

  KOKKOS_INLINE_FUNCTION void operator()(int cta, char* shared) const {
    const int thread = Warp::thread(), warp = thread / 32, lane = thread % 32;
    const Lane at(lane);
    const int pairs = query_block_pairs();
    const int pair = pairs - 1 - cta % pairs;  // the latest query blocks, which see the most keys under a causal mask, first
    const int h = cta / pairs % args.heads, b = cta / pairs / args.heads;
    const int first_block = 2 * pair;
    const int q_first = first_block * L;
    BlockUnion visits{pattern.visited_key_blocks(b, h, first_block),
                      first_block + 1 < pattern.query_blocks() ? pattern.visited_key_blocks(b, h, first_block + 1)
                                                               : BlockList{}};
    char* const sq = shared;
    char* const sk = shared + q_bytes;
    char* const sv = sk + kv_bytes;

    const int warp_first = q_first + 16 * row_tiles * warp;  // the warp's first query
    const bool has_rows = warp_first < args.queries;
    // This lane's two queries of row tile r: row_of(r) and row_of(r) + 8.
    const auto row_of = [&](int r) { return warp_first + 16 * r + at.group; };

    float m[row_tiles][2], l[row_tiles][2], o[row_tiles][D / 8][4];
    LONGATTN_WARP_UNROLL
    for (int r = 0; r < row_tiles; ++r) start(b, h, row_of(r), lane, m[r], l[r], o[r]);

    load_tile<Warp, query_rows, D, threads>(sq, args.q.row(b, q_first, h), args.q.token_stride,
                                            min_int(args.queries - q_first, query_rows), thread);
    int block = 0;
    bool in_first = false, in_second = false;
    bool more = visits.next(block, in_first, in_second);
    if (more) load_keys_or_values(sk, args.k, b, h, block, thread);
    Warp::cp_async_commit();
    bool first_visit = true;
    while (more) {
      const bool mine = has_rows && (warp < warps / 2 ? in_first : in_second);
      Warp::cp_async_wait_all();
      if (first_visit) round_tile<Warp, query_rows, D, threads, S>(sq, thread);
      round_tile<Warp, L, D, threads, S>(sk, thread);
      Warp::sync_cta();  // K landed; every warp is done with V
      load_keys_or_values(sv, args.v, b, h, block, thread);
      Warp::cp_async_commit();
      float s[row_tiles][L / 8][4];
      if (mine) {
        scores(sq, sk, warp, lane, s);
        LONGATTN_WARP_UNROLL
        for (int r = 0; r < row_tiles; ++r) softmax(s[r], block * L, row_of(r), lane, m[r], l[r], o[r]);
      }
      int next_block = 0;
      bool next_first = false, next_second = false;
      const bool next = visits.next(next_block, next_first, next_second);
      Warp::cp_async_wait_all();
      round_tile<Warp, L, D, threads, S>(sv, thread);
      Warp::sync_cta();  // V landed; every warp is done with K
      if (next) load_keys_or_values(sk, args.k, b, h, next_block, thread);
      Warp::cp_async_commit();
      if (mine) add_probabilities_times_values(s, sv, lane, o);
      block = next_block;
      in_first = next_first;
      in_second = next_second;
      more = next;
      first_visit = false;
    }
    Warp::cp_async_wait_all();
    Warp::sync_cta();
    LONGATTN_WARP_UNROLL
    for (int r = 0; r < row_tiles; ++r)
      if (row_of(r) - at.group < args.queries)
        store(sq + tile_offset<S>(16 * (row_tiles * warp + r), 0, D), b, h, row_of(r) - at.group, row_of(r), lane,
              m[r], l[r], o[r]);
  }

  // The running softmax of a row tile's rows: max m (log2 units), this lane's part of the sum l,
  // O. It starts empty, or, accumulating, as the result already in (o, lse): m = lse in log2
  // units, l = 1 (counted by one lane of the quad), O = o / output_scale. first_row: the lane's
  // first query (its second is 8 later).
  KOKKOS_INLINE_FUNCTION void start(int b, int h, int first_row, int lane, float (&m)[2], float (&l)[2],
                                    float (&o)[D / 8][4]) const {
    const Lane at(lane);
    const float inverse_output_scale = 1.0f / args.output_scale;
    LONGATTN_WARP_UNROLL
    for (int half = 0; half < 2; ++half) {
      const int row = first_row + 8 * half;
      const float previous = args.accumulate && row < args.queries ? args.lse(b, h, row) : minus_infinity<float>();
      const bool empty = previous == minus_infinity<float>();
      m[half] = empty ? minus_infinity<float>() : previous * log2_e<float>();
      l[half] = empty || at.quad_lane != 0 ? 0.0f : 1.0f;
      const S* o_row = empty ? nullptr : args.o.row(b, row, h);
      LONGATTN_WARP_UNROLL
      for (int n = 0; n < D / 8; ++n)
        LONGATTN_WARP_UNROLL
        for (int e = 0; e < 2; ++e)
          o[n][2 * half + e] = empty ? 0.0f : float(o_row[8 * n + 2 * at.quad_lane + e]) * inverse_output_scale;
    }
  }

  // K or V rows of key block `block` into a tile (zeros past the sequence).
  KOKKOS_INLINE_FUNCTION void load_keys_or_values(char* tile, const Tensor<const S>& x, int b, int h, int block,
                                                  int thread) const {
    load_tile<Warp, L, D, threads>(tile, x.row(b, std::int64_t(block) * L, h), x.token_stride,
                                   min_int(args.keys - std::int64_t(block) * L, L), thread);
  }

  // s = Q K^T for the warp's row tiles and the 64 keys of the K tile, each K fragment used by
  // every row tile. Where O takes 128 floats a thread (two tiles at D = 128, one at 256) the
  // k-steps stay a loop: unrolled, their operands did not fit the registers beside it.
  KOKKOS_INLINE_FUNCTION static void scores(const char* sq, const char* sk, int warp, int lane,
                                            float (&s)[row_tiles][L / 8][4]) {
    LONGATTN_WARP_UNROLL
    for (int r = 0; r < row_tiles; ++r)
      LONGATTN_WARP_UNROLL
      for (int n = 0; n < L / 8; ++n)
        LONGATTN_WARP_UNROLL
        for (int i = 0; i < 4; ++i) s[r][n][i] = 0.0f;
    constexpr int k = mma_k<S>;
    auto k_step = [&](int kk) {
      std::uint32_t a[row_tiles][4];
      LONGATTN_WARP_UNROLL
      for (int r = 0; r < row_tiles; ++r) a_from_rows<Warp, S>(a[r], sq, lane, 16 * (row_tiles * warp + r), k * kk, D);
      LONGATTN_WARP_UNROLL
      for (int nn = 0; nn < L / 16; ++nn) {
        std::uint32_t bk[4];
        b_from_rows<Warp, S>(bk, sk, lane, 16 * nn, k * kk, D);
        LONGATTN_WARP_UNROLL
        for (int r = 0; r < row_tiles; ++r) {
          mma<Warp, S>(s[r][2 * nn], a[r], bk[0], bk[1]);
          mma<Warp, S>(s[r][2 * nn + 1], a[r], bk[2], bk[3]);
        }
      }
    };
    if constexpr (D * row_tiles <= 128) {
      LONGATTN_WARP_UNROLL
      for (int kk = 0; kk < D / k; ++kk) k_step(kk);
    } else {
      LONGATTN_WARP_ROLLED
      for (int kk = 0; kk < D / k; ++kk) k_step(kk);
    }
  }

  // Scores to log2 units, masked; the running max and sum move, s becomes the probabilities
  // 2^(score - max), and alpha the factor the rows' O takes (rescale). Row `half` of the lane
  // sees the block's keys [0, seen[half]): those inside the sequence and, causal, not after its
  // query.
  KOKKOS_INLINE_FUNCTION void probabilities(float (&s)[L / 8][4], int k_first, int first_row, int lane, float (&m)[2],
                                            float (&l)[2], float (&alpha)[2]) const {
    int seen[2];
    LONGATTN_WARP_UNROLL
    for (int half = 0; half < 2; ++half) {
      seen[half] = min_int(args.keys - k_first, L);
      if (args.causal)
        seen[half] = min_int(seen[half], clamp_to_block(args.query_offset + first_row + 8 * half - args.key_offset - k_first + 1, L));
    }
    LONGATTN_WARP_UNROLL
    for (int n = 0; n < L / 8; ++n)
      LONGATTN_WARP_UNROLL
      for (int i = 0; i < 4; ++i)
        s[n][i] = 8 * n + accumulator_col(lane, i) < seen[i / 2] ? s[n][i] * args.scale_log2 : minus_infinity<float>();
    LONGATTN_WARP_UNROLL
    for (int half = 0; half < 2; ++half) {
      float block_max = minus_infinity<float>();
      LONGATTN_WARP_UNROLL
      for (int n = 0; n < L / 8; ++n) block_max = fmaxf(block_max, fmaxf(s[n][2 * half], s[n][2 * half + 1]));
      block_max = fmaxf(block_max, Warp::shfl_xor(block_max, 1));  // the quad holds the row
      block_max = fmaxf(block_max, Warp::shfl_xor(block_max, 2));
      const float m_new = fmaxf(m[half], block_max);
      // A row with every key masked so far keeps m = -inf; subtract 0 there, not -inf.
      const float m_ref = m_new == minus_infinity<float>() ? 0.0f : m_new;
      alpha[half] = Warp::exp2(m[half] - m_ref);
      float sum = 0.0f;
      LONGATTN_WARP_UNROLL
      for (int n = 0; n < L / 8; ++n)
        LONGATTN_WARP_UNROLL
        for (int e = 0; e < 2; ++e) {
          const float p = Warp::exp2(s[n][2 * half + e] - m_ref);
          s[n][2 * half + e] = p;
          sum += p;
        }
      m[half] = m_new;
      l[half] = l[half] * alpha[half] + sum;
    }
  }

  // O's rows times their alpha.
  KOKKOS_INLINE_FUNCTION static void rescale(float (&o)[D / 8][4], const float (&alpha)[2]) {
    LONGATTN_WARP_UNROLL
    for (int n = 0; n < D / 8; ++n)
      LONGATTN_WARP_UNROLL
      for (int i = 0; i < 4; ++i) o[n][i] *= alpha[i / 2];
  }

  // The online softmax of a block: probabilities, then O rescaled.
  KOKKOS_INLINE_FUNCTION void softmax(float (&s)[L / 8][4], int k_first, int first_row, int lane, float (&m)[2],
                                      float (&l)[2], float (&o)[D / 8][4]) const {
    float alpha[2];
    probabilities(s, k_first, first_row, lane, m, l, alpha);
    rescale(o, alpha);
  }

  // O += P V: the probabilities, packed to 16 bits (or rounded to TF32) one k-step at a time, are
  // the A operand as they lie; each V fragment is used by every row tile.
  KOKKOS_INLINE_FUNCTION static void add_probabilities_times_values(const float (&p)[row_tiles][L / 8][4],
                                                                    const char* sv, int lane,
                                                                    float (&o)[row_tiles][D / 8][4]) {
    constexpr int k = mma_k<S>;
    LONGATTN_WARP_UNROLL
    for (int kk = 0; kk < L / k; ++kk) {
      std::uint32_t a[row_tiles][4];
      LONGATTN_WARP_UNROLL
      for (int r = 0; r < row_tiles; ++r) a_from_accumulators<Warp, S>(p[r], kk, a[r]);
      LONGATTN_WARP_UNROLL
      for (int nn = 0; nn < D / 16; ++nn) {
        std::uint32_t bv[4];
        b_from_columns<Warp, S>(bv, sv, lane, k * kk, 16 * nn, D);
        LONGATTN_WARP_UNROLL
        for (int r = 0; r < row_tiles; ++r) {
          mma<Warp, S>(o[r][2 * nn], a[r], bv[0], bv[1]);
          mma<Warp, S>(o[r][2 * nn + 1], a[r], bv[2], bv[3]);
        }
      }
    }
  }

  // One row tile's O = output_scale O / l, staged in its own 16 Q rows (no other warp reads them), then
  // stored a 16-byte chunk per lane; LSE = ln 2 (m + log2 l). A query that sees no key gets
  // O = 0, LSE = -inf; a NaN sum (NaN inputs) stays NaN in both.
  KOKKOS_INLINE_FUNCTION void store(char* staging, int b, int h, int tile_first, int first_row, int lane,
                                    const float (&m)[2], float (&l)[2], const float (&o)[D / 8][4]) const {
    const Lane at(lane);
    LONGATTN_WARP_UNROLL
    for (int half = 0; half < 2; ++half) {
      l[half] += Warp::shfl_xor(l[half], 1);
      l[half] += Warp::shfl_xor(l[half], 2);
      const float sum = l[half];
      const float inverse = sum > 0.0f ? args.output_scale / sum : sum == 0.0f ? 0.0f : sum;
      LONGATTN_WARP_UNROLL
      for (int n = 0; n < D / 8; ++n)
        store_pair<Warp, S>(staging + tile_offset<S>(at.group + 8 * half, 8 * n + 2 * at.quad_lane, D),
                            o[n][2 * half] * inverse, o[n][2 * half + 1] * inverse);
      const int row = first_row + 8 * half;
      if (at.quad_lane == 0 && row < args.queries)
        args.lse(b, h, row) = sum > 0.0f    ? (m[half] + math::log2(sum)) * ln_2<float>()
                                     : sum == 0.0f ? minus_infinity<float>()
                                                   : sum;
    }
    Warp::sync_warp();
    store_warp_rows<Warp, D>(staging, args.o.row(b, tile_first, h), args.o.token_stride,
                             min_int(args.queries - tile_first, 16), false, lane);
  }
};

}  // namespace longattn::detail::tensor_core
