// merge_partial(exec, o, lse, o_part, lse_part): folds a partial attention result (the output
// and LSE of the same queries over another set of keys) into (o, lse), in place:
//   o   <- (e^lse o + e^lse_part o_part) / (e^lse + e^lse_part)
//   lse <- log(e^lse + e^lse_part)
// computed relative to max(lse, lse_part) so nothing overflows. A side with lse = -inf (its
// queries saw no key) contributes nothing, whatever its o holds; when both are -inf, o and lse
// are left as they are. This is ring attention's accumulation over key shards and LongNet's
// mixing of dilation configurations. Shapes: o, o_part [B, N, H, D]; lse, lse_part [B, H, N].
// o and o_part hold float, double, bfloat16 or float16; lse and lse_part accumulate_t of that.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "longattn/core/attention.hpp"
#include "longattn/core/detail/eti.hpp"
#include "longattn/kokkos_compat.hpp"

namespace longattn {

namespace detail {

template <class ExecSpace, class S>
struct MergePartialKernel {
  using T = accumulate_t<S>;
  Tensor4<S, ExecSpace> o;
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
      for (int d = 0; d < head_dim; ++d) o(b, i, h, d) = o_part(b, i, h, d);
      lse(b, h, i) = theirs;
      return;
    }
    const T top = mine < theirs ? theirs : mine;
    const T w_mine = math::exp(mine - top);
    const T w_theirs = math::exp(theirs - top);
    const T inverse = T(1) / (w_mine + w_theirs);
    for (int d = 0; d < head_dim; ++d)
      o(b, i, h, d) = S((w_mine * T(o(b, i, h, d)) + w_theirs * T(o_part(b, i, h, d))) * inverse);
    lse(b, h, i) = top + math::log(w_mine + w_theirs);
  }
};

// The compiled entry point under merge_partial (out of line: see AttentionKernels).
template <class ExecSpace, class S>
struct MergePartialKernels {
  using T = accumulate_t<S>;
  static void run(const ExecSpace& exec, const Tensor4<S, ExecSpace>& o, const Tensor3<T, ExecSpace>& lse,
                  const Tensor4<const S, ExecSpace>& o_part, const Tensor3<const T, ExecSpace>& lse_part);
};

template <class ExecSpace, class S>
void MergePartialKernels<ExecSpace, S>::run(const ExecSpace& exec, const Tensor4<S, ExecSpace>& o,
                                            const Tensor3<T, ExecSpace>& lse, const Tensor4<const S, ExecSpace>& o_part,
                                            const Tensor3<const T, ExecSpace>& lse_part) {
  const int N = int(o.extent(1)), H = int(o.extent(2)), D = int(o.extent(3));
  Kokkos::parallel_for("longattn::merge_partial",
                       Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(
                           exec, 0, std::int64_t(o.extent(0)) * N * H),
                       MergePartialKernel<ExecSpace, S>{o, lse, o_part, lse_part, N, H, D});
}

// Compiled into liblongattn_core (detail/eti.hpp).
#define LONGATTN_MERGE_PARTIAL_ETI(SPACE, S) extern template struct MergePartialKernels<SPACE, S>;
LONGATTN_ETI_FOR_EACH(LONGATTN_ETI_STORAGE_TYPES, LONGATTN_MERGE_PARTIAL_ETI)
#undef LONGATTN_MERGE_PARTIAL_ETI

}  // namespace detail

template <class ExecSpace, class O, class Lse, class OPart, class LsePart>
void merge_partial(const ExecSpace& exec, const O& o, const Lse& lse, const OPart& o_part,
                   const LsePart& lse_part) {
  static_assert(O::rank == 4 && OPart::rank == 4, "o, o_part are rank-4 views [batch, tokens, heads, head dim]");
  static_assert(Lse::rank == 3 && LsePart::rank == 3, "lse, lse_part are rank-3 views [batch, heads, tokens]");
  using T = longattn::scalar_of<O>;
  const char* where = "longattn::merge_partial";
  if constexpr (!detail::attention_scalar<T>)
    throw_invalid_argument(where, "o's value type", detail::scalar_name<T>(), "float, double, bfloat16 or float16");
  detail::check_view<ExecSpace, T>(where, "o", o, "o");
  detail::check_lse_view<ExecSpace, T>(where, "lse", lse, "o");
  detail::check_view<ExecSpace, T>(where, "o_part", o_part, "o");
  detail::check_lse_view<ExecSpace, T>(where, "lse_part", lse_part, "o");
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
  if constexpr (detail::runnable_attention<T, Lse, OPart> && std::is_same_v<longattn::scalar_of<LsePart>, accumulate_t<T>>) {
    detail::MergePartialKernels<ExecSpace, T>::run(exec, o, lse, o_part, lse_part);
  }
}

}  // namespace longattn
