#pragma once
// Turns the use of the CPU's bf16 dot products (gemm, attention) on or off while it lives.
#include <Kokkos_Core.hpp>
#include <type_traits>

#include "longattn/core/bf16_dot_products.hpp"
#include "longattn/core/half.hpp"

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

// The factor on a bfloat16 kernel's tolerance for the bf16 dot products: with them on (host
// memory only) P and dS are rounded to bfloat16 too, one more 2^-9 relative. Found by seeds
// 3660149687 (attention, 0.0044 against 0.0039) and 934338784 (block-sparse dv, 0.0043).
template <class T, class Memory>
double dot_product_rounding() {
  const bool on = std::is_same_v<T, bfloat16> && std::is_same_v<Memory, Kokkos::HostSpace> &&
                  bf16_dot_products_in_use();
  return on ? 1.5 : 1.0;
}

}  // namespace longattn::test
