// LayerNorm over the last dimension of a [rows, E] matrix, forward and backward:
//   y = (x - mean) * rstd * gamma + beta,   rstd = 1 / sqrt(var + eps)   (biased variance)
// Forward saves mean and rstd per row; backward recomputes x_hat from them and adds the
// parameters' gradients into dgamma and dbeta. A pre-norm transformer's residual connections
// fuse into the norm's pass over a row: residual_layer_norm_forward adds the residual into x
// before normalizing it, residual_layer_norm_backward adds the residual branch's gradient as it
// writes dx (one kernel and one pass over the rows instead of two each). x, y, dy, dx, gamma and beta hold one storage type
// T (float, double, bfloat16 or float16); the statistics, dgamma and dbeta hold accumulate_t<T>,
// in which every sum is taken (float for the 16-bit types: mixed precision). Shapes are checked
// (longattn::Error). One thread per row (per column for the parameter gradients): rows are long
// enough (E values) to keep every thread busy on its own.
// Features split over a FeatureGroup (tensor parallelism): the overloads taking a group.
#pragma once

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "longattn/core/attention.hpp"  // longattn::check_extents, check_no_alias, scalar_of
#include "longattn/core/detail/column_sums.hpp"
#include "longattn/core/detail/eti.hpp"
#include "longattn/core/execution_context.hpp"
#include "longattn/core/feature_group.hpp"
#include "longattn/error.hpp"
#include "longattn/kokkos_compat.hpp"

