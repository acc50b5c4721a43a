#pragma once
// How a sequence of N tokens is split over the P ranks of a context-parallel group.
//
//   contiguous  rank r holds tokens [r N/P, (r+1) N/P)
//   zigzag      the sequence is cut into 2P chunks; rank r holds chunks r and 2P-1-r, so under
//               a causal mask every rank has the same work (an early and a late chunk)
//
// A rank's local tensor lists its segments (global token ranges) one after the other. shard()
// copies a rank's tokens out of a global tensor; unshard() gathers every rank's local tensor back
// into the global one (collective). Tensors are [B, N, H, D] (tokens in dimension 1) or LSE rows
// [B, H, N] (tokens in dimension 2), in memory the host can read.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "longattn/error.hpp"
#include "longattn/parallel/communicator.hpp"

namespace longattn::parallel {

enum class Sharding { contiguous, zigzag };
std::string to_string(Sharding sharding);

// A run of consecutive global tokens in a rank's local tensor.
struct Segment {
  std::int64_t global_begin = 0;  // position of its first token in the sequence
  std::int64_t local_begin = 0;   // index of its first token in the rank's tensor
  std::int64_t tokens = 0;
};

// The segments of rank `rank` of `ranks`, in local order. Throws longattn::Error unless `tokens`
// splits evenly (into P, or 2P chunks for zigzag) in multiples of `granule` tokens (the
// attention kernels' block, so that ring steps stay in whole blocks).
std::vector<Segment> shard_segments(std::int64_t tokens, int ranks, int rank, Sharding sharding, int granule = 1);

namespace detail {
// The tokens [begin, begin + count) of a tensor whose tokens are in dimension TokenDim.
template <int TokenDim, class View>
auto token_range(const View& view, std::int64_t begin, std::int64_t count) {
  const auto range = Kokkos::make_pair(std::size_t(begin), std::size_t(begin + count));
  if constexpr (TokenDim == 1) return Kokkos::subview(view, Kokkos::ALL, range, Kokkos::ALL, Kokkos::ALL);
  else return Kokkos::subview(view, Kokkos::ALL, Kokkos::ALL, range);
}

// A contiguous host View with the extents of `view`.
template <class Block, class View>
Block contiguous_like(const std::string& label, const View& view) {
  if constexpr (View::rank == 4) return Block(label, view.extent(0), view.extent(1), view.extent(2), view.extent(3));
  else return Block(label, view.extent(0), view.extent(1), view.extent(2));
}
template <class Block, class T, class View>
Block wrap_like(T* data, const View& view) {
  if constexpr (View::rank == 4) return Block(data, view.extent(0), view.extent(1), view.extent(2), view.extent(3));
  else return Block(data, view.extent(0), view.extent(1), view.extent(2));
}

template <int TokenDim, class Global, class Local>
void check_shard_extents(const char* where, const Global& global, const Local& local, int ranks) {
  static_assert(Global::rank == Local::rank, "global and local tensors of the same rank");
  static_assert((TokenDim == 1 && Global::rank == 4) || (TokenDim == 2 && Global::rank == 3),
                "[B, N, H, D] tensors (tokens in dimension 1) or [B, H, N] rows (tokens in dimension 2)");
  for (unsigned d = 0; d < Global::rank; ++d) {
    const std::int64_t expected = d == TokenDim ? std::int64_t(global.extent(d)) / ranks : std::int64_t(global.extent(d));
    if (std::int64_t(local.extent(d)) != expected)
      throw_invalid_argument(where, "local.extent(" + std::to_string(d) + ")", local.extent(d),
                             std::to_string(expected) + (d == TokenDim ? " (the global tokens over the ranks)"
                                                                       : " (the global tensor's extent)"));
  }
}
}  // namespace detail

// This rank's tokens of `global` into `local` (extent N/P in the token dimension).
template <int TokenDim = 1, class ExecSpace, class Global, class Local>
void shard(const ExecSpace& exec, const Global& global, const Local& local, int ranks, int rank, Sharding sharding) {
  const char* where = "longattn::parallel::shard";
  detail::check_shard_extents<TokenDim>(where, global, local, ranks);
  for (const Segment& s : shard_segments(std::int64_t(global.extent(TokenDim)), ranks, rank, sharding))
    Kokkos::deep_copy(exec, detail::token_range<TokenDim>(local, s.local_begin, s.tokens),
                      detail::token_range<TokenDim>(global, s.global_begin, s.tokens));
  exec.fence();
}

// Every rank's `local` gathered into `global` on every rank (collective over `group`). Any
// memory: the gather goes through host copies (it serves checks and checkpoints, not steps).
template <int TokenDim = 1, class ExecSpace, class Local, class Global>
void unshard(const ExecSpace& exec, const Communicator& group, const Local& local, const Global& global,
             Sharding sharding) {
  const char* where = "longattn::parallel::unshard";
  using T = typename Global::non_const_value_type;
  const int P = group.size();
  group.guarded(where, [&] { detail::check_shard_extents<TokenDim>(where, global, local, P); });
  // Contiguous copies of every rank's tensor, one after the other, then each segment in place.
  using Block = Kokkos::View<typename Local::non_const_data_type, Kokkos::LayoutRight, Kokkos::HostSpace>;
  const auto local_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), local);
  const Block mine = detail::contiguous_like<Block>("longattn::parallel::unshard::mine", local);
  Kokkos::deep_copy(mine, local_host);
  std::vector<T> all(mine.size() * std::size_t(P));
  group.all_gather(mine.data(), all.data(), mine.size(), data_type_of<T>());
  const auto global_host = Kokkos::create_mirror_view(Kokkos::HostSpace(), global);
  const std::int64_t N = std::int64_t(global.extent(TokenDim));
  for (int r = 0; r < P; ++r) {
    const Block theirs = detail::wrap_like<Block>(all.data() + mine.size() * std::size_t(r), local);
    for (const Segment& s : shard_segments(N, P, r, sharding))
      Kokkos::deep_copy(detail::token_range<TokenDim>(global_host, s.global_begin, s.tokens),
                        detail::token_range<TokenDim>(theirs, s.local_begin, s.tokens));
  }
  Kokkos::deep_copy(exec, global, global_host);
  exec.fence();
}

}  // namespace longattn::parallel
