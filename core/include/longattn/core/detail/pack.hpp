// Pack<T, W>: W lanes of T that the attention kernels treat as one value (one SIMD register on a
// CPU, one scalar per thread on a GPU). The kernels are written once against this type; the
// width is a tile parameter (see attention_tiles.hpp).
//
// On host compilers with GNU vector extensions (GCC, Clang) a pack is a native vector, so the
// micro-kernels compile to broadcast + FMA on full registers. Plain loops over arrays do not:
// GCC 12 leaves them scalar (2 GFLOP/s instead of ~110 on one Sapphire Rapids core). nvcc
// compiles host and device code from one source, so CUDA builds use the portable lane loops;
// so does a host build with LONGATTN_PORTABLE_PACKS defined, which is how their host kernels
// are tested without nvcc.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "longattn/core/half.hpp"
#include "longattn/kokkos_compat.hpp"

#if defined(__GNUC__) && !defined(__CUDACC__) && !defined(__HIPCC__) && !defined(LONGATTN_PORTABLE_PACKS)
#define LONGATTN_VECTOR_EXTENSIONS 1
#if defined(__AVX512F__)
#define LONGATTN_AVX512_PACKS 1
#include <immintrin.h>
#endif
#endif

// Unrolls the loop that follows completely (its trip count a compile-time constant). Loops over
// a micro-tile's registers need it: GCC 12 leaves the store loop of a 4 x 4 tile rolled, keeps
// the accumulators in a stack array and copies them out (2.5% of the forward pass). Host GCC
// only: nvcc's host pass hands `#pragma unroll` to GCC, which rejects it, and its device pass
// unrolls these short loops by itself.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && !defined(__HIPCC__)
#define LONGATTN_UNROLL _Pragma("GCC unroll 64")
#else
#define LONGATTN_UNROLL
#endif

namespace longattn::detail {

// Two bf16 values as one word of a pair for the bf16 dot products: even in the low half.
KOKKOS_INLINE_FUNCTION std::uint32_t bf16_pair(std::uint16_t even, std::uint16_t odd) {
  return std::uint32_t(even) | std::uint32_t(odd) << 16;
}

// Bytes in one SIMD register of the host this code is compiled for.
#if defined(__AVX512F__)
inline constexpr int host_simd_bytes = 64;
#elif defined(__AVX__)
inline constexpr int host_simd_bytes = 32;
#else
inline constexpr int host_simd_bytes = 16;
#endif

// Asks L2 for the line holding p ahead of use (ForWrite: to write it; a store that misses waits
// in the store buffer for its line, and a row of them fills it): the next block's rows, into L2,
// not L1, whose 48 KiB the block products' operands fill. The empty asm is a side effect the
// compiler must keep: without it GCC 12's IPA pure-const pass finds none in a function made of
// prefetches (`__builtin_prefetch` has no side effect to it), marks the callers const and
// deletes every call.
template <bool ForWrite = false>
KOKKOS_INLINE_FUNCTION void prefetch(const void* p) {
#if defined(__GNUC__) && !defined(__CUDA_ARCH__)
  __builtin_prefetch(p, ForWrite ? 1 : 0, 2);
  asm volatile("");
#else
  (void)p;
#endif
}

// 2^f for |f| <= 1/2 by a degree-6 polynomial fitted for relative error (2e-9 in exact
// arithmetic; 1.0e-7 evaluated in float, as the degree-7 Taylor series it replaced, one FMA more).
template <class P>
KOKKOS_INLINE_FUNCTION P exp2_polynomial(P f) {
  constexpr float c1 = 0.693147202840192f, c2 = 0.24022647929215457f, c3 = 0.055503324871020644f,
                  c4 = 0.009618435441699975f, c5 = 0.0013398870388723742f, c6 = 0.00015353897188132937f;
  P p = P::broadcast(c6);
  p = fma(p, f, P::broadcast(c5));
  p = fma(p, f, P::broadcast(c4));
  p = fma(p, f, P::broadcast(c3));
  p = fma(p, f, P::broadcast(c2));
  p = fma(p, f, P::broadcast(c1));
  return fma(p, f, P::broadcast(1.0f));
}
// 2^x for x <= 0 (wider inputs work up to 2^127): x = n + f with n = round(x), |f| <= 1/2, 2^f
// by the polynomial, 2^n by writing n into the exponent bits. x <= -127 gives exactly 0, so a
// masked score (-inf) has probability 0; NaN stays NaN.
template <class P>
KOKKOS_INLINE_FUNCTION P exp2_float_lanes(P x) {
  constexpr float round_magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  x = select_less(x, -127.0f, P::broadcast(-127.0f));
  const P t = x + P::broadcast(round_magic);
  const P n = t - P::broadcast(round_magic);
  return exp2_polynomial(x - n) * pow2_of_rounded(t);
}

#ifdef LONGATTN_VECTOR_EXTENSIONS

template <class T, int W>
struct Pack {
  static_assert(std::is_floating_point_v<T>, "Pack holds float or double lanes");
  static constexpr int width = W;
  typedef T Native __attribute__((vector_size(sizeof(T) * W)));
  Native v;

