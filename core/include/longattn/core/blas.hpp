#pragma once
// What BLAS longattn's gemm calls reach, and making sure it runs the right kernels.
//
// Debian's OpenBLAS (0.3.21, DYNAMIC_ARCH) misdetects recent Xeons as "Prescott" and runs SSE3
// kernels, 4-5x below the CPU's sgemm rate. select_blas_kernels() compares the kernels OpenBLAS
// picked with the vector ISA this CPU has and, when OpenBLAS picked an older ISA, switches it to
// the matching kernels (SkylakeX for AVX-512, Haswell for AVX2) through OpenBLAS's own runtime
// selection. It changes the process's BLAS (it sets OPENBLAS_CORETYPE and re-initializes
// OpenBLAS), so it runs only when asked: call it, or start longattn with
// ScopeGuard(argc, argv, {/*select_blas_kernels=*/true}) as longattn's own programs do. Loading
// the library or calling gemm never does. An OPENBLAS_CORETYPE set by the user is respected;
// with another BLAS it does nothing.
#include <string>

namespace longattn {

struct BlasRuntime {
  std::string library;    // e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY ...", or "BLAS (not OpenBLAS)"
  std::string kernels;    // OpenBLAS kernel set in use, e.g. "SkylakeX"; empty if unknown
  std::string selection;  // how those kernels were chosen
  int threads = 0;        // BLAS threads, 0 if unknown
};

// Idempotent and thread-safe; call before the first BLAS call of a process (switching the
// kernels while another thread runs a BLAS call is not safe).
void select_blas_kernels();

// What is in use now; selects nothing.
BlasRuntime blas_runtime();

// Sets the number of threads OpenBLAS uses (no effect with another BLAS). Throws
// longattn::Error if threads < 1.
void set_blas_threads(int threads);

namespace detail {
// Vector ISA levels: 0 SSE, 1 AVX, 2 AVX2 + FMA, 3 AVX-512; -1 unknown (not x86-64).
int cpu_isa_level();
// The decision select_blas_kernels() takes: the OpenBLAS kernel set to switch to, or "" to keep
// `picked`. It keeps a choice the user forced, kernels it does not know and kernels already at
// the CPU's level.
std::string kernels_to_select(const std::string& picked, int cpu_isa_level, bool user_forced);
// Re-initializes OpenBLAS with the named kernel set (its OPENBLAS_CORETYPE names) and returns
// the set now in use; returns "" without OpenBLAS. No BLAS call may run meanwhile.
std::string switch_openblas_kernels(const std::string& name);
}  // namespace detail

}  // namespace longattn
