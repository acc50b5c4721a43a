#pragma once
// Linear layers and what follows their products in a transformer:
//   linear_forward:         y = x W^T + b, then optionally y += residual and g = GELU(y);
//   linear_input_gradient:  dx = dy W, then optionally dx *= GELU'(u) (u: GELU's input).
// x [rows, in], W [out, in] (a layer's weights, as torch.nn.Linear holds them), b [out],
// y [rows, out]; one storage type throughout, the products summed as gemm(ctx, ...) sums them.
//
// On Kokkos::Cuda with 16-bit storage (float too where TF32 products are allowed, gemm.hpp's
// tf32_matmul_allowed()) each is a cuBLASLt matmul whose epilogue adds the bias and reads the
// residual as its C (detail/cublaslt_linear.hpp): they cost no pass over memory of their own.
// GELU (keeping its input) and its derivative join the epilogue where cublaslt_gelu_in_use(),
// else run as their own kernels after it. Elsewhere, and where cuBLASLt has no algorithm for a
// shape or the GELU input's rows are not a multiple of 8 elements apart, the same results come
// from gemm(ctx, ...) and the element-wise kernels below, in this order: the bias broadcast into
// y, the product added (beta = 1), the residual added, GELU (each result rounded to the storage
// type, as cuBLASLt's epilogue rounds only its outputs: 16-bit results differ by that rounding).
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>
#include <type_traits>

#include "longattn/checks.hpp"
#include "longattn/core/execution_context.hpp"
#include "longattn/core/gemm.hpp"
#include "longattn/core/half.hpp"
#if defined(KOKKOS_ENABLE_CUDA)
#include "longattn/core/detail/cublaslt_linear.hpp"
#endif
#include "longattn/kokkos_compat.hpp"

namespace longattn {

// Whether GELU and its derivative run in cuBLASLt's epilogue (above) or as their own kernels
// after the matmul. Off unless LONGATTN_CUBLASLT_GELU=1 in the environment (read at the first
// call) or use_cublaslt_gelu(true): llm.c measured bf16 GELU epilogues slower than a matmul and
// a GELU kernel on an H100 (cuBLAS 12.4); this library's have not been timed on a GPU yet.
bool cublaslt_gelu_in_use();
void use_cublaslt_gelu(bool on);

// GELU, tanh form (GPT-2, and cuBLASLt's epilogue): GELU(u) = u/2 (1 + tanh(a)),
// a = c (u + 0.044715 u^3), c = sqrt(2/pi), computed as u sigmoid(2a) = u / (1 + exp(-2a)): one
// exp instead of tanh (libm's tanhf, through expm1f, took a third of a training step).
template <class T>
KOKKOS_INLINE_FUNCTION T gelu_sigmoid(T u) {  // sigmoid(2a)
  const T a = T(0.7978845608028654) * (u + T(0.044715) * u * u * u);
  return T(1) / (T(1) + math::exp(T(-2) * a));
}

// GELU'(u) = s + u s (1 - s) 2 a'(u), s = sigmoid(2a), a'(u) = c (1 + 3 0.044715 u^2).
template <class T>
KOKKOS_INLINE_FUNCTION T gelu_derivative(T u) {
  const T s = gelu_sigmoid(u);
  const T da = T(0.7978845608028654) * (T(1) + T(3 * 0.044715) * u * u);
  return s + u * s * (T(1) - s) * T(2) * da;
}

// y += x (a residual connection) for [rows, cols] matrices, computed in accumulate_t of y's
// type and rounded once.
template <class ExecSpace, class Y, class X>
void add_into(const ExecSpace& exec, const Y& y, const X& x) {
  static_assert(Y::rank == 2 && X::rank == 2, "add_into: y and x [rows, cols]");
  using T = scalar_of<Y>;
  using A = accumulate_t<T>;
  check_extents("longattn::add_into", "x", x, {std::int64_t(y.extent(0)), std::int64_t(y.extent(1))}, "the extents of y");
  const int cols = int(y.extent(1));
  Kokkos::parallel_for(
      "longattn::add_into", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, y.extent(0)),
      KOKKOS_LAMBDA(std::int64_t r) {
        for (int c = 0; c < cols; ++c) y(r, c) = T(A(y(r, c)) + A(x(r, c)));
      });
}

