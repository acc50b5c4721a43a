// Rotary position embeddings (RoPE: Su et al. 2021, RoFormer), in GPT-NeoX's and LLaMA's layout
// ("rotate half"): a head's D features are D/2 pairs (x_i, x_{i + D/2}), and the pair of a token
// at position p turns by the angle theta_i = p * base^(-2i / D):
//   y_i = x_i cos(theta_i) - x_{i + D/2} sin(theta_i),   y_{i + D/2} = x_{i + D/2} cos(theta_i) + x_i sin(theta_i).
// Applied to Q and K (not V), a score q_t . k_s then depends on the positions only through
// p_t - p_s, so there are no position parameters, and a rank holding a shard of a sequence
// (context parallelism) turns its tokens by their global positions. The turn is orthogonal:
// backward turns the gradients back by -theta (Rotation::backward).
//
// Precision: p * base^(-2i/D) is formed and reduced modulo 2 pi in double (at a million tokens
// p * 1 is ~1e6 radians: float would keep one digit of it), then cos and sin are taken in
// accumulate_t<T> (float for float and the 16-bit types). One thread per (token, pair), over
// every head of Q and K: the angle is computed once for all of them.
#pragma once

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <string>

#include "longattn/core/attention.hpp"  // check_extents
#include "longattn/core/half.hpp"
#include "longattn/error.hpp"
#include "longattn/kokkos_compat.hpp"

namespace longattn {

enum class Rotation { forward, backward };  // by +theta (the embedding) or -theta (its gradient)

// The default base of the angles (RoFormer, LLaMA).
inline constexpr double rotary_default_base = 10000;

// q and k [B, n, H, D] (LayoutRight, turned in place), positions [n]: the position of each of the
// n tokens (the same for every sequence). Throws longattn::Error on an odd D, a base not above 1
// or mismatched extents.
template <class ExecSpace, class Heads, class Positions>
void rotary_embedding(const ExecSpace& exec, const Heads& q, const Heads& k, const Positions& positions, double base,
                      Rotation rotation) {
  static_assert(Heads::rank == 4 && Positions::rank == 1, "rotary_embedding: q and k [B, n, H, D], positions [n]");
  const char* where = "longattn::rotary_embedding";
  const std::int64_t B = q.extent(0), n = q.extent(1), H = q.extent(2), D = q.extent(3);
  require(D % 2 == 0, where, "q.extent(3)", D, "an even head dim (the features turn in pairs)");
  require(base > 1 && std::isfinite(base), where, "base", base, "a finite number above 1");
  check_extents(where, "k", k, {B, n, H, D}, "the extents of q");
  check_extents(where, "positions", positions, {n}, "[n] of q");
  using T = typename Heads::non_const_value_type;
  using A = accumulate_t<T>;
  const std::int64_t pairs = D / 2;
  const double log_base = std::log(base), sign = rotation == Rotation::forward ? 1.0 : -1.0;
  Kokkos::parallel_for(
      "longattn::rotary_embedding", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, B * n * pairs),
      KOKKOS_LAMBDA(std::int64_t index) {
        const std::int64_t i = index % pairs, row = index / pairs, t = row % n, b = row / n;
        constexpr double two_pi = 6.283185307179586476925286766559;
        const double angle = double(positions(t)) * math::exp(-2.0 * double(i) / double(D) * log_base);
        const double reduced = sign * (angle - two_pi * math::floor(angle / two_pi));
        const A c = math::cos(A(reduced)), s = math::sin(A(reduced));
        for (std::int64_t h = 0; h < H; ++h) {
          const A q0 = A(q(b, t, h, i)), q1 = A(q(b, t, h, i + pairs));
          q(b, t, h, i) = T(q0 * c - q1 * s);
          q(b, t, h, i + pairs) = T(q1 * c + q0 * s);
          const A k0 = A(k(b, t, h, i)), k1 = A(k(b, t, h, i + pairs));
          k(b, t, h, i) = T(k0 * c - k1 * s);
          k(b, t, h, i + pairs) = T(k1 * c + k0 * s);
        }
      });
}

}  // namespace longattn
