// The backward pass's dK and dV on Hopper's warpgroup tensor-core instructions (wgmma, sm_90a),
// 16-bit at head dims 64 and 128, in FlashAttention-3's structure: a producer warpgroup brings the
// tiles by the tensor copy engine (TMA) on mbarriers, two consumer warpgroups compute, each on the
// 64 keys of its own key block, with the products of the warp-level KeyGradientProgram
// (backward.hpp) as warpgroup products (warpgroup.hpp says where their values sit). dQ is the
// warp-level QueryGradientProgram's pass (the two-pass form: deterministic, 7 products in all).
// One CTA per (batch, head, pair of 64-key blocks):
//
//   CTA      2 consumer warpgroups (256 threads): warpgroup g the pair's key block g, its warp w
//            the keys 16 w .. 16 w + 15 of that block (M = keys, as the warp-level program's
//            warp); then a producer warpgroup, whose first thread issues every copy. A whole
//            producer warpgroup rather than a warp, for setmaxnreg (which moves registers between
//            warpgroups): 12 warps start with 168 registers a thread (an SM sub-partition's 16K
//            over its 3 warps), the producer gives back all but 24, the consumers take 240
//            (24 + 2 x 240 = 504 of a sub-partition's 512 a lane), which D = 128 needs
//   shared   K [128][D], V [128][D] (resident), and two stages of Q [64][D] and dO [64][D],
//            128-byte-swizzled panels on a 1024-byte boundary; 5 mbarriers: K's and V's, and each
//            stage's full (1 arrival: the producer's, with the stage's bytes) and empty (2: a
//            thread of each consumer warpgroup). D = 64: 65 KiB, 128: 129 KiB with the alignment
//   producer K and V (2 D / 64 copies of 128 rows); then for the i-th query block of the union of
//            the two key blocks' visiting query blocks, into stage i % 2: wait until the stage is
//            empty (its phase i / 2 - 1, from i = 2 on), announce Q's and dO's bytes on its full
//            barrier, 2 D / 64 copies of 64 rows
//   consumer wait for K and V; for each query block i: wait until stage i % 2 is full (phase
//            i / 2); a warpgroup whose key block the query block does not visit releases the
//            stage; the other
//              S^T = K Q^T          D / 16 x wgmma m64n64k16: A = K, B = Q, K-major descriptors
//              P^T = 2^(S^T scale log2(e) - LSE), masked, packed to 16 bits as A operands
//              dV += P^T dO         4 x wgmma m64nDk16: A = P^T (registers), B = dO MN-major
//              dP^T = V dO^T        D / 16 x wgmma m64n64k16, as S^T (one commit group with dV)
//              dS^T = P^T (output_scale dP^T - Delta), packed
//              dK += dS^T Q         4 x wgmma m64nDk16: A = dS^T, B = Q MN-major
//            then releases the stage. Each query's LSE (log2 units) and Delta are read from the
//            QueryStatistics rows in global memory (L2) where the softmax needs them
//   end      a CTA barrier; dK = scale dK, dV = output_scale dV staged through the K, V and Q
//            tiles (the warp-level epilogue's padded rows), 16-byte stores
//
// Per consumer thread: dK and dV D / 2 floats each, S^T (then dP^T) 32, P^T's and dS^T's operands
// 16 each (at D = 128, with what is in flight, beyond 168 registers: ptxas spilled there and
// serialized the wgmma, C7512). Products of one warpgroup wait for each other; the two
// warpgroups' products overlap on the tensor cores.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "longattn/core/detail/tensor_core/backward.hpp"
#include "longattn/core/detail/tensor_core/fragments.hpp"
#include "longattn/core/detail/tensor_core/stages.hpp"
#include "longattn/core/detail/tensor_core/tiles.hpp"
#include "longattn/core/detail/tensor_core/warpgroup.hpp"

