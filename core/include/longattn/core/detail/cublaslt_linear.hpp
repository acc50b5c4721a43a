#pragma once
// A gemm with what follows it in one cuBLASLt matmul (cublasLtMatmul's epilogues), for the
// linear layers of linear.hpp on Kokkos::Cuda:
//   D = alpha op(A) op(B) + beta C, C read from its own matrix (a residual) or D itself, then
//   bias:           D += bias (a vector of D's columns, broadcast over its rows);
//   gelu_aux:       aux = D, D = GELU(aux) (GELU's input kept for backward);
//   gelu_aux_bias:  aux = D + bias, D = GELU(aux);
//   dgelu:          D *= GELU'(aux) (aux read: GELU's input saved by forward).
// Row-major operands as in cublas_gemm.hpp (B passed first, m and n swapped), so cuBLAS's bias
// "of D's rows" is a vector of our columns, and aux is a row-major matrix like D. Built only with
// Kokkos::Cuda.
#include <cstddef>
#include <cstdint>

#include "longattn/core/detail/cublas_gemm.hpp"

namespace longattn::detail {

enum class CublasEpilogue { none, bias, gelu_aux, gelu_aux_bias, dgelu };

struct CublasLtMatmul {
  CublasGemm gemm;                // D is gemm.c (its type gemm.c_type, gemm.ldc elements between rows)
  const void* c = nullptr;        // C where it is not D (beta != 0): of D's type, m x n
  std::int64_t c_leading = 0;     // elements between C's rows
  CublasEpilogue epilogue = CublasEpilogue::none;
  const void* bias = nullptr;     // n values of D's type (bias, gelu_aux_bias)
  void* aux = nullptr;            // GELU's input, m x n of D's type: written (gelu_aux, gelu_aux_bias) or read (dgelu)
  std::int64_t aux_leading = 0;   // elements between aux's rows: cuBLASLt takes multiples of 8
};

// Enqueues `call` on `stream` (the workspace the caller's, from its pool). Returns false, having
// enqueued nothing, where cuBLASLt has no algorithm for it (the caller computes it otherwise);
// throws longattn::Error where a cuBLASLt call fails.
bool cublaslt_matmul(cudaStream_t stream, const CublasLtMatmul& call, void* workspace, std::size_t workspace_bytes);

// How many matmuls cublaslt_matmul has enqueued in this process (the tests check which path ran).
std::int64_t cublaslt_matmul_calls();

}  // namespace longattn::detail