  static Pack load(const T* p) {
    Pack r;
    std::memcpy(&r.v, p, sizeof(Native));
    return r;
  }
  void store(T* p) const { std::memcpy(p, &v, sizeof(Native)); }
  static Pack broadcast(T x) { return {Native{} + x}; }
  T operator[](int lane) const { return v[lane]; }

  friend Pack operator+(Pack a, Pack b) { return {a.v + b.v}; }
  friend Pack operator-(Pack a, Pack b) { return {a.v - b.v}; }
  friend Pack operator*(Pack a, Pack b) { return {a.v * b.v}; }
  friend Pack operator/(Pack a, Pack b) { return {a.v / b.v}; }
  // a * b + c; GCC and Clang contract it to one FMA instruction.
  friend Pack fma(Pack a, Pack b, Pack c) { return {a.v * b.v + c.v}; }
  friend Pack fma(T a, Pack b, Pack c) { return {a * b.v + c.v}; }
  // x, which the compiler must then hold in a register (an empty asm that may change it): it
  // cannot fold the load of x into every instruction that reads it. Only a pack that is one
  // vector register: one scalar (the GPU's tile shapes run on the host) or several registers
  // have none to name.
  friend Pack in_register(Pack x) {
#if defined(__x86_64__) || defined(__i386__)
    if constexpr (sizeof(Native) >= 16 && sizeof(Native) <= host_simd_bytes) asm("" : "+v"(x.v));
#endif
    return x;
  }
  friend Pack max(Pack a, Pack b) { return {a.v < b.v ? b.v : a.v}; }
  // Lane-wise: x < bound ? y : x.
  friend Pack select_less(Pack x, T bound, Pack y) { return {x.v < bound ? y.v : x.v}; }
  // Lane-wise: x == value ? y : x.
  friend Pack select_equal(Pack x, T value, Pack y) { return {x.v == value ? y.v : x.v}; }
  // 2^n for t = n + 1.5 * 2^23 (float lanes), from t's bits: the low mantissa bits hold n. In
  // unsigned arithmetic, which wraps where a NaN's bits would overflow a signed int (the result
  // is NaN all the same: the polynomial's factor is NaN).
  friend Pack pow2_of_rounded(Pack t) {
    typedef unsigned Bits __attribute__((vector_size(sizeof(unsigned) * W)));
    // A C-style cast between vector types of one size reinterprets the bits.
    const Bits n = (Bits)t.v - 0x4B400000u;
    return {(Native)((n + 127u) << 23)};
  }

  // The lanes rounded to bfloat16 (as bfloat16(float), half.hpp), stored as pairs for the bf16
  // dot products (bf16_pair_product.hpp): word l = (even[l], odd[l]), even in the low half.
  friend void store_bf16_pairs(Pack even, Pack odd, std::uint32_t* out) {
    const Words pairs = bf16_bits(even) | bf16_bits(odd) << 16;
    std::memcpy(out, &pairs, sizeof pairs);
  }

