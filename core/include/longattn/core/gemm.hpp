#pragma once
// longattn::gemm: C = alpha op(A) op(B) + beta C through Kokkos Kernels (OpenBLAS on the host,
// cuBLAS on CUDA) on the caller's execution space instance, with the shapes checked first so
// that a mismatch is a longattn::Error naming the argument rather than an abort inside the BLAS.
//
// Kokkos Kernels 4 runs it on that instance. Kokkos Kernels 3 has no instance argument and runs
// on the space's default instance: there the call is fenced on both sides, so it is ordered
// after the caller's earlier work on `exec` and before its later work (correct, not concurrent).
//
// 16-bit storage (bfloat16, float16) goes through gemm(ctx, ...): A and B of one 16-bit type, C
// of that type or float. Products of 16-bit values are exact in float and the sums are taken in
// float (mixed precision, as tensor cores do). On Kokkos::Cuda it is cuBLAS's cublasGemmEx on the
// tensor cores (detail/cublas_gemm.hpp: the context's stream, cuBLAS's workspace from its pool),
// wherever each matrix's rows are contiguous. bfloat16 on a host space whose CPU has bf16 dot
// products (AVX512-BF16) runs on them (detail/bf16_gemm.hpp: twice the products per instruction
// of a float FMA); otherwise it is the float gemm on float copies of the operands, taken from
// ctx.pool() while the call runs, the result rounded into a 16-bit C. add_column_sums sums a
// 16-bit matrix in float.
#include <KokkosBlas2_gemv.hpp>
#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>

#include "longattn/checks.hpp"
#include "longattn/core/bf16_dot_products.hpp"
#include "longattn/core/convert.hpp"
#include "longattn/core/detail/bf16_gemm.hpp"
#include "longattn/core/detail/column_sums.hpp"
#if defined(KOKKOS_ENABLE_CUDA)
#include "longattn/core/detail/cublas_gemm.hpp"
#endif
#include "longattn/core/execution_context.hpp"
#include "longattn/core/half.hpp"
#include "longattn/error.hpp"

