// The forward pass on Hopper's warpgroup tensor-core instructions (wgmma, sm_90a), 16-bit at head
// dims 64 and 128, in FlashAttention-3's structure: a producer warp brings the tiles by the tensor
// copy engine (TMA) on mbarriers, two consumer warpgroups compute (S = Q K^T with both operands
// from shared memory, O += P V with the probabilities from registers and V read transposed by its
// descriptor) on the warp-level program's softmax and epilogue (forward.hpp), whose row tiles hold
// the same accumulator layout (warpgroup.hpp). One CTA per (batch, head, pair of 64-query blocks):
//
//   CTA      2 consumer warpgroups (256 threads): warpgroup g the pair's query block g, its warp w
//            the rows 16 w .. 16 w + 15 of that block (one row tile, as the warp-level program's);
//            then 1 producer warp (32 threads), whose lane 0 issues every copy
//   shared   Q [128][D], and three stages of K [64][D] and V [64][D], 128-byte-swizzled panels on
//            a 1024-byte boundary (warpgroup.hpp); 7 mbarriers: Q's, and each stage's full (1
//            arrival: the producer's, with the stage's bytes) and empty (2: a thread of each
//            consumer warpgroup). D = 64: 65 KiB, 128: 129 KiB with the alignment
//   producer Q (D / 64 copies of 128 rows); then for the i-th key block of the union of the two
//            query blocks' key blocks, into stage i % 3: wait until the stage is empty (its phase
//            i / 3 - 1, from i = 3 on), announce K's and V's bytes on its full barrier, 2 D / 64
//            copies of 64 rows
//   consumer wait for Q; for each key block i (block j): wait until stage i % 3 is full (phase
//            i / 3), then for the warpgroup's turn (named barriers, below), then
//              issue S_j = Q K_j^T     D / 16 x wgmma m64n64k16: A = Q, B = K, K-major descriptors
//              issue O += P_{j-1} V_{j-1}  4 x wgmma m64nDk16: A = P_{j-1} (registers), B = V as
//                                          an MN-major descriptor (imm-trans-b)
//              pass the turn to the other warpgroup (ping-pong: its products run while this
//              warpgroup's softmax does)
//              wait for S_j; scale, mask, online softmax (forward.hpp), P_j packed to 16 bits
//              wait for P_{j-1} V_{j-1}; O rescaled for block j; block j - 1's stage released
//            (block j - 1's O += P V runs while j's softmax does: FlashAttention-3's overlap
//            inside a warpgroup); a warpgroup whose query block skips block j takes its turn all
//            the same, finishes its pending P V and releases both stages
//   end      the last P V; a CTA barrier; O / l staged through the K and V stages (the warp-level
//            epilogue), LSE
//
// Per consumer thread: S 32 floats, O D / 2, P 16 registers. Registers are not moved from the
// producer to the consumers (setmaxnreg, which works on whole warpgroups; the backward program
// does): 9 warps leave every thread 168 registers (an SM sub-partition's 16K over the 3 warps it
// holds), more than the consumers use (ptxas: 123 at D = 64, 157 at D = 128).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "longattn/core/detail/tensor_core/forward.hpp"
#include "longattn/core/detail/tensor_core/fragments.hpp"
#include "longattn/core/detail/tensor_core/stages.hpp"
#include "longattn/core/detail/tensor_core/tiles.hpp"
#include "longattn/core/detail/tensor_core/warpgroup.hpp"

namespace longattn::detail::tensor_core {

template <class Warp, class S, int D, class Pattern>
struct WarpgroupForwardProgram {
  static_assert(sizeof(S) == 2 && (D == 64 || D == 128), "16-bit, head dims 64 and 128");
  using RowTiles = ForwardProgram<Warp, S, D, Pattern>;  // its softmax and epilogue
  using TensorMap = typename Warp::TensorMap;
  static constexpr int L = block_tokens;
  static constexpr int consumers = 2, query_rows = consumers * L;
  static constexpr int producer = consumers * warpgroup_threads;  // the producer warp's lane 0
  static constexpr int threads = producer + 32;
  static constexpr int stages = 3;
  // One CTA an SM: two of 288 threads would leave 96 registers a thread (D = 64 spills there).
  static constexpr int min_ctas_per_sm = 1;
  static constexpr std::size_t q_bytes = swizzled_tile_bytes(query_rows, D), kv_bytes = swizzled_tile_bytes(L, D);
  static constexpr std::size_t stage_bytes = 2 * kv_bytes;  // K, then V
  using Barriers = StageBarriers<stages>;  // resident: Q's
  static constexpr std::size_t shared_bytes = swizzle_bytes + q_bytes + stages * stage_bytes + Barriers::bytes;
  static_assert(shared_bytes <= max_shared_bytes, "the tiles fit an H100's shared memory");
  static_assert(consumers * 4 * tile_bytes<S>(16, D) <= stages * stage_bytes, "the epilogue stages in K and V");

