// AdamW (Loshchilov & Hutter) with linear warmup, cosine decay and global-norm gradient clipping.
//
//   lr(s) = lr * (s + 1) / warmup                          s < warmup
//         = min_lr + (lr - min_lr) (1 + cos(pi p)) / 2     p = (s - warmup) / (steps - warmup)
//   g <- g * min(1, clip / ||g||)  (the norm over all parameters; clip 0: none)
//   m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
//   w <- w - lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + decay w)   (decay on matrices)
//
// The moments m and v are one buffer each over all parameter groups, from the context's pool;
// the update runs on the context's instance. Multi-tensor (as apex's and Megatron-LM's fused
// AdamW): the groups are cut into chunks of at most chunk_elements, one team a chunk, so a step
// is two kernels over all groups - the squared norms per chunk, then the update - and waits on
// the host once, for the norm (which it clips by and the trainer logs). Everything is in A = accumulate_t<T>: for a model in
// 16-bit storage (T = bfloat16 or float16; its gradients are float) AdamW keeps fp32 master
// weights, updates them and writes their rounded values into the model's parameters (mixed
// precision). step() takes the loss scale the gradients carry and divides it out; with a
// non-finite gradient it changes nothing (fp16 loss scaling skips that step). Under ZeRO 1
// (zero.hpp) each rank's AdamW has its shard of the groups, and under tensor parallelism part of
// some tensors: `squares_over_ranks` then sums the squared gradient norm over the ranks (the
// squares of split tensors apart from those of whole ones, which tensor-parallel ranks hold
// alike) so that every rank clips by the same global norm.
#pragma once

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "longattn/core/convert.hpp"
#include "longattn/core/execution_context.hpp"
#include "longattn/error.hpp"
#include "longattn/kokkos_compat.hpp"
#include "longattn/train/model.hpp"

namespace longattn::train {

struct OptimizerConfig {
  double lr = 2e-3;
  double min_lr = 2e-4;
  int warmup = 10;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.1;
  double clip = 1.0;
};

void validate(const OptimizerConfig& config);

// The learning rate of step `step` (0-based) of `steps`.
double learning_rate(const OptimizerConfig& config, int step, int steps);

namespace detail {
// A piece of one parameter group that one team of AdamW's kernels updates (outside the class:
// nvcc refuses private types in a device lambda's captures).
template <class T>
struct AdamWChunk {
  T* values;                        // the model's parameters
  accumulate_t<T>* weights;         // what AdamW updates: the values (fp32) or the master weights (16-bit)
  const accumulate_t<T>* gradients;
  accumulate_t<T>* m;
  accumulate_t<T>* v;
  std::int64_t count;
  bool decay;
};
}  // namespace detail

template <class ExecSpace, class T>
class AdamW {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using Accumulate = accumulate_t<T>;
  using Flat = Kokkos::View<Accumulate*, memory_space>;
  using Context = ExecutionContext<ExecSpace>;
  static constexpr bool keeps_master_weights = is_half_v<T>;

  // This rank's squared gradient norm: of the groups that are parts of split tensors
  // (ParameterGroup::split), and of the others.
  struct Squares {
    double split = 0, whole = 0;
  };
  // The whole model's squared gradient norm from every rank's Squares; empty: this rank's groups
  // are all of the model.
  using SquaresOverRanks = std::function<double(const Squares&)>;

  AdamW(const Context& context, const OptimizerConfig& config, const std::vector<ParameterGroup<T>>& groups,
        SquaresOverRanks squares_over_ranks = {})
      : context_(context), config_(config), groups_(groups), squares_over_ranks_(std::move(squares_over_ranks)) {
    validate(config);
    std::size_t total = 0;
    for (const auto& g : groups_) total += g.count;
    const memory::CategoryScope scope(memory::Category::optimizer_states);
    m_ = context_.template allocate<Flat>(total);
    v_ = context_.template allocate<Flat>(total);
    Kokkos::deep_copy(context_.exec(), m_.view(), Accumulate(0));
    Kokkos::deep_copy(context_.exec(), v_.view(), Accumulate(0));
    if constexpr (keeps_master_weights) {
      master_ = context_.template allocate<Flat>(total);
      std::size_t offset = 0;
      for (const auto& g : groups_) {
        longattn::convert(context_.exec(), g.values, master_.data() + offset, g.count);
        offset += g.count;
      }
    }
    cut_into_chunks();
  }
  AdamW(const OptimizerConfig& config, const std::vector<ParameterGroup<T>>& groups)
      : AdamW(Context(), config, groups) {}

