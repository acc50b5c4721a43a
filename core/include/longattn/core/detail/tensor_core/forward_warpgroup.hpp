// The forward pass on Hopper's warpgroup tensor-core instructions (wgmma, sm_90a), 16-bit at head
// dims 64 and 128: FlashAttention-3's products (S = Q K^T with both operands from shared memory,
// O += P V with the probabilities from registers and V read transposed by its descriptor) on the
// warp-level program's grid, softmax and epilogue (forward.hpp), whose row tiles hold the same
// accumulator layout (warpgroup.hpp). One CTA per (batch, head, pair of 64-query blocks):
//
//   CTA     2 warpgroups (256 threads); warpgroup g the pair's query block g, its warp w the rows
//           16 w .. 16 w + 15 of that block (one row tile, as the warp-level program's)
//   shared  Q [128][D], and three stages of K [64][D] and V [64][D], 128-byte-swizzled panels on a
//           1024-byte boundary (warpgroup.hpp): D = 64: 65 KiB, 128: 129 KiB with the alignment
//   loop    over the union of the two query blocks' key blocks j (stage j % 3), the copies of
//           block j + 1 landing while j's products run, and block j - 1's O += P V running while
//           j's softmax does (FlashAttention-3's overlap inside a warpgroup):
//             wait; fence.proxy.async; barrier     (stage j landed; stage j + 1 is free: its
//                                                   block's products were waited for at j - 1)
//             cp.async block j + 1's K, V into stage j + 1
//             issue S_j = Q K_j^T    D / 16 x wgmma m64n64k16: A = Q, B = K, K-major descriptors
//             issue O += P_{j-1} V_{j-1}   4 x wgmma m64nDk16: A = P_{j-1} (registers), B = V as
//                                          an MN-major descriptor (imm-trans-b)
//             wait for S_j; scale, mask, online softmax (forward.hpp), P_j packed to 16 bits
//             wait for P_{j-1} V_{j-1}; O rescaled for block j
//           a warpgroup whose query block skips block j issues and waits for its pending P V
//   end     the last P V; O / l staged through the free K and V stages (the warp-level
//           epilogue), LSE
//
// Per thread: S 32 floats, O D / 2, P 16 registers. Not yet: TMA copies on mbarriers, a producer
// warpgroup, and the two consumer warpgroups' products taking turns (FlashAttention-3's ping-pong).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "longattn/core/detail/tensor_core/forward.hpp"
#include "longattn/core/detail/tensor_core/fragments.hpp"
#include "longattn/core/detail/tensor_core/tiles.hpp"
#include "longattn/core/detail/tensor_core/warpgroup.hpp"

namespace longattn::detail::tensor_core {

template <class Warp, class S, int D, class Pattern>
struct WarpgroupForwardProgram {
  static_assert(sizeof(S) == 2 && (D == 64 || D == 128), "16-bit, head dims 64 and 128");
  using RowTiles = ForwardProgram<Warp, S, D, Pattern>;  // its softmax and epilogue
  static constexpr int L = block_tokens;
  static constexpr int query_rows = 2 * L, warpgroups = 2, threads = warpgroup_threads * warpgroups;
  static constexpr int stages = 3;
  // D = 64: two CTAs an SM; D = 128 one.
  static constexpr int min_ctas_per_sm = D == 64 ? 2 : 1;
  static constexpr std::size_t q_bytes = swizzled_tile_bytes(query_rows, D), kv_bytes = swizzled_tile_bytes(L, D);
  static constexpr std::size_t stage_bytes = 2 * kv_bytes;  // K, then V
  static constexpr std::size_t shared_bytes = swizzle_bytes + q_bytes + stages * stage_bytes;
  static_assert(shared_bytes <= max_shared_bytes, "the tiles fit an H100's shared memory");
  static_assert(warpgroups * 4 * tile_bytes<S>(16, D) <= stages * stage_bytes, "the epilogue stages in K and V");

  RowTiles rows;

  int ctas() const { return rows.ctas(); }

  // The probabilities of a block as the A operands of O += P V's k-steps, and the V they multiply.
  struct PendingProduct {
    std::uint32_t p[L / 16][4];
    std::uint32_t v_address;
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
    const std::uint32_t q_address = Warp::shared_address(sq), kv_address = Warp::shared_address(skv);

    const int tile_first = q_first + L * group + 16 * (warp % 4);  // the warp's first query
    const int first_row = tile_first + Lane(lane).group;           // the lane's (and 8 later)
    const bool has_rows = q_first + L * group < args.queries;      // the same for the warpgroup
    float m[2], l[2], o[D / 8][4];
    rows.start(b, h, first_row, lane, m, l, o);
    PendingProduct previous;

