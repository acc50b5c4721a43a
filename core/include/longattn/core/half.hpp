// 16-bit floating-point storage: bfloat16 (float's 8 exponent bits, 7 mantissa bits) and
// float16 (IEEE 754 binary16: 5 exponent bits, 10 mantissa bits). Tensors stored in them halve
// the memory and the bytes a kernel moves; the kernels compute in float (accumulate_t<T>).
// Conversions round to nearest, ties to even, on the host and on a device alike; the bits are
// those of CUDA's __nv_bfloat16 and __half, so a CUDA kernel may reinterpret the data.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>
#include <type_traits>

// x86's F16C instructions convert between float and float16 in one instruction, rounding as the
// portable code below does; host code uses them where the compiler targets them (Kokkos' host
// architecture flags: Haswell and later). Without them a float16 element-wise kernel cost 2-4x
// its bfloat16 twin.
#if defined(__F16C__) && !defined(__CUDACC__)
#define LONGATTN_F16C 1
#include <immintrin.h>
#endif

namespace longattn {

namespace detail {

KOKKOS_INLINE_FUNCTION std::uint32_t float_bits(float x) {
  std::uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

KOKKOS_INLINE_FUNCTION float float_from_bits(std::uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

KOKKOS_INLINE_FUNCTION std::uint16_t bfloat16_bits(float x) {
  const std::uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x0040u);  // NaN stays a quiet NaN
  return std::uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);                     // carries into the exponent
}

// float16's conversions in integer arithmetic, for every compiler and device; float16_bits and
// float16_value below use the hardware's instruction where there is one.
KOKKOS_INLINE_FUNCTION std::uint16_t float16_bits_portable(float x) {
  const std::uint32_t u = float_bits(x);
  const std::uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return std::uint16_t(sign | 0x7e00u);   // NaN
  if (a >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);  // 65520 and up round to infinity
  if (a >= 0x38800000u) {  // normal: rebias the exponent (127 -> 15), round 23 mantissa bits to 10
    const std::uint32_t rebiased = a - 0x38000000u;
    return std::uint16_t(sign | ((rebiased + 0xfffu + ((rebiased >> 13) & 1u)) >> 13));
  }
  // Subnormal (or zero): the value m 2^(e - 150) in units of 2^-24 is m >> (126 - e).
  const std::uint32_t e = a >> 23;
  if (e < 102) return std::uint16_t(sign);  // below 2^-25: rounds to zero
  const std::uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
  std::uint32_t r = m >> shift;
  const std::uint32_t rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rest > half || (rest == half && (r & 1u))) ++r;  // may carry into the smallest normal: still right
  return std::uint16_t(sign | r);
}

KOKKOS_INLINE_FUNCTION float float16_value_portable(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return float_from_bits(sign | 0x7f800000u | (m << 13));  // infinity, NaN
  if (e == 0) {                                                           // zero, subnormal: m 2^-24
    const float magnitude = float(m) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  return float_from_bits(sign | ((e + 112) << 23) | (m << 13));
}

KOKKOS_INLINE_FUNCTION std::uint16_t float16_bits(float x) {
#if defined(LONGATTN_F16C)
  return _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT);
#else
  return float16_bits_portable(x);
#endif
}

// Every float16 value is a float exactly, so each conversion gives the same float. On a GPU the
// device's own: the portable one branches per value, and values converted between Hopper's
// asynchronous products (the accumulating forward's start) made ptxas serialize them.
KOKKOS_INLINE_FUNCTION float float16_value(std::uint16_t h) {
#if defined(__CUDA_ARCH__)
  float x;
  asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(h));
  return x;
#elif defined(LONGATTN_F16C)
  return _cvtsh_ss(h);
#else
  return float16_value_portable(h);
#endif
}

}  // namespace detail

struct bfloat16 {
  std::uint16_t bits;

  bfloat16() = default;
  KOKKOS_INLINE_FUNCTION explicit bfloat16(float x) : bits(detail::bfloat16_bits(x)) {}
  KOKKOS_INLINE_FUNCTION explicit bfloat16(double x) : bfloat16(float(x)) {}
  KOKKOS_INLINE_FUNCTION operator float() const { return detail::float_from_bits(std::uint32_t(bits) << 16); }
  KOKKOS_INLINE_FUNCTION static bfloat16 from_bits(std::uint16_t b) {
    bfloat16 x;
    x.bits = b;
    return x;
  }
};

struct float16 {
  std::uint16_t bits;

  float16() = default;
  KOKKOS_INLINE_FUNCTION explicit float16(float x) : bits(detail::float16_bits(x)) {}
  KOKKOS_INLINE_FUNCTION explicit float16(double x) : float16(float(x)) {}
  KOKKOS_INLINE_FUNCTION operator float() const { return detail::float16_value(bits); }
  KOKKOS_INLINE_FUNCTION static float16 from_bits(std::uint16_t b) {
    float16 x;
    x.bits = b;
    return x;
  }
};

static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);
static_assert(sizeof(float16) == 2 && alignof(float16) == 2 && std::is_trivially_copyable_v<float16>);

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

// The type a kernel computes and accumulates in for storage type T: float for the 16-bit types.
template <class T>
using accumulate_t = std::conditional_t<is_half_v<T>, float, T>;

}  // namespace longattn
