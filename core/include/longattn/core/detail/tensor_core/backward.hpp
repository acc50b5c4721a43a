// The backward pass on tensor cores (FlashAttention-2's structure), after QueryStatistics (each
// query's LSE in log2 units and Delta = rowsum(dO * O), side by side, in rows padded to whole
// 64-query blocks). Scores are recomputed from LSE; dS = P (dP - Delta).
//
// KeyGradientProgram: one CTA per (batch, head, 64-key block), dK and dV.
//   CTA     4 warps (128 threads); warp w owns keys 16 w .. 16 w + 15 of the block (M = keys)
//   shared  K [64][D], V [64][D] (resident), Q and dO [2][64][D] (double-buffered query blocks),
//           LSE (log2 units) and Delta of the buffered queries; with SumQueryGradient also
//           dS^T [64][64]; rows padded (fragments.hpp). D = 64: 64 KiB (55 KiB without dS^T),
//           128: 112 KiB (103 KiB)
//   loop    over the query blocks that visit the key block (a block pattern's transpose):
//             wait; barrier; cp.async the next query block's Q, dO and statistics
//             S^T = K Q^T                    A = K rows (ldmatrix), B = Q rows (ldmatrix)
//             P^T = 2^(S^T scale log2(e) - LSE), packed to 16 bits (TF32: rounded) as an A operand
//             dV += P^T dO                   B = dO (ldmatrix.trans; TF32: 32-bit loads)
//             dP^T = V dO^T; dS^T = P^T (output_scale dP^T - Delta), with P^T's operand values
//             dK += dS^T Q                   A = dS^T packed, B = Q (as dO)
//             SumQueryGradient: dS^T to shared memory; barrier; warp w adds dQ for queries
//             16 w .. 16 w + 15: dQ += scale dS K (A = dS by ldmatrix.trans of dS^T, B = K by
//             ldmatrix.trans; TF32: 32-bit loads) into a float [B][H][Nq][D] sum, atomically
//             (red.global.add.v2.f32): FlashAttention-2's one pass, 5 products, the sums' order
//             not fixed
//   end     dK = scale dK, dV = output_scale dV through the Q and dO tiles, 16-byte stores
//   Per thread: dK and dV accumulators D / 2 floats each, S^T (then dP^T) 32, P^T's operands 16
//   (TF32: 32); D <= 128. Float tiles take twice the bytes: D = 64: 120 KiB, 128: 216 KiB.
//
// QueryGradientProgram: one CTA per (batch, head, 64-query block), dQ alone, deterministic (the
// two-pass form's second pass, S and dP computed again: 7 products in all).
//   CTA     4 warps; warp w owns queries 16 w .. 16 w + 15 (M = queries)
//   shared  Q [64][D], dO [64][D] (resident), K and V [2][64][D] (double-buffered key blocks):
//           D = 64: 54 KiB, 128: 102 KiB (float: 102 and 198 KiB)
//   loop    over the key blocks the query block visits: S = Q K^T, dP = dO V^T, dS, dQ += dS K
//           (A = dS from the accumulators, B = K by ldmatrix.trans; TF32: 32-bit loads)
// Float tiles are rounded to TF32 where they land (tiles.hpp, round_tile).
//   end     dQ = scale dQ through the Q tile
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "longattn/core/detail/tensor_core/fragments.hpp"
#include "longattn/core/detail/tensor_core/tiles.hpp"

namespace longattn::detail::tensor_core {

template <class S>
struct BackwardArguments {
  Tensor<const S> q, k, v, d_o;
  Tensor<S> dq, dk, dv;
  // [B][H][padded_queries] of (LSE in log2 units, Delta): QueryStatistics' output.
  const FloatPair* statistics = nullptr;
  int padded_queries = 0;
  float* dq_sum = nullptr;  // [B][H][Nq][D]: KeyGradientProgram<..., true> adds scale dS K into it
  int batch = 0, heads = 0, queries = 0, keys = 0;
  std::int64_t query_offset = 0, key_offset = 0;
  bool causal = false;
  float scale = 0;       // the softmax scale
  float scale_log2 = 0;  // scale * log2(e)
  float output_scale = 1;
  bool accumulate = false;  // add into dq, dk, dv

