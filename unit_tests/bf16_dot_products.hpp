#pragma once
// Turns the use of the CPU's bf16 dot products (gemm, attention) on or off while it lives.
#include "longattn/core/bf16_dot_products.hpp"

namespace longattn::test {

class Bf16DotProducts {
 public:
  explicit Bf16DotProducts(bool on) : before_(bf16_dot_products_in_use()) { use_bf16_dot_products(on); }
  ~Bf16DotProducts() { use_bf16_dot_products(before_); }
  Bf16DotProducts(const Bf16DotProducts&) = delete;
  Bf16DotProducts& operator=(const Bf16DotProducts&) = delete;

 private:
  bool before_;
};

}  // namespace longattn::test