namespace longattn::detail::tensor_core {

template <class Warp, class S, int D, class Pattern>
struct WarpgroupKeyGradientProgram {
  static_assert(sizeof(S) == 2 && (D == 64 || D == 128), "16-bit, head dims 64 and 128");
  using TensorMap = typename Warp::TensorMap;
  static constexpr int L = block_tokens;
  static constexpr int consumers = 2, key_rows = consumers * L;
  static constexpr int producer = consumers * warpgroup_threads;  // the producer warpgroup's first thread
  static constexpr int threads = producer + warpgroup_threads;
  static constexpr int producer_registers = 24, consumer_registers = 240;
  static constexpr int stages = 2;
  static constexpr int min_ctas_per_sm = 1;
  static constexpr std::size_t kv_bytes = swizzled_tile_bytes(key_rows, D), q_bytes = swizzled_tile_bytes(L, D);
  static constexpr std::size_t stage_bytes = 2 * q_bytes;  // Q, then dO
  using Barriers = StageBarriers<stages>;  // resident: K's and V's
  static constexpr std::size_t shared_bytes = swizzle_bytes + 2 * kv_bytes + stages * stage_bytes + Barriers::bytes;
  static_assert(shared_bytes <= max_shared_bytes, "the tiles fit an H100's shared memory");
  static constexpr int consumer_warps = consumers * warpgroup_threads / 32;
  static_assert(consumer_warps * 2 * tile_bytes<S>(16, D) <= 2 * kv_bytes + stages * stage_bytes,
                "the epilogue stages in K, V and the stages");

  BackwardArguments<S> args;
  Pattern pattern;
  TensorMap q_map, k_map, v_map, d_o_map;  // boxes of L (Q, dO) and key_rows (K, V) rows

  KOKKOS_INLINE_FUNCTION int key_block_pairs() const { return (pattern.key_blocks() + 1) / 2; }
  int ctas() const { return args.batch * args.heads * key_block_pairs(); }

