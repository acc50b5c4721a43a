// The kernels on bf16 dot products: gemm's packing and micro-kernel
// (include/longattn/core/detail/bf16_gemm.hpp has the shape) and the attention kernels' block
// products (detail/bf16_pair_product.hpp; on tile products they are in bf16_tile_products.cpp).
// Functions that use AVX-512 carry a target attribute, so this file needs no -mavx512 flags and
// the rest of the library runs on any x86-64; they are only called after the CPU check.
#include "longattn/core/detail/bf16_gemm.hpp"
#include "longattn/core/detail/bf16_pair_product.hpp"
#include "longattn/core/bf16_dot_products.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include "longattn/error.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#include <immintrin.h>
#define LONGATTN_BF16_KERNELS 1
#define LONGATTN_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#endif

namespace longattn {
namespace {

bool cpu_has_avx512_bf16() {
#ifdef LONGATTN_BF16_KERNELS
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

#ifdef LONGATTN_BF16_KERNELS
#define LONGATTN_ON_16_REGISTERS(op) \
  op("0") op("1") op("2") op("3") op("4") op("5") op("6") op("7") op("8") op("9") op("10") op("11") op("12") op("13") op("14") op("15")
#define LONGATTN_ZERO(r) "vpxord %%zmm" r ", %%zmm" r ", %%zmm" r "\n"
#define LONGATTN_DOT(r) "vdpbf16ps %%zmm16, %%zmm17, %%zmm" r "\n"
#define LONGATTN_FMA(r) "vfmadd231ps %%zmm16, %%zmm17, %%zmm" r "\n"
#define LONGATTN_CLOBBERS                                                                                       \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", \
      "xmm14", "xmm15", "xmm16", "xmm17"

// Seconds for 16 independent chains of 4096 instructions (bf16 dot products or float FMAs) on
// zeroed registers.
LONGATTN_AVX512_BF16 double seconds_for(bool dot_products) {
  const auto start = std::chrono::steady_clock::now();
  asm volatile(LONGATTN_ON_16_REGISTERS(LONGATTN_ZERO) LONGATTN_ZERO("16") LONGATTN_ZERO("17")::: LONGATTN_CLOBBERS);
  for (int round = 0; round < 4096; ++round) {
    if (dot_products)
      asm volatile(LONGATTN_ON_16_REGISTERS(LONGATTN_DOT)::: LONGATTN_CLOBBERS);
    else
      asm volatile(LONGATTN_ON_16_REGISTERS(LONGATTN_FMA)::: LONGATTN_CLOBBERS);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
#endif

// Products per second of bf16 dot products over float FMAs on this core (bf16_dot_products.hpp),
// the best of three alternations.
double measure_speedup() {
#ifdef LONGATTN_BF16_KERNELS
  if (!bf16_dot_products_available()) return 0;
  double fma = 1e30, dot = 1e30;
  for (int alternation = 0; alternation < 3; ++alternation) {
    fma = std::min(fma, seconds_for(false));
    dot = std::min(dot, seconds_for(true));
  }
  return 2 * fma / dot;
#else
  return 0;
#endif
}

// LONGATTN_BF16_DOT_PRODUCTS: unset or "auto": used where they are faster; "1": used wherever
// the CPU has them; "0": not used. Checked on every CPU, used only on those with them.
bool wanted() {
  const char* value = std::getenv("LONGATTN_BF16_DOT_PRODUCTS");
  const std::string v = value ? value : "auto";
  require(v == "0" || v == "1" || v == "auto", "longattn (bf16 dot products)", "LONGATTN_BF16_DOT_PRODUCTS", v,
          "0 (off), 1 (on where the CPU has them) or auto (on where faster than float FMAs, the default)");
  if (!bf16_dot_products_available()) return false;
  if (v == "auto") return bf16_dot_product_speedup() >= bf16_dot_products_minimum_speedup;
  return v == "1";
}

std::atomic<bool>& in_use() {
  static std::atomic<bool> flag(wanted());
  return flag;
}

}  // namespace

bool bf16_dot_products_available() {
  static const bool available = cpu_has_avx512_bf16();
  return available;
}

double bf16_dot_product_speedup() {
  static const double speedup = measure_speedup();
  return speedup;
}

bool bf16_dot_products_in_use() { return in_use().load(std::memory_order_relaxed); }

void use_bf16_dot_products(bool on) { in_use().store(on && bf16_dot_products_available(), std::memory_order_relaxed); }

namespace detail {

void pack_bf16_panel(const Bf16Operand& op, int first, int width, bfloat16* panel) {
  // panel[(q * width + w) * 2 + s] = op(first + w, 2q + s): pairs of depth next to each other.
  const int pairs = (op.depth + 1) / 2, valid = std::min(width, op.outer - first);
  std::uint16_t* out = reinterpret_cast<std::uint16_t*>(panel);
  auto element = [&](int w, int d) -> std::uint16_t {
    return op.data[std::ptrdiff_t(first + w) * op.outer_stride + std::ptrdiff_t(d) * op.depth_stride].bits;
  };
  if (op.outer_stride == 1) {
    // Outer indices contiguous (op(B) of a row-major B, op(A) of a transposed A): interleave two
    // depth rows at a time; the inner loop vectorizes.
    for (int q = 0; q < pairs; ++q) {
      std::uint16_t* dst = out + std::size_t(q) * width * 2;
      const std::uint16_t* even = &op.data[std::ptrdiff_t(first) + std::ptrdiff_t(2 * q) * op.depth_stride].bits;
      const std::uint16_t* odd = 2 * q + 1 < op.depth ? even + op.depth_stride : nullptr;
      for (int w = 0; w < valid; ++w) {
        dst[2 * w] = even[w];
        dst[2 * w + 1] = odd ? odd[w] : std::uint16_t(0);
      }
      for (int w = valid; w < width; ++w) dst[2 * w] = dst[2 * w + 1] = 0;
    }
    return;
  }
  if (op.depth_stride == 1) {
    // Depth contiguous (op(A) of a row-major A, op(B) of a transposed B): pairs are 4-byte copies.
    const int full_pairs = op.depth / 2;
    for (int w = 0; w < width; ++w) {
      const std::uint16_t* src = w < valid ? &op.data[std::ptrdiff_t(first + w) * op.outer_stride].bits : nullptr;
      for (int q = 0; q < pairs; ++q) {
        std::uint16_t* dst = out + (std::size_t(q) * width + w) * 2;
        if (!src) {
          dst[0] = dst[1] = 0;
        } else if (q < full_pairs) {
          std::memcpy(dst, src + 2 * q, 2 * sizeof(std::uint16_t));
        } else {
          dst[0] = src[2 * q];
          dst[1] = 0;
        }
      }
    }
    return;
  }
  for (int w = 0; w < width; ++w)
    for (int q = 0; q < pairs; ++q) {
      std::uint16_t* dst = out + (std::size_t(q) * width + w) * 2;
      const bool inside = w < valid;
      dst[0] = inside ? element(w, 2 * q) : 0;
      dst[1] = inside && 2 * q + 1 < op.depth ? element(w, 2 * q + 1) : 0;
    }
}

#ifdef LONGATTN_BF16_KERNELS
// GCC 12's AVX-512 intrinsics start results from _mm512_undefined_*() ("__Y = __Y"), which it
// then reports as maybe uninitialized wherever they inline.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
namespace {

constexpr int mr = bf16_gemm_mr, nr = bf16_gemm_nr, lanes = 16;
static_assert(nr == 2 * lanes, "a micro-tile row is two zmm registers");

LONGATTN_AVX512_BF16 inline __m512 widen_bf16(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// Rounds to nearest, ties to even, NaN to a quiet NaN: the bits of bfloat16(float) (half.hpp).
LONGATTN_AVX512_BF16 inline __m256i round_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

// C rows [0, rows) x columns [0, cols) of the micro-tile at c (unit column stride) from acc.
LONGATTN_AVX512_BF16 inline void store_rows(const __m512 (&acc)[mr][2], int rows, int cols, const Bf16GemmOutput& out,
                                           std::ptrdiff_t offset) {
  const __m512 alpha = _mm512_set1_ps(out.alpha), beta = _mm512_set1_ps(out.beta);
  const bool read_c = out.beta != 0.0f;
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < 2; ++h) {
      const int n = std::min(lanes, cols - h * lanes);
      if (n <= 0) break;
      const __mmask16 mask = __mmask16((1u << n) - 1);
      const std::ptrdiff_t at = offset + r * out.row_stride + h * lanes;
      __m512 v = _mm512_mul_ps(alpha, acc[r][h]);
      if (out.bf16) {
        std::uint16_t* c = static_cast<std::uint16_t*>(out.data) + at;
        if (read_c) v = _mm512_fmadd_ps(beta, widen_bf16(_mm256_maskz_loadu_epi16(mask, c)), v);
        _mm256_mask_storeu_epi16(c, mask, round_bf16(v));
      } else {
        float* c = static_cast<float*>(out.data) + at;
        if (read_c) v = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(mask, c), v);
        _mm512_mask_storeu_ps(c, mask, v);
      }
    }
}

// The same for any column stride, element by element.
LONGATTN_AVX512_BF16 inline void store_elements(const __m512 (&acc)[mr][2], int rows, int cols,
                                               const Bf16GemmOutput& out, std::ptrdiff_t offset) {
  alignas(64) float tile[mr][nr];
  for (int r = 0; r < mr; ++r)
    for (int h = 0; h < 2; ++h) _mm512_store_ps(&tile[r][h * lanes], acc[r][h]);
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < cols; ++j) {
      const std::ptrdiff_t at = offset + r * out.row_stride + j * out.col_stride;
      float v = out.alpha * tile[r][j];
      if (out.bf16) {
        bfloat16& c = static_cast<bfloat16*>(out.data)[at];
        if (out.beta != 0.0f) v += out.beta * float(c);
        c = bfloat16(v);
      } else {
        float& c = static_cast<float*>(out.data)[at];
        if (out.beta != 0.0f) v += out.beta * c;
        c = v;
      }
    }
}

}  // namespace

LONGATTN_AVX512_BF16 void bf16_gemm_block(const bfloat16* packed_a, const bfloat16* packed_b, int depth,
                                          int first_row_panel, int row_panels, int column_panel,
                                          const Bf16GemmOutput& c) {
  const int pairs = (depth + 1) / 2;
  const std::uint16_t* b = &packed_b[bf16_panel_elements(nr, depth) * std::size_t(column_panel)].bits;
  const int j0 = column_panel * nr, cols = std::min(nr, c.cols - j0);
  for (int p = first_row_panel; p < first_row_panel + row_panels; ++p) {
    const std::uint16_t* a = &packed_a[bf16_panel_elements(mr, depth) * std::size_t(p)].bits;
    __m512 acc[mr][2];
#pragma GCC unroll 12
    for (int r = 0; r < mr; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int q = 0; q < pairs; ++q) {
      const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + q * 2 * nr);
      const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + q * 2 * nr + 2 * lanes);
#pragma GCC unroll 12
      for (int r = 0; r < mr; ++r) {
        std::int32_t pair;
        std::memcpy(&pair, a + (q * mr + r) * 2, sizeof pair);
        const __m512bh a_r = (__m512bh)_mm512_set1_epi32(pair);
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a_r, b0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a_r, b1);
      }
    }
    const int i0 = p * mr, rows = std::min(mr, c.rows - i0);
    const std::ptrdiff_t offset = i0 * c.row_stride + j0 * c.col_stride;
    if (c.col_stride == 1)
      store_rows(acc, rows, cols, c, offset);
    else
      store_elements(acc, rows, cols, c, offset);
  }
}

