// The 16-bit storage types' conversions, exhaustively: every bfloat16 and float16 value survives
// float and back, every midpoint between neighbours rounds to the even one, values just either
// side of a midpoint round to the nearer one; overflow, underflow, infinities and NaN. float16
// also against the compiler's own _Float16 where it has one.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "execution_spaces.hpp"
#include "longattn/core/half.hpp"

namespace {

// Checks one 16-bit type H over all its finite values of both signs (bits up to
// largest_finite, then the next value away from zero is bits + 1). Counts failures instead of
// one CHECK per value.
template <class H>
void check_round_trip_and_ties(std::uint16_t largest_finite) {
  int wrong_round_trip = 0, wrong_tie = 0, wrong_near_tie = 0;
  for (std::uint32_t bits = 0; bits <= largest_finite; ++bits)
    for (const std::uint32_t sign : {0u, 0x8000u}) {
      const std::uint16_t value_bits = std::uint16_t(bits | sign);
      const float value = H::from_bits(value_bits);
      if (H(value).bits != value_bits) ++wrong_round_trip;
      if (bits == largest_finite) continue;
      // The midpoint of this value and the next one away from zero is exact in float.
      const float next = H::from_bits(std::uint16_t((bits + 1) | sign));
      const float middle = value / 2 + next / 2;
      const std::uint16_t even = (bits & 1u) ? std::uint16_t((bits + 1) | sign) : value_bits;
      if (H(middle).bits != even) ++wrong_tie;
      const float below = std::nextafter(middle, value), above = std::nextafter(middle, next);
      if (H(below).bits != value_bits || H(above).bits != std::uint16_t((bits + 1) | sign)) ++wrong_near_tie;
    }
  CHECK(wrong_round_trip == 0);
  CHECK(wrong_tie == 0);
  CHECK(wrong_near_tie == 0);
}

// A 16-bit value from its definition, in double: sign, exponent field e (biased by `bias`),
// mantissa field m of `mantissa_bits`; e all ones is infinity (m 0) or NaN, e 0 is m 2^(1-bias-p).
double value_of(std::uint32_t bits, int exponent_bits, int mantissa_bits) {
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const std::uint32_t m = bits & ((1u << mantissa_bits) - 1), e = (bits >> mantissa_bits) & ((1u << exponent_bits) - 1);
  const double sign = (bits >> (exponent_bits + mantissa_bits)) & 1u ? -1.0 : 1.0;
  if (e == (1u << exponent_bits) - 1)
    return m == 0 ? sign * std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  const double fraction = double(m) / double(1u << mantissa_bits);
  return sign * std::ldexp(e == 0 ? fraction : 1.0 + fraction, (e == 0 ? 1 : int(e)) - bias);
}

// Whether a converted float is the double value (NaN for NaN).
bool same_value(float converted, double expected) {
  return std::isnan(expected) ? std::isnan(converted) : double(converted) == expected;
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("every bfloat16 and float16 value reads as its float on each execution space", "[core][half]",
                        longattn::test::ExecutionSpaces) {
  using Exec = TestType;
  constexpr int values = 1 << 16;
  Kokkos::View<float* [2], typename Exec::memory_space> as_float("as_float", values);
  Kokkos::parallel_for(
      Kokkos::RangePolicy<Exec>(Exec(), 0, values), KOKKOS_LAMBDA(int bits) {
        as_float(bits, 0) = float(longattn::bfloat16::from_bits(std::uint16_t(bits)));
        as_float(bits, 1) = float(longattn::float16::from_bits(std::uint16_t(bits)));
      });
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), as_float);
  int wrong_bfloat16 = 0, wrong_float16 = 0;
  for (std::uint32_t bits = 0; bits < values; ++bits) {
    wrong_bfloat16 += !same_value(host(bits, 0), value_of(bits, 8, 7));
    wrong_float16 += !same_value(host(bits, 1), value_of(bits, 5, 10));
  }
  CHECK(wrong_bfloat16 == 0);
  CHECK(wrong_float16 == 0);
}

TEST_CASE("bfloat16 converts from float rounding to nearest even, exactly back", "[core][half]") {
  using longattn::bfloat16;
  check_round_trip_and_ties<bfloat16>(0x7f7f);
  CHECK(float(bfloat16(1.0f)) == 1.0f);
  CHECK(bfloat16(1.0f).bits == 0x3f80);
  CHECK(float(bfloat16(3.14159265f)) == 3.140625f);
  CHECK(bfloat16(std::numeric_limits<float>::max()).bits == 0x7f80);  // rounds up to infinity
  CHECK(bfloat16(std::numeric_limits<float>::infinity()).bits == 0x7f80);
  CHECK(bfloat16(-std::numeric_limits<float>::infinity()).bits == 0xff80);
  CHECK(std::isnan(float(bfloat16(std::numeric_limits<float>::quiet_NaN()))));
  // A signalling NaN whose payload is all in the low half would truncate to infinity.
  CHECK(std::isnan(float(bfloat16(std::numeric_limits<float>::signaling_NaN()))));
  CHECK(std::abs(float(bfloat16(1e-40f)) - 1e-40f) <= 0x1p-134f);  // float's subnormals: half a step
}

TEST_CASE("float16 converts from float rounding to nearest even, exactly back", "[core][half]") {
  using longattn::float16;
  check_round_trip_and_ties<float16>(0x7bff);
  CHECK(float16(1.0f).bits == 0x3c00);
  CHECK(float(float16(65504.0f)) == 65504.0f);
  CHECK(float16(65519.0f).bits == 0x7bff);  // below the midpoint to 65536: the largest finite
  CHECK(float16(65520.0f).bits == 0x7c00);  // the midpoint rounds to even: infinity
  CHECK(float16(-1e9f).bits == 0xfc00);
  CHECK(float(float16(5.9604644775390625e-8f)) == 5.9604644775390625e-8f);  // smallest subnormal 2^-24
  CHECK(float16(2.98023223876953125e-8f).bits == 0);                        // 2^-25: a tie, to even 0
  CHECK(float16(2.99e-8f).bits == 1);                                       // just above it: 2^-24
  CHECK(float16(-1e-10f).bits == 0x8000);                                   // underflow keeps the sign
  CHECK(std::isnan(float(float16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isinf(float(float16::from_bits(0x7c00))));
#if defined(__FLT16_MAX__) && !defined(__CUDACC__)
  // Against the compiler's IEEE binary16 on random float bit patterns (every magnitude).
  std::mt19937 rng(20261123);
  int disagree = 0;
  for (int n = 0; n < 1000000; ++n) {
    const float x = longattn::detail::float_from_bits(rng());
    if (std::isnan(x)) continue;
    const _Float16 theirs = static_cast<_Float16>(x);
    std::uint16_t their_bits;
    std::memcpy(&their_bits, &theirs, sizeof their_bits);
    if (float16(x).bits != their_bits) ++disagree;
  }
  CHECK(disagree == 0);
#endif
}