  KOKKOS_INLINE_FUNCTION void operator()(int cta, char* shared) const {
    const int thread = Warp::thread(), warp = thread / 32, lane = thread % 32;
    const Lane at(lane);
    // Values the same across a warpgroup, made known to the compiler (Warp::uniform): wgmma in a
    // branch it cannot prove uniform is serialized (ptxas C7520).
    const int group = Warp::uniform(thread / warpgroup_threads);
    const int pairs = key_block_pairs(), blocks = pattern.key_blocks();
    const int pair = cta % pairs;  // a head's first key blocks (the most queries see them when causal) first
    const int h = cta / pairs % args.heads, b = cta / pairs / args.heads;
    const int first_block = 2 * pair;
    BlockUnion visits{pattern.visiting_query_blocks(b, h, first_block),
                      first_block + 1 < blocks ? pattern.visiting_query_blocks(b, h, first_block + 1) : BlockList{}};
    char* const sk = shared + (swizzle_bytes - Warp::shared_address(shared) % swizzle_bytes) % swizzle_bytes;
    char* const sv = sk + kv_bytes;
    char* const sq = sv + kv_bytes;  // stage t: Q at sq + t stage_bytes, dO after it
    const Barriers barriers{Warp::shared_address(sq + stages * stage_bytes)};
    if (thread == 0) barriers.template init<Warp>(consumers);
    Warp::sync_cta();
    if (group == consumers) {
      Warp::template setmaxnreg_dec<producer_registers>();
      if (thread == producer) produce(visits, b, h, first_block * L, sk, sv, sq, barriers);
      Warp::sync_cta();  // the consumers' epilogue
      return;
    }
    Warp::template setmaxnreg_inc<consumer_registers>();

    const std::int64_t k_first = std::int64_t(first_block + group) * L;  // the warpgroup's key block
    const int row0 = 16 * (warp % 4);                                    // the warp's keys in it
    const int keys[2] = {row0 + at.group, row0 + at.group + 8};          // the lane's
    const bool has_keys = k_first < args.keys;                           // the same for the warpgroup
    const std::uint32_t k_address = Warp::shared_address(sk), v_address = Warp::shared_address(sv);
    const std::uint32_t q_address = Warp::shared_address(sq);
    const FloatPair* const statistics = args.statistics_of(b, h);
    float dk[D / 8][4], dv[D / 8][4];
    LONGATTN_WARP_UNROLL
    for (int n = 0; n < D / 8; ++n)
      LONGATTN_WARP_UNROLL
      for (int i = 0; i < 4; ++i) dk[n][i] = dv[n][i] = 0.0f;
    Warp::mbarrier_wait(barriers.resident(), 0);
    int block = 0;
    bool in_first = false, in_second = false;
    for (int i = 0; Warp::uniform(visits.next(block, in_first, in_second)); ++i) {
      const int stage = i % stages;
      Warp::mbarrier_wait(barriers.full(stage), i / stages % 2);
      if (!Warp::uniform(has_keys && (group == 0 ? in_first : in_second))) {
        barriers.template release<Warp>(stage);
        continue;
      }
      const std::int64_t q_first = std::int64_t(block) * L;
      const std::uint32_t stage_q = q_address + std::uint32_t(stage * stage_bytes);
      const std::uint32_t stage_d_o = stage_q + std::uint32_t(q_bytes);
      // The queries that see each of this lane's two keys; each query's LSE and Delta.
      int first[2], end[2];
      for (int half = 0; half < 2; ++half) args.queries_seeing(k_first, keys[half], q_first, first[half], end[half]);
      const FloatPair* const query_stats = statistics + q_first;
      auto lse2_of = [&](int n, int r) { return query_stats[8 * n + accumulator_col(lane, r)].x; };
      auto delta_of = [&](int n, int r) { return query_stats[8 * n + accumulator_col(lane, r)].y; };

      float x[L / 8][4];  // S^T, then dP^T: rows the warpgroup's keys, columns the block's queries
      BlockOperands<S> p, ds;
      clear(x);
      Warp::fence_accumulators(x);
      Warp::wgmma_fence();
      issue_rows_times_rows<Warp, S, D, L>(x, k_address, key_rows, L * group, stage_q);  // S^T = K Q^T
      Warp::wgmma_commit();
      Warp::template wgmma_wait<0>();
      Warp::fence_accumulators(x);
      probabilities<Warp>(x, args.scale_log2, first, end, lane, lse2_of);
      make_operands<Warp, S>(x, p);
      clear(x);
      Warp::fence_accumulators(x);
      Warp::fence_accumulators(dv);
      Warp::wgmma_fence();
      issue_operands_times_rows<Warp, S, D>(dv, p, stage_d_o);                             // dV += P^T dO
      issue_rows_times_rows<Warp, S, D, L>(x, v_address, key_rows, L * group, stage_d_o);  // dP^T = V dO^T
      Warp::wgmma_commit();
      Warp::template wgmma_wait<0>();
      Warp::fence_accumulators(x);
      Warp::fence_accumulators(dv);
      score_gradients(x, args.output_scale, [&](int n, int r) { return operand_value<S>(p, n, r); }, delta_of);
      make_operands<Warp, S>(x, ds);
      Warp::fence_accumulators(dk);
      Warp::wgmma_fence();
      issue_operands_times_rows<Warp, S, D>(dk, ds, stage_q);  // dK += dS^T Q
      Warp::wgmma_commit();
      Warp::template wgmma_wait<0>();
      Warp::fence_accumulators(dk);
      barriers.template release<Warp>(stage);
    }
    Warp::sync_cta();  // every copy landed and every product is done: the tiles hold the epilogue's rows
    if (!has_keys) return;
    char* const dk_staging = sk + 2 * tile_bytes<S>(16, D) * warp;
    char* const dv_staging = dk_staging + tile_bytes<S>(16, D);
    stage_rows<Warp, S, D>(dk_staging, dk, args.scale, lane);
    stage_rows<Warp, S, D>(dv_staging, dv, args.output_scale, lane);
    Warp::sync_warp();
    const std::int64_t warp_first_key = k_first + row0;
    const int count = min_int(args.keys - warp_first_key, 16);
    store_warp_rows<Warp, D>(dk_staging, args.dk.row(b, warp_first_key, h), args.dk.token_stride, count,
                             args.accumulate, lane);
    store_warp_rows<Warp, D>(dv_staging, args.dv.row(b, warp_first_key, h), args.dv.token_stride, count,
                             args.accumulate, lane);
  }

  // The producer (one thread): K and V of the pair's keys, then Q and dO of every query block that
  // visits either key block.
  KOKKOS_INLINE_FUNCTION void produce(BlockUnion visits, int b, int h, int k_first, char* sk, char* sv, char* sq,
                                      const Barriers& barriers) const {
    Warp::mbarrier_arrive_expect_tx(barriers.resident(), std::uint32_t(2 * kv_bytes));
    tma_load_rows<Warp, D>(sk, k_map, key_rows, k_first, h, b, barriers.resident());
    tma_load_rows<Warp, D>(sv, v_map, key_rows, k_first, h, b, barriers.resident());
    stream_block_pairs<Warp, D>(visits, sq, q_map, d_o_map, h, b, barriers);
  }

  KOKKOS_INLINE_FUNCTION static void clear(float (&x)[L / 8][4]) {
    LONGATTN_WARP_UNROLL
    for (int n = 0; n < L / 8; ++n)
      LONGATTN_WARP_UNROLL
      for (int r = 0; r < 4; ++r) x[n][r] = 0.0f;
  }
};

}  // namespace longattn::detail::tensor_core