namespace longattn {

namespace detail {

// Shapes both passes share: x [rows, E], gamma [E], mean and rstd [rows].
template <class X, class Gamma, class Stats>
void check_layer_norm(const char* where, const X& x, const Gamma& gamma, const Stats& mean, const Stats& rstd) {
  static_assert(X::rank == 2 && Gamma::rank == 1 && Stats::rank == 1,
                "layer norm: x is [rows, E], gamma and beta [E], mean and rstd [rows]");
  const std::int64_t rows = x.extent(0), E = x.extent(1);
  require(E > 0, where, "x.extent(1)", E, "at least 1 value per row");
  check_extents(where, "gamma", gamma, {E}, "[E] of x");
  check_extents(where, "mean", mean, {rows}, "[rows] of x");
  check_extents(where, "rstd", rstd, {rows}, "[rows] of x");
}

// And backward's: dy and dx as x, dgamma and dbeta as gamma.
template <class DY, class X, class Gamma, class Stats, class DX, class DGamma>
void check_layer_norm_backward(const char* where, const DY& dy, const X& x, const Gamma& gamma, const Stats& mean,
                               const Stats& rstd, const DX& dx, const DGamma& dgamma, const DGamma& dbeta) {
  check_layer_norm(where, x, gamma, mean, rstd);
  const std::int64_t rows = x.extent(0), columns = x.extent(1);
  longattn::check_extents(where, "dy", dy, {rows, columns}, "the extents of x");
  longattn::check_extents(where, "dx", dx, {rows, columns}, "the extents of x");
  longattn::check_extents(where, "dgamma", dgamma, {columns}, "[E] of x");
  longattn::check_extents(where, "dbeta", dbeta, {columns}, "[E] of x");
  // dy is read again after dx is written (the parameter gradients).
  longattn::check_no_alias(where, "dx", dx, "dy", dy);
}

// Backward's two sums over row r's E columns: of g = dy gamma and of g x_hat.
template <class DY, class X, class Gamma, class A>
KOKKOS_INLINE_FUNCTION void layer_norm_row_sums(const DY& dy, const X& x, const Gamma& gamma, A mu, A inverse,
                                                std::int64_t r, int E, A& g_sum, A& g_x_hat_sum) {
  for (int e = 0; e < E; ++e) {
    const A g = A(dy(r, e)) * A(gamma(e));
    g_sum += g;
    g_x_hat_sum += g * (A(x(r, e)) - mu) * inverse;
  }
}
// dx of row r from the means of those sums over the features: rstd (g - mean(g) - x_hat mean(g x_hat)),
// plus residual's row where it has one (residual_layer_norm_backward).
template <class DY, class X, class Gamma, class A, class DX, class Residual>
KOKKOS_INLINE_FUNCTION void layer_norm_row_dx(const DY& dy, const X& x, const Gamma& gamma, A mu, A inverse,
                                              std::int64_t r, int E, A g_mean, A g_x_hat_mean, const DX& dx,
                                              const Residual& residual) {
  using T = typename DX::non_const_value_type;
  const auto norm_dx = [&](int e) {
    return inverse * (A(dy(r, e)) * A(gamma(e)) - g_mean - (A(x(r, e)) - mu) * inverse * g_x_hat_mean);
  };
  if (residual.data() == nullptr)  // two loops, each without a branch: both vectorize
    for (int e = 0; e < E; ++e) dx(r, e) = T(norm_dx(e));
  else
    for (int e = 0; e < E; ++e) dx(r, e) = T(norm_dx(e) + A(residual(r, e)));
}

// dgamma += sum_rows dy x_hat, dbeta += sum_rows dy: on a host a thread per column, rows in
// order; on a device in teams (detail/column_sums.hpp).
template <class ExecSpace, class DY, class X, class Stats, class DGamma>
void layer_norm_parameter_gradients(const ExecSpace& exec, const DY& dy, const X& x, const Stats& mean,
                                    const Stats& rstd, const DGamma& dgamma, const DGamma& dbeta) {
  using A = typename DGamma::non_const_value_type;
  const std::int64_t rows = x.extent(0);
  if constexpr (!Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible) {
    detail::device_column_sums<2, A>(
        "longattn::layer_norm_backward::parameters", exec, rows, int(x.extent(1)),
        KOKKOS_LAMBDA(std::int64_t r, int e, A(&sums)[2]) {
          sums[0] += A(dy(r, e)) * (A(x(r, e)) - mean(r)) * rstd(r);
          sums[1] += A(dy(r, e));
        },
        KOKKOS_LAMBDA(int e, const A(&sums)[2]) {
          dgamma(e) += sums[0];
          dbeta(e) += sums[1];
        });
    return;
  }
  Kokkos::parallel_for(
      "longattn::layer_norm_backward::parameters", Kokkos::RangePolicy<ExecSpace>(exec, 0, int(x.extent(1))),
      KOKKOS_LAMBDA(int e) {
        A sum_gamma = 0, sum_beta = 0;
        for (std::int64_t r = 0; r < rows; ++r) {
          sum_gamma += A(dy(r, e)) * (A(x(r, e)) - mean(r)) * rstd(r);
          sum_beta += A(dy(r, e));
        }
        dgamma(e) += sum_gamma;
        dbeta(e) += sum_beta;
      });
}

// The compiled entry points under layer_norm_forward and layer_norm_backward, per execution
// space, scalar T and layout: LayoutRight when every matrix is row-major and contiguous (the
// common case: loops over a row vectorize), LayoutStride otherwise. Members out of line: see
// AttentionKernels.
template <class ExecSpace, class T, class Layout>
struct LayerNormKernels {
  using A = accumulate_t<T>;
  using Memory = typename ExecSpace::memory_space;
  using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  template <class Value>
  using Matrix = Kokkos::View<Value**, Layout, Memory, Unmanaged>;
  template <class Value>
  using Vector = Kokkos::View<Value*, Kokkos::LayoutStride, Memory, Unmanaged>;

  // With a residual (else an empty view), sum = x + residual first and the norm of sum (sum may be x).
  static void forward(const ExecSpace& exec, const Matrix<const T>& x, const Matrix<const T>& residual,
                      const Matrix<T>& sum, const Vector<const T>& gamma, const Vector<const T>& beta, A epsilon,
                      const Matrix<T>& y, const Vector<A>& mean, const Vector<A>& rstd);
  // With a residual (else an empty view), dx = the norm's dx + residual.
  static void backward(const ExecSpace& exec, const Matrix<const T>& dy, const Matrix<const T>& x,
                       const Vector<const T>& gamma, const Vector<const A>& mean, const Vector<const A>& rstd,
                       const Matrix<const T>& residual, const Matrix<T>& dx, const Vector<A>& dgamma,
                       const Vector<A>& dbeta);