  RowTiles rows;
  TensorMap q_map, k_map, v_map;  // boxes of query_rows (Q) and L (K, V) rows

  int ctas() const { return rows.ctas(); }

  // The probabilities of a block as the A operands of O += P V's k-steps, the V they multiply and
  // its stage.
  struct PendingProduct {
    std::uint32_t p[L / 16][4];
    std::uint32_t v_address;
    int stage = 0;
    bool pending = false;
  };

  KOKKOS_INLINE_FUNCTION void operator()(int cta, char* shared) const {
    const ForwardArguments<S>& args = rows.args;
    const int thread = Warp::thread(), warp = thread / 32, lane = thread % 32;
    // Values the same across a warpgroup, made known to the compiler as a warp's (Warp::uniform):
    // wgmma in a branch it cannot prove uniform is serialized (ptxas C7520).
    const int group = Warp::uniform(thread / warpgroup_threads);
    const int pairs = rows.query_block_pairs();
    const int pair = pairs - 1 - cta % pairs;  // the latest query blocks, which see the most keys under a causal mask, first
    const int h = cta / pairs % args.heads, b = cta / pairs / args.heads;
    const int first_block = 2 * pair;
    const int q_first = first_block * L;
    BlockUnion visits{rows.pattern.visited_key_blocks(b, h, first_block),
                      first_block + 1 < rows.pattern.query_blocks()
                          ? rows.pattern.visited_key_blocks(b, h, first_block + 1)
                          : BlockList{}};
    // The swizzle is a function of the shared-memory address: the tiles start on its period.
    char* const sq = shared + (swizzle_bytes - Warp::shared_address(shared) % swizzle_bytes) % swizzle_bytes;
    char* const skv = sq + q_bytes;  // stage t: K at skv + t stage_bytes, V after it
    const Barriers barriers{Warp::shared_address(skv + stages * stage_bytes)};
    if (thread == 0) barriers.template init<Warp>(consumers);
    Warp::sync_cta();
    if (group == consumers) {
      if (lane == 0) produce(visits, b, h, q_first, sq, skv, barriers);
      Warp::sync_cta();  // the consumers' epilogue
      return;
    }

    const std::uint32_t q_address = Warp::shared_address(sq), kv_address = Warp::shared_address(skv);
    const int tile_first = q_first + L * group + 16 * (warp % 4);  // the warp's first query
    const int first_row = tile_first + Lane(lane).group;           // the lane's (and 8 later)
    const bool has_rows = q_first + L * group < args.queries;      // the same for the warpgroup
    float m[2], l[2], o[D / 8][4];
    rows.start(b, h, first_row, lane, m, l, o);
    PendingProduct previous;
    Warp::mbarrier_wait(barriers.resident(), 0);
    int block = 0;
    bool in_first = false, in_second = false;
    begin_turns(group);
    for (int i = 0; Warp::uniform(visits.next(block, in_first, in_second)); ++i) {
      const int stage = i % stages;
      const bool mine = Warp::uniform(has_rows && (group == 0 ? in_first : in_second));
      Warp::mbarrier_wait(barriers.full(stage), i / stages % 2);
      take_turn(group);
      if (!mine) {
        // Inside the turn (skipping is rare: a causal diagonal, a sparse layout).
        finish_probabilities_times_values(previous, o, barriers);
        pass_turn(group);
        barriers.template release<Warp>(stage);
        continue;
      }
      const std::uint32_t k_address = kv_address + std::uint32_t(stage * stage_bytes);
      float s[L / 8][4];
      LONGATTN_WARP_UNROLL
      for (int n = 0; n < L / 8; ++n)
        LONGATTN_WARP_UNROLL
        for (int r = 0; r < 4; ++r) s[n][r] = 0.0f;
      Warp::fence_accumulators(s);
      Warp::fence_accumulators(o);
      Warp::wgmma_fence();  // s, o and the probabilities were written by ordinary instructions
      issue_rows_times_rows<Warp, S, D, L>(s, q_address, query_rows, L * group, k_address);  // S = Q K^T
      Warp::wgmma_commit();
      issue_probabilities_times_values(previous, o);
      Warp::wgmma_commit();  // an empty group where nothing is pending
      pass_turn(group);
      Warp::template wgmma_wait<1>();  // S_j; P_{j-1} V_{j-1} may still run
      Warp::fence_accumulators(s);
      float alpha[2];
      rows.probabilities(s, block * L, first_row, lane, m, l, alpha);
      Warp::template wgmma_wait<0>();
      Warp::fence_accumulators(o);
      RowTiles::rescale(o, alpha);
      if (previous.pending) barriers.template release<Warp>(previous.stage);
      LONGATTN_WARP_UNROLL
      for (int kk = 0; kk < L / 16; ++kk) a_from_accumulators<Warp, S>(s, kk, previous.p[kk]);
      previous.v_address = k_address + std::uint32_t(kv_bytes);
      previous.stage = stage;
      previous.pending = true;
    }
    end_turns(group);
    finish_probabilities_times_values(previous, o, barriers);
    Warp::sync_cta();  // every copy landed and every product is done: K's and V's stages hold the epilogue's rows
    if (tile_first < args.queries)
      rows.store(skv + tile_bytes<S>(16, D) * warp, b, h, tile_first, first_row, lane, m, l, o);
  }