  KOKKOS_INLINE_FUNCTION const FloatPair* statistics_of(int b, int h) const {
    return statistics + (std::int64_t(b) * heads + h) * padded_queries;
  }
  // The keys of the block from k_first (of 64) that query `query` sees, [0, return).
  KOKKOS_INLINE_FUNCTION int keys_seen(std::int64_t query, std::int64_t k_first) const {
    const int inside = query < queries ? min_int(keys - k_first, block_tokens) : 0;
    return causal ? min_int(inside, clamp_to_block(query_offset + query - key_offset - k_first + 1, block_tokens))
                  : inside;
  }
  // The queries of the block from q_first that see key `key` of the block from k_first, [first, end).
  KOKKOS_INLINE_FUNCTION void queries_seeing(std::int64_t k_first, int key, std::int64_t q_first, int& first,
                                             int& end) const {
    end = k_first + key < keys ? min_int(queries - q_first, block_tokens) : 0;
    first = causal ? clamp_to_block(key_offset + k_first + key - query_offset - q_first, block_tokens) : 0;
  }
};

// The backward programs' per-query values: (LSE in log2 units, Delta = sum_d dO O) for the queries
// of each (batch, head), rows of `padded` (whole 64-query blocks, so that the programs copy
// them in 16-byte chunks); +inf and 0 past the queries and where LSE = -inf (a query that sees no
// key: its P is then 0).
template <class ExecSpace, class S, class Lse>
struct QueryStatistics {
  Tensor4<const S, ExecSpace> o, d_o;
  Lse lse;
  FloatPair* statistics;
  int heads, queries, padded, head_dim;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t row) const {
    const int i = int(row % padded), h = int(row / padded % heads), b = int(row / padded / heads);
    FloatPair value{-minus_infinity<float>(), 0.0f};
    if (i < queries) {
      const float lse_i = lse(b, h, i);
      if (lse_i != minus_infinity<float>()) value.x = lse_i * log2_e<float>();
      for (int d = 0; d < head_dim; ++d) value.y += float(d_o(b, i, h, d)) * float(o(b, i, h, d));
    }
    statistics[row] = value;
  }
};

// c = A B^T over the head dim: rows m0 .. m0 + 15 of a [.][D] tile `a` (the A operand by ldmatrix)
// against the 64 rows of a [64][D] tile `b` (two B operands per ldmatrix): S = Q K^T, S^T = K Q^T,
// dP = dO V^T, dP^T = V dO^T.
template <class Warp, class S, int D>
KOKKOS_INLINE_FUNCTION void rows_times_rows(const char* a, const char* b, int m0, int lane, float (&c)[8][4]) {
  constexpr int k = mma_k<S>;
  LONGATTN_WARP_UNROLL
  for (int n = 0; n < 8; ++n)
    LONGATTN_WARP_UNROLL
    for (int i = 0; i < 4; ++i) c[n][i] = 0.0f;
  LONGATTN_WARP_ROLLED  // unrolled, the loads of every k-step were hoisted: 255 registers and spills at D = 128
  for (int kk = 0; kk < D / k; ++kk) {
    std::uint32_t x[4];
    a_from_rows<Warp, S>(x, a, lane, m0, k * kk, D);
    LONGATTN_WARP_UNROLL
    for (int nn = 0; nn < 4; ++nn) {
      std::uint32_t y[4];
      b_from_rows<Warp, S>(y, b, lane, 16 * nn, k * kk, D);
      mma<Warp, S>(c[2 * nn], x, y[0], y[1]);
      mma<Warp, S>(c[2 * nn + 1], x, y[2], y[3]);
    }
  }
}