namespace {

// One micro-tile of an attention block product: R rows x 64 columns from (row, col), the
// columns past x.cols masked off.
template <int R>
LONGATTN_AVX512_BF16 inline void pair_micro_tile(const Bf16PairProduct& x, int row, int col) {
  constexpr int packs = bf16_pair_tile_cols / lanes;
  // Every loop over the micro-tile is unrolled: GCC keeps acc in registers only when each index
  // into it is a constant (else it spills all 16 accumulators on every pair).
  __mmask16 mask[packs];
#pragma GCC unroll 4
  for (int v = 0; v < packs; ++v) {
    const int n = std::clamp(x.cols - col - v * lanes, 0, lanes);
    mask[v] = __mmask16((1u << n) - 1);
  }
  __m512 acc[R][packs];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < packs; ++v) acc[r][v] = _mm512_setzero_ps();
  // A(row + r, p) and B[p][col] advance by a pair's stride each step.
  const std::uint32_t* a = x.a + std::ptrdiff_t(row) * x.a_row_stride;
  const std::uint32_t* b = x.b + col;
  const std::ptrdiff_t a_row_stride = x.a_row_stride, a_pair_stride = x.a_pair_stride, ldb = x.ldb;
  for (int p = x.pairs; p > 0; --p, a += a_pair_stride, b += ldb) {
    __m512bh b_p[packs];
#pragma GCC unroll 4
    for (int v = 0; v < packs; ++v) b_p[v] = (__m512bh)_mm512_maskz_loadu_epi32(mask[v], b + v * lanes);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512bh a_rp = (__m512bh)_mm512_set1_epi32(int(a[r * a_row_stride]));
#pragma GCC unroll 4
      for (int v = 0; v < packs; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a_rp, b_p[v]);
    }
  }
  const __m512 alpha = _mm512_set1_ps(x.alpha);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < packs; ++v) {
      float* c = x.c + std::ptrdiff_t(row + r) * x.ldc + col + v * lanes;
      const __m512 before = x.accumulate ? _mm512_maskz_loadu_ps(mask[v], c) : _mm512_setzero_ps();
      _mm512_mask_storeu_ps(c, mask[v], _mm512_fmadd_ps(alpha, acc[r][v], before));
    }
}

