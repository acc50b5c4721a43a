#pragma once
// Naive double-precision C = alpha op(A) op(B) + beta C on host views: the reference the BLAS
// path is checked against.
#include <vector>

namespace longattn::test {

template <class AView, class BView, class CView>
std::vector<double> reference_gemm(bool trans_a, bool trans_b, double alpha, const AView& a, const BView& b,
                                   double beta, const CView& c) {
  const std::size_t m = c.extent(0), n = c.extent(1), k = trans_a ? a.extent(0) : a.extent(1);
  std::vector<double> out(m * n);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double sum = 0;
      for (std::size_t l = 0; l < k; ++l)
        sum += double(trans_a ? a(l, i) : a(i, l)) * double(trans_b ? b(j, l) : b(l, j));
      out[i * n + j] = alpha * sum + beta * double(c(i, j));
    }
  return out;
}

}  // namespace longattn::test
