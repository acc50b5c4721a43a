// cuBLAS gemm for the CUDA build (see longattn/core/detail/cublas_gemm.hpp).
#include "longattn/core/detail/cublas_gemm.hpp"

#include <cublas_v2.h>

#include <Kokkos_Core.hpp>
#include <mutex>
#include <string>

#include "longattn/error.hpp"

namespace longattn::detail {
namespace {

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("longattn::gemm (cuBLAS): ") + what + " failed: " + cublasGetStatusString(status));
}

cudaDataType_t data_type(CublasType type) {
  switch (type) {
    case CublasType::bfloat16: return CUDA_R_16BF;
    case CublasType::float16: return CUDA_R_16F;
    case CublasType::float32: break;
  }
  return CUDA_R_32F;
}

// One handle for the process, made at the first call and destroyed when Kokkos finalizes (while
// the CUDA runtime still runs); calls are serialized because a handle holds its stream and
// workspace between cublasSet* and the enqueue.
std::mutex handle_mutex;
cublasHandle_t handle = nullptr;
std::int64_t calls = 0;

cublasHandle_t process_handle() {
  if (!handle) {
    check(cublasCreate(&handle), "cublasCreate");
    Kokkos::push_finalize_hook([] {
      const std::lock_guard<std::mutex> lock(handle_mutex);
      cublasDestroy(handle);
      handle = nullptr;
    });
  }
  return handle;
}

}  // namespace

void cublas_gemm(cudaStream_t stream, const CublasGemm& call, void* workspace, std::size_t workspace_bytes) {
  const std::lock_guard<std::mutex> lock(handle_mutex);
  const cublasHandle_t h = process_handle();
  check(cublasSetStream(h, stream), "cublasSetStream");
  check(cublasSetWorkspace(h, workspace, workspace_bytes), "cublasSetWorkspace");
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B first, m and n swapped.
  const cublasComputeType_t compute = call.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  check(cublasGemmEx(h, call.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, call.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                     int(call.n), int(call.m), int(call.k), &call.alpha, call.b.data, data_type(call.b.type),
                     int(call.b.leading), call.a.data, data_type(call.a.type), int(call.a.leading), &call.beta,
                     call.c, data_type(call.c_type), int(call.ldc), compute, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
  ++calls;
}

std::int64_t cublas_gemm_calls() {
  const std::lock_guard<std::mutex> lock(handle_mutex);
  return calls;
}

}  // namespace longattn::detail
