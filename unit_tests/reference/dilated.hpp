#pragma once
// Naive dilated attention (LongNet) in double precision, written from the definition rather
// than from the kernel's passes: for each query and configuration, the keys it sees are listed
// position by position, their softmax formed, and the configurations combined as the modes say.
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "reference/attention.hpp"

namespace longattn::test {

struct ReferenceDilated {
  std::vector<std::int64_t> segment_lengths, dilation_rates;
  bool head_groups = false;  // false: longnet
  bool causal = false;
};

namespace detail {

// The configuration head h belongs to in head_groups mode: k groups, sizes as equal as
// possible, earlier groups one larger.
inline std::size_t head_group(std::size_t h, std::size_t heads, std::size_t groups) {
  std::size_t first = 0;
  for (std::size_t g = 0; g < groups; ++g) {
    const std::size_t size = heads / groups + (g < heads % groups ? 1 : 0);
    if (h < first + size) return g;
    first += size;
  }
  return groups;
}

// Keys query i of head h sees under configuration c (empty if i is not selected).
inline std::vector<std::size_t> dilated_keys(const ReferenceDilated& cfg, std::size_t c, std::size_t h,
                                             std::size_t i, std::size_t tokens) {
  const std::size_t w = cfg.segment_lengths[c], r = cfg.dilation_rates[c];
  const std::size_t offset = cfg.head_groups ? c % r : h % r;
  const std::size_t start = i / w * w, end = std::min(tokens, start + w);
  std::vector<std::size_t> keys;
  if ((i - start) % r != offset) return keys;
  for (std::size_t p = start + offset; p < end; p += r)
    if (!cfg.causal || p <= i) keys.push_back(p);
  return keys;
}

// The configurations query (h) attends through.
inline std::vector<std::size_t> configurations_of(const ReferenceDilated& cfg, std::size_t h, std::size_t heads) {
  const std::size_t k = cfg.segment_lengths.size();
  if (cfg.head_groups) return {head_group(h, heads, k)};
  std::vector<std::size_t> all(k);
  for (std::size_t c = 0; c < k; ++c) all[c] = c;
  return all;
}

inline double score(const HostTensor& q, const HostTensor& k, std::size_t b, std::size_t i, std::size_t j,
                    std::size_t h) {
  double s = 0;
  for (std::size_t d = 0; d < q.extent(3); ++d) s += q(b, i, h, d) * k(b, j, h, d);
  return s / std::sqrt(double(q.extent(3)));
}

}  // namespace detail

// o, lse as the definition states: longnet combines the configurations' outputs with weights
// proportional to their softmax denominators; head_groups takes the head's group's output / k.
inline void reference_dilated_forward(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                                      const HostTensor& o, const HostRows& lse, const ReferenceDilated& cfg) {
  const std::size_t B = q.extent(0), N = q.extent(1), H = q.extent(2), D = q.extent(3);
  const double groups = double(cfg.segment_lengths.size());
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < N; ++i) {
        // Per configuration: output O_c and denominator Z_c = e^{lse_c}.
        std::vector<std::vector<double>> outputs;
        std::vector<double> lses;
        for (std::size_t c : detail::configurations_of(cfg, h, H)) {
          const std::vector<std::size_t> keys = detail::dilated_keys(cfg, c, h, i, N);
          if (keys.empty()) continue;
          double top = -std::numeric_limits<double>::infinity();
          for (std::size_t j : keys) top = std::max(top, detail::score(q, k, b, i, j, h));
          double z = 0;
          std::vector<double> out(D, 0.0);
          for (std::size_t j : keys) {
            const double p = std::exp(detail::score(q, k, b, i, j, h) - top);
            z += p;
            for (std::size_t d = 0; d < D; ++d) out[d] += p * v(b, j, h, d);
          }
          for (double& x : out) x /= z;
          outputs.push_back(out);
          lses.push_back(top + std::log(z));
        }
        for (std::size_t d = 0; d < D; ++d) o(b, i, h, d) = 0;
        lse(b, h, i) = -std::numeric_limits<double>::infinity();
        if (lses.empty()) continue;
        if (cfg.head_groups) {
          for (std::size_t d = 0; d < D; ++d) o(b, i, h, d) = outputs[0][d] / groups;
          lse(b, h, i) = lses[0];
          continue;
        }
        const double top = *std::max_element(lses.begin(), lses.end());
        double total = 0;
        for (double l : lses) total += std::exp(l - top);
        for (std::size_t c = 0; c < lses.size(); ++c) {
          const double weight = std::exp(lses[c] - top) / total;
          for (std::size_t d = 0; d < D; ++d) o(b, i, h, d) += weight * outputs[c][d];
        }
        lse(b, h, i) = top + std::log(total);
      }
}

// Gradients of sum(d_o * o). longnet's o is one softmax over the multiset union of the
// configurations' keys (the denominator-weighted mix is exactly that), so the gradient is the
// softmax gradient over that list; head_groups' is its group's softmax gradient divided by k.
// (Checked against finite differences of reference_dilated_forward in the tests.)
inline void reference_dilated_backward(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                                       const HostTensor& d_o, const HostTensor& dq, const HostTensor& dk,
                                       const HostTensor& dv, const ReferenceDilated& cfg) {
  const std::size_t B = q.extent(0), N = q.extent(1), H = q.extent(2), D = q.extent(3);
  const double scale = 1.0 / std::sqrt(double(D));
  const double output_scale = cfg.head_groups ? 1.0 / double(cfg.segment_lengths.size()) : 1.0;
  Kokkos::deep_copy(dq, 0.0);
  Kokkos::deep_copy(dk, 0.0);
  Kokkos::deep_copy(dv, 0.0);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < N; ++i) {
        std::vector<std::size_t> keys;  // with repeats: one entry per (configuration, key)
        for (std::size_t c : detail::configurations_of(cfg, h, H))
          for (std::size_t j : detail::dilated_keys(cfg, c, h, i, N)) keys.push_back(j);
        if (keys.empty()) continue;
        std::vector<double> p(keys.size()), dp(keys.size());
        double top = -std::numeric_limits<double>::infinity();
        for (std::size_t e = 0; e < keys.size(); ++e) top = std::max(top, p[e] = detail::score(q, k, b, i, keys[e], h));
        double z = 0;
        for (double& x : p) z += (x = std::exp(x - top));
        double row = 0;  // sum_e p_e dP_e
        for (std::size_t e = 0; e < keys.size(); ++e) {
          p[e] /= z;
          dp[e] = 0;
          for (std::size_t d = 0; d < D; ++d) dp[e] += output_scale * d_o(b, i, h, d) * v(b, keys[e], h, d);
          row += p[e] * dp[e];
        }
        for (std::size_t e = 0; e < keys.size(); ++e) {
          const double ds = p[e] * (dp[e] - row);
          for (std::size_t d = 0; d < D; ++d) {
            dv(b, keys[e], h, d) += p[e] * output_scale * d_o(b, i, h, d);
            dq(b, i, h, d) += scale * ds * k(b, keys[e], h, d);
            dk(b, keys[e], h, d) += scale * ds * q(b, i, h, d);
          }
        }
      }
}

}  // namespace longattn::test