// P = 2^(S scale log2(e) - LSE) in place of S (16 rows x 64 columns of accumulators), 0 outside
// the columns [first[half], end[half]) that row `half` of the lane sees; lse2(n, i) is the LSE (log2
// units) of entry (n, i)'s query.
template <class Warp, class Lse2>
KOKKOS_INLINE_FUNCTION void probabilities(float (&s)[8][4], float scale_log2, const int (&first)[2],
                                          const int (&end)[2], int lane, const Lse2& lse2) {
  LONGATTN_WARP_UNROLL
  for (int n = 0; n < 8; ++n)
    LONGATTN_WARP_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int column = 8 * n + accumulator_col(lane, i);
      const bool seen = column >= first[i / 2] && column < end[i / 2];
      s[n][i] = seen ? Warp::exp2(s[n][i] * scale_log2 - lse2(n, i)) : 0.0f;
    }
}

// dS = P (output_scale dP - Delta) in place of dP; p(n, i) and delta(n, i) are entry (n, i)'s
// probability and its query's Delta.
template <class P, class Delta>
KOKKOS_INLINE_FUNCTION void score_gradients(float (&dp)[8][4], float output_scale, const P& p, const Delta& delta) {
  LONGATTN_WARP_UNROLL
  for (int n = 0; n < 8; ++n)
    LONGATTN_WARP_UNROLL
    for (int i = 0; i < 4; ++i) dp[n][i] = p(n, i) * (dp[n][i] * output_scale - delta(n, i));
}

// The A operands of a row block of 16 x 64 accumulators (P, dS): one per k-step.
template <class S>
using BlockOperands = std::uint32_t[block_tokens / mma_k<S>][4];

template <class Warp, class S>
KOKKOS_INLINE_FUNCTION void make_operands(const float (&c)[8][4], BlockOperands<S>& a) {
  LONGATTN_WARP_UNROLL
  for (int kk = 0; kk < block_tokens / mma_k<S>; ++kk) a_from_accumulators<Warp, S>(c, kk, a[kk]);
}

// acc += A B for 16 rows: A the operands a (16 x 64), B the 64 rows of a [64][D] tile, acc
// [D / 8][4].
template <class Warp, class S, int D>
KOKKOS_INLINE_FUNCTION void add_product(const BlockOperands<S>& a, const char* tile, int lane, float (&acc)[D / 8][4]) {
  constexpr int k = mma_k<S>;
  LONGATTN_WARP_UNROLL
  for (int nn = 0; nn < D / 16; ++nn)
    LONGATTN_WARP_UNROLL
    for (int kk = 0; kk < block_tokens / k; ++kk) {
      std::uint32_t b[4];
      b_from_columns<Warp, S>(b, tile, lane, k * kk, 16 * nn, D);
      mma<Warp, S>(acc[2 * nn], a[kk], b[0], b[1]);
      mma<Warp, S>(acc[2 * nn + 1], a[kk], b[2], b[3]);
    }
}

// Stages factor * acc (16 rows of D) in a warp's rows of a tile as values of S.
template <class Warp, class S, int D>
KOKKOS_INLINE_FUNCTION void stage_rows(char* staging, const float (&acc)[D / 8][4], float factor, int lane) {
  const Lane at(lane);
  LONGATTN_WARP_UNROLL
  for (int half = 0; half < 2; ++half)
    LONGATTN_WARP_UNROLL
    for (int n = 0; n < D / 8; ++n)
      store_pair<Warp, S>(staging + tile_offset<S>(at.group + 8 * half, 8 * n + 2 * at.quad_lane, D),
                          acc[n][2 * half] * factor, acc[n][2 * half + 1] * factor);
}