// Rows [first_row, end_row) of the product on dot products, a row of micro-tiles at a time.
LONGATTN_AVX512_BF16 void bf16_dot_pair_product(const Bf16PairProduct& x, int first_row, int end_row) {
  constexpr int R = bf16_pair_tile_rows;
  const int row_tiles = (end_row - first_row + R - 1) / R;
  for (int t = 0; t < row_tiles; ++t) {
    const int row = first_row + t * R;
    for (int col = 0; col < x.cols; col += bf16_pair_tile_cols)
      if (row + R <= end_row)
        pair_micro_tile<R>(x, row, col);
      else
        for (int r = row; r < end_row; ++r) pair_micro_tile<1>(x, r, col);
    bf16_prefetch_part(x, first_row, end_row, t, row_tiles);
  }
}

}  // namespace

void bf16_pair_product(const Bf16PairProduct& x, int first_row, int end_row) {
  if (bf16_tile_products_in_use())
    bf16_tile_pair_product(x, first_row, end_row);
  else
    bf16_dot_pair_product(x, first_row, end_row);
}

#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#else

void bf16_gemm_block(const bfloat16*, const bfloat16*, int, int, int, int, const Bf16GemmOutput&) {
  throw Error("longattn::gemm: bf16 dot products are not available in this build");
}

void bf16_pair_product(const Bf16PairProduct&, int, int) {
  throw Error("longattn attention: bf16 dot products are not available in this build");
}

#endif

}  // namespace detail
}  // namespace longattn
