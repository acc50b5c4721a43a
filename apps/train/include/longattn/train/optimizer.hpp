// AdamW (Loshchilov & Hutter) with linear warmup, cosine decay and global-norm gradient clipping.
//
//   lr(s) = lr * (s + 1) / warmup                          s < warmup
//         = min_lr + (lr - min_lr) (1 + cos(pi p)) / 2     p = (s - warmup) / (steps - warmup)
//   g <- g * min(1, clip / ||g||)  (the norm over all parameters; clip 0: none)
//   m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
//   w <- w - lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + decay w)   (decay on matrices)
//
// The moments m and v are one buffer each over all parameter groups, from the context's pool;
// the update runs on the context's instance.
#pragma once

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

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
  using Flat = Kokkos::View<T*, memory_space>;
  using Context = ExecutionContext<ExecSpace>;

  AdamW(const Context& context, const OptimizerConfig& config, const std::vector<ParameterGroup<T>>& groups)
      : context_(context), config_(config), groups_(groups) {
    validate(config);
    std::size_t total = 0;
    for (const auto& g : groups_) total += g.count;
    m_ = context_.template allocate<Flat>(total);
    v_ = context_.template allocate<Flat>(total);
    Kokkos::deep_copy(context_.exec(), m_.view(), T(0));
    Kokkos::deep_copy(context_.exec(), v_.view(), T(0));
  }
  AdamW(const OptimizerConfig& config, const std::vector<ParameterGroup<T>>& groups)
      : AdamW(Context(), config, groups) {}

  // The gradients' global norm (every rank holds the same, all-reduced gradients).
  double gradient_norm() const {
    double squares = 0;
    for (const auto& g : groups_) {
      const T* grad = g.gradients;
      double sum = 0;
      Kokkos::parallel_reduce(
          "longattn::train::gradient_norm", Kokkos::RangePolicy<ExecSpace>(context_.exec(), 0, std::int64_t(g.count)),
          KOKKOS_LAMBDA(std::int64_t i, double& s) { s += double(grad[i]) * double(grad[i]); }, sum);
      squares += sum;
    }
    return std::sqrt(squares);
  }

  // One update at learning rate lr; returns the gradient norm before clipping.
  double step(double lr) {
    require(lr >= 0 && std::isfinite(lr), "longattn::train::AdamW::step", "lr", lr, "a finite learning rate >= 0");
    const double norm = gradient_norm();
    const double scale = config_.clip > 0 && norm > config_.clip ? config_.clip / norm : 1.0;
    ++steps_;
    const T b1 = T(config_.beta1), b2 = T(config_.beta2), eps = T(config_.eps), g_scale = T(scale), rate = T(lr);
    const T c1 = T(1 / (1 - std::pow(config_.beta1, double(steps_))));
    const T c2 = T(1 / (1 - std::pow(config_.beta2, double(steps_))));
    std::size_t offset = 0;
    for (const auto& g : groups_) {
      T* w = g.values;
      const T* grad = g.gradients;
      T* m = m_.data() + offset;
      T* v = v_.data() + offset;
      const T decay = g.decay ? T(config_.weight_decay) : T(0);
      Kokkos::parallel_for(
          "longattn::train::adamw", Kokkos::RangePolicy<ExecSpace>(context_.exec(), 0, std::int64_t(g.count)),
          KOKKOS_LAMBDA(std::int64_t i) {
            const T gi = grad[i] * g_scale;
            m[i] = b1 * m[i] + (T(1) - b1) * gi;
            v[i] = b2 * v[i] + (T(1) - b2) * gi * gi;
            w[i] -= rate * (m[i] * c1 / (math::sqrt(v[i] * c2) + eps) + decay * w[i]);
          });
      offset += g.count;
    }
    context_.exec().fence();
    return norm;
  }

  // State for checkpoints: the moments and the update count.
  const Flat& first_moment() const { return m_.view(); }
  const Flat& second_moment() const { return v_.view(); }
  std::int64_t steps() const { return steps_; }
  void set_steps(std::int64_t steps) { steps_ = steps; }

 private:
  Context context_;
  OptimizerConfig config_;
  std::vector<ParameterGroup<T>> groups_;
  memory::PooledView<Flat> m_, v_;
  std::int64_t steps_ = 0;
};

}  // namespace longattn::train