namespace detail {
// linear_forward's and linear_input_gradient's element-wise kernels, of [rows, cols] matrices
// whose extents they checked: rows outer, columns inner (the inner loop vectorizes), computed in
// accumulate_t of the storage type and rounded once.

// g = GELU(u).
template <class ExecSpace, class U, class G>
void gelu_forward(const ExecSpace& exec, const U& u, const G& g) {
  using T = scalar_of<G>;
  using A = accumulate_t<T>;
  const int cols = int(u.extent(1));
  Kokkos::parallel_for(
      "longattn::gelu_forward", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, u.extent(0)),
      KOKKOS_LAMBDA(std::int64_t r) {
        for (int c = 0; c < cols; ++c) {
          const A x = A(u(r, c));
          g(r, c) = T(x * gelu_sigmoid(x));
        }
      });
}

// d (in place) *= GELU'(u): a gradient of GELU's output made one of its input.
template <class ExecSpace, class U, class D>
void gelu_backward(const ExecSpace& exec, const U& u, const D& d) {
  using T = scalar_of<D>;
  using A = accumulate_t<T>;
  const int cols = int(u.extent(1));
  Kokkos::parallel_for(
      "longattn::gelu_backward", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, u.extent(0)),
      KOKKOS_LAMBDA(std::int64_t r) {
        for (int c = 0; c < cols; ++c) d(r, c) = T(A(d(r, c)) * gelu_derivative(A(u(r, c))));
      });
}

// out[r][e] = bias[e] for every row of a [rows, E] matrix (a linear layer's bias, before its
// gemm with beta = 1). A 2D range, columns fastest: vectorized rows on the host, coalesced on
// GPUs (a flat index paid a division per element: 4% of a training step).
template <class ExecSpace, class Bias, class Out>
void broadcast_rows(const ExecSpace& exec, const Bias& bias, const Out& out) {
  using Policy = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2, Kokkos::Iterate::Right, Kokkos::Iterate::Right>,
                                       Kokkos::IndexType<std::int64_t>>;
  Kokkos::parallel_for(
      "longattn::broadcast_rows", Policy(exec, {0, 0}, {std::int64_t(out.extent(0)), std::int64_t(out.extent(1))}),
      KOKKOS_LAMBDA(std::int64_t r, std::int64_t e) { out(r, e) = bias(e); });
}
}  // namespace detail

// What follows a linear layer's product, each left out while its view is empty (no data).
template <class Matrix>
struct LinearEpilogue {
  Matrix residual;  // [rows, out], added after the bias: the residual connection around the layer
  Matrix gelu;      // [rows, out]: GELU(y) written here, y keeping GELU's input (for backward)
};

