// LayerNorm over the last dimension of a [rows, E] matrix, forward and backward:
//   y = (x - mean) * rstd * gamma + beta,   rstd = 1 / sqrt(var + eps)   (biased variance)
// Forward saves mean and rstd per row; backward recomputes x_hat from them and adds the
// parameters' gradients into dgamma and dbeta. Shapes are checked (longattn::Error). One thread per row (per column for the
// parameter gradients): rows are long enough (E values) to keep every thread busy on its own.
#pragma once

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>

#include "longattn/core/attention.hpp"  // detail::check_extents, check_no_alias
#include "longattn/error.hpp"

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

}  // namespace detail

template <class ExecSpace, class X, class Gamma, class Y, class Stats>
void layer_norm_forward(const ExecSpace& exec, const X& x, const Gamma& gamma, const Gamma& beta, double eps,
                        const Y& y, const Stats& mean, const Stats& rstd) {
  const char* where = "longattn::layer_norm_forward";
  detail::check_layer_norm(where, x, gamma, mean, rstd);
  detail::check_extents(where, "beta", beta, {std::int64_t(x.extent(1))}, "[E] of x");
  detail::check_extents(where, "y", y, {std::int64_t(x.extent(0)), std::int64_t(x.extent(1))}, "the extents of x");
  require(eps > 0 && std::isfinite(eps), where, "eps", eps, "a positive finite number");
  using T = typename Y::non_const_value_type;
  const int E = static_cast<int>(x.extent(1));
  const T epsilon = static_cast<T>(eps);
  Kokkos::parallel_for(
      "longattn::layer_norm_forward", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, x.extent(0)),
      KOKKOS_LAMBDA(std::int64_t r) {
        T sum = 0;
        for (int e = 0; e < E; ++e) sum += x(r, e);
        const T mu = sum / T(E);
        T squares = 0;
        for (int e = 0; e < E; ++e) squares += (x(r, e) - mu) * (x(r, e) - mu);
        const T inverse = T(1) / Kokkos::Experimental::sqrt(squares / T(E) + epsilon);
        for (int e = 0; e < E; ++e) y(r, e) = (x(r, e) - mu) * inverse * gamma(e) + beta(e);
        mean(r) = mu;
        rstd(r) = inverse;
      });
}

// dx = rstd (g - mean(g) - x_hat mean(g x_hat)) with g = dy * gamma;  dgamma += sum_rows dy x_hat,
// dbeta += sum_rows dy.
template <class ExecSpace, class DY, class X, class Gamma, class Stats, class DX, class DGamma>
void layer_norm_backward(const ExecSpace& exec, const DY& dy, const X& x, const Gamma& gamma, const Stats& mean,
                         const Stats& rstd, const DX& dx, const DGamma& dgamma, const DGamma& dbeta) {
  const char* where = "longattn::layer_norm_backward";
  detail::check_layer_norm(where, x, gamma, mean, rstd);
  const std::int64_t rows = x.extent(0), columns = x.extent(1);
  detail::check_extents(where, "dy", dy, {rows, columns}, "the extents of x");
  detail::check_extents(where, "dx", dx, {rows, columns}, "the extents of x");
  detail::check_extents(where, "dgamma", dgamma, {columns}, "[E] of x");
  detail::check_extents(where, "dbeta", dbeta, {columns}, "[E] of x");
  // dy is read again after dx is written (the parameter gradients).
  detail::check_no_alias(where, "dx", dx, "dy", dy);
  using T = typename DX::non_const_value_type;
  const int E = static_cast<int>(columns);
  Kokkos::parallel_for(
      "longattn::layer_norm_backward", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, rows),
      KOKKOS_LAMBDA(std::int64_t r) {
        const T mu = mean(r), inverse = rstd(r);
        T g_mean = 0, g_x_hat_mean = 0;
        for (int e = 0; e < E; ++e) {
          const T g = dy(r, e) * gamma(e);
          g_mean += g;
          g_x_hat_mean += g * (x(r, e) - mu) * inverse;
        }
        g_mean /= T(E);
        g_x_hat_mean /= T(E);
        for (int e = 0; e < E; ++e)
          dx(r, e) = inverse * (dy(r, e) * gamma(e) - g_mean - (x(r, e) - mu) * inverse * g_x_hat_mean);
      });
  Kokkos::parallel_for(
      "longattn::layer_norm_backward::parameters", Kokkos::RangePolicy<ExecSpace>(exec, 0, E), KOKKOS_LAMBDA(int e) {
        T sum_gamma = 0, sum_beta = 0;
        for (std::int64_t r = 0; r < rows; ++r) {
          sum_gamma += dy(r, e) * (x(r, e) - mean(r)) * rstd(r);
          sum_beta += dy(r, e);
        }
        dgamma(e) += sum_gamma;
        dbeta(e) += sum_beta;
      });
}

}  // namespace longattn
