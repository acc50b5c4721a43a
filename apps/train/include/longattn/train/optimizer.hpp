// AdamW (Loshchilov & Hutter) with linear warmup, cosine decay and global-norm gradient clipping.
//
//   lr(s) = lr * (s + 1) / warmup                          s < warmup
//         = min_lr + (lr - min_lr) (1 + cos(pi p)) / 2     p = (s - warmup) / (steps - warmup)
//   g <- g * min(1, clip / ||g||)  (the norm over all parameters; clip 0: none)
//   m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
//   w <- w - lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + decay w)   (decay on matrices)
//
// The moments m and v are one buffer each over all parameter groups, from the context's pool;
// the update runs on the context's instance. Everything is in A = accumulate_t<T>: for a model in
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
  }
  AdamW(const OptimizerConfig& config, const std::vector<ParameterGroup<T>>& groups)
      : AdamW(Context(), config, groups) {}

  // The gradients' global norm (every rank holds the same, all-reduced gradients). Collective
  // over the ranks when squares_over_ranks was given.
  double gradient_norm() const {
    Squares squares;
    for (const auto& g : groups_) {
      const Accumulate* grad = g.gradients;
      double sum = 0;
      Kokkos::parallel_reduce(
          "longattn::train::gradient_norm", Kokkos::RangePolicy<ExecSpace>(context_.exec(), 0, std::int64_t(g.count)),
          KOKKOS_LAMBDA(std::int64_t i, double& s) { s += double(grad[i]) * double(grad[i]); }, sum);
      (g.split.split() ? squares.split : squares.whole) += sum;
    }
    return std::sqrt(squares_over_ranks_ ? squares_over_ranks_(squares) : squares.split + squares.whole);
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
            rate = A(lr);
    const A c1 = A(1 / (1 - std::pow(config_.beta1, double(steps_))));
    const A c2 = A(1 / (1 - std::pow(config_.beta2, double(steps_))));
    std::size_t offset = 0;
    for (const auto& g : groups_) {
      T* values = g.values;
      A* w = values_or_master(g, offset);
      const A* grad = g.gradients;
      A* m = m_.data() + offset;
      A* v = v_.data() + offset;
      const A decay = g.decay ? A(config_.weight_decay) : A(0);
      Kokkos::parallel_for(
          "longattn::train::adamw", Kokkos::RangePolicy<ExecSpace>(context_.exec(), 0, std::int64_t(g.count)),
          KOKKOS_LAMBDA(std::int64_t i) {
            const A gi = grad[i] * g_scale;
            m[i] = b1 * m[i] + (A(1) - b1) * gi;
            v[i] = b2 * v[i] + (A(1) - b2) * gi * gi;
            w[i] -= rate * (m[i] * c1 / (math::sqrt(v[i] * c2) + eps) + decay * w[i]);
            if (keeps_master_weights) values[i] = T(w[i]);  // not if constexpr: nvcc refuses a first capture there
          });
      offset += g.count;
    }
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
  Context context_;
  OptimizerConfig config_;
  std::vector<ParameterGroup<T>> groups_;
  SquaresOverRanks squares_over_ranks_;
  memory::PooledView<Flat> m_, v_, master_;  // master_: 16-bit parameters only
  std::int64_t steps_ = 0;
};

}  // namespace longattn::train