  // A [rows, E] view of any layout as this class's matrix (its strides kept).
  template <class Value, class View>
  static Matrix<Value> matrix(const View& view) {
    if constexpr (std::is_same_v<Layout, Kokkos::LayoutRight>)
      return Matrix<Value>(view.data(), view.extent(0), view.extent(1));
    else
      return Matrix<Value>(view.data(), Kokkos::LayoutStride(view.extent(0), view.stride(0), view.extent(1),
                                                             view.stride(1)));
  }
  template <class Value, class View>
  static Vector<Value> vector(const View& view) {
    return Vector<Value>(view.data(), Kokkos::LayoutStride(view.extent(0), view.stride(0)));
  }
};

template <class ExecSpace, class T, class Layout>
void LayerNormKernels<ExecSpace, T, Layout>::forward(const ExecSpace& exec, const Matrix<const T>& x,
                                                     const Matrix<const T>& residual, const Matrix<T>& sum,
                                                     const Vector<const T>& gamma, const Vector<const T>& beta,
                                                     A epsilon, const Matrix<T>& y, const Vector<A>& mean,
                                                     const Vector<A>& rstd) {
  const int E = static_cast<int>(x.extent(1));
  const bool add = residual.data() != nullptr;
  const Matrix<const T> input = add ? Matrix<const T>(sum) : x;  // what is normalized, in T
  Kokkos::parallel_for(
      "longattn::layer_norm_forward", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, x.extent(0)),
      KOKKOS_LAMBDA(std::int64_t r) {
        A total = 0;
        if (add) {
          for (int e = 0; e < E; ++e) {
            const T value = T(A(x(r, e)) + A(residual(r, e)));
            sum(r, e) = value;
            total += A(value);
          }
        } else {
          for (int e = 0; e < E; ++e) total += A(x(r, e));
        }
        const A mu = total / A(E);
        A squares = 0;
        for (int e = 0; e < E; ++e) squares += (A(input(r, e)) - mu) * (A(input(r, e)) - mu);
        const A inverse = A(1) / math::sqrt(squares / A(E) + epsilon);
        for (int e = 0; e < E; ++e) y(r, e) = T((A(input(r, e)) - mu) * inverse * A(gamma(e)) + A(beta(e)));
        mean(r) = mu;
        rstd(r) = inverse;
      });
}

// dx = rstd (g - mean(g) - x_hat mean(g x_hat)) with g = dy * gamma;  dgamma += sum_rows dy x_hat,
// dbeta += sum_rows dy.
template <class ExecSpace, class T, class Layout>
void LayerNormKernels<ExecSpace, T, Layout>::backward(const ExecSpace& exec, const Matrix<const T>& dy,
                                                      const Matrix<const T>& x, const Vector<const T>& gamma,
                                                      const Vector<const A>& mean, const Vector<const A>& rstd,
                                                      const Matrix<const T>& residual, const Matrix<T>& dx,
                                                      const Vector<A>& dgamma, const Vector<A>& dbeta) {
  const std::int64_t rows = x.extent(0);
  const int E = static_cast<int>(x.extent(1));
  Kokkos::parallel_for(
      "longattn::layer_norm_backward", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, rows),
      KOKKOS_LAMBDA(std::int64_t r) {
        A g_sum = 0, g_x_hat_sum = 0;
        layer_norm_row_sums(dy, x, gamma, mean(r), rstd(r), r, E, g_sum, g_x_hat_sum);
        layer_norm_row_dx(dy, x, gamma, mean(r), rstd(r), r, E, g_sum / A(E), g_x_hat_sum / A(E), dx, residual);
      });
  detail::layer_norm_parameter_gradients(exec, dy, x, mean, rstd, dgamma, dbeta);
}

// Compiled into liblongattn_core for both layouts (detail/eti.hpp).
#define LONGATTN_LAYER_NORM_ETI(SPACE, T)                                     \
  extern template struct LayerNormKernels<SPACE, T, Kokkos::LayoutRight>; \
  extern template struct LayerNormKernels<SPACE, T, Kokkos::LayoutStride>;
LONGATTN_ETI_FOR_EACH(LONGATTN_ETI_STORAGE_TYPES, LONGATTN_LAYER_NORM_ETI)
#undef LONGATTN_LAYER_NORM_ETI

// Whether every matrix is row-major with contiguous rows (then the LayoutRight kernels run).
template <class... Matrices>
bool row_major(const Matrices&... matrices) {
  return ((matrices.stride(1) == 1 &&
           (matrices.extent(0) <= 1 || std::size_t(matrices.stride(0)) == matrices.extent(1))) && ...);
}

