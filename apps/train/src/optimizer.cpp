#include "longattn/train/optimizer.hpp"

namespace longattn::train {

void validate(const OptimizerConfig& c) {
  const char* where = "longattn-train";
  require(c.lr > 0 && std::isfinite(c.lr), where, "lr", c.lr, "a positive learning rate");
  require(c.min_lr >= 0 && c.min_lr <= c.lr, where, "min-lr", c.min_lr, "a rate in [0, lr]");
  require(c.warmup >= 0, where, "warmup", c.warmup, "a step count >= 0 (longer than the run: it ramps all the way)");
  require(c.beta1 >= 0 && c.beta1 < 1, where, "beta1", c.beta1, "a value in [0, 1)");
  require(c.beta2 >= 0 && c.beta2 < 1, where, "beta2", c.beta2, "a value in [0, 1)");
  require(c.eps > 0, where, "eps", c.eps, "a positive number");
  require(c.weight_decay >= 0, where, "weight-decay", c.weight_decay, "a value >= 0");
  require(c.clip >= 0, where, "clip", c.clip, "a gradient norm >= 0 (0: no clipping)");
}

double learning_rate(const OptimizerConfig& c, int step, int steps) {
  if (step < c.warmup) return c.lr * double(step + 1) / double(c.warmup);
  const int decay = steps - c.warmup;
  const double progress = decay > 0 ? std::min(1.0, double(step - c.warmup) / double(decay)) : 1.0;
  return c.min_lr + (c.lr - c.min_lr) * 0.5 * (1 + std::cos(3.141592653589793 * progress));
}

}  // namespace longattn::train
