// The warpgroup programs' pipeline: a producer thread brings tiles by the tensor copy engine
// (warpgroup.hpp) into stages that the consumer warpgroups wait for (full) and give back (empty)
// on mbarriers. forward_warpgroup.hpp streams K and V past resident Q, backward_warpgroup.hpp Q
// and dO past resident K and V.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

#include "longattn/core/detail/tensor_core/tiles.hpp"
#include "longattn/core/detail/tensor_core/warpgroup.hpp"

namespace longattn::detail::tensor_core {

// The mbarriers of a warpgroup program's pipeline, by shared-memory address: one for the tiles
// brought once (`resident`), then each stage's full (1 arrival: the producer's, with the stage's
// bytes) and empty (one arrival from each consumer warpgroup, once it is done with the stage).
template <int Stages>
struct StageBarriers {
  static constexpr std::size_t bytes = 8 * (1 + 2 * Stages);
  std::uint32_t first;
  KOKKOS_INLINE_FUNCTION std::uint32_t resident() const { return first; }
  KOKKOS_INLINE_FUNCTION std::uint32_t full(int stage) const { return first + 8 * (1 + stage); }
  KOKKOS_INLINE_FUNCTION std::uint32_t empty(int stage) const { return first + 8 * (1 + Stages + stage); }

  // By one thread, before a CTA barrier.
  template <class Warp>
  KOKKOS_INLINE_FUNCTION void init(int consumers) const {
    Warp::mbarrier_init(resident(), 1);
    for (int t = 0; t < Stages; ++t) {
      Warp::mbarrier_init(full(t), 1);
      Warp::mbarrier_init(empty(t), consumers);
    }
    Warp::fence_barrier_init();
  }
  // A consumer warpgroup is done with a stage: one of its threads arrives on the stage's empty
  // barrier (after the warpgroup's wait for the products that read it).
  template <class Warp>
  KOKKOS_INLINE_FUNCTION void release(int stage) const {
    if (Warp::thread() % warpgroup_threads == 0) Warp::mbarrier_arrive(empty(stage));
  }
};

// Rows token .. token + rows - 1 of head h, batch b of a tensor (its map's boxes: `rows` rows)
// into a swizzled tile of D columns, panel by panel, counted on `barrier` (whose bytes the
// caller announced).
template <class Warp, int D>
KOKKOS_INLINE_FUNCTION void tma_load_rows(char* tile, const typename Warp::TensorMap& map, int rows, int token,
                                          int h, int b, std::uint32_t barrier) {
  LONGATTN_WARP_UNROLL
  for (int panel = 0; panel < D / panel_values; ++panel)
    Warp::tma_load(tile + panel * panel_bytes(rows), map, panel * panel_values, token, h, b, barrier);
}

// The producer's stream (one thread): the i-th block of `visits` into stage i % Stages (at
// stages + its index times the stage's bytes), the block's 64 rows of two tensors (K and V, or Q
// and dO) into the stage's two tiles: it waits until the stage is empty (its phase
// i / Stages - 1, from i = Stages on), announces the stage's bytes on its full barrier and issues
// the copies.
template <class Warp, int D, int Stages>
KOKKOS_INLINE_FUNCTION void stream_block_pairs(BlockUnion visits, char* stages, const typename Warp::TensorMap& first,
                                               const typename Warp::TensorMap& second, int h, int b,
                                               const StageBarriers<Stages>& barriers) {
  constexpr int tile_bytes = swizzled_tile_bytes(block_tokens, D);
  int block = 0;
  bool in_first = false, in_second = false;
  for (int i = 0; visits.next(block, in_first, in_second); ++i) {
    const int stage = i % Stages;
    if (i >= Stages) Warp::mbarrier_wait(barriers.empty(stage), (i / Stages - 1) % 2);
    char* const tile = stages + stage * 2 * tile_bytes;
    Warp::mbarrier_arrive_expect_tx(barriers.full(stage), std::uint32_t(2 * tile_bytes));
    tma_load_rows<Warp, D>(tile, first, block_tokens, block * block_tokens, h, b, barriers.full(stage));
    tma_load_rows<Warp, D>(tile + tile_bytes, second, block_tokens, block * block_tokens, h, b, barriers.full(stage));
  }
}

}  // namespace longattn::detail::tensor_core