// The checks and the layout choice of both forward entry points; residual and sum empty views
// (nullptr_t) for the plain norm.
template <class ExecSpace, class X, class Residual, class Gamma, class Y, class Stats>
void layer_norm_forward(const char* where, const ExecSpace& exec, const X& x, const Residual& residual,
                        const Gamma& gamma, const Gamma& beta, double eps, const Y& y, const Stats& mean,
                        const Stats& rstd) {
  static_assert(std::is_same_v<longattn::scalar_of<X>, longattn::scalar_of<Y>> &&
                    std::is_same_v<longattn::scalar_of<X>, longattn::scalar_of<Gamma>> &&
                    std::is_same_v<accumulate_t<longattn::scalar_of<X>>, longattn::scalar_of<Stats>>,
                "layer_norm_forward: x, gamma, beta and y hold one storage type T, mean and rstd accumulate_t<T>");
  constexpr bool fused = !std::is_same_v<Residual, std::nullptr_t>;
  check_layer_norm(where, x, gamma, mean, rstd);
  const std::int64_t rows = x.extent(0), columns = x.extent(1);
  longattn::check_extents(where, "beta", beta, {columns}, "[E] of x");
  longattn::check_extents(where, "y", y, {rows, columns}, "the extents of x");
  require(eps > 0 && std::isfinite(eps), where, "eps", eps, "a positive finite number");
  using T = longattn::scalar_of<Y>;
  using A = accumulate_t<T>;
  const auto run = [&](auto kernels) {
    using K = decltype(kernels);
    typename K::template Matrix<const T> residual_matrix;
    typename K::template Matrix<T> sum_matrix;  // x + residual, written over x
    if constexpr (fused) {
      residual_matrix = K::template matrix<const T>(residual);
      sum_matrix = K::template matrix<T>(x);
    }
    K::forward(exec, K::template matrix<const T>(x), residual_matrix, sum_matrix, K::template vector<const T>(gamma),
               K::template vector<const T>(beta), static_cast<A>(eps), K::template matrix<T>(y),
               K::template vector<A>(mean), K::template vector<A>(rstd));
  };
  bool row_major_views = row_major(x, y);
  if constexpr (fused) {
    static_assert(std::is_same_v<longattn::scalar_of<Residual>, longattn::scalar_of<X>> &&
                      !std::is_const_v<typename X::value_type>,
                  "residual_layer_norm_forward: x (written: x + residual) and residual hold one storage type T");
    longattn::check_extents(where, "residual", residual, {rows, columns}, "the extents of x");
    longattn::check_no_alias(where, "residual", residual, "x", x);
    longattn::check_no_alias(where, "y", y, "residual", residual);
    row_major_views = row_major_views && row_major(residual);
  }
  if (row_major_views) run(LayerNormKernels<ExecSpace, T, Kokkos::LayoutRight>{});
  else run(LayerNormKernels<ExecSpace, T, Kokkos::LayoutStride>{});
}

// And both backward entry points; residual nullptr_t for the plain norm.
template <class ExecSpace, class DY, class X, class Gamma, class Stats, class Residual, class DX, class DGamma>
void layer_norm_backward(const char* where, const ExecSpace& exec, const DY& dy, const X& x, const Gamma& gamma,
                         const Stats& mean, const Stats& rstd, const Residual& residual, const DX& dx,
                         const DGamma& dgamma, const DGamma& dbeta) {
  static_assert(std::is_same_v<longattn::scalar_of<X>, longattn::scalar_of<DY>> &&
                    std::is_same_v<longattn::scalar_of<X>, longattn::scalar_of<Gamma>> &&
                    std::is_same_v<longattn::scalar_of<X>, longattn::scalar_of<DX>> &&
                    std::is_same_v<accumulate_t<longattn::scalar_of<X>>, longattn::scalar_of<Stats>> &&
                    std::is_same_v<accumulate_t<longattn::scalar_of<X>>, longattn::scalar_of<DGamma>>,
                "layer_norm_backward: dy, x, gamma and dx hold one storage type T, mean, rstd, dgamma and dbeta "
                "accumulate_t<T>");
  constexpr bool fused = !std::is_same_v<Residual, std::nullptr_t>;
  check_layer_norm_backward(where, dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
  using T = longattn::scalar_of<DX>;
  using A = accumulate_t<T>;
  const auto run = [&](auto kernels) {
    using K = decltype(kernels);
    typename K::template Matrix<const T> residual_matrix;
    if constexpr (fused) residual_matrix = K::template matrix<const T>(residual);
    K::backward(exec, K::template matrix<const T>(dy), K::template matrix<const T>(x),
                K::template vector<const T>(gamma), K::template vector<const A>(mean),
                K::template vector<const A>(rstd), residual_matrix, K::template matrix<T>(dx),
                K::template vector<A>(dgamma), K::template vector<A>(dbeta));
  };
  bool row_major_views = row_major(dy, x, dx);
  if constexpr (fused) {
    static_assert(std::is_same_v<longattn::scalar_of<Residual>, longattn::scalar_of<DX>>,
                  "residual_layer_norm_backward: residual and dx hold one storage type T");
    longattn::check_extents(where, "residual", residual, {std::int64_t(x.extent(0)), std::int64_t(x.extent(1))},
                            "the extents of x");
    longattn::check_no_alias(where, "dx", dx, "residual", residual);
    row_major_views = row_major_views && row_major(residual);
  }
  if (row_major_views) run(LayerNormKernels<ExecSpace, T, Kokkos::LayoutRight>{});
  else run(LayerNormKernels<ExecSpace, T, Kokkos::LayoutStride>{});
}

}  // namespace detail