    load_swizzled_tile<Warp, query_rows, D, threads>(sq, args.q.row(b, q_first, h), args.q.token_stride,
                                                     min_int(args.queries - q_first, query_rows), thread);
    int block = 0, stage = 0;
    bool in_first = false, in_second = false;
    bool more = Warp::uniform(visits.next(block, in_first, in_second));
    if (more) load_keys_and_values(skv, block, b, h, thread);
    Warp::cp_async_commit();
    while (more) {
      const bool mine = Warp::uniform(has_rows && (group == 0 ? in_first : in_second));
      Warp::cp_async_wait_all();
      Warp::fence_proxy_async();  // the copies (generic proxy) before wgmma reads them (async proxy)
      Warp::sync_cta();           // this stage landed; every warpgroup is done with the next one
      int next_block = 0;
      bool next_first = false, next_second = false;
      const bool next = Warp::uniform(visits.next(next_block, next_first, next_second));
      const int next_stage = stage == stages - 1 ? 0 : stage + 1;
      if (next) load_keys_and_values(skv + next_stage * stage_bytes, next_block, b, h, thread);
      Warp::cp_async_commit();
      const std::uint32_t k_address = kv_address + std::uint32_t(stage * stage_bytes);
      if (mine) {
        float s[L / 8][4];
        LONGATTN_WARP_UNROLL
        for (int n = 0; n < L / 8; ++n)
          LONGATTN_WARP_UNROLL
          for (int i = 0; i < 4; ++i) s[n][i] = 0.0f;
        Warp::fence_accumulators(s);
        Warp::fence_accumulators(o);
        Warp::wgmma_fence();  // s, o and the probabilities were written by ordinary instructions
        issue_scores(q_address, k_address, group, s);
        Warp::wgmma_commit();
        issue_probabilities_times_values(previous, o);
        if (previous.pending) {
          Warp::wgmma_commit();
          Warp::template wgmma_wait<1>();  // S_j; P_{j-1} V_{j-1} may still run
        } else {
          Warp::template wgmma_wait<0>();
        }
        Warp::fence_accumulators(s);
        float alpha[2];
        rows.probabilities(s, block * L, first_row, lane, m, l, alpha);
        Warp::template wgmma_wait<0>();
        Warp::fence_accumulators(o);
        RowTiles::rescale(o, alpha);
        LONGATTN_WARP_UNROLL
        for (int kk = 0; kk < L / 16; ++kk) a_from_accumulators<Warp, S>(s, kk, previous.p[kk]);
        previous.v_address = k_address + std::uint32_t(kv_bytes);
        previous.pending = true;
      } else {
        finish_probabilities_times_values(previous, o);  // its V's stage is the next one's copies
      }
      stage = next_stage;
      block = next_block;
      in_first = next_first;
      in_second = next_second;
      more = next;
    }
    finish_probabilities_times_values(previous, o);
    Warp::cp_async_wait_all();
    Warp::sync_cta();  // every product is done with K and V: their stages hold the epilogue's rows
    if (tile_first < args.queries)
      rows.store(skv + tile_bytes<S>(16, D) * warp, b, h, tile_first, first_row, lane, m, l, o);
  }

  // K and V rows of key block `block` into the stage at `tile` (zeros past the sequence).
  KOKKOS_INLINE_FUNCTION void load_keys_and_values(char* tile, int block, int b, int h, int thread) const {
    const ForwardArguments<S>& args = rows.args;
    const std::int64_t first = std::int64_t(block) * L;
    const int count = min_int(args.keys - first, L);
    load_swizzled_tile<Warp, L, D, threads>(tile, args.k.row(b, first, h), args.k.token_stride, count, thread);
    load_swizzled_tile<Warp, L, D, threads>(tile + kv_bytes, args.v.row(b, first, h), args.v.token_stride, count,
                                            thread);
  }

  // s += Q K^T for the warpgroup's 64 queries and the stage's 64 keys (issued, not waited for).
  KOKKOS_INLINE_FUNCTION static void issue_scores(std::uint32_t q_address, std::uint32_t k_address, int group,
                                                  float (&s)[L / 8][4]) {
    LONGATTN_WARP_UNROLL
    for (int kk = 0; kk < D / 16; ++kk)
      Warp::template wgmma<operand_of<S>, L>(s, k_major_descriptor(q_address, query_rows, L * group, 16 * kk),
                                             k_major_descriptor(k_address, L, 0, 16 * kk));
  }

  // O += P V of a pending block: the probabilities' k-steps (16 keys) as A, V's rows k0 .. k0 + 15
  // as the MN-major B (issued, not committed or waited for).
  KOKKOS_INLINE_FUNCTION static void issue_probabilities_times_values(const PendingProduct& previous,
                                                                      float (&o)[D / 8][4]) {
    if (!previous.pending) return;
    LONGATTN_WARP_UNROLL
    for (int kk = 0; kk < L / 16; ++kk)
      Warp::template wgmma<operand_of<S>, D>(o, previous.p[kk], mn_major_descriptor(previous.v_address, L, 16 * kk));
  }

  // The pending O += P V issued and waited for.
  KOKKOS_INLINE_FUNCTION static void finish_probabilities_times_values(PendingProduct& previous,
                                                                       float (&o)[D / 8][4]) {
    if (!previous.pending) return;
    Warp::fence_accumulators(o);
    Warp::wgmma_fence();
    issue_probabilities_times_values(previous, o);
    Warp::wgmma_commit();
    Warp::template wgmma_wait<0>();
    Warp::fence_accumulators(o);
    previous.pending = false;
  }
};

}  // namespace longattn::detail::tensor_core
