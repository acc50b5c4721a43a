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

}  // namespace

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