// Stores the operands a of a row block (16 x 64: rows m0 .. m0 + 15 of a [64][64] tile) as the
// values they hold, each where its accumulator sits.
template <class Warp, class S>
KOKKOS_INLINE_FUNCTION void store_operands(char* tile, const BlockOperands<S>& a, int m0, int lane) {
  const Lane at(lane);
  LONGATTN_WARP_UNROLL
  for (int n = 0; n < 8; ++n)
    LONGATTN_WARP_UNROLL
    for (int half = 0; half < 2; ++half) {
      char* address = tile + tile_offset<S>(m0 + at.group + 8 * half, 8 * n + 2 * at.quad_lane, block_tokens);
      if constexpr (sizeof(S) == 2)  // register 2 (n % 2) + half holds the pair as it is stored
        Warp::store_shared(address, a[n / 2][2 * (n % 2) + half]);
      else
        Warp::store_shared(address, FloatPair{operand_value<S>(a, n, 2 * half), operand_value<S>(a, n, 2 * half + 1)});
    }
}

template <class Warp, class S, int D, class Pattern, bool SumQueryGradient>
struct KeyGradientProgram {
  static_assert(D == 64 || D == 128, "head dims 64 and 128 (dK and dV accumulators stay in registers)");
  static constexpr int L = block_tokens;
  static constexpr int warps = 4, threads = 32 * warps;
  static constexpr int min_ctas_per_sm = 2;
  static constexpr std::size_t tile = tile_bytes<S>(L, D), stats_bytes = L * sizeof(FloatPair);
  static constexpr std::size_t ds_bytes = SumQueryGradient ? tile_bytes<S>(L, L) : 0;
  static constexpr std::size_t shared_bytes = 6 * tile + 2 * stats_bytes + ds_bytes;
  static_assert(shared_bytes <= max_shared_bytes, "the tiles fit an H100's shared memory");

  BackwardArguments<S> args;
  Pattern pattern;

  int ctas() const { return args.batch * args.heads * pattern.key_blocks(); }

  // Shared memory: K, V, then per stage Q, dO, the queries' statistics, then dS^T.
  KOKKOS_INLINE_FUNCTION static char* k_tile(char* shared) { return shared; }
  KOKKOS_INLINE_FUNCTION static char* v_tile(char* shared) { return shared + tile; }
  KOKKOS_INLINE_FUNCTION static char* q_tile(char* shared, int stage) { return shared + (2 + 2 * stage) * tile; }
  KOKKOS_INLINE_FUNCTION static char* do_tile(char* shared, int stage) { return shared + (3 + 2 * stage) * tile; }
  KOKKOS_INLINE_FUNCTION static char* stats(char* shared, int stage) { return shared + 6 * tile + stage * stats_bytes; }
  KOKKOS_INLINE_FUNCTION static char* ds_tile(char* shared) { return shared + 6 * tile + 2 * stats_bytes; }

