#pragma once
// The CPU's bf16 products (bf16_dot_products.hpp) set to one path while an object lives.
#include <Kokkos_Core.hpp>
#include <type_traits>

#include "longattn/core/bf16_dot_products.hpp"
#include "longattn/core/half.hpp"

namespace longattn::test {

// bfloat16 operands on a host space: float products on float values; the dot products
// (AVX512-BF16: gemm and attention); the tile products (AMX-BF16: attention's block products).
enum class Bf16Path { float_values, dot_products, tile_products };

inline const char* to_string(Bf16Path path) {
  return path == Bf16Path::float_values   ? "float values"
         : path == Bf16Path::dot_products ? "bf16 dot products"
                                          : "bf16 tile products";
}

inline bool available(Bf16Path path) {
  return path == Bf16Path::float_values   ? true
         : path == Bf16Path::dot_products ? bf16_dot_products_available()
                                          : bf16_tile_products_available();
}

// The SKIP line of a path this CPU or build does not have.
inline const char* missing(Bf16Path path) {
  return path == Bf16Path::dot_products ? "SKIP: bf16 dot products need a CPU with AVX512-BF16 (this build or CPU has none)"
                                        : "SKIP: bf16 tile products need a CPU with AMX-BF16 and Linux 5.16 or later "
                                          "(this build, CPU or OS has none)";
}

class Bf16Products {
 public:
  explicit Bf16Products(Bf16Path path)
      : dot_products_before_(bf16_dot_products_in_use()), tile_products_before_(bf16_tile_products_in_use()) {
    use_bf16_dot_products(path == Bf16Path::dot_products);
    use_bf16_tile_products(path == Bf16Path::tile_products);
  }
  ~Bf16Products() {
    use_bf16_dot_products(dot_products_before_);
    use_bf16_tile_products(tile_products_before_);
  }
  Bf16Products(const Bf16Products&) = delete;
  Bf16Products& operator=(const Bf16Products&) = delete;

 private:
  bool dot_products_before_, tile_products_before_;
};

// The factor on a bfloat16 attention kernel's tolerance for the bf16 products: with them on (host
// memory only) P and dS are rounded to bfloat16 too, one more 2^-9 relative. Found by seeds
// 3660149687 (attention, 0.0044 against 0.0039) and 934338784 (block-sparse dv, 0.0043).
template <class T, class Memory>
double bf16_product_rounding() {
  const bool on = std::is_same_v<T, bfloat16> && std::is_same_v<Memory, Kokkos::HostSpace> &&
                  (bf16_dot_products_in_use() || bf16_tile_products_in_use());
  return on ? 1.5 : 1.0;
}

}  // namespace longattn::test