namespace longattn {

// Float gemm(ctx, ...) and float linear layers (linear.hpp) on Kokkos::Cuda run on TF32 tensor
// cores where allowed, as PyTorch's torch.backends.cuda.matmul.allow_tf32: the operands rounded
// to 10-bit mantissas, the products summed in float. Off unless LONGATTN_ALLOW_TF32=1 in the
// environment (read at the first call) or allow_tf32_matmul(true); other spaces ignore it.
bool tf32_matmul_allowed();
void allow_tf32_matmul(bool on);

namespace detail {
inline bool valid_trans(const char* t) {
  return t && (t[0] == 'N' || t[0] == 'n' || t[0] == 'T' || t[0] == 't' || t[0] == 'C' ||
               t[0] == 'c');
}
inline bool transposed(const char* t) { return t[0] != 'N' && t[0] != 'n'; }
}  // namespace detail

namespace detail {
#if defined(KOKKOSKERNELS_VERSION) && KOKKOSKERNELS_VERSION >= 40000
inline constexpr bool blas_takes_instance = true;
#else
inline constexpr bool blas_takes_instance = false;
#endif

// Runs a Kokkos Kernels call on `exec`: call(exec) where the BLAS takes an instance, else
// call() between fences (see above). `call` is a generic lambda forwarding its arguments first.
template <class ExecSpace, class Call>
void on_instance(const ExecSpace& exec, Call&& call) {
  if constexpr (blas_takes_instance) {
    call(exec);
  } else {
    exec.fence();
    call();
    ExecSpace().fence();
  }
}
}  // namespace detail

namespace detail {
// Throws longattn::Error unless trans_a, trans_b name a transpose and op(A) op(B) fits C.
template <class AView, class BView, class CView>
void check_gemm_arguments(const char* trans_a, const char* trans_b, const AView& a, const BView& b, const CView& c) {
  static_assert(AView::rank == 2 && BView::rank == 2 && CView::rank == 2, "longattn::gemm takes rank-2 views");
  const char* where = "longattn::gemm";
  require(valid_trans(trans_a), where, "trans_a", trans_a ? trans_a : "null", "\"N\", \"T\" or \"C\"");
  require(valid_trans(trans_b), where, "trans_b", trans_b ? trans_b : "null", "\"N\", \"T\" or \"C\"");
  const auto rows_a = transposed(trans_a) ? a.extent(1) : a.extent(0);
  const auto inner_a = transposed(trans_a) ? a.extent(0) : a.extent(1);
  const auto inner_b = transposed(trans_b) ? b.extent(1) : b.extent(0);
  const auto cols_b = transposed(trans_b) ? b.extent(0) : b.extent(1);
  auto expect = [](const char* what, std::size_t n) {
    std::ostringstream s;
    s << n << " (" << what << ")";
    return s.str();
  };
  require(inner_b == inner_a, where, "B's inner extent", inner_b, expect("columns of op(A)", inner_a));
  require(c.extent(0) == rows_a, where, "C.extent(0)", c.extent(0), expect("rows of op(A)", rows_a));
  require(c.extent(1) == cols_b, where, "C.extent(1)", c.extent(1), expect("columns of op(B)", cols_b));
}
}  // namespace detail

template <class ExecSpace, class AView, class BView, class CView>
void gemm(const ExecSpace& exec, const char* trans_a, const char* trans_b, typename CView::const_value_type alpha,
          const AView& a, const BView& b, typename CView::const_value_type beta, const CView& c) {
  static_assert(Kokkos::is_execution_space<ExecSpace>::value, "longattn::gemm(exec, ...): an execution space instance");
  detail::check_gemm_arguments(trans_a, trans_b, a, b, c);
  detail::on_instance(exec, [&](const auto&... space) { KokkosBlas::gemm(space..., trans_a, trans_b, alpha, a, b, beta, c); });
}

namespace detail {
template <class ExecSpace>
using FloatMatrix = Kokkos::View<float**, Kokkos::LayoutRight, typename ExecSpace::memory_space>;

// A float copy of a rank-2 view, from the context's pool.
template <class ExecSpace, class View>
memory::PooledView<FloatMatrix<ExecSpace>> widened(const ExecutionContext<ExecSpace>& ctx, const View& view,
                                                   bool copy) {
  using Float = FloatMatrix<ExecSpace>;
  const memory::CategoryScope scope(memory::Category::transient_copies);
  auto wide = ctx.template allocate<Float>(view.extent(0), view.extent(1));
  if (copy) convert(ctx.exec(), view, wide.view());
  return wide;
}
}  // namespace detail

#if defined(KOKKOS_ENABLE_CUDA)
namespace detail {
// Whether products of T's over these views may run on cuBLAS or cuBLASLt (gemm(ctx, ...) here,
// linear.hpp's layers): on Kokkos::Cuda with every view in its memory, 16-bit storage, or float
// where TF32 products are allowed (tensor_cores_take, the part known only at run time).
template <class ExecSpace, class T, class... Views>
constexpr bool on_cuda_tensor_cores() {
  return std::is_same_v<ExecSpace, Kokkos::Cuda> && (is_half_v<T> || std::is_same_v<T, float>) &&
         (std::is_same_v<typename Views::memory_space, Kokkos::Cuda::memory_space> && ...);
}
template <class T>
bool tensor_cores_take() {
  return is_half_v<T> || tf32_matmul_allowed();
}

template <class T>
constexpr CublasType cublas_type() {
  if constexpr (std::is_same_v<T, bfloat16>) return CublasType::bfloat16;
  else if constexpr (std::is_same_v<T, float16>) return CublasType::float16;
  else return CublasType::float32;
}

// A rank-2 view as cuBLAS reads it: rows contiguous, `leading` elements apart (nullopt-like
// false where its rows are not contiguous or an extent passes cuBLAS's int).
template <class View>
bool cublas_matrix(const View& x, CublasMatrix& matrix) {
  constexpr std::int64_t int_max = std::numeric_limits<int>::max();
  const std::int64_t rows = x.extent(0), cols = x.extent(1);
  if (cols > 1 && x.stride(1) != 1) return false;
  const std::int64_t leading = std::max<std::int64_t>({rows > 1 ? std::int64_t(x.stride(0)) : 0, cols, 1});
  if (rows > int_max || leading > int_max) return false;
  matrix = {x.data(), cublas_type<scalar_of<View>>(), leading};
  return true;
}

// C = alpha op(A) op(B) + beta C by cublasGemmEx on ctx's stream, its workspace from ctx's pool
// (float operands on TF32 tensor cores); false (nothing done) where a matrix is not one cuBLAS
// reads in place.
template <class AView, class BView, class CView>
bool cublas_gemm_in(const ExecutionContext<Kokkos::Cuda>& ctx, const char* trans_a, const char* trans_b, float alpha,
                    const AView& a, const BView& b, float beta, const CView& c) {
  CublasGemm call;
  call.tf32 = std::is_same_v<scalar_of<AView>, float>;
  CublasMatrix c_matrix;
  if (!cublas_matrix(a, call.a) || !cublas_matrix(b, call.b) || !cublas_matrix(c, c_matrix)) return false;
  call.trans_a = transposed(trans_a);
  call.trans_b = transposed(trans_b);
  call.m = c.extent(0);
  call.n = c.extent(1);
  call.k = call.trans_a ? a.extent(0) : a.extent(1);
  if (call.n > std::numeric_limits<int>::max() || call.k > std::numeric_limits<int>::max()) return false;
  call.alpha = alpha;
  call.beta = beta;
  call.c = c.data();
  call.c_type = c_matrix.type;
  call.ldc = c_matrix.leading;
  if (call.m == 0 || call.n == 0) return true;
  const memory::CategoryScope scope(memory::Category::workspaces);
  const auto workspace = ctx.template allocate<Kokkos::View<char*, Kokkos::Cuda::memory_space>>(cublas_workspace_bytes);
  cublas_gemm(ctx.exec().cuda_stream(), call, workspace.data(), cublas_workspace_bytes);
  return true;
}
}  // namespace detail
#endif

// The pool memory a 16-bit gemm(ctx, ...) takes on ExecSpace beside its operands' copies (pool
// category "workspaces"): cuBLAS's workspace on Kokkos::Cuda, none elsewhere.
template <class ExecSpace>
constexpr std::size_t gemm_workspace_bytes() {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same_v<ExecSpace, Kokkos::Cuda>) return detail::cublas_workspace_bytes;
#endif
  return 0;
}