  KOKKOS_INLINE_FUNCTION void operator()(int cta, char* shared) const {
    const int thread = Warp::thread(), warp = thread / 32, lane = thread % 32;
    const Lane at(lane);
    const int blocks = pattern.key_blocks();
    const int kb = cta % blocks, h = cta / blocks % args.heads, b = cta / blocks / args.heads;
    const std::int64_t k_first = std::int64_t(kb) * L;
    const BlockList visiting = pattern.visiting_query_blocks(b, h, kb);

    load_block_pair<Warp, D, threads>(k_tile(shared), args.k, v_tile(shared), args.v, b, h, k_first, args.keys, thread);
    if (visiting.count > 0) load_query_block(shared, 0, b, h, visiting[0], thread);
    Warp::cp_async_commit();

    float dk[D / 8][4], dv[D / 8][4];
    LONGATTN_WARP_UNROLL
    for (int n = 0; n < D / 8; ++n)
      LONGATTN_WARP_UNROLL
      for (int i = 0; i < 4; ++i) dk[n][i] = dv[n][i] = 0.0f;
    const std::int64_t warp_first_key = k_first + 16 * warp;
    const int keys[2] = {16 * warp + at.group, 16 * warp + at.group + 8};  // this lane's keys in the block
    for (int visit = 0; visit < visiting.count; ++visit) {
      const int stage = visit & 1;
      Warp::cp_async_wait_all();
      if (visit == 0) round_block_pair<Warp, D, threads, S>(k_tile(shared), v_tile(shared), thread);
      round_block_pair<Warp, D, threads, S>(q_tile(shared, stage), do_tile(shared, stage), thread);
      Warp::sync_cta();  // this query block landed; every warp is done with the other stage (and dS^T)
      if (visit + 1 < visiting.count) load_query_block(shared, stage ^ 1, b, h, visiting[visit + 1], thread);
      Warp::cp_async_commit();
      const std::int64_t q_first = std::int64_t(visiting[visit]) * L;
      const char* sq = q_tile(shared, stage);
      const char* sdo = do_tile(shared, stage);
      const char* query_stats = stats(shared, stage);

      // The queries that see each of this lane's two keys, and their LSE (log2 units) and Delta.
      int first[2], end[2];
      for (int half = 0; half < 2; ++half) args.queries_seeing(k_first, keys[half], q_first, first[half], end[half]);
      auto lse2_of = [&](int n, int i) {
        return Warp::template load_shared<float>(query_stats + (8 * n + accumulator_col(lane, i)) * sizeof(FloatPair));
      };
      auto delta_of = [&](int n, int i) {
        return Warp::template load_shared<float>(query_stats + (8 * n + accumulator_col(lane, i)) * sizeof(FloatPair) +
                                                 sizeof(float));
      };
      // Rows are this warp's keys, columns the block's queries. P^T is made an operand right
      // away (its values also make dS^T), so that S^T's and dP^T's registers are not live at once.
      float x[8][4];  // S^T, then dP^T
      BlockOperands<S> p, ds;
      rows_times_rows<Warp, S, D>(k_tile(shared), sq, 16 * warp, lane, x);
      probabilities<Warp>(x, args.scale_log2, first, end, lane, lse2_of);
      make_operands<Warp, S>(x, p);
      add_product<Warp, S, D>(p, sdo, lane, dv);  // dV += P^T dO
      rows_times_rows<Warp, S, D>(v_tile(shared), sdo, 16 * warp, lane, x);
      score_gradients(x, args.output_scale, [&](int n, int i) { return operand_value<S>(p, n, i); }, delta_of);
      make_operands<Warp, S>(x, ds);
      add_product<Warp, S, D>(ds, sq, lane, dk);  // dK += dS^T Q
      if constexpr (SumQueryGradient) {
        store_operands<Warp, S>(ds_tile(shared), ds, 16 * warp, lane);
        Warp::sync_cta();  // dS^T whole
        add_query_gradient(shared, b, h, q_first, warp, lane);
      }
    }
    Warp::cp_async_wait_all();
    Warp::sync_cta();
    // dK and dV through this warp's rows of the first stage's Q and dO tiles.
    char* dk_staging = q_tile(shared, 0) + tile_offset<S>(16 * warp, 0, D);
    char* dv_staging = do_tile(shared, 0) + tile_offset<S>(16 * warp, 0, D);
    stage_rows<Warp, S, D>(dk_staging, dk, args.scale, lane);
    stage_rows<Warp, S, D>(dv_staging, dv, args.output_scale, lane);
    Warp::sync_warp();
    const int count = min_int(args.keys - warp_first_key, 16);
    store_warp_rows<Warp, D>(dk_staging, args.dk.row(b, warp_first_key, h), args.dk.token_stride, count,
                             args.accumulate, lane);
    store_warp_rows<Warp, D>(dv_staging, args.dv.row(b, warp_first_key, h), args.dv.token_stride, count,
                             args.accumulate, lane);
  }