namespace detail {
template <class View>
bool present(const View& view) {
  return view.data() != nullptr;
}

#if defined(KOKKOS_ENABLE_CUDA)
// `call` on cuBLASLt with its workspace from ctx's pool; false (nothing done) where a matrix is
// not one cuBLAS reads in place, GELU's input is not one cuBLASLt takes, the products have no
// depth (cuBLASLt takes k >= 1) or it has no algorithm.
template <class AView, class BView, class DView>
bool cublaslt_linear_in(const ExecutionContext<Kokkos::Cuda>& ctx, bool trans_b, const AView& a, const BView& b,
                        const DView& d, CublasLtMatmul& call) {
  if (a.extent(1) == 0) return false;
  CublasMatrix d_matrix;
  if (!cublas_matrix(a, call.gemm.a) || !cublas_matrix(b, call.gemm.b) || !cublas_matrix(d, d_matrix)) return false;
  if (call.aux && call.aux_leading % 8 != 0) return false;
  call.gemm.tf32 = std::is_same_v<scalar_of<DView>, float>;
  call.gemm.trans_b = trans_b;
  call.gemm.m = d.extent(0);
  call.gemm.n = d.extent(1);
  call.gemm.k = a.extent(1);
  call.gemm.c = d.data();
  call.gemm.c_type = d_matrix.type;
  call.gemm.ldc = d_matrix.leading;
  const memory::CategoryScope scope(memory::Category::workspaces);
  const auto workspace = ctx.template allocate<Kokkos::View<char*, Kokkos::Cuda::memory_space>>(cublas_workspace_bytes);
  return cublaslt_matmul(ctx.exec().cuda_stream(), call, workspace.data(), cublas_workspace_bytes);
}

// linear_forward in one cuBLASLt matmul (arguments checked); false where it cannot be one.
template <class X, class W, class Bias, class Y>
bool linear_forward_on_cublaslt(const ExecutionContext<Kokkos::Cuda>& ctx, const X& x, const W& w, const Bias& bias,
                                const Y& y, const LinearEpilogue<Y>& after) {
  CublasLtMatmul call;
  call.gemm.alpha = 1;
  call.bias = present(bias) ? bias.data() : nullptr;
  if (present(after.residual)) {  // C, beside D
    CublasMatrix residual;
    if (!cublas_matrix(after.residual, residual)) return false;
    call.c = residual.data;
    call.c_leading = residual.leading;
    call.gemm.beta = 1;
  }
  if (!present(after.gelu)) {
    call.epilogue = call.bias ? CublasEpilogue::bias : CublasEpilogue::none;
    return cublaslt_linear_in(ctx, true, x, w, y, call);
  }
  // D is GELU's output, its input (y) the epilogue's aux.
  call.epilogue = call.bias ? CublasEpilogue::gelu_aux_bias : CublasEpilogue::gelu_aux;
  call.aux = y.data();
  call.aux_leading = std::int64_t(y.stride(0));
  return cublaslt_linear_in(ctx, true, x, w, after.gelu, call);
}
#endif
}  // namespace detail

// y = x W^T + b (+ residual; then g = GELU(y), see LinearEpilogue) in `ctx`. An empty `bias`
// (no data) adds none (a tensor-parallel layer's partial product on all ranks but one).
template <class ExecSpace, class X, class W, class Bias, class Y>
void linear_forward(const ExecutionContext<ExecSpace>& ctx, const X& x, const W& w, const Bias& bias, const Y& y,
                    const LinearEpilogue<Y>& after = {}) {
  using T = scalar_of<Y>;
  static_assert(X::rank == 2 && W::rank == 2 && Bias::rank == 1 && Y::rank == 2,
                "linear_forward: x [rows, in], w [out, in], bias [out], y [rows, out]");
  static_assert(std::is_same_v<scalar_of<X>, T> && std::is_same_v<scalar_of<W>, T> && std::is_same_v<scalar_of<Bias>, T>,
                "linear_forward: x, w, bias and y hold one type");
  const char* where = "longattn::linear_forward";
  const std::int64_t rows = x.extent(0), in = x.extent(1), out = w.extent(0);
  check_extents(where, "w", w, {out, in}, "[out, in] with in the columns of x");
  check_extents(where, "y", y, {rows, out}, "[rows of x, rows of w]");
  const bool has_bias = detail::present(bias);
  if (has_bias) check_extents(where, "bias", bias, {out}, "[rows of w]");
  const bool has_residual = detail::present(after.residual), has_gelu = detail::present(after.gelu);
  if (has_residual) check_extents(where, "residual", after.residual, {rows, out}, "the extents of y");
  if (has_gelu) check_extents(where, "gelu", after.gelu, {rows, out}, "the extents of y");
  check_no_alias(where, "y", y, "x", x);
  check_no_alias(where, "y", y, "w", w);
  if (has_bias) check_no_alias(where, "y", y, "bias", bias);
  if (has_residual) check_no_alias(where, "y", y, "residual", after.residual);
  if (has_gelu) {
    check_no_alias(where, "gelu", after.gelu, "y", y);
    check_no_alias(where, "gelu", after.gelu, "x", x);
    if (has_residual) check_no_alias(where, "gelu", after.gelu, "residual", after.residual);
  }
  if (rows == 0 || out == 0) return;
  using Accumulate = accumulate_t<T>;
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (detail::on_cuda_tensor_cores<ExecSpace, T, X, W, Bias, Y>()) {
    const bool gelu_in_epilogue = has_gelu && cublaslt_gelu_in_use();
    if (detail::tensor_cores_take<T>() &&
        detail::linear_forward_on_cublaslt(ctx, x, w, bias, y, {after.residual, gelu_in_epilogue ? after.gelu : Y()})) {
      if (has_gelu && !gelu_in_epilogue) detail::gelu_forward(ctx.exec(), y, after.gelu);
      return;
    }
  }
#endif
  const ExecSpace& exec = ctx.exec();
  if (has_bias) detail::broadcast_rows(exec, bias, y);
  gemm(ctx, "N", "T", Accumulate(1), x, w, Accumulate(has_bias ? 1 : 0), y);
  if (has_residual) add_into(exec, y, after.residual);
  if (has_gelu) detail::gelu_forward(exec, y, after.gelu);
}

