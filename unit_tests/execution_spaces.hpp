#pragma once
// The Kokkos execution spaces this build enables, as a tuple for Catch2's
// TEMPLATE_LIST_TEST_CASE: every kernel test runs on each of them.
#include <Kokkos_Core.hpp>
#include <tuple>
#include <utility>

namespace longattn::test {

#ifdef KOKKOS_ENABLE_SERIAL
using SerialSpaces = std::tuple<Kokkos::Serial>;
#else
using SerialSpaces = std::tuple<>;
#endif
#ifdef KOKKOS_ENABLE_OPENMP
using OpenMPSpaces = std::tuple<Kokkos::OpenMP>;
#else
using OpenMPSpaces = std::tuple<>;
#endif
#ifdef KOKKOS_ENABLE_CUDA
using CudaSpaces = std::tuple<Kokkos::Cuda>;
#else
using CudaSpaces = std::tuple<>;
#endif

// The host's spaces (what MPI exchanges without a device path).
using HostExecutionSpaces = decltype(std::tuple_cat(std::declval<SerialSpaces>(), std::declval<OpenMPSpaces>()));

using ExecutionSpaces = decltype(std::tuple_cat(std::declval<SerialSpaces>(), std::declval<OpenMPSpaces>(),
                                                std::declval<CudaSpaces>()));

}  // namespace longattn::test
