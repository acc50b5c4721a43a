// A program that links longattn and does not ask for BLAS kernel selection keeps its BLAS as it
// was: loading liblongattn_core, a default ScopeGuard and gemm calls change neither
// OPENBLAS_CORETYPE nor OpenBLAS's kernels; select_blas_kernels() does, when called. Its own
// main (not the Catch2 runner, whose ScopeGuard asks for the selection). CTest runs it with
// OPENBLAS_CORETYPE unset.
#include <Kokkos_Core.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "longattn/core/blas.hpp"
#include "longattn/core/gemm.hpp"
#include "longattn/core/runtime.hpp"

namespace {
int failures = 0;
void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAILED", what.c_str());
  failures += ok ? 0 : 1;
}
}  // namespace

int main(int argc, char* argv[]) {
  if (std::getenv("OPENBLAS_CORETYPE")) {
    std::printf("FAILED: run with OPENBLAS_CORETYPE unset\n");
    return 1;
  }
  {
    longattn::ScopeGuard guard(argc, argv);
    const std::string kernels_at_start = longattn::blas_runtime().kernels;
    Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace> a("A", 8, 8), c("C", 8, 8);
    Kokkos::deep_copy(a, 1.0f);
    longattn::gemm(Kokkos::DefaultHostExecutionSpace(), "N", "N", 1.0f, a, a, 0.0f, c);
    const auto untouched = longattn::blas_runtime();
    check(c(7, 7) == 8.0f, "gemm computes C = A A");
    check(std::getenv("OPENBLAS_CORETYPE") == nullptr, "OPENBLAS_CORETYPE still unset after load, ScopeGuard, gemm");
    check(untouched.kernels == kernels_at_start, "kernels unchanged: " + untouched.kernels);
    check(untouched.selection.find("not called") != std::string::npos, "selection: " + untouched.selection);

    longattn::select_blas_kernels();
    const auto selected = longattn::blas_runtime();
    check(selected.selection.find("not called") == std::string::npos, "after the call: " + selected.selection);
  }
  std::printf("%s\n", failures ? "the BLAS was changed without being asked" : "BLAS untouched until asked");
  return failures ? 1 : 0;
}