// dx = dy W, the gradient of a linear layer's input (dy [rows, out], W [out, in], dx [rows, in]);
// with `gelu_input` (u [rows, in], GELU's input where x = GELU(u)) then dx *= GELU'(u), the
// gradient of u.
template <class ExecSpace, class DY, class W, class DX>
void linear_input_gradient(const ExecutionContext<ExecSpace>& ctx, const DY& dy, const W& w, const DX& dx,
                           const DX& gelu_input = DX()) {
  using T = scalar_of<DX>;
  static_assert(DY::rank == 2 && W::rank == 2 && DX::rank == 2,
                "linear_input_gradient: dy [rows, out], w [out, in], dx [rows, in]");
  static_assert(std::is_same_v<scalar_of<DY>, T> && std::is_same_v<scalar_of<W>, T>,
                "linear_input_gradient: dy, w and dx hold one type");
  const char* where = "longattn::linear_input_gradient";
  const std::int64_t rows = dy.extent(0), out = dy.extent(1), in = w.extent(1);
  check_extents(where, "w", w, {out, in}, "[out, in] with out the columns of dy");
  check_extents(where, "dx", dx, {rows, in}, "[rows of dy, columns of w]");
  const bool has_gelu = detail::present(gelu_input);
  if (has_gelu) check_extents(where, "gelu_input", gelu_input, {rows, in}, "the extents of dx");
  check_no_alias(where, "dx", dx, "dy", dy);
  check_no_alias(where, "dx", dx, "w", w);
  if (has_gelu) check_no_alias(where, "dx", dx, "gelu_input", gelu_input);
  if (rows == 0 || in == 0) return;
  using Accumulate = accumulate_t<T>;
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (detail::on_cuda_tensor_cores<ExecSpace, T, DY, W, DX>()) {
    if (has_gelu && cublaslt_gelu_in_use() && detail::tensor_cores_take<T>()) {
      detail::CublasLtMatmul call;
      call.gemm.alpha = 1;
      call.epilogue = detail::CublasEpilogue::dgelu;
      call.aux = gelu_input.data();
      call.aux_leading = std::int64_t(gelu_input.stride(0));
      if (detail::cublaslt_linear_in(ctx, false, dy, w, dx, call)) return;
    }
  }
#endif
  gemm(ctx, "N", "N", Accumulate(1), dy, w, Accumulate(0), dx);
  if (has_gelu) detail::gelu_backward(ctx.exec(), gelu_input, dx);
}

}  // namespace longattn
