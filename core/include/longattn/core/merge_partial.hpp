// merge_partial(exec, o, lse, o_part, lse_part): folds a partial attention result (the output
// and LSE of the same queries over another set of keys) into (o, lse), in place:
//   o   <- (e^lse o + e^lse_part o_part) / (e^lse + e^lse_part)
//   lse <- log(e^lse + e^lse_part)
// computed relative to max(lse, lse_part) so nothing overflows. A side with lse = -inf (its
// queries saw no key) contributes nothing, whatever its o holds; when both are -inf, o and lse
// are left as they are. This is ring attention's accumulation over key shards and LongNet's
// mixing of dilation configurations. Shapes: o, o_part [B, N, H, D]; lse, lse_part [B, H, N].
// o_part holds float, double, bfloat16 or float16, lse and lse_part accumulate_t of that; o
// holds o_part's type, or float for a 16-bit o_part (an accumulator that rounds only once, at
// the end: ring attention's over its steps).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "longattn/core/attention.hpp"
#include "longattn/core/detail/eti.hpp"
#include "longattn/kokkos_compat.hpp"

namespace longattn {

namespace detail {

// o_part of S, o of O: S, or float for 16-bit S.
template <class ExecSpace, class S, class O = S>
struct MergePartialKernel {
  using T = accumulate_t<S>;
  Tensor4<O, ExecSpace> o;
  Tensor3<T, ExecSpace> lse;
  Tensor4<const S, ExecSpace> o_part;
  Tensor3<const T, ExecSpace> lse_part;
  int tokens, heads, head_dim;

  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t row) const {
    const int h = static_cast<int>(row % heads);
    const int i = static_cast<int>(row / heads % tokens);
    const int b = static_cast<int>(row / heads / tokens);
    const T mine = lse(b, h, i), theirs = lse_part(b, h, i);
    if (theirs == minus_infinity<T>()) return;
    if (mine == minus_infinity<T>()) {
      for (int d = 0; d < head_dim; ++d) o(b, i, h, d) = O(T(o_part(b, i, h, d)));
      lse(b, h, i) = theirs;
      return;
    }
    const T top = mine < theirs ? theirs : mine;
    const T w_mine = math::exp(mine - top);
    const T w_theirs = math::exp(theirs - top);
    const T inverse = T(1) / (w_mine + w_theirs);
    for (int d = 0; d < head_dim; ++d)
      o(b, i, h, d) = O((w_mine * T(o(b, i, h, d)) + w_theirs * T(o_part(b, i, h, d))) * inverse);
    lse(b, h, i) = top + math::log(w_mine + w_theirs);
  }
};

// The compiled entry point under merge_partial (out of line: see AttentionKernels).
template <class ExecSpace, class S, class O = S>
struct MergePartialKernels {
  using T = accumulate_t<S>;
  static void run(const ExecSpace& exec, const Tensor4<O, ExecSpace>& o, const Tensor3<T, ExecSpace>& lse,
                  const Tensor4<const S, ExecSpace>& o_part, const Tensor3<const T, ExecSpace>& lse_part);
};

template <class ExecSpace, class S, class O>
void MergePartialKernels<ExecSpace, S, O>::run(const ExecSpace& exec, const Tensor4<O, ExecSpace>& o,
                                               const Tensor3<T, ExecSpace>& lse,
                                               const Tensor4<const S, ExecSpace>& o_part,
                                               const Tensor3<const T, ExecSpace>& lse_part) {
  const int N = int(o.extent(1)), H = int(o.extent(2)), D = int(o.extent(3));
  Kokkos::parallel_for("longattn::merge_partial",
                       Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(
                           exec, 0, std::int64_t(o.extent(0)) * N * H),
                       MergePartialKernel<ExecSpace, S, O>{o, lse, o_part, lse_part, N, H, D});
}

// Compiled into liblongattn_core (detail/eti.hpp).
#define LONGATTN_MERGE_PARTIAL_ETI(SPACE, S) extern template struct MergePartialKernels<SPACE, S>;
LONGATTN_ETI_FOR_EACH(LONGATTN_ETI_STORAGE_TYPES, LONGATTN_MERGE_PARTIAL_ETI)
#undef LONGATTN_MERGE_PARTIAL_ETI
#define LONGATTN_MERGE_PARTIAL_INTO_FLOAT_ETI(SPACE, S) extern template struct MergePartialKernels<SPACE, S, float>;
LONGATTN_ETI_FOR_EACH(LONGATTN_ETI_HALF_TYPES, LONGATTN_MERGE_PARTIAL_INTO_FLOAT_ETI)
#undef LONGATTN_MERGE_PARTIAL_INTO_FLOAT_ETI

}  // namespace detail

template <class ExecSpace, class O, class Lse, class OPart, class LsePart>
void merge_partial(const ExecSpace& exec, const O& o, const Lse& lse, const OPart& o_part,
                   const LsePart& lse_part) {
  static_assert(O::rank == 4 && OPart::rank == 4, "o, o_part are rank-4 views [batch, tokens, heads, head dim]");
  static_assert(Lse::rank == 3 && LsePart::rank == 3, "lse, lse_part are rank-3 views [batch, heads, tokens]");
  using S = longattn::scalar_of<OPart>;  // the part's storage type
  using T = longattn::scalar_of<O>;      // S, or a float accumulator for 16-bit S
  const char* where = "longattn::merge_partial";
  if constexpr (!detail::attention_scalar<S>)
    throw_invalid_argument(where, "o_part's value type", detail::scalar_name<S>(), "float, double, bfloat16 or float16");
  constexpr bool float_accumulator = is_half_v<S> && std::is_same_v<T, float>;
  if constexpr (!std::is_same_v<T, S> && !float_accumulator)
    throw_invalid_argument(where, "o's value type", detail::scalar_name<T>(),
                           detail::scalar_name<S>() + " (o_part's)" + (is_half_v<S> ? " or float" : ""));
  detail::check_view<ExecSpace, T>(where, "o", o, "o");
  detail::check_lse_view<ExecSpace, S>(where, "lse", lse, "o_part");
  detail::check_view<ExecSpace, S>(where, "o_part", o_part, "o_part");
  detail::check_lse_view<ExecSpace, S>(where, "lse_part", lse_part, "o_part");
  const std::int64_t B = o.extent(0), N = o.extent(1), H = o.extent(2), D = o.extent(3);
  longattn::check_extents(where, "lse", lse, {B, H, N}, "[batch, heads, tokens] of o");
  longattn::check_extents(where, "o_part", o_part, {B, N, H, D}, "the extents of o");
  longattn::check_extents(where, "lse_part", lse_part, {B, H, N}, "the extents of lse");
  longattn::check_no_alias(where, "o", o, "o_part", o_part);
  longattn::check_no_alias(where, "o", o, "lse_part", lse_part);
  longattn::check_no_alias(where, "o", o, "lse", lse);
  longattn::check_no_alias(where, "lse", lse, "o_part", o_part);
  longattn::check_no_alias(where, "lse", lse, "lse_part", lse_part);
  if (B * N * H * D == 0) return;
  if constexpr (detail::runnable_attention<S, Lse, OPart> && std::is_same_v<longattn::scalar_of<LsePart>, accumulate_t<S>> &&
                (std::is_same_v<T, S> || float_accumulator)) {
    detail::MergePartialKernels<ExecSpace, S, T>::run(exec, o, lse, o_part, lse_part);
  }
}

}  // namespace longattn