  // The producer (one thread): Q, then the K and V of every key block the pair visits, each stage
  // refilled once both consumer warpgroups released it.
  KOKKOS_INLINE_FUNCTION void produce(BlockUnion visits, int b, int h, int q_first, char* sq, char* skv,
                                      const Barriers& barriers) const {
    Warp::mbarrier_arrive_expect_tx(barriers.resident(), std::uint32_t(q_bytes));
    tma_load_rows<Warp, D>(sq, q_map, query_rows, q_first, h, b, barriers.resident());
    stream_block_pairs<Warp, D>(visits, skv, k_map, v_map, h, b, barriers);
  }

  // O += P V of a pending block (issued, not committed or waited for).
  KOKKOS_INLINE_FUNCTION static void issue_probabilities_times_values(const PendingProduct& previous,
                                                                      float (&o)[D / 8][4]) {
    if (previous.pending) issue_operands_times_rows<Warp, S, D>(o, previous.p, previous.v_address);
  }

  // The pending O += P V issued and waited for, its stage released. Issue and wait sit in one
  // branch: a path from a wgmma past its wait makes ptxas wait and serialize (C7514, C7517).
  KOKKOS_INLINE_FUNCTION static void finish_probabilities_times_values(PendingProduct& previous, float (&o)[D / 8][4],
                                                                       const Barriers& barriers) {
    if (!previous.pending) return;
    Warp::fence_accumulators(o);
    Warp::wgmma_fence();
    issue_probabilities_times_values(previous, o);
    Warp::wgmma_commit();
    Warp::template wgmma_wait<0>();
    Warp::fence_accumulators(o);
    barriers.template release<Warp>(previous.stage);
    previous.pending = false;
  }

  // FlashAttention-3's ping-pong: the consumer warpgroups take turns at issuing their products, so
  // that one's softmax runs while the tensor cores run the other's. Warpgroup g's turn waits on
  // named barrier 1 + g for the other's pass: warpgroup 1 passes once before the first, so
  // warpgroup 0 goes first, then 1, 0, 1, ...; after the last, warpgroup 0 takes the turn that
  // warpgroup 1 passes last.
  static constexpr int turn_barrier = 1;
  static constexpr int turn_threads = consumers * warpgroup_threads;
  KOKKOS_INLINE_FUNCTION static void begin_turns(int group) {
    if (group == 1) Warp::barrier_arrive(turn_barrier, turn_threads);
  }
  KOKKOS_INLINE_FUNCTION static void take_turn(int group) { Warp::barrier_sync(turn_barrier + group, turn_threads); }
  KOKKOS_INLINE_FUNCTION static void pass_turn(int group) {
    Warp::barrier_arrive(turn_barrier + 1 - group, turn_threads);
  }
  KOKKOS_INLINE_FUNCTION static void end_turns(int group) {
    if (group == 0) Warp::barrier_sync(turn_barrier, turn_threads);
  }
};

}  // namespace longattn::detail::tensor_core
