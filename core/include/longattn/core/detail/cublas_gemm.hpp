#pragma once
// C = alpha op(A) op(B) + beta C on NVIDIA tensor cores through cuBLAS (cublasGemmEx): A and B of
// one 16-bit type (bf16 or fp16), C of that type or float, products summed in float; or float A,
// B and C on TF32 tensor cores where the caller opts in. Row-major operands (the library's
// LayoutRight matrices, or any view whose rows are contiguous), on the caller's stream, with
// cuBLAS's workspace given by the caller (from its pool). Built only with Kokkos::Cuda.
//
// cuBLAS is column-major: a row-major C[m][n] is the column-major C^T[n][m], and
// C^T = op(B)^T op(A)^T, so the call passes B first and swaps m and n.
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace longattn::detail {

enum class CublasType { float32, bfloat16, float16 };

struct CublasMatrix {
  const void* data = nullptr;
  CublasType type = CublasType::float32;
  std::int64_t leading = 0;  // elements between rows
};

struct CublasGemm {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;  // C is m x n, op(A) m x k, op(B) k x n
  float alpha = 1, beta = 0;
  CublasMatrix a, b;
  void* c = nullptr;
  CublasType c_type = CublasType::float32;
  std::int64_t ldc = 0;
  bool tf32 = false;  // float operands on TF32 tensor cores
};

// cuBLAS's workspace a call is given (cuBLAS's own default on Hopper).
inline constexpr std::size_t cublas_workspace_bytes = std::size_t(32) << 20;

// Runs `call` on `stream` with the workspace; throws longattn::Error naming what failed.
void cublas_gemm(cudaStream_t stream, const CublasGemm& call, void* workspace, std::size_t workspace_bytes);

// How many calls cublas_gemm has enqueued in this process (the tests check which path ran).
std::int64_t cublas_gemm_calls();

}  // namespace longattn::detail