// C = alpha op(A) op(B) + beta C in `ctx`: gemm(ctx.exec(), ...) for float and double (float on
// Kokkos::Cuda through cuBLAS on TF32 tensor cores where tf32_matmul_allowed()); for 16-bit A and
// B (C of their type or float) through cuBLAS on Kokkos::Cuda, on the CPU's bf16 dot products or
// on float copies from ctx.pool(), see above.
template <class ExecSpace, class AView, class BView, class CView>
void gemm(const ExecutionContext<ExecSpace>& ctx, const char* trans_a, const char* trans_b,
          accumulate_t<scalar_of<CView>> alpha, const AView& a, const BView& b, accumulate_t<scalar_of<CView>> beta,
          const CView& c) {
  using TA = scalar_of<AView>;
  using TC = scalar_of<CView>;
  static_assert(std::is_same_v<TA, scalar_of<BView>>, "longattn::gemm: A and B hold one type");
  static_assert(std::is_same_v<TC, TA> || (is_half_v<TA> && std::is_same_v<TC, float>),
                "longattn::gemm: C holds the type of A and B, or float where theirs is 16-bit");
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (detail::on_cuda_tensor_cores<ExecSpace, TA, AView, BView, CView>()) {
    if (detail::tensor_cores_take<TA>()) {
      detail::check_gemm_arguments(trans_a, trans_b, a, b, c);
      if (detail::cublas_gemm_in(ctx, trans_a, trans_b, alpha, a, b, beta, c)) return;
    }
  }
#endif
  if constexpr (!is_half_v<TA>) {
    gemm(ctx.exec(), trans_a, trans_b, alpha, a, b, beta, c);
  } else {
    if constexpr (std::is_same_v<TA, bfloat16> && std::is_same_v<typename ExecSpace::memory_space, Kokkos::HostSpace>) {
      if (bf16_dot_products_in_use()) {
        detail::check_gemm_arguments(trans_a, trans_b, a, b, c);
        detail::bf16_dot_product_gemm(ctx, detail::transposed(trans_a), detail::transposed(trans_b), alpha, a, b, beta, c);
        return;
      }
    }
    const auto a32 = detail::widened(ctx, a, true);
    const auto b32 = detail::widened(ctx, b, true);
    if constexpr (std::is_same_v<TC, float>) {
      gemm(ctx.exec(), trans_a, trans_b, alpha, a32.view(), b32.view(), beta, c);
    } else {
      static_assert(CView::rank == 2, "longattn::gemm takes rank-2 views");
      const auto c32 = detail::widened(ctx, c, beta != 0.0f);
      gemm(ctx.exec(), trans_a, trans_b, alpha, a32.view(), b32.view(), beta, c32.view());
      convert(ctx.exec(), c32.view(), c);
    }
  }
}