template <class ExecSpace, class X, class Gamma, class Y, class Stats>
void layer_norm_forward(const ExecSpace& exec, const X& x, const Gamma& gamma, const Gamma& beta, double eps,
                        const Y& y, const Stats& mean, const Stats& rstd) {
  detail::layer_norm_forward("longattn::layer_norm_forward", exec, x, nullptr, gamma, beta, eps, y, mean, rstd);
}

// x += residual (rounded to T), then y = LayerNorm(x): a pre-norm block's residual connection
// and the norm after it. residual overlaps neither x nor y.
template <class ExecSpace, class X, class Residual, class Gamma, class Y, class Stats>
void residual_layer_norm_forward(const ExecSpace& exec, const X& x, const Residual& residual, const Gamma& gamma,
                                 const Gamma& beta, double eps, const Y& y, const Stats& mean, const Stats& rstd) {
  detail::layer_norm_forward("longattn::residual_layer_norm_forward", exec, x, residual, gamma, beta, eps, y, mean,
                             rstd);
}

template <class ExecSpace, class DY, class X, class Gamma, class Stats, class DX, class DGamma>
void layer_norm_backward(const ExecSpace& exec, const DY& dy, const X& x, const Gamma& gamma, const Stats& mean,
                         const Stats& rstd, const DX& dx, const DGamma& dgamma, const DGamma& dbeta) {
  detail::layer_norm_backward("longattn::layer_norm_backward", exec, dy, x, gamma, mean, rstd, nullptr, dx, dgamma,
                              dbeta);
}

// layer_norm_backward with dx = the norm's input gradient + residual (the gradient that reaches
// the norm's input around it, through the residual connection). residual does not overlap dx.
template <class ExecSpace, class DY, class X, class Gamma, class Stats, class Residual, class DX, class DGamma>
void residual_layer_norm_backward(const ExecSpace& exec, const DY& dy, const X& x, const Gamma& gamma,
                                  const Stats& mean, const Stats& rstd, const Residual& residual, const DX& dx,
                                  const DGamma& dgamma, const DGamma& dbeta) {
  detail::layer_norm_backward("longattn::residual_layer_norm_backward", exec, dy, x, gamma, mean, rstd, residual, dx,
                              dgamma, dbeta);
}

