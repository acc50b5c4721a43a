// cuBLAS gemm and cuBLASLt matmuls with epilogues for the CUDA build (see
// longattn/core/detail/cublas_gemm.hpp and cublaslt_linear.hpp).
#include "longattn/core/detail/cublas_gemm.hpp"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <Kokkos_Core.hpp>
#include <mutex>
#include <string>

#include "longattn/core/detail/cublaslt_linear.hpp"
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

// A library's handle for the process, made at the first call and destroyed when Kokkos finalizes
// (while the CUDA runtime still runs); calls hold `mutex`, as a cuBLAS handle keeps its stream
// and workspace between cublasSet* and the enqueue. `calls` counts what was enqueued.
template <class Handle, cublasStatus_t (*create)(Handle*), cublasStatus_t (*destroy)(Handle)>
struct ProcessHandle {
  std::mutex mutex;
  Handle handle = nullptr;
  std::int64_t calls = 0;

  Handle get(const char* what) {  // with `mutex` held
    if (!handle) {
      check(create(&handle), what);
      Kokkos::push_finalize_hook([this] {
        const std::lock_guard<std::mutex> lock(mutex);
        destroy(handle);
        handle = nullptr;
      });
    }
    return handle;
  }
  std::int64_t count() {
    const std::lock_guard<std::mutex> lock(mutex);
    return calls;
  }
};

ProcessHandle<cublasHandle_t, cublasCreate, cublasDestroy> blas;
ProcessHandle<cublasLtHandle_t, cublasLtCreate, cublasLtDestroy> blas_lt;  // cuBLASLt takes no cublasHandle_t

}  // namespace

void cublas_gemm(cudaStream_t stream, const CublasGemm& call, void* workspace, std::size_t workspace_bytes) {
  const std::lock_guard<std::mutex> lock(blas.mutex);
  const cublasHandle_t h = blas.get("cublasCreate");
  check(cublasSetStream(h, stream), "cublasSetStream");
  check(cublasSetWorkspace(h, workspace, workspace_bytes), "cublasSetWorkspace");
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B first, m and n swapped.
  const cublasComputeType_t compute = call.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  check(cublasGemmEx(h, call.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, call.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                     int(call.n), int(call.m), int(call.k), &call.alpha, call.b.data, data_type(call.b.type),
                     int(call.b.leading), call.a.data, data_type(call.a.type), int(call.a.leading), &call.beta,
                     call.c, data_type(call.c_type), int(call.ldc), compute, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
  ++blas.calls;
}

std::int64_t cublas_gemm_calls() { return blas.count(); }

namespace {

// A cuBLASLt descriptor, destroyed when the call returns or throws.
template <class Handle, cublasStatus_t (*destroy)(Handle)>
struct Owned {
  Handle handle = nullptr;
  Owned() = default;
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() {
    if (handle) destroy(handle);
  }
};
using MatmulDesc = Owned<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using Layout = Owned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using Preference = Owned<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

template <class Value>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const Value& value, const char* what) {
  check(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof value), what);
}

// A column-major rows x cols matrix, `leading` elements between its columns.
void make_layout(Layout& layout, CublasType type, std::int64_t rows, std::int64_t cols, std::int64_t leading) {
  check(cublasLtMatrixLayoutCreate(&layout.handle, data_type(type), std::uint64_t(rows), std::uint64_t(cols), leading),
        "cublasLtMatrixLayoutCreate");
}

cublasLtEpilogue_t lt_epilogue(CublasEpilogue epilogue) {
  switch (epilogue) {
    case CublasEpilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case CublasEpilogue::gelu_aux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case CublasEpilogue::gelu_aux_bias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case CublasEpilogue::dgelu: return CUBLASLT_EPILOGUE_DGELU;
    case CublasEpilogue::none: break;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

}  // namespace

bool cublaslt_matmul(cudaStream_t stream, const CublasLtMatmul& call, void* workspace, std::size_t workspace_bytes) {
  const CublasGemm& g = call.gemm;
  const std::lock_guard<std::mutex> lock(blas_lt.mutex);
  const cublasLtHandle_t handle = blas_lt.get("cublasLtCreate");
  MatmulDesc desc;
  check(cublasLtMatmulDescCreate(&desc.handle, g.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F),
        "cublasLtMatmulDescCreate");
  // Row-major D = op(A) op(B) is column-major D^T = op(B)^T op(A)^T: cuBLASLt's A is our B and
  // its B our A; D^T is n x m, so cuBLASLt's bias (one value a row of D^T) is one a column of D.
  set(desc.handle, CUBLASLT_MATMUL_DESC_TRANSA, std::int32_t(g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N), "transa");
  set(desc.handle, CUBLASLT_MATMUL_DESC_TRANSB, std::int32_t(g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N), "transb");
  set(desc.handle, CUBLASLT_MATMUL_DESC_EPILOGUE, std::uint32_t(lt_epilogue(call.epilogue)), "epilogue");
  if (call.bias) set(desc.handle, CUBLASLT_MATMUL_DESC_BIAS_POINTER, call.bias, "bias pointer");
  if (call.aux) {
    set(desc.handle, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, call.aux, "aux pointer");
    set(desc.handle, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, call.aux_leading, "aux leading dimension");
  }
  // Stored shapes, column-major: our row-major B (k x n, or n x k transposed) and A (m x k, or k x m).
  Layout a, b, c, d;
  make_layout(a, g.b.type, g.trans_b ? g.k : g.n, g.trans_b ? g.n : g.k, g.b.leading);
  make_layout(b, g.a.type, g.trans_a ? g.m : g.k, g.trans_a ? g.k : g.m, g.a.leading);
  make_layout(c, g.c_type, g.n, g.m, call.c ? call.c_leading : g.ldc);
  make_layout(d, g.c_type, g.n, g.m, g.ldc);
  Preference preference;
  check(cublasLtMatmulPreferenceCreate(&preference.handle), "cublasLtMatmulPreferenceCreate");
  const std::uint64_t bytes = workspace_bytes;
  check(cublasLtMatmulPreferenceSetAttribute(preference.handle, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes,
                                             sizeof bytes),
        "the workspace preference");
  cublasLtMatmulHeuristicResult_t chosen{};
  int found = 0;
  const cublasStatus_t heuristic = cublasLtMatmulAlgoGetHeuristic(handle, desc.handle, a.handle, b.handle, c.handle,
                                                                   d.handle, preference.handle, 1, &chosen, &found);
  if (heuristic == CUBLAS_STATUS_NOT_SUPPORTED || (heuristic == CUBLAS_STATUS_SUCCESS && found == 0)) return false;
  check(heuristic, "cublasLtMatmulAlgoGetHeuristic");
  // NOT_SUPPORTED here too: the algorithm refuses an operand's alignment, say (nothing enqueued).
  const cublasStatus_t status =
      cublasLtMatmul(handle, desc.handle, &g.alpha, g.b.data, a.handle, g.a.data, b.handle, &g.beta,
                     call.c ? call.c : g.c, c.handle, g.c, d.handle, &chosen.algo, workspace, workspace_bytes, stream);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  check(status, "cublasLtMatmul");
  ++blas_lt.calls;
  return true;
}

std::int64_t cublaslt_matmul_calls() { return blas_lt.count(); }

}  // namespace longattn::detail
