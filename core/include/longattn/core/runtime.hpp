#pragma once
// longattn::ScopeGuard: start and stop what longattn runs on. Put one at the top of main():
//
//   int main(int argc, char* argv[]) {
//     longattn::ScopeGuard guard(argc, argv);
//     ...
//   }
//
// It initializes Kokkos (passing --kokkos-* arguments on; the program's --help and -h stay the
// program's) unless the program already did, and finalizes Kokkos at scope exit if it
// initialized it. Where neither OMP_PROC_BIND nor OMP_PLACES is set it sets OMP_PROC_BIND=false,
// what OpenMP does without them (unbound threads), so that Kokkos does not warn on every run.
// It changes nothing else in the process unless asked through RuntimeOptions.
namespace longattn {

struct RuntimeOptions {
  // Switch OpenBLAS to the kernels of this CPU's vector ISA where it misdetected the CPU
  // (select_blas_kernels(), core/blas.hpp). It sets OPENBLAS_CORETYPE and re-initializes
  // OpenBLAS for the whole process, so it is off unless the program asks; longattn's own apps,
  // tests and benchmarks ask.
  bool select_blas_kernels = false;
};

// Reads longattn's environment switches now (LONGATTN_ALLOW_TF32, LONGATTN_CUBLASLT_GELU,
// LONGATTN_BF16_DOT_PRODUCTS; docs/user-guide.md): a value they do not take is a longattn::Error
// here, on every build and CPU, rather than where a path first reads it (where a build has no
// such path, never). longattn's apps call it as they start.
void check_environment_switches();

class ScopeGuard {
 public:
  ScopeGuard(int& argc, char* argv[], const RuntimeOptions& options = {});
  ~ScopeGuard();
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;

 private:
  bool owns_kokkos_ = false;
};

}  // namespace longattn
