#pragma once
// longattn::convert(exec, from, to): to = from element by element, changing the value type, which
// Kokkos::deep_copy does not do. Between float, double, bfloat16 and float16 (to 16 bits: round
// to nearest even, through float). Views of rank 1 to 5 with equal extents, any layouts, in
// memory exec can reach; the work is queued on exec.
//
//   longattn::convert(exec, q16, q32);              // a bfloat16 tensor's float copy
//   longattn::convert(exec, grads32, grads16);      // rounded back
//
// Raw arrays of one space: convert(exec, from, to, count).
#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

#include "longattn/checks.hpp"
#include "longattn/core/half.hpp"

namespace longattn {

namespace detail {
// to(i...) = To(from(i...)), through From's accumulate type (float for the 16-bit types).
template <class From, class To>
struct ConvertElements {
  using Wide = accumulate_t<scalar_of<From>>;
  using Out = typename To::non_const_value_type;
  From from;
  To to;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const { to(i) = Out(Wide(from(i))); }
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t j) const { to(i, j) = Out(Wide(from(i, j))); }
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t j, std::int64_t k) const {
    to(i, j, k) = Out(Wide(from(i, j, k)));
  }
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t j, std::int64_t k, std::int64_t l) const {
    to(i, j, k, l) = Out(Wide(from(i, j, k, l)));
  }
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t j, std::int64_t k, std::int64_t l,
                                         std::int64_t m) const {
    to(i, j, k, l, m) = Out(Wide(from(i, j, k, l, m)));
  }
};
}  // namespace detail

template <class ExecSpace, class From, class To>
void convert(const ExecSpace& exec, const From& from, const To& to) {
  static_assert(Kokkos::is_view<From>::value && Kokkos::is_view<To>::value, "longattn::convert: Kokkos Views");
  constexpr unsigned rank = From::rank;
  static_assert(To::rank == rank && rank >= 1 && rank <= 5, "longattn::convert: views of one rank, 1 to 5");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename From::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<ExecSpace, typename To::memory_space>::accessible,
                "longattn::convert: views the execution space can reach");
  std::int64_t extents[rank];
  for (unsigned r = 0; r < rank; ++r) extents[r] = std::int64_t(from.extent(r));
  check_extents("longattn::convert", "to", to, extents, "the extents of from");
  if (from.size() == 0) return;
  const detail::ConvertElements<From, To> elements{from, to};
  if constexpr (rank == 1) {
    Kokkos::parallel_for("longattn::convert",
                         Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, extents[0]),
                         elements);
  } else {
    using Policy = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<rank>, Kokkos::IndexType<std::int64_t>>;
    typename Policy::point_type begin{}, end{};
    for (unsigned r = 0; r < rank; ++r) end[r] = extents[r];
    Kokkos::parallel_for("longattn::convert", Policy(exec, begin, end), elements);
  }
}

// `count` elements of the arrays at from and to, both in ExecSpace's memory.
template <class ExecSpace, class From, class To>
void convert(const ExecSpace& exec, const From* from, To* to, std::size_t count) {
  using Memory = typename ExecSpace::memory_space;
  convert(exec, Kokkos::View<const From*, Memory, Kokkos::MemoryUnmanaged>(from, count),
          Kokkos::View<To*, Memory, Kokkos::MemoryUnmanaged>(to, count));
}

}  // namespace longattn
