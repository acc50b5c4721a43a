#pragma once
// The Kokkos execution spaces this build enables, as a tuple for Catch2's
// TEMPLATE_LIST_TEST_CASE: every kernel test runs on each of them.
#include <Kokkos_Core.hpp>
#include <tuple>
#include <type_traits>
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

// Whether Space is Kokkos::Cuda (false in builds without it).
template <class Space>
inline constexpr bool is_cuda =
#ifdef KOKKOS_ENABLE_CUDA
    std::is_same_v<Space, Kokkos::Cuda>;
#else
    false;
#endif

using ExecutionSpaces = decltype(std::tuple_cat(std::declval<SerialSpaces>(), std::declval<OpenMPSpaces>(),
                                                std::declval<CudaSpaces>()));

// The MPI tests' spaces: the host's default and the GPU's. The parallel layer's code is the same
// on every host space and its kernels are tested on each in core; at one thread per rank a
// second host space would repeat the same runs.
using MpiTestSpaces =
    decltype(std::tuple_cat(std::declval<std::tuple<Kokkos::DefaultHostExecutionSpace>>(), std::declval<CudaSpaces>()));

}  // namespace longattn::test
