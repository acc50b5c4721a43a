// ZeRO stages 1 and 2 (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
// Parameter Models", 2020): the optimizer's state (1), then the gradients too (2), sharded over
// the R ranks that hold the same parameters (in longattn-train: the dp x cp ranks of one
// tensor-parallel rank).
//
//   group g of C elements: pieces of S = ceil(C / R); rank r owns [r S, min(C, (r + 1) S))
//   (parallel::shard_piece)
//   stage 1, each step: gradients all-reduced as without ZeRO (every rank has them whole);
//   rank r's AdamW updates its pieces only, keeping moments (and 16-bit master weights) for
//   them: 1/R of the optimizer's memory; then all_gather_parameters() gives every rank the
//   others' pieces.
//   stage 2: as stage 1, but the gradients are reduce-scattered (parallel::GradientReduceScatter)
//   into piece_gradients(), this rank's pieces of them, which AdamW reads: the model holds
//   gradients only while backward makes them (GradientMemory::per_block), 1/R of them persist.
//
// A piece is a ParameterGroup pointing into the whole group, so AdamW runs on the pieces as on
// groups; only its gradient norm needs the other ranks' squares (sum_squares_over_ranks). The
// all-gathers go group by group through staging buffers of R x S elements from the pool.
// Checkpoints keep the whole state, whatever R: gather() collects a per-piece float vector
// whole, take_pieces() picks a rank's pieces out of a whole one.
#pragma once

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "longattn/core/execution_context.hpp"
#include "longattn/parallel/communicator.hpp"
#include "longattn/parallel/gradient_reduce_scatter.hpp"
#include "longattn/train/model.hpp"

namespace longattn::train {

template <class ExecSpace, class T>
class ParameterShards {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using Context = ExecutionContext<ExecSpace>;

  // `ranks`: the ranks holding the same parameters; `stage` 1 or 2. The groups stay the caller's
  // (the model's).
  ParameterShards(const Context& context, const parallel::Communicator& ranks, const std::vector<ParameterGroup<T>>& groups,
                  int stage = 1)
      : context_(context), ranks_(ranks), groups_(groups), stage_(stage) {
    std::size_t whole_offset = 0, piece_offset = 0;
    for (const auto& g : groups_) {
      const parallel::ShardPiece mine = parallel::shard_piece(g.count, ranks_.size(), ranks_.rank());
      pieces_.push_back({g.name, g.values + mine.begin, g.gradients ? g.gradients + mine.begin : nullptr, mine.count,
                         g.decay, g.split, g.sequence_partial});
      piece_size_.push_back(mine.size);
      piece_begin_.push_back(whole_offset + mine.begin);
      whole_offset += g.count;
      piece_offset += mine.count;
    }
    if (stage_ == 2) {
      const memory::CategoryScope scope(memory::Category::gradients);
      piece_gradients_ = context_.template allocate<Kokkos::View<float*, memory_space>>(piece_offset);
      float* at = piece_gradients_.data();
      for (auto& p : pieces_) {
        p.gradients = at;
        at += p.count;
      }
    }
  }

  int stage() const { return stage_; }
  // Stage 2: this rank's pieces of the gradients, in pieces()' order (piece_elements()); empty at stage 1.
  Kokkos::View<float*, memory_space> piece_gradients() const { return piece_gradients_; }

  // This rank's pieces, in the groups' order (what its AdamW updates).
  const std::vector<ParameterGroup<T>>& pieces() const { return pieces_; }
  std::size_t piece_elements() const {
    std::size_t n = 0;
    for (const auto& p : pieces_) n += p.count;
    return n;
  }

  // Each rank's squared gradient norms of its pieces (of split tensors, of whole ones), summed
  // over the ranks.
  std::pair<double, double> sum_squares_over_ranks(double split, double whole) const {
    const double mine[2] = {split, whole};
    double total[2];
    ranks_.all_reduce(mine, total, 2, parallel::DataType::float64, parallel::ReduceOp::sum);
    return {total[0], total[1]};
  }

  // After the update of the pieces: every rank's groups hold every rank's pieces. Collective.
  void all_gather_parameters() const {
    for (std::size_t i = 0; i < groups_.size(); ++i)
      all_gather(pieces_[i].values, pieces_[i].count, piece_size_[i], groups_[i].values, groups_[i].count);
  }

  // `whole` (the groups' elements, in memory_space) gets every rank's `local` (piece_elements(),
  // laid out as pieces()), e.g. AdamW's moments. Collective.
  void gather(const float* local, float* whole) const {
    std::size_t at = 0, whole_at = 0;
    for (std::size_t i = 0; i < groups_.size(); ++i) {
      all_gather(local + at, pieces_[i].count, piece_size_[i], whole + whole_at, groups_[i].count);
      at += pieces_[i].count;
      whole_at += groups_[i].count;
    }
  }
  // `local` (piece_elements()) gets this rank's pieces of `whole` (the groups' elements), both in
  // memory_space.
  void take_pieces(const float* whole, float* local) const {
    using Floats = Kokkos::View<float*, memory_space, Kokkos::MemoryUnmanaged>;
    std::size_t at = 0;
    for (std::size_t i = 0; i < groups_.size(); ++i) {
      const std::size_t n = pieces_[i].count;
      Kokkos::deep_copy(context_.exec(), Floats(local + at, n), Floats(const_cast<float*>(whole) + piece_begin_[i], n));
      at += n;
    }
    context_.exec().fence();
  }

 private:
  // whole[0, count) = the concatenation of every rank's piece, each sent as S elements (this
  // rank's: `piece_count` at `piece`; the last ranks' pieces may be shorter or empty), through
  // staging buffers from the pool.
  template <class V>
  void all_gather(const V* piece, std::size_t piece_count, std::size_t S, V* whole, std::size_t count) const {
    using Values = Kokkos::View<V*, memory_space, Kokkos::MemoryUnmanaged>;
    const std::size_t R = std::size_t(ranks_.size());
    const memory::CategoryScope scope(memory::Category::communication_buffers);
    auto send = context_.template allocate<Kokkos::View<V*, memory_space>>(S);
    auto received = context_.template allocate<Kokkos::View<V*, memory_space>>(R * S);
    const auto exec = context_.exec();
    if (piece_count > 0)
      Kokkos::deep_copy(exec, Kokkos::subview(send.view(), std::make_pair(std::size_t(0), piece_count)),
                        Values(const_cast<V*>(piece), piece_count));
    ranks_.all_gather(exec, send.data(), received.data(), S, parallel::data_type_of<V>());
    Kokkos::deep_copy(exec, Values(whole, count), Kokkos::subview(received.view(), std::make_pair(std::size_t(0), count)));
    exec.fence();
  }
  Context context_;
  parallel::Communicator ranks_;
  std::vector<ParameterGroup<T>> groups_, pieces_;
  std::vector<std::size_t> piece_size_, piece_begin_;  // S per group; where the piece starts in a whole vector
  int stage_;
  memory::PooledView<Kokkos::View<float*, memory_space>> piece_gradients_;
};

}  // namespace longattn::train