// LayerNorm over features split across a FeatureGroup of P ranks (tensor parallelism): x, y, dy
// and dx hold this rank's [rows, E / P] columns, gamma and beta (and their gradients) its part.
// The row statistics are sums over the group - forward: the sum, then the centered squares (two
// passes, as above); backward: sum(g) and sum(g x_hat) - so each rank computes its columns of
// what one rank holding all E features computes. Row-major contiguous matrices (a module's
// activations); backward's two sums per row come from ctx's pool.
template <class ExecSpace, class X, class Gamma, class Y, class Stats>
void layer_norm_forward(const ExecutionContext<ExecSpace>& ctx, const FeatureGroup<ExecSpace>& group, const X& x,
                        const Gamma& gamma, const Gamma& beta, double eps, const Y& y, const Stats& mean,
                        const Stats& rstd) {
  using T = longattn::scalar_of<Y>;
  using A = accumulate_t<T>;
  static_assert(std::is_same_v<accumulate_t<longattn::scalar_of<X>>, A> &&
                    std::is_same_v<longattn::scalar_of<Stats>, A>,
                "layer_norm_forward: x and y hold one storage type T, mean and rstd accumulate_t<T>");
  const char* where = "longattn::layer_norm_forward (features split)";
  detail::check_layer_norm(where, x, gamma, mean, rstd);
  longattn::check_extents(where, "beta", beta, {std::int64_t(x.extent(1))}, "[E / P] of x");
  longattn::check_extents(where, "y", y, {std::int64_t(x.extent(0)), std::int64_t(x.extent(1))}, "the extents of x");
  require(detail::row_major(x, y), where, "x, y", "strided views", "row-major contiguous matrices");
  require(eps > 0 && std::isfinite(eps), where, "eps", eps, "a positive finite number");
  const ExecSpace& exec = ctx.exec();
  const int E = int(x.extent(1));
  const A features = A(double(E) * group.size()), epsilon = A(eps);
  using Rows = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
  Kokkos::parallel_for(
      "longattn::layer_norm_forward::sums", Rows(exec, 0, x.extent(0)), KOKKOS_LAMBDA(std::int64_t r) {
        A sum = 0;
        for (int e = 0; e < E; ++e) sum += A(x(r, e));
        mean(r) = sum;
      });
  group.sum(exec, mean.data(), mean.extent(0));
  Kokkos::parallel_for(
      "longattn::layer_norm_forward::squares", Rows(exec, 0, x.extent(0)), KOKKOS_LAMBDA(std::int64_t r) {
        const A mu = mean(r) / features;
        A squares = 0;
        for (int e = 0; e < E; ++e) squares += (A(x(r, e)) - mu) * (A(x(r, e)) - mu);
        mean(r) = mu;
        rstd(r) = squares;
      });
  group.sum(exec, rstd.data(), rstd.extent(0));
  Kokkos::parallel_for(
      "longattn::layer_norm_forward::normalize", Rows(exec, 0, x.extent(0)), KOKKOS_LAMBDA(std::int64_t r) {
        const A mu = mean(r), inverse = A(1) / math::sqrt(rstd(r) / features + epsilon);
        for (int e = 0; e < E; ++e) y(r, e) = T((A(x(r, e)) - mu) * inverse * A(gamma(e)) + A(beta(e)));
        rstd(r) = inverse;
      });
}

template <class ExecSpace, class DY, class X, class Gamma, class Stats, class DX, class DGamma>
void layer_norm_backward(const ExecutionContext<ExecSpace>& ctx, const FeatureGroup<ExecSpace>& group, const DY& dy,
                         const X& x, const Gamma& gamma, const Stats& mean, const Stats& rstd, const DX& dx,
                         const DGamma& dgamma, const DGamma& dbeta) {
  using T = longattn::scalar_of<DX>;
  using A = accumulate_t<T>;
  const char* where = "longattn::layer_norm_backward (features split)";
  detail::check_layer_norm_backward(where, dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
  require(detail::row_major(dy, x, dx), where, "dy, x, dx", "strided views", "row-major contiguous matrices");
  const std::int64_t rows = x.extent(0), columns = x.extent(1);
  const ExecSpace& exec = ctx.exec();
  const int E = int(columns);
  const A features = A(double(E) * group.size());
  // sums(r, 0) = sum_e g, sums(r, 1) = sum_e g x_hat over the row's columns, then over the group.
  const memory::CategoryScope scope(memory::Category::workspaces);
  const auto sums = ctx.template allocate<Kokkos::View<A**, Kokkos::LayoutRight, typename ExecSpace::memory_space>>(
      std::size_t(rows), std::size_t(2));
  const auto s = sums.view();
  using Rows = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
  Kokkos::parallel_for(
      "longattn::layer_norm_backward::sums", Rows(exec, 0, rows), KOKKOS_LAMBDA(std::int64_t r) {
        A g_sum = 0, g_x_hat_sum = 0;
        detail::layer_norm_row_sums(dy, x, gamma, mean(r), rstd(r), r, E, g_sum, g_x_hat_sum);
        s(r, 0) = g_sum;
        s(r, 1) = g_x_hat_sum;
      });
  group.sum(exec, s.data(), s.size());
  Kokkos::parallel_for(
      "longattn::layer_norm_backward::dx", Rows(exec, 0, rows), KOKKOS_LAMBDA(std::int64_t r) {
        detail::layer_norm_row_dx(dy, x, gamma, mean(r), rstd(r), r, E, s(r, 0) / features, s(r, 1) / features, dx,
                                  DX());
      });
  detail::layer_norm_parameter_gradients(exec, dy, x, mean, rstd, dgamma, dbeta);
}

}  // namespace longattn
