#include "longattn/core/runtime.hpp"

#include <Kokkos_Core.hpp>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "longattn/core/blas.hpp"

namespace longattn {

namespace {
// The program's own help flags: Kokkos would print its help for them too (its own: --kokkos-help).
bool is_help(const char* arg) { return std::strcmp(arg, "--help") == 0 || std::strcmp(arg, "-h") == 0; }
}  // namespace

ScopeGuard::ScopeGuard(int& argc, char* argv[], const RuntimeOptions& options) {
  if (options.select_blas_kernels) select_blas_kernels();
  if (!Kokkos::is_initialized()) {
    // Without OMP_PROC_BIND and OMP_PLACES, OpenMP leaves its threads unbound; saying so spares
    // every run Kokkos' warning about the variable and binds nothing.
    if (!std::getenv("OMP_PROC_BIND") && !std::getenv("OMP_PLACES")) setenv("OMP_PROC_BIND", "false", 0);
    // Kokkos sees the arguments without the help flags and removes its own; the program gets
    // the rest, help flags last.
    std::vector<char*> kokkos_args, help;
    for (int i = 0; i < argc; ++i) (i > 0 && is_help(argv[i]) ? help : kokkos_args).push_back(argv[i]);
    int kokkos_argc = int(kokkos_args.size());
    kokkos_args.push_back(nullptr);
    Kokkos::initialize(kokkos_argc, kokkos_args.data());
    owns_kokkos_ = true;
    argc = 0;
    for (int i = 0; i < kokkos_argc; ++i) argv[argc++] = kokkos_args[std::size_t(i)];
    for (char* flag : help) argv[argc++] = flag;
    argv[argc] = nullptr;
  }
}

ScopeGuard::~ScopeGuard() {
  if (owns_kokkos_ && Kokkos::is_initialized()) Kokkos::finalize();
}

}  // namespace longattn
