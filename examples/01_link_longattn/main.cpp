// Example 01: link longattn from another CMake project and call it.
// Multiplies two small matrices with longattn::gemm (Kokkos Kernels -> BLAS) and checks the
// result against a plain loop.
#include <cmath>
#include <cstdio>

#include "longattn/longattn.hpp"  // everything longattn::core offers

int main(int argc, char* argv[]) {
  longattn::ScopeGuard guard(argc, argv);  // Kokkos up; the process's BLAS left as it is
  const auto build = longattn::build_info();
  std::printf("longattn %s on Kokkos %s (%s)\n", build.version.c_str(), build.kokkos_version.c_str(),
              build.default_execution_space.c_str());

  const int m = 3, k = 4, n = 2;
  Kokkos::View<double**, Kokkos::LayoutRight, Kokkos::HostSpace> a("A", m, k), b("B", k, n), c("C", m, n);
  for (int i = 0; i < m; ++i)
    for (int l = 0; l < k; ++l) a(i, l) = i + 0.5 * l;
  for (int l = 0; l < k; ++l)
    for (int j = 0; j < n; ++j) b(l, j) = 1.0 - l + j;

  longattn::gemm(Kokkos::DefaultHostExecutionSpace(), "N", "N", 1.0, a, b, 0.0, c);  // C = A B

  double worst = 0;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double expected = 0;
      for (int l = 0; l < k; ++l) expected += a(i, l) * b(l, j);
      worst = std::fmax(worst, std::fabs(c(i, j) - expected));
    }
  std::printf("C = A B %s (largest error %.1e, BLAS kernels %s)\n", worst < 1e-12 ? "matches" : "DIFFERS", worst,
              longattn::blas_runtime().kernels.c_str());
  return worst < 1e-12 ? 0 : 1;
}
