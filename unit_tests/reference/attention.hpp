#pragma once
// Naive softmax attention in double precision: the reference the fused kernels are checked
// against. Every score is formed, so memory is O(N^2) per row block; only for test sizes.
// Tensors are host views [B, N, H, D]; lse is [B, H, Nq]; causal masking by global position
// (key_offset + j > query_offset + i is masked) and by an optional token mask (block-sparse
// patterns), a query that sees no key gets o = 0, lse = -inf.
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace longattn::test {

using HostTensor = Kokkos::View<double****, Kokkos::LayoutRight, Kokkos::HostSpace>;
using HostRows = Kokkos::View<double***, Kokkos::LayoutRight, Kokkos::HostSpace>;

struct ReferenceOptions {
  double scale = 0;  // 0: 1 / sqrt(D)
  bool causal = false;
  std::int64_t query_offset = 0, key_offset = 0;
  // mask(b, h, i, j): whether query i of (b, h) may see key j at all (empty: every key).
  std::function<bool(std::size_t, std::size_t, std::size_t, std::size_t)> mask;
};

namespace detail {
inline double scale_of(const ReferenceOptions& opts, std::size_t head_dim) {
  return opts.scale != 0 ? opts.scale : 1.0 / std::sqrt(double(head_dim));
}
inline bool visible(const ReferenceOptions& opts, std::size_t b, std::size_t h, std::size_t i, std::size_t j) {
  return (!opts.causal || opts.key_offset + std::int64_t(j) <= opts.query_offset + std::int64_t(i)) &&
         (!opts.mask || opts.mask(b, h, i, j));
}

// Probabilities of query i of (b, h) over all keys (0 where masked); returns false if it sees none.
inline bool reference_probabilities(const HostTensor& q, const HostTensor& k, const ReferenceOptions& opts,
                                    std::size_t b, std::size_t h, std::size_t i, std::vector<double>& p,
                                    double& lse) {
  const std::size_t Nk = k.extent(1), D = q.extent(3);
  const double scale = scale_of(opts, D);
  double top = -std::numeric_limits<double>::infinity();
  p.assign(Nk, 0.0);
  for (std::size_t j = 0; j < Nk; ++j) {
    if (!visible(opts, b, h, i, j)) continue;
    double s = 0;
    for (std::size_t d = 0; d < D; ++d) s += q(b, i, h, d) * k(b, j, h, d);
    p[j] = s * scale;
    top = std::max(top, p[j]);
  }
  if (top == -std::numeric_limits<double>::infinity()) {
    lse = top;
    return false;
  }
  double sum = 0;
  for (std::size_t j = 0; j < Nk; ++j) sum += visible(opts, b, h, i, j) ? std::exp(p[j] - top) : 0.0;
  lse = top + std::log(sum);
  for (std::size_t j = 0; j < Nk; ++j) p[j] = visible(opts, b, h, i, j) ? std::exp(p[j] - lse) : 0.0;
  return true;
}
}  // namespace detail

inline void reference_attention_forward(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                                        const HostTensor& o, const HostRows& lse,
                                        const ReferenceOptions& opts) {
  const std::size_t B = q.extent(0), Nq = q.extent(1), H = q.extent(2), D = q.extent(3), Nk = k.extent(1);
  std::vector<double> p;
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < Nq; ++i) {
        detail::reference_probabilities(q, k, opts, b, h, i, p, lse(b, h, i));
        for (std::size_t d = 0; d < D; ++d) {
          double sum = 0;
          for (std::size_t j = 0; j < Nk; ++j) sum += p[j] * v(b, j, h, d);
          o(b, i, h, d) = sum;
        }
      }
}

// Gradients of sum(dO * O) with respect to q, k, v (written, not accumulated).
inline void reference_attention_backward(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                                         const HostTensor& d_o, const HostTensor& dq,
                                         const HostTensor& dk, const HostTensor& dv,
                                         const ReferenceOptions& opts) {
  const std::size_t B = q.extent(0), Nq = q.extent(1), H = q.extent(2), D = q.extent(3), Nk = k.extent(1);
  const double scale = detail::scale_of(opts, D);
  Kokkos::deep_copy(dq, 0.0);
  Kokkos::deep_copy(dk, 0.0);
  Kokkos::deep_copy(dv, 0.0);
  std::vector<double> p, dp;
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < Nq; ++i) {
        double lse;
        if (!detail::reference_probabilities(q, k, opts, b, h, i, p, lse)) continue;
        dp.assign(Nk, 0.0);
        double row = 0;  // sum_j P_ij dP_ij
        for (std::size_t j = 0; j < Nk; ++j) {
          for (std::size_t d = 0; d < D; ++d) dp[j] += d_o(b, i, h, d) * v(b, j, h, d);
          row += p[j] * dp[j];
        }
        for (std::size_t j = 0; j < Nk; ++j) {
          const double ds = p[j] * (dp[j] - row);
          for (std::size_t d = 0; d < D; ++d) {
            dv(b, j, h, d) += p[j] * d_o(b, i, h, d);
            dq(b, i, h, d) += scale * ds * k(b, j, h, d);
            dk(b, j, h, d) += scale * ds * q(b, i, h, d);
          }
        }
      }
}

}  // namespace longattn::test