// sums[c] += sum_r a(r, c), for a contiguous LayoutRight [rows, cols] matrix (a bias gradient):
// one gemv on the same memory read as the LayoutLeft [cols, rows] matrix a^T, which reaches the
// BLAS (Kokkos Kernels' own transposed gemv over LayoutRight took 6% of a training step).
// `ones` holds at least `rows` ones. Runs on `exec` as gemm does. A 16-bit `a` (sums: float) is
// summed by a kernel instead, in a fixed order (`ones` is not read): on a device in teams of 32
// columns (detail/column_sums.hpp).
template <class ExecSpace, class AView, class OnesView, class SumsView>
void add_column_sums(const ExecSpace& exec, const AView& a, const OnesView& ones, const SumsView& sums) {
  static_assert(AView::rank == 2 && OnesView::rank == 1 && SumsView::rank == 1,
                "add_column_sums: a [rows, cols], ones [>= rows], sums [cols]");
  static_assert(std::is_same_v<typename AView::array_layout, Kokkos::LayoutRight>, "add_column_sums: a LayoutRight a");
  const char* where = "longattn::add_column_sums";
  require(a.span_is_contiguous(), where, "a", a.label(), "a contiguous matrix");
  require(ones.extent(0) >= a.extent(0), where, "ones.extent(0)", ones.extent(0),
          "at least the rows of a, " + std::to_string(a.extent(0)));
  require(sums.extent(0) == a.extent(1), where, "sums.extent(0)", sums.extent(0),
          "the columns of a, " + std::to_string(a.extent(1)));
  using T = typename AView::non_const_value_type;
  static_assert(std::is_same_v<scalar_of<SumsView>, accumulate_t<T>>, "add_column_sums: sums of accumulate_t of a's type");
  if constexpr (is_half_v<T> &&
                !Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible) {
    // On a device in teams, reads coalesced across a team's 32 columns (detail/column_sums.hpp).
    detail::device_column_sums<1, float>(
        "longattn::add_column_sums", exec, std::int64_t(a.extent(0)), int(a.extent(1)),
        KOKKOS_LAMBDA(std::int64_t r, int c, float(&sum)[1]) { sum[0] += float(a(r, c)); },
        KOKKOS_LAMBDA(int c, const float(&sum)[1]) { sums(c) += sum[0]; });
  } else if constexpr (is_half_v<T>) {
    // A thread sums 16 neighbouring columns down the rows: contiguous reads.
    constexpr int width = 16;
    const std::int64_t rows = a.extent(0);
    const int cols = int(a.extent(1));
    Kokkos::parallel_for(
        "longattn::add_column_sums", Kokkos::RangePolicy<ExecSpace>(exec, 0, (cols + width - 1) / width),
        KOKKOS_LAMBDA(int block) {
          const int first = block * width, count = cols - first < width ? cols - first : width;
          float sum[width] = {};
          for (std::int64_t r = 0; r < rows; ++r)
            for (int c = 0; c < count; ++c) sum[c] += float(a(r, first + c));
          for (int c = 0; c < count; ++c) sums(first + c) += sum[c];
        });
  } else {
    using Memory = typename AView::memory_space;
    using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
    const Kokkos::View<const T**, Kokkos::LayoutLeft, Memory, Unmanaged> transposed(a.data(), a.extent(1), a.extent(0));
    const Kokkos::View<const T*, Kokkos::LayoutLeft, Memory, Unmanaged> x(ones.data(), a.extent(0));
    const Kokkos::View<T*, Kokkos::LayoutLeft, Memory, Unmanaged> y(sums.data(), sums.extent(0));
    detail::on_instance(exec, [&](const auto&... space) { KokkosBlas::gemv(space..., "N", T(1), transposed, x, T(1), y); });
  }
}

}  // namespace longattn
