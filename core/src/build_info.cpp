#include "longattn/core/build_info.hpp"

#include <Kokkos_Core.hpp>

#include "longattn/config.hpp"
#include "longattn/kokkos_compat.hpp"

namespace longattn {

BuildInfo build_info() {
  BuildInfo b;
  b.version = LONGATTN_VERSION;
  b.build_type = LONGATTN_BUILD_TYPE;
  b.compiler = LONGATTN_CXX_COMPILER;
  b.kokkos_version = LONGATTN_KOKKOS_VERSION;
  b.kokkos_kernels_version = LONGATTN_KOKKOS_KERNELS_VERSION;
#ifdef KOKKOS_ENABLE_CUDA
  b.execution_spaces.push_back(Kokkos::Cuda::name());
#endif
#ifdef KOKKOS_ENABLE_HIP
  b.execution_spaces.push_back(HIP::name());
#endif
#ifdef KOKKOS_ENABLE_OPENMP
  b.execution_spaces.push_back(Kokkos::OpenMP::name());
#endif
#ifdef KOKKOS_ENABLE_THREADS
  b.execution_spaces.push_back(Kokkos::Threads::name());
#endif
#ifdef KOKKOS_ENABLE_SERIAL
  b.execution_spaces.push_back(Kokkos::Serial::name());
#endif
  b.default_execution_space = Kokkos::DefaultExecutionSpace::name();

#if defined(KOKKOS_ARCH_HOPPER90)
  b.architecture = "HOPPER90 (sm_90)";
#elif defined(KOKKOS_ARCH_AMPERE80)
  b.architecture = "AMPERE80 (sm_80)";
#elif defined(KOKKOS_ARCH_AVX512XEON)
  b.architecture = "SKX";
#elif defined(KOKKOS_ARCH_AVX2)
  b.architecture = "HSW";
#else
  b.architecture = "generic";
#endif
  // The host ISA the compiler targets (the host side of a CUDA build too).
#if defined(__AVX512F__)
  b.architecture += ", host AVX-512";
#elif defined(__AVX2__)
  b.architecture += ", host AVX2";
#elif defined(__AVX__)
  b.architecture += ", host AVX";
#else
  b.architecture += ", host SSE2";
#endif
  b.cuda = LONGATTN_HAVE_CUDA;
  b.mpi = LONGATTN_HAVE_MPI;
  b.nccl = LONGATTN_HAVE_NCCL;
  b.hwloc = LONGATTN_HAVE_HWLOC;
  return b;
}

}  // namespace longattn