 private:
  typedef std::uint32_t Words __attribute__((vector_size(sizeof(std::uint32_t) * W)));
  static Words bf16_bits(Pack x) {
    typedef float Floats __attribute__((vector_size(sizeof(float) * W)));
    const Floats f = __builtin_convertvector(x.v, Floats);
    const Words u = (Words)f;
    const Words rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // to nearest, ties to even
    const Words quiet_nan = (u >> 16) | 0x40u;
    return f != f ? quiet_nan : rounded;
  }
};

#else

template <class T, int W>
struct Pack {
  static_assert(std::is_floating_point_v<T>, "Pack holds float or double lanes");
  static constexpr int width = W;
  T v[W];

  KOKKOS_INLINE_FUNCTION static Pack load(const T* p) {
    Pack r;
    for (int l = 0; l < W; ++l) r.v[l] = p[l];
    return r;
  }
  KOKKOS_INLINE_FUNCTION void store(T* p) const {
    for (int l = 0; l < W; ++l) p[l] = v[l];
  }
  KOKKOS_INLINE_FUNCTION static Pack broadcast(T x) {
    Pack r;
    for (int l = 0; l < W; ++l) r.v[l] = x;
    return r;
  }
  KOKKOS_INLINE_FUNCTION T operator[](int lane) const { return v[lane]; }

#define LONGATTN_PACK_LANEWISE(signature, expression) \
  KOKKOS_INLINE_FUNCTION friend Pack signature {      \
    Pack r;                                           \
    for (int l = 0; l < W; ++l) r.v[l] = expression;  \
    return r;                                         \
  }
  LONGATTN_PACK_LANEWISE(operator+(Pack a, Pack b), a.v[l] + b.v[l])
  LONGATTN_PACK_LANEWISE(operator-(Pack a, Pack b), a.v[l] - b.v[l])
  LONGATTN_PACK_LANEWISE(operator*(Pack a, Pack b), a.v[l] * b.v[l])
  LONGATTN_PACK_LANEWISE(operator/(Pack a, Pack b), a.v[l] / b.v[l])
  LONGATTN_PACK_LANEWISE(fma(Pack a, Pack b, Pack c), a.v[l] * b.v[l] + c.v[l])
  LONGATTN_PACK_LANEWISE(fma(T a, Pack b, Pack c), a * b.v[l] + c.v[l])
  KOKKOS_INLINE_FUNCTION friend Pack in_register(Pack x) { return x; }
  LONGATTN_PACK_LANEWISE(max(Pack a, Pack b), a.v[l] < b.v[l] ? b.v[l] : a.v[l])
  LONGATTN_PACK_LANEWISE(select_less(Pack x, T bound, Pack y), x.v[l] < bound ? y.v[l] : x.v[l])
  LONGATTN_PACK_LANEWISE(select_equal(Pack x, T value, Pack y), x.v[l] == value ? y.v[l] : x.v[l])
#undef LONGATTN_PACK_LANEWISE
  KOKKOS_INLINE_FUNCTION friend Pack pow2_of_rounded(Pack t) {
    Pack r;
    for (int l = 0; l < W; ++l) {
      std::uint32_t bits;
      memcpy(&bits, &t.v[l], sizeof bits);
      bits = (bits - 0x4B400000u + 127u) << 23;
      memcpy(&r.v[l], &bits, sizeof bits);
    }
    return r;
  }
  KOKKOS_INLINE_FUNCTION friend void store_bf16_pairs(Pack even, Pack odd, std::uint32_t* out) {
    for (int l = 0; l < W; ++l)
      out[l] = bf16_pair(bfloat16_bits(float(even.v[l])), bfloat16_bits(float(odd.v[l])));
  }
};

#endif

// 2^x lane-wise: the polynomial above for float, the math library for double (the double
// kernels are the accurate reference path, not the fast one).
template <int W>
KOKKOS_INLINE_FUNCTION Pack<float, W> exp2(Pack<float, W> x) {
  return exp2_float_lanes(x);
}

#ifdef LONGATTN_AVX512_PACKS
// The same polynomial with AVX-512's rounding (vrndscaleps) and 2^n scaling (vscalefps): 11
// instructions where the bit arithmetic above takes 15. x <= -151 gives exactly 0 (2^-151
// rounds to 0); between -150 and -126 the result is subnormal. NaN stays NaN. (The masked
// forms with every lane set: GCC 12 calls the unmasked ones' undefined source uninitialized.)
inline Pack<float, 16> exp2(Pack<float, 16> x) {
  using P = Pack<float, 16>;
  constexpr __mmask16 all = 0xffff;
  const __m512 clamped = (__m512)select_less(x, -151.0f, P::broadcast(-151.0f)).v;
  const __m512 n = _mm512_mask_roundscale_ps(clamped, all, clamped, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const P p = exp2_polynomial(P{(P::Native)(clamped - n)});
  return {(P::Native)_mm512_mask_scalef_ps((__m512)p.v, all, (__m512)p.v, n)};
}

// Whether every lane holds `value`.
inline bool all_lanes_equal(Pack<float, 16> x, float value) {
  return _mm512_cmp_ps_mask((__m512)x.v, _mm512_set1_ps(value), _CMP_NEQ_UQ) == 0;
}
#endif

// How the bf16 path rounds float lanes to bf16 for its products: in integer arithmetic, on any
// CPU (store_bf16_pairs above), or by AVX512-BF16's vcvtne2ps2bf16, which rounds two packs in
// one instruction where the CPU has it (every CPU with the bf16 dot or tile products does). Both
// round to nearest, ties to even, and keep NaN a quiet NaN; the instruction also takes subnormal
// inputs (below 2^-126) as zero.
enum class Bf16Rounding { integer, avx512_bf16 };

template <class T, int W>
KOKKOS_INLINE_FUNCTION void store_bf16_pairs(Pack<T, W> even, Pack<T, W> odd, std::uint32_t* out, Bf16Rounding) {
  store_bf16_pairs(even, odd, out);
}
// The 2W lanes of `first` then `second` rounded to bf16 in their order, W words.
template <class T, int W>
KOKKOS_INLINE_FUNCTION void store_bf16_in_order(Pack<T, W> first, Pack<T, W> second, std::uint32_t* out, Bf16Rounding) {
  auto bits = [&](int lane) { return bfloat16_bits(float(lane < W ? first[lane] : second[lane - W])); };
  for (int word = 0; word < W; ++word) out[word] = bf16_pair(bits(2 * word), bits(2 * word + 1));
}

#ifdef LONGATTN_AVX512_PACKS
// vcvtne2ps2bf16 puts low's 16 lanes as bf16 in the low 16 halfwords, high's in the high 16;
// for pairs, vpermw interleaves them. Inline assembly: this code is compiled for AVX-512F,
// which need not include AVX512-BF16 or AVX512BW (it runs only where the CPU has both), so
// their intrinsics are not there to call.
inline __m512i bf16_halves(Pack<float, 16> low, Pack<float, 16> high) {
  __m512i halves;
  asm("vcvtne2ps2bf16 %2, %1, %0" : "=v"(halves) : "v"(high.v), "v"(low.v));
  return halves;
}
inline void store_bf16_in_order(Pack<float, 16> first, Pack<float, 16> second, std::uint32_t* out, Bf16Rounding rounding) {
  if (rounding == Bf16Rounding::integer) return store_bf16_in_order<float, 16>(first, second, out, rounding);
  _mm512_storeu_si512(out, bf16_halves(first, second));
}
inline void store_bf16_pairs(Pack<float, 16> even, Pack<float, 16> odd, std::uint32_t* out, Bf16Rounding rounding) {
  if (rounding == Bf16Rounding::integer) return store_bf16_pairs(even, odd, out);
  const __m512i halves = bf16_halves(even, odd);
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                              22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  __m512i pairs;
  asm("vpermw %2, %1, %0" : "=v"(pairs) : "v"(interleave), "v"(halves));
  _mm512_storeu_si512(out, pairs);
}
#endif

// Whether every lane holds `value`.
template <class T, int W>
KOKKOS_INLINE_FUNCTION bool all_lanes_equal(Pack<T, W> x, T value) {
  for (int l = 0; l < W; ++l)
    if (!(x[l] == value)) return false;
  return true;
}

template <int W>
KOKKOS_INLINE_FUNCTION Pack<double, W> exp2(Pack<double, W> x) {
  alignas(sizeof(double) * W) double lanes[W];
  x.store(lanes);
  for (int l = 0; l < W; ++l) lanes[l] = math::exp2(lanes[l]);
  return Pack<double, W>::load(lanes);
}

}  // namespace longattn::detail
