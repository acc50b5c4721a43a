// The 16-bit storage types' conversions, exhaustively: every bfloat16 and float16 value survives
// float and back, every midpoint between neighbours rounds to the even one, values just either
// side of a midpoint round to the nearer one; overflow, underflow, infinities and NaN. float16
// also against the compiler's own _Float16 where it has one, both its own conversions (a host's
// F16C instructions where it has them) and the portable integer code; every 16-bit value read as
// a float on each execution space (a GPU converts with its own instruction) against its definition.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "execution_spaces.hpp"
#include "longattn/core/half.hpp"

namespace {

// A 16-bit type's conversions as functions of bits: H's own (the hardware's where it has them), or
// float16's portable integer code, which a host with F16C does not otherwise run.
template <class H>
struct Conversions {
  static std::uint16_t to_bits(float x) { return H(x).bits; }
  static float to_float(std::uint16_t bits) { return H::from_bits(bits); }
};
struct PortableFloat16 {
  static std::uint16_t to_bits(float x) { return longattn::detail::float16_bits_portable(x); }
  static float to_float(std::uint16_t bits) { return longattn::detail::float16_value_portable(bits); }
};

// Checks the conversions C over all finite values of both signs (bits up to largest_finite, then
// the next value away from zero is bits + 1). Counts failures instead of one CHECK per value.
template <class C>
void check_round_trip_and_ties(std::uint16_t largest_finite) {
  int wrong_round_trip = 0, wrong_tie = 0, wrong_near_tie = 0;
  for (std::uint32_t bits = 0; bits <= largest_finite; ++bits)
    for (const std::uint32_t sign : {0u, 0x8000u}) {
      const std::uint16_t value_bits = std::uint16_t(bits | sign);
      const float value = C::to_float(value_bits);
      if (C::to_bits(value) != value_bits) ++wrong_round_trip;
      if (bits == largest_finite) continue;
      // The midpoint of this value and the next one away from zero is exact in float.
      const float next = C::to_float(std::uint16_t((bits + 1) | sign));
      const float middle = value / 2 + next / 2;
      const std::uint16_t even = (bits & 1u) ? std::uint16_t((bits + 1) | sign) : value_bits;
      if (C::to_bits(middle) != even) ++wrong_tie;
      const float below = std::nextafter(middle, value), above = std::nextafter(middle, next);
      if (C::to_bits(below) != value_bits || C::to_bits(above) != std::uint16_t((bits + 1) | sign)) ++wrong_near_tie;
    }
  CHECK(wrong_round_trip == 0);
  CHECK(wrong_tie == 0);
  CHECK(wrong_near_tie == 0);
}

// A 16-bit value from its definition, in double: sign, exponent field e (biased by `bias`),
// mantissa field m of `mantissa_bits`; e all ones is infinity (m 0) or NaN, e 0 is m 2^(1 - bias - mantissa_bits).
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
  check_round_trip_and_ties<Conversions<bfloat16>>(0x7f7f);
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

namespace {

// float16's conversions C: rounding, the extremes, every value read against the definition, and
// the compiler's own binary16 where it has one.
template <class C>
void check_float16() {
  check_round_trip_and_ties<C>(0x7bff);
  CHECK(C::to_bits(1.0f) == 0x3c00);
  CHECK(C::to_float(C::to_bits(65504.0f)) == 65504.0f);
  CHECK(C::to_bits(65519.0f) == 0x7bff);  // below the midpoint to 65536: the largest finite
  CHECK(C::to_bits(65520.0f) == 0x7c00);  // the midpoint rounds to even: infinity
  CHECK(C::to_bits(-1e9f) == 0xfc00);
  CHECK(C::to_float(C::to_bits(5.9604644775390625e-8f)) == 5.9604644775390625e-8f);  // smallest subnormal 2^-24
  CHECK(C::to_bits(2.98023223876953125e-8f) == 0);                                  // 2^-25: a tie, to even 0
  CHECK(C::to_bits(2.99e-8f) == 1);                                                 // just above it: 2^-24
  CHECK(C::to_bits(-1e-10f) == 0x8000);                                             // underflow keeps the sign
  CHECK(std::isnan(C::to_float(C::to_bits(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isinf(C::to_float(0x7c00)));
  int wrong_value = 0;
  for (std::uint32_t bits = 0; bits < (1u << 16); ++bits)
    wrong_value += !same_value(C::to_float(std::uint16_t(bits)), value_of(bits, 5, 10));
  CHECK(wrong_value == 0);
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
    if (C::to_bits(x) != their_bits) ++disagree;
  }
  CHECK(disagree == 0);
#endif
}

}  // namespace

TEST_CASE("float16 converts from float rounding to nearest even, exactly back", "[core][half]") {
  SECTION("float16's own conversions (F16C on a host that has it)") { check_float16<Conversions<longattn::float16>>(); }
  SECTION("the portable conversions") { check_float16<PortableFloat16>(); }
}