  // Q, dO rows of query block `block` and their statistics into stage `stage`.
  KOKKOS_INLINE_FUNCTION void load_query_block(char* shared, int stage, int b, int h, int block, int thread) const {
    const std::int64_t q_first = std::int64_t(block) * L;
    load_block_pair<Warp, D, threads>(q_tile(shared, stage), args.q, do_tile(shared, stage), args.d_o, b, h, q_first,
                                      args.queries, thread);
    constexpr int chunks = L * sizeof(FloatPair) / 16;
    if (thread < chunks)
      Warp::cp_async_16(stats(shared, stage) + 16 * thread, args.statistics_of(b, h) + q_first + 2 * thread, true);
  }

  // dQ[q][d] += scale sum_k dS[q][k] K[k][d] for this warp's 16 queries, 32 head-dim columns at a
  // time (beside the dK and dV accumulators), added atomically into dq_sum.
  KOKKOS_INLINE_FUNCTION void add_query_gradient(char* shared, int b, int h, std::int64_t q_first, int warp,
                                                 int lane) const {
    const Lane at(lane);
    const char* sds = ds_tile(shared);
    const char* sk = k_tile(shared);
    float* sums = args.dq_sum + ((std::int64_t(b) * args.heads + h) * args.queries) * D;
    LONGATTN_WARP_UNROLL
    for (int column0 = 0; column0 < D; column0 += 32) {
      float acc[4][4];
      LONGATTN_WARP_UNROLL
      for (int n = 0; n < 4; ++n)
        LONGATTN_WARP_UNROLL
        for (int i = 0; i < 4; ++i) acc[n][i] = 0.0f;
      constexpr int k = mma_k<S>;
      LONGATTN_WARP_ROLLED
      for (int kk = 0; kk < L / k; ++kk) {
        std::uint32_t a[4];
        a_from_columns<Warp, S>(a, sds, lane, k * kk, 16 * warp, L);
        LONGATTN_WARP_UNROLL
        for (int nn = 0; nn < 2; ++nn) {
          std::uint32_t bk[4];
          b_from_columns<Warp, S>(bk, sk, lane, k * kk, column0 + 16 * nn, D);
          mma<Warp, S>(acc[2 * nn], a, bk[0], bk[1]);
          mma<Warp, S>(acc[2 * nn + 1], a, bk[2], bk[3]);
        }
      }
      LONGATTN_WARP_UNROLL
      for (int half = 0; half < 2; ++half) {
        const std::int64_t query = q_first + 16 * warp + at.group + 8 * half;
        if (query >= args.queries) continue;
        LONGATTN_WARP_UNROLL
        for (int n = 0; n < 4; ++n)
          Warp::atomic_add_pair(sums + query * D + column0 + 8 * n + 2 * at.quad_lane, acc[n][2 * half] * args.scale,
                                acc[n][2 * half + 1] * args.scale);
      }
    }
  }
};

template <class Warp, class S, int D, class Pattern>
struct QueryGradientProgram {
  static_assert(D == 64 || D == 128, "head dims 64 and 128");
  static constexpr int L = block_tokens;
  static constexpr int warps = 4, threads = 32 * warps;
  static constexpr int min_ctas_per_sm = 2;
  static constexpr std::size_t tile = tile_bytes<S>(L, D);
  static constexpr std::size_t shared_bytes = 6 * tile;
  static_assert(shared_bytes <= max_shared_bytes, "the tiles fit an H100's shared memory");

  BackwardArguments<S> args;
  Pattern pattern;

  int ctas() const { return args.batch * args.heads * pattern.query_blocks(); }

  // Shared memory: Q, dO, then per stage K, V.
  KOKKOS_INLINE_FUNCTION static char* k_tile(char* shared, int stage) { return shared + (2 + 2 * stage) * tile; }
  KOKKOS_INLINE_FUNCTION static char* v_tile(char* shared, int stage) { return shared + (3 + 2 * stage) * tile; }