  // The gradients' global norm (every rank holds the same, all-reduced gradients). Collective
  // over the ranks when squares_over_ranks was given.
  double gradient_norm() const {
    const auto chunks = chunks_;
    const auto squares = chunk_squares_;
    Kokkos::parallel_for(
        "longattn::train::gradient_norm", Policy(context_.exec(), int(chunks.extent(0)), Kokkos::AUTO),
        KOKKOS_LAMBDA(const Team& team) {
          const Chunk c = chunks(team.league_rank());
          double sum = 0;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(team, c.count),
              [&](std::int64_t i, double& s) { s += double(c.gradients[i]) * double(c.gradients[i]); }, sum);
          Kokkos::single(Kokkos::PerTeam(team), [&] { squares(team.league_rank()) = sum; });
        });
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), squares);  // the step's one wait
    Squares total;  // in chunk order: the same sum on every run
    for (std::size_t i = 0; i < host.extent(0); ++i) (chunk_split_[i] ? total.split : total.whole) += host(i);
    return std::sqrt(squares_over_ranks_ ? squares_over_ranks_(total) : total.split + total.whole);
  }

  // One update at learning rate lr of gradients that carry a factor loss_scale; returns the
  // gradient norm before clipping (without the factor). A non-finite norm updates nothing.
  double step(double lr, double loss_scale = 1) {
    const char* where = "longattn::train::AdamW::step";
    require(lr >= 0 && std::isfinite(lr), where, "lr", lr, "a finite learning rate >= 0");
    require(loss_scale > 0 && std::isfinite(loss_scale), where, "loss_scale", loss_scale, "a positive finite factor");
    const double norm = gradient_norm() / loss_scale;
    if (!std::isfinite(norm)) return norm;
    const double clip = config_.clip > 0 && norm > config_.clip ? config_.clip / norm : 1.0;
    ++steps_;
    using A = Accumulate;
    const A b1 = A(config_.beta1), b2 = A(config_.beta2), eps = A(config_.eps), g_scale = A(clip / loss_scale),
            rate = A(lr), weight_decay = A(config_.weight_decay);
    const A c1 = A(1 / (1 - std::pow(config_.beta1, double(steps_))));
    const A c2 = A(1 / (1 - std::pow(config_.beta2, double(steps_))));
    const auto chunks = chunks_;
    Kokkos::parallel_for(
        "longattn::train::adamw", Policy(context_.exec(), int(chunks.extent(0)), Kokkos::AUTO),
        KOKKOS_LAMBDA(const Team& team) {
          const Chunk c = chunks(team.league_rank());
          const A decay = c.decay ? weight_decay : A(0);
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, c.count), [&](std::int64_t i) {
            const A gi = c.gradients[i] * g_scale;
            c.m[i] = b1 * c.m[i] + (A(1) - b1) * gi;
            c.v[i] = b2 * c.v[i] + (A(1) - b2) * gi * gi;
            c.weights[i] -= rate * (c.m[i] * c1 / (math::sqrt(c.v[i] * c2) + eps) + decay * c.weights[i]);
            if (keeps_master_weights) c.values[i] = T(c.weights[i]);  // not if constexpr: nvcc refuses a first capture there
          });
        });
    context_.exec().fence();
    return norm;
  }

  // State for checkpoints: the moments and the update count; with 16-bit parameters the master
  // weights (in the groups' order), which master_weights_changed() writes back rounded into the parameters.
  const Flat& first_moment() const { return m_.view(); }
  const Flat& second_moment() const { return v_.view(); }
  const Flat& master_weights() const {
    static_assert(keeps_master_weights, "AdamW::master_weights: for 16-bit parameters only");
    return master_.view();
  }
  void master_weights_changed() {
    static_assert(keeps_master_weights, "AdamW::master_weights_changed: for 16-bit parameters only");
    std::size_t offset = 0;
    for (const auto& g : groups_) {
      longattn::convert(context_.exec(), master_.data() + offset, g.values, g.count);
      offset += g.count;
    }
    context_.exec().fence();
  }
  std::int64_t steps() const { return steps_; }
  void set_steps(std::int64_t steps) { steps_ = steps; }

 private:
  Accumulate* values_or_master(const ParameterGroup<T>& g, std::size_t offset) const {
    if constexpr (keeps_master_weights)
      return master_.data() + offset;
    else
      return g.values;
  }
  using Policy = Kokkos::TeamPolicy<ExecSpace>;
  using Team = typename Policy::member_type;
  static constexpr std::int64_t chunk_elements = std::int64_t(1) << 15;
  using Chunk = detail::AdamWChunk<T>;
  // The chunks' table, in the groups' order (the groups' memory stays where it is for the
  // optimizer's life). Small descriptors, not state: device memory of their own, not the pool's.
  void cut_into_chunks() {
    std::vector<Chunk> chunks;
    std::size_t offset = 0;
    for (const auto& g : groups_) {
      Accumulate* w = values_or_master(g, offset);
      for (std::int64_t begin = 0; begin < std::int64_t(g.count); begin += chunk_elements) {
        chunks.push_back({g.values + begin, w + begin, g.gradients + begin, m_.data() + offset + begin,
                          v_.data() + offset + begin, std::min<std::int64_t>(chunk_elements, std::int64_t(g.count) - begin),
                          g.decay});
        chunk_split_.push_back(g.split.split());
      }
      offset += g.count;
    }
    chunks_ = Kokkos::View<Chunk*, memory_space>("longattn::train::AdamW::chunks", chunks.size());
    Kokkos::deep_copy(chunks_, Kokkos::View<const Chunk*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(chunks.data(), chunks.size()));
    chunk_squares_ = Kokkos::View<double*, memory_space>("longattn::train::AdamW::chunk_squares", chunks.size());
  }

  Context context_;
  OptimizerConfig config_;
  std::vector<ParameterGroup<T>> groups_;
  SquaresOverRanks squares_over_ranks_;
  memory::PooledView<Flat> m_, v_, master_;  // master_: 16-bit parameters only
  Kokkos::View<Chunk*, memory_space> chunks_;
  std::vector<bool> chunk_split_;                 // whether each chunk's group is part of a split tensor
  Kokkos::View<double*, memory_space> chunk_squares_;  // each chunk's squared gradient norm
  std::int64_t steps_ = 0;
};

}  // namespace longattn::train
