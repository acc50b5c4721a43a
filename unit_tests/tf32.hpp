#pragma once
// Allows float matrix products on TF32 tensor cores (gemm.hpp) or forbids them while it lives.
#include "longattn/core/gemm.hpp"

namespace longattn::test {

class AllowTf32 {
 public:
  explicit AllowTf32(bool on) : before_(tf32_matmul_allowed()) { allow_tf32_matmul(on); }
  ~AllowTf32() { allow_tf32_matmul(before_); }
  AllowTf32(const AllowTf32&) = delete;
  AllowTf32& operator=(const AllowTf32&) = delete;

 private:
  bool before_;
};

// The relative error of one product of floats where ExecSpace takes them on TF32 tensor cores
// now (each operand rounded to a 10-bit mantissa: 2^-11 each), else of a float product.
template <class ExecSpace>
double float_product_roundoff() {
#if defined(KOKKOS_ENABLE_CUDA)
  if (std::is_same_v<ExecSpace, Kokkos::Cuda> && tf32_matmul_allowed()) return 1.0 / 1024;
#endif
  return 6e-8;
}

}  // namespace longattn::test
