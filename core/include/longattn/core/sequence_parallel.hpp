// Sequence parallelism's two moves (Korthikanti et al., "Reducing Activation Recomputation in
// Large Transformer Models", 2022): outside the tensor-parallel sublayers each of the P ranks of
// a FeatureGroup holds only its tokens of every sequence, rank p tokens [p s, (p + 1) s) of the
// n = P s, so activations there take 1/P of the memory.
//
//   gather_sequence          shards [B, s, C] of every rank -> the whole [B, n, C] (all-gather),
//                            entering a column-parallel layer
//   reduce_scatter_sequence  partial results [B, n, C] of every rank -> this rank's tokens of
//                            their sum [B, s, C] (reduce-scatter), leaving a row-parallel layer
//
// The collectives move rank-major blocks [P, B, s, C] through a staging buffer from the
// context's pool, reordered from or into the [B, n, C] layout by one kernel. All on the
// context's instance, in its memory space.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "longattn/core/execution_context.hpp"
#include "longattn/core/feature_group.hpp"
#include "longattn/error.hpp"

namespace longattn {

namespace detail {

// whole(b, p s + t, :) = staging(p, b, t, :) (to_whole), or the reverse.
template <class ExecSpace, class Staging, class Whole>
void permute_sequence(const ExecSpace& exec, const Staging& staging, const Whole& whole, bool to_whole) {
  using Policy = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2, Kokkos::Iterate::Right, Kokkos::Iterate::Right>,
                                       Kokkos::IndexType<std::int64_t>>;
  const std::int64_t B = staging.extent(1), s = staging.extent(2), C = staging.extent(3);
  const std::int64_t rows = std::int64_t(staging.extent(0)) * B * s;
  Kokkos::parallel_for(
      "longattn::permute_sequence", Policy(exec, {0, 0}, {rows, C}), KOKKOS_LAMBDA(std::int64_t r, std::int64_t c) {
        const std::int64_t p = r / (B * s), b = r / s % B, t = r % s;
        if (to_whole) whole(b, p * s + t, c) = staging(p, b, t, c);
        else staging(p, b, t, c) = whole(b, p * s + t, c);
      });
}

template <class Shard, class Whole>
void check_sequence_extents(const char* where, int parts, const Shard& shard, const Whole& whole) {
  const bool fits = whole.extent(0) == shard.extent(0) && whole.extent(1) == std::size_t(parts) * shard.extent(1) &&
                    whole.extent(2) == shard.extent(2);
  require(fits, where, "whole's extents",
          "[" + std::to_string(whole.extent(0)) + ", " + std::to_string(whole.extent(1)) + ", " +
              std::to_string(whole.extent(2)) + "]",
          "[B, P s, C] = [" + std::to_string(shard.extent(0)) + ", " + std::to_string(std::size_t(parts) * shard.extent(1)) +
              ", " + std::to_string(shard.extent(2)) + "] for shards of [B, s, C] over P = " + std::to_string(parts) +
              " ranks");
  require(shard.span_is_contiguous() && whole.span_is_contiguous(), where, "shard / whole", "a strided view",
          "contiguous LayoutRight views");
}

}  // namespace detail

// whole [B, P s, C] = every rank's shard [B, s, C] in place along the tokens. Collective.
template <class ExecSpace, class Shard, class Whole>
void gather_sequence(const ExecutionContext<ExecSpace>& ctx, const FeatureGroup<ExecSpace>& group, const Shard& shard,
                     const Whole& whole) {
  using T = typename Whole::non_const_value_type;
  detail::check_sequence_extents("longattn::gather_sequence", group.size(), shard, whole);
  const memory::CategoryScope scope(memory::Category::communication_buffers);
  const auto staging = ctx.template allocate<Kokkos::View<T****, Kokkos::LayoutRight, typename ExecSpace::memory_space>>(
      std::size_t(group.size()), shard.extent(0), shard.extent(1), shard.extent(2));
  group.gather(ctx.exec(), shard.data(), staging.data(), shard.size());
  detail::permute_sequence(ctx.exec(), staging.view(), whole, true);
}

// shard [B, s, C] = this rank's tokens of whole [B, P s, C] summed over the ranks. Collective.
template <class ExecSpace, class Whole, class Shard>
void reduce_scatter_sequence(const ExecutionContext<ExecSpace>& ctx, const FeatureGroup<ExecSpace>& group,
                             const Whole& whole, const Shard& shard) {
  using T = typename Shard::non_const_value_type;
  detail::check_sequence_extents("longattn::reduce_scatter_sequence", group.size(), shard, whole);
  const memory::CategoryScope scope(memory::Category::communication_buffers);
  const auto staging = ctx.template allocate<Kokkos::View<T****, Kokkos::LayoutRight, typename ExecSpace::memory_space>>(
      std::size_t(group.size()), shard.extent(0), shard.extent(1), shard.extent(2));
  detail::permute_sequence(ctx.exec(), staging.view(), whole, false);
  group.reduce_scatter(ctx.exec(), staging.data(), shard.data(), shard.size());
}

}  // namespace longattn
