#pragma once
// What differs between the Kokkos versions longattn builds with (3.4 through 4.x), in one
// place. Everything else uses the API the supported versions share.
//
// - The mathematical functions moved from Kokkos::Experimental to Kokkos in 3.7, and 4.0
//   dropped the old names: longattn::math::exp(x) etc. name whichever the version has.
// - The numeric traits (infinity) are still in Kokkos::Experimental in every version.
// - The HIP backend left Kokkos::Experimental in 4.0: longattn::HIP etc. name its spaces.
#include <Kokkos_Core.hpp>

#if KOKKOS_VERSION < 30400
#error "longattn needs Kokkos 3.4 or newer"
#endif

namespace longattn::math {

#if KOKKOS_VERSION >= 30700
using Kokkos::cos;
using Kokkos::exp;
using Kokkos::exp2;
using Kokkos::fabs;
using Kokkos::floor;
using Kokkos::log;
using Kokkos::log2;
using Kokkos::sin;
using Kokkos::sqrt;
#else
using Kokkos::Experimental::cos;
using Kokkos::Experimental::exp;
using Kokkos::Experimental::exp2;
using Kokkos::Experimental::fabs;
using Kokkos::Experimental::floor;
using Kokkos::Experimental::log;
using Kokkos::Experimental::log2;
using Kokkos::Experimental::sin;
using Kokkos::Experimental::sqrt;
#endif

template <class T>
KOKKOS_INLINE_FUNCTION constexpr T infinity() {
  return Kokkos::Experimental::infinity<T>::value;
}

}  // namespace longattn::math

#ifdef KOKKOS_ENABLE_HIP
namespace longattn {
#if KOKKOS_VERSION >= 40000
using HIP = Kokkos::HIP;
using HIPSpace = Kokkos::HIPSpace;
using HIPHostPinnedSpace = Kokkos::HIPHostPinnedSpace;
#else
using HIP = Kokkos::Experimental::HIP;
using HIPSpace = Kokkos::Experimental::HIPSpace;
using HIPHostPinnedSpace = Kokkos::Experimental::HIPHostPinnedSpace;
#endif
}  // namespace longattn
#endif
