#include "longattn/core/runtime.hpp"

#include <Kokkos_Core.hpp>

#include "longattn/core/blas.hpp"

namespace longattn {

ScopeGuard::ScopeGuard(int& argc, char* argv[], const RuntimeOptions& options) {
  if (options.select_blas_kernels) select_blas_kernels();
  if (!Kokkos::is_initialized()) {
    Kokkos::initialize(argc, argv);
    owns_kokkos_ = true;
  }
}

ScopeGuard::~ScopeGuard() {
  if (owns_kokkos_ && Kokkos::is_initialized()) Kokkos::finalize();
}

}  // namespace longattn
