#pragma once
// Argument checks every layer shares: a view's extents against what a function expects, and
// outputs that must not overlap inputs. Each throws longattn::Error naming the function, the
// argument, its value and what was expected.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include "longattn/error.hpp"

namespace longattn {

// "[2, 3, 4]": a view's extents as messages show them.
template <class View>
std::string extents_of(const View& view) {
  std::ostringstream s;
  s << "[";
  for (unsigned r = 0; r < View::rank; ++r) s << (r ? ", " : "") << view.extent(r);
  s << "]";
  return s.str();
}

// The value type a view holds, without const.
template <class View>
using scalar_of = std::remove_const_t<typename View::value_type>;

// Throws unless view's extents equal `expected`; `meaning` says what they are, e.g. "[batch, heads] of q".
template <class View>
void check_extents(const char* where, const char* name, const View& view,
                   const std::int64_t (&expected)[View::rank], const char* meaning) {
  bool same = true;
  for (unsigned r = 0; r < View::rank; ++r) same = same && std::int64_t(view.extent(r)) == expected[r];
  if (same) return;
  std::ostringstream want;
  want << "[";
  for (unsigned r = 0; r < View::rank; ++r) want << (r ? ", " : "") << expected[r];
  want << "] (" << meaning << ")";
  throw_invalid_argument(where, std::string(name) + "'s extents", extents_of(view), want.str());
}

// The bytes [begin, end) a view can touch: from its first element to one past its last (a
// subview's span() may reach beyond its parent, so compute it from the strides).
template <class View>
std::pair<const char*, const char*> byte_range(const View& view) {
  const char* begin = reinterpret_cast<const char*>(view.data());
  std::size_t last = 0;
  for (unsigned r = 0; r < View::rank; ++r) {
    if (view.extent(r) == 0) return {begin, begin};
    last += (view.extent(r) - 1) * view.stride(r);
  }
  return {begin, begin + (last + 1) * sizeof(typename View::value_type)};
}

// Whether two views' memory ranges overlap.
template <class A, class B>
bool overlap(const A& a, const B& b) {
  const auto [a_begin, a_end] = byte_range(a);
  const auto [b_begin, b_end] = byte_range(b);
  return a_begin < a_end && b_begin < b_end && a_begin < b_end && b_begin < a_end;
}

// Throws when an output's memory overlaps an input's (or another output's).
template <class Output, class Input>
void check_no_alias(const char* where, const char* output_name, const Output& output,
                    const char* input_name, const Input& input) {
  if (overlap(output, input))
    throw_invalid_argument(where, output_name, std::string("overlapping ") + input_name,
                           "an output whose memory range overlaps no input and no other output");
}

}  // namespace longattn
