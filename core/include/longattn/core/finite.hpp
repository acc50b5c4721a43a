// find_non_finite: the first NaN or infinity in a view, so that a check can name where it is.
//
//   const longattn::NonFinite bad = longattn::find_non_finite(exec, q);
//   if (bad.found) ... bad.describe() is e.g. "nan at [0, 17, 1, 3]"
//
// One reduction over the view on the caller's instance (any execution space, any layout, ranks
// 1 to 4, float, double, bfloat16 or float16), then one element copied back: it waits for the
// instance. The attention kernels run it on their inputs and outputs when
// AttentionOptions::check_finite is set; the trainer names a model's first non-finite tensor
// with it.
#pragma once

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>

#include "longattn/core/half.hpp"

namespace longattn {

struct NonFinite {
  bool found = false;
  int rank = 0;
  std::array<std::int64_t, 4> index{};  // the first one in index order (the last index fastest)
  double value = 0;                     // NaN, +inf or -inf

  // "nan at [0, 17, 1, 3]"; "finite" when none was found.
  std::string describe() const {
    if (!found) return "finite";
    std::ostringstream out;
    out << value << " at [";
    for (int r = 0; r < rank; ++r) out << (r ? ", " : "") << index[std::size_t(r)];
    out << "]";
    return out.str();
  }
};

namespace detail {

// A view's entries by flat index (row-major over its extents), as accumulate_t values.
template <class View>
struct FlatEntries {
  using Accumulate = accumulate_t<std::remove_const_t<typename View::value_type>>;
  static constexpr int rank = int(View::rank);
  View view;
  std::int64_t extents[4] = {1, 1, 1, 1};

  explicit FlatEntries(const View& v) : view(v) {
    for (int r = 0; r < rank; ++r) extents[r] = std::int64_t(v.extent(std::size_t(r)));
  }
  std::int64_t size() const { return extents[0] * extents[1] * extents[2] * extents[3]; }
  KOKKOS_INLINE_FUNCTION void indices(std::int64_t flat, std::int64_t (&i)[4]) const {
    for (int r = 3; r >= 0; --r) {
      i[r] = r < rank ? flat % extents[r] : 0;
      if (r < rank) flat /= extents[r];
    }
  }
  KOKKOS_INLINE_FUNCTION Accumulate operator[](std::int64_t flat) const {
    std::int64_t i[4];
    indices(flat, i);
    if constexpr (rank == 1)
      return Accumulate(view(i[0]));
    else if constexpr (rank == 2)
      return Accumulate(view(i[0], i[1]));
    else if constexpr (rank == 3)
      return Accumulate(view(i[0], i[1], i[2]));
    else
      return Accumulate(view(i[0], i[1], i[2], i[3]));
  }
};

// The flat index of the first entry that is not finite.
template <class View>
struct FirstNonFinite {
  using Accumulate = typename FlatEntries<View>::Accumulate;
  FlatEntries<View> entries;
  bool allow_minus_infinity;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t flat, std::int64_t& first) const {
    const Accumulate x = entries[flat];
    // x - x is 0 for every finite x, NaN for NaN and both infinities.
    const bool finite = x - x == Accumulate(0);
    const bool minus_infinity = !finite && x == x && x < Accumulate(0);
    if (!finite && !(allow_minus_infinity && minus_infinity) && flat < first) first = flat;
  }
};

// The largest |entry| (NaN entries are not counted).
template <class View>
struct LargestMagnitude {
  using Accumulate = typename FlatEntries<View>::Accumulate;
  FlatEntries<View> entries;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t flat, double& largest) const {
    const Accumulate x = entries[flat];
    const double magnitude = x < Accumulate(0) ? -double(x) : double(x);
    if (magnitude > largest) largest = magnitude;
  }
};

}  // namespace detail

// The largest |entry| of `view` (0 for an empty view), computed on `exec`: bounds what sums of
// its entries can reach (the attention checks use it to tell scores that would overflow).
template <class ExecSpace, class View>
double largest_magnitude(const ExecSpace& exec, const View& view) {
  static_assert(View::rank >= 1 && View::rank <= 4, "largest_magnitude: a view of rank 1 to 4");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename View::memory_space>::accessible,
                "largest_magnitude: a view the execution space can read");
  const detail::LargestMagnitude<View> search{detail::FlatEntries<View>(view)};
  double largest = 0;
  Kokkos::parallel_reduce("longattn::largest_magnitude",
                          Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, search.entries.size()),
                          search, Kokkos::Max<double>(largest));
  return std::max(largest, 0.0);
}

// The first non-finite entry of `view`, searched on `exec`. allow_minus_infinity: -inf counts as
// finite (the log-sum-exp of a query that sees no key).
template <class ExecSpace, class View>
NonFinite find_non_finite(const ExecSpace& exec, const View& view, bool allow_minus_infinity = false) {
  static_assert(View::rank >= 1 && View::rank <= 4, "find_non_finite: a view of rank 1 to 4");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename View::memory_space>::accessible,
                "find_non_finite: a view the execution space can read");
  const detail::FirstNonFinite<View> search{detail::FlatEntries<View>(view), allow_minus_infinity};
  const std::int64_t total = search.entries.size();
  NonFinite result;
  result.rank = int(View::rank);
  if (total == 0) return result;
  std::int64_t first = total;
  Kokkos::parallel_reduce("longattn::find_non_finite",
                          Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, total), search,
                          Kokkos::Min<std::int64_t>(first));
  if (first >= total) return result;
  result.found = true;
  std::int64_t index[4];
  search.entries.indices(first, index);
  for (int r = 0; r < 4; ++r) result.index[std::size_t(r)] = index[r];
  const auto& i = result.index;
  Kokkos::View<std::remove_const_t<typename View::value_type>, Kokkos::HostSpace> element("element");
  if constexpr (View::rank == 1) Kokkos::deep_copy(element, Kokkos::subview(view, i[0]));
  if constexpr (View::rank == 2) Kokkos::deep_copy(element, Kokkos::subview(view, i[0], i[1]));
  if constexpr (View::rank == 3) Kokkos::deep_copy(element, Kokkos::subview(view, i[0], i[1], i[2]));
  if constexpr (View::rank == 4) Kokkos::deep_copy(element, Kokkos::subview(view, i[0], i[1], i[2], i[3]));
  result.value = double(accumulate_t<std::remove_const_t<typename View::value_type>>(element()));
  return result;
}

}  // namespace longattn