  KOKKOS_INLINE_FUNCTION void operator()(int cta, char* shared) const {
    const int thread = Warp::thread(), warp = thread / 32, lane = thread % 32;
    const Lane at(lane);
    const int blocks = pattern.query_blocks();
    const int qb = blocks - 1 - cta % blocks;  // the latest query blocks, which see the most keys when causal, first
    const int h = cta / blocks % args.heads, b = cta / blocks / args.heads;
    const std::int64_t q_first = std::int64_t(qb) * L;
    const BlockList visited = pattern.visited_key_blocks(b, h, qb);
    char* const sq = shared;
    char* const sdo = shared + tile;

    load_block_pair<Warp, D, threads>(sq, args.q, sdo, args.d_o, b, h, q_first, args.queries, thread);
    if (visited.count > 0) load_key_block(shared, 0, b, h, visited[0], thread);
    Warp::cp_async_commit();

    const std::int64_t warp_first = q_first + 16 * warp;
    const std::int64_t rows[2] = {warp_first + at.group, warp_first + at.group + 8};  // this lane's queries
    FloatPair row_stats[2];  // LSE (log2 units) and Delta of this lane's two queries
    LONGATTN_WARP_UNROLL
    for (int half = 0; half < 2; ++half) row_stats[half] = args.statistics_of(b, h)[rows[half]];
    float dq[D / 8][4];
    LONGATTN_WARP_UNROLL
    for (int n = 0; n < D / 8; ++n)
      LONGATTN_WARP_UNROLL
      for (int i = 0; i < 4; ++i) dq[n][i] = 0.0f;
    for (int visit = 0; visit < visited.count; ++visit) {
      const int stage = visit & 1;
      Warp::cp_async_wait_all();
      if (visit == 0) round_block_pair<Warp, D, threads, S>(sq, sdo, thread);
      round_block_pair<Warp, D, threads, S>(k_tile(shared, stage), v_tile(shared, stage), thread);
      Warp::sync_cta();  // this key block landed; every warp is done with the other stage
      if (visit + 1 < visited.count) load_key_block(shared, stage ^ 1, b, h, visited[visit + 1], thread);
      Warp::cp_async_commit();
      const std::int64_t k_first = std::int64_t(visited[visit]) * L;
      float s[8][4], dp[8][4];
      rows_times_rows<Warp, S, D>(sq, k_tile(shared, stage), 16 * warp, lane, s);
      rows_times_rows<Warp, S, D>(sdo, v_tile(shared, stage), 16 * warp, lane, dp);
      const int first[2] = {0, 0}, end[2] = {args.keys_seen(rows[0], k_first), args.keys_seen(rows[1], k_first)};
      probabilities<Warp>(s, args.scale_log2, first, end, lane, [&](int, int i) { return row_stats[i / 2].x; });
      score_gradients(dp, args.output_scale, [&](int n, int i) { return s[n][i]; },
                      [&](int, int i) { return row_stats[i / 2].y; });
      BlockOperands<S> ds;
      make_operands<Warp, S>(dp, ds);
      add_product<Warp, S, D>(ds, k_tile(shared, stage), lane, dq);  // dQ += dS K
    }
    Warp::cp_async_wait_all();
    Warp::sync_cta();
    char* staging = sq + tile_offset<S>(16 * warp, 0, D);  // this warp's own Q rows
    stage_rows<Warp, S, D>(staging, dq, args.scale, lane);
    Warp::sync_warp();
    store_warp_rows<Warp, D>(staging, args.dq.row(b, warp_first, h), args.dq.token_stride,
                             min_int(args.queries - warp_first, 16), args.accumulate, lane);
  }

  KOKKOS_INLINE_FUNCTION void load_key_block(char* shared, int stage, int b, int h, int block, int thread) const {
    load_block_pair<Warp, D, threads>(k_tile(shared, stage), args.k, v_tile(shared, stage), args.v, b, h,
                                      std::int64_t(block) * L, args.keys, thread);
  }
};

}  // namespace longattn::detail::tensor_core
