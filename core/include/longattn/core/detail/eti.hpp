// Explicit template instantiation (ETI), as Kokkos Kernels does it: liblongattn_core compiles
// the kernels once for every execution space the Kokkos build enables (Serial, OpenMP, Cuda, HIP)
// and every storage type (float, double, bfloat16, float16), in core/src/eti/. The public
// headers declare those instantiations `extern template`, so tests, apps and users link them
// instead of compiling the kernels again in each translation unit; any other space, type or
// view layout is instantiated from the header templates as before.
//
//   LONGATTN_ETI_FOR_EACH(TYPES, M) expands M(Space, Type) for each enabled space and each
//   type of the list TYPES: LONGATTN_ETI_STORAGE_TYPES (float, double, bfloat16, float16) or
//   LONGATTN_ETI_HALF_TYPES (bfloat16, float16).
#pragma once

#include <Kokkos_Core.hpp>

#include "longattn/core/half.hpp"
#include "longattn/kokkos_compat.hpp"

#define LONGATTN_ETI_STORAGE_TYPES(M, SPACE) \
  M(SPACE, float) M(SPACE, double) M(SPACE, ::longattn::bfloat16) M(SPACE, ::longattn::float16)
#define LONGATTN_ETI_HALF_TYPES(M, SPACE) M(SPACE, ::longattn::bfloat16) M(SPACE, ::longattn::float16)

#ifdef KOKKOS_ENABLE_SERIAL
#define LONGATTN_ETI_SERIAL(TYPES, M) TYPES(M, ::Kokkos::Serial)
#else
#define LONGATTN_ETI_SERIAL(TYPES, M)
#endif
#ifdef KOKKOS_ENABLE_OPENMP
#define LONGATTN_ETI_OPENMP(TYPES, M) TYPES(M, ::Kokkos::OpenMP)
#else
#define LONGATTN_ETI_OPENMP(TYPES, M)
#endif
#ifdef KOKKOS_ENABLE_CUDA
#define LONGATTN_ETI_CUDA(TYPES, M) TYPES(M, ::Kokkos::Cuda)
#else
#define LONGATTN_ETI_CUDA(TYPES, M)
#endif

#ifdef KOKKOS_ENABLE_HIP
#define LONGATTN_ETI_HIP(TYPES, M) TYPES(M, ::longattn::HIP)
#else
#define LONGATTN_ETI_HIP(TYPES, M)
#endif

#define LONGATTN_ETI_FOR_EACH(TYPES, M) \
  LONGATTN_ETI_SERIAL(TYPES, M) LONGATTN_ETI_OPENMP(TYPES, M) LONGATTN_ETI_CUDA(TYPES, M) LONGATTN_ETI_HIP(TYPES, M)
