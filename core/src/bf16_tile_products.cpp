// The attention kernels' block products on Intel AMX-BF16 tile products
// (detail/bf16_pair_product.hpp has the operands and the micro-kernel's shape), and the switch
// that says whether they are used (bf16_dot_products.hpp). Functions that use AMX or AVX-512
// carry a target attribute, so this file needs no -mamx flags; they run only after the CPU
// check and the OS's grant of the tile registers.
#include "longattn/core/bf16_dot_products.hpp"
#include "longattn/core/detail/amx_tile_config.hpp"
#include "longattn/core/detail/bf16_pair_product.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "longattn/error.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__) && !defined(__CUDACC__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define LONGATTN_AMX_KERNELS 1
#define LONGATTN_AMX_BF16 __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl")))
#endif

namespace longattn {
namespace {

// The CPU has the instructions and Linux lets this process use the tile registers (their 8 KiB
// of state is granted per process on request: arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)).
bool cpu_and_os_have_amx_bf16() {
#ifdef LONGATTN_AMX_KERNELS
  // CPUID leaf 7's EDX: bit 22 AMX-BF16, bit 24 AMX-TILE (Clang 14 cannot name them to
  // __builtin_cpu_supports).
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || !(edx >> 22 & 1u) || !(edx >> 24 & 1u)) return false;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl")) return false;
  constexpr long request_permission = 0x1023, tile_data = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
  return syscall(SYS_arch_prctl, request_permission, tile_data) == 0;
#else
  return false;
#endif
}

// LONGATTN_BF16_TILE_PRODUCTS: unset or "1": used where available; "0": not used.
bool wanted() {
  const char* value = std::getenv("LONGATTN_BF16_TILE_PRODUCTS");
  const std::string v = value ? value : "1";
  require(v == "0" || v == "1", "longattn (bf16 tile products)", "LONGATTN_BF16_TILE_PRODUCTS", v,
          "0 (off) or 1 (on where the CPU has AMX-BF16, the default)");
  return v == "1" && bf16_tile_products_available();
}

std::atomic<bool>& in_use() {
  static std::atomic<bool> flag(wanted());
  return flag;
}

}  // namespace

bool bf16_tile_products_available() {
  static const bool available = cpu_and_os_have_amx_bf16();
  return available;
}

bool bf16_tile_products_in_use() { return in_use().load(std::memory_order_relaxed); }

void use_bf16_tile_products(bool on) {
  in_use().store(on && bf16_tile_products_available(), std::memory_order_relaxed);
}

namespace detail {

#ifdef LONGATTN_AMX_KERNELS
// GCC 12's AVX-512 intrinsics start results from _mm512_undefined_*() ("__Y = __Y"), which it
// then reports as maybe uninitialized wherever they inline (as in bf16_gemm.cpp).
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
namespace {

// A tile register holds 16 rows of 64 bytes: 16 pairs (A), 16 columns of pairs (B) or 16 floats
// (C). The micro-kernel keeps C tiles 0-3 (rows 0-15 and 16-31 by columns 0-15 and 16-31 of its
// 32 x 32 block), A tiles 4-5 (its rows 0-15, 16-31) and B tiles 6-7 (its columns 0-15, 16-31).
constexpr int tile = 16;
constexpr int block = 2 * tile;
constexpr int tile_row_bytes = 64;

// Tiles 0-7 as 16 rows of 64 bytes, at every call: other code on the thread (oneDNN under
// PyTorch, say) may have configured them otherwise. Keeping them configured between calls (the
// configuration in force read back, loaded where it differed) measured no faster on a Sapphire
// Rapids guest (perf_tests/RESULTS.md, 2026-12-02, evening).
LONGATTN_AMX_BF16 void configure_tiles() { load_amx_tile_config(amx_tile_config(8, tile, tile_row_bytes)); }

// Transposes 16 x 16 words: on return, v[i] holds what was column i of v[0..15].
LONGATTN_AMX_BF16 void transpose_16x16(__m512i (&v)[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {  // per 128-bit lane: (a0 b0 a1 b1), (a2 b2 a3 b3) of rows i, i + 1
    t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // v[i + j], lane L: column 4L + j of rows i .. i + 3
    v[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    v[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    v[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    v[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int j = 0; j < 4; ++j) {  // column 4L + j: lane L of v[j], v[4 + j], v[8 + j], v[12 + j]
    const __m512i low01 = _mm512_shuffle_i32x4(v[j], v[4 + j], 0x44);  // lanes 0, 1 of each
    const __m512i high01 = _mm512_shuffle_i32x4(v[j], v[4 + j], 0xee);  // lanes 2, 3
    const __m512i low23 = _mm512_shuffle_i32x4(v[8 + j], v[12 + j], 0x44);
    const __m512i high23 = _mm512_shuffle_i32x4(v[8 + j], v[12 + j], 0xee);
    t[j] = _mm512_shuffle_i32x4(low01, low23, 0x88);
    t[4 + j] = _mm512_shuffle_i32x4(low01, low23, 0xdd);
    t[8 + j] = _mm512_shuffle_i32x4(high01, high23, 0x88);
    t[12 + j] = _mm512_shuffle_i32x4(high01, high23, 0xdd);
  }
  for (int i = 0; i < 16; ++i) v[i] = t[i];
}

// Rows [row, row + 32) of A over all its pairs, as tile loads read them: words
// strip[r * stride + p]. A itself where its pairs lie along its rows and the 32 rows and
// the pairs fill whole tiles; otherwise a copy with zeros past A's rows and pairs, in `copy`
// (transposed where A's pairs run down its columns, which then hold its rows: a_row_stride 1).
struct Strip {
  const std::uint32_t* words;
  std::ptrdiff_t stride;
};

LONGATTN_AMX_BF16 Strip a_strip(const Bf16PairProduct& x, int row, std::vector<std::uint32_t>& copy) {
  const int pairs_padded = (x.pairs + tile - 1) / tile * tile;
  if (x.a_pair_stride == 1 && row + block <= x.rows && x.pairs == pairs_padded)
    return {x.a + std::ptrdiff_t(row) * x.a_row_stride, x.a_row_stride};
  copy.resize(std::size_t(block) * pairs_padded);
  const int rows = std::min(block, x.rows - row);
  if (x.a_pair_stride == 1) {
    std::fill(copy.begin() + std::ptrdiff_t(rows) * pairs_padded, copy.end(), 0u);
    for (int r = 0; r < rows; ++r) {
      std::uint32_t* out = &copy[std::size_t(r) * pairs_padded];
      std::memcpy(out, x.a + std::ptrdiff_t(row + r) * x.a_row_stride, std::size_t(x.pairs) * sizeof(std::uint32_t));
      std::fill(out + x.pairs, out + pairs_padded, 0u);
    }
    return {copy.data(), pairs_padded};
  }
  // 16 rows by 16 pairs at a time: 16 pairs' rows read as vectors (masked past A's rows, zero past
  // its pairs), transposed into 16 rows' pairs.
  for (int group = 0; group < block; group += tile) {
    const __mmask16 inside = __mmask16((1u << std::clamp(rows - group, 0, tile)) - 1);
    for (int pair = 0; pair < pairs_padded; pair += tile) {
      __m512i v[tile];
      for (int k = 0; k < tile; ++k)
        v[k] = pair + k < x.pairs
                   ? _mm512_maskz_loadu_epi32(inside, x.a + std::ptrdiff_t(pair + k) * x.a_pair_stride + row + group)
                   : _mm512_setzero_si512();
      transpose_16x16(v);
      for (int i = 0; i < tile; ++i) _mm512_storeu_si512(&copy[std::size_t(group + i) * pairs_padded + pair], v[i]);
    }
  }
  return {copy.data(), pairs_padded};
}

// The B tile of pairs [pair, pair + 16) and columns [col, col + 16): in place where whole, else
// copied into `edge` with zeros past B's pairs and columns. Sets its row stride in bytes.
const std::uint32_t* b_tile(const Bf16PairProduct& x, int pair, int col, std::uint32_t (&edge)[tile * tile],
                            int& stride_bytes) {
  if (pair + tile <= x.pairs && col + tile <= x.cols) {
    stride_bytes = int(x.ldb * sizeof(std::uint32_t));
    return x.b + std::ptrdiff_t(pair) * x.ldb + col;
  }
  std::fill(std::begin(edge), std::end(edge), 0u);
  const int pairs = std::clamp(x.pairs - pair, 0, tile), cols = std::clamp(x.cols - col, 0, tile);
  for (int p = 0; p < pairs; ++p)
    std::memcpy(&edge[p * tile], x.b + std::ptrdiff_t(pair + p) * x.ldb + col, std::size_t(cols) * sizeof(std::uint32_t));
  stride_bytes = tile_row_bytes;
  return edge;
}

// C rows [row, end_row) and columns [col, x.cols) of the 32 x 32 block at `row`, `col`:
// [C +] alpha times the block's products, which lie in `products` (32 rows of 32 floats).
LONGATTN_AMX_BF16 void store_block(const Bf16PairProduct& x, const float (&products)[block][block], int row,
                                   int end_row, int col) {
  const __m512 alpha = _mm512_set1_ps(x.alpha);
  const int rows = std::min(block, end_row - row);
  __mmask16 mask[2];
  for (int h = 0; h < 2; ++h) {
    const int n = std::clamp(x.cols - col - h * tile, 0, tile);
    mask[h] = __mmask16((1u << n) - 1);
  }
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < 2; ++h) {
      float* c = x.c + std::ptrdiff_t(row + r) * x.ldc + col + h * tile;
      const __m512 before = x.accumulate ? _mm512_maskz_loadu_ps(mask[h], c) : _mm512_setzero_ps();
      _mm512_mask_storeu_ps(c, mask[h], _mm512_fmadd_ps(alpha, _mm512_load_ps(&products[r][h * tile]), before));
    }
}

// The 32 x 32 block of C at `row`, `col`, over every pair: into `products`, or with `in_place`
// (a whole block, alpha 1) added to C itself (or stored there without x.accumulate).
LONGATTN_AMX_BF16 void block_products(const Bf16PairProduct& x, const Strip& a, int row, int col, bool in_place,
                                      float (&products)[block][block]) {
  const int a_stride_bytes = int(a.stride * sizeof(std::uint32_t));
  float* c = in_place ? x.c + std::ptrdiff_t(row) * x.ldc + col : &products[0][0];
  const std::ptrdiff_t c_stride = in_place ? x.ldc : block;
  const int c_stride_bytes = int(c_stride * sizeof(float));
  if (in_place && x.accumulate) {
    _tile_loadd(0, c, c_stride_bytes);
    _tile_loadd(1, c + tile, c_stride_bytes);
    _tile_loadd(2, c + tile * c_stride, c_stride_bytes);
    _tile_loadd(3, c + tile * c_stride + tile, c_stride_bytes);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  std::uint32_t edge0[tile * tile], edge1[tile * tile];
  for (int pair = 0; pair < x.pairs; pair += tile) {
    int b0_stride = 0, b1_stride = 0;
    const std::uint32_t* b0 = b_tile(x, pair, col, edge0, b0_stride);
    const std::uint32_t* b1 = b_tile(x, pair, col + tile, edge1, b1_stride);
    _tile_loadd(4, a.words + pair, a_stride_bytes);
    _tile_loadd(5, a.words + tile * a.stride + pair, a_stride_bytes);
    _tile_loadd(6, b0, b0_stride);
    _tile_loadd(7, b1, b1_stride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, c_stride_bytes);
  _tile_stored(1, c + tile, c_stride_bytes);
  _tile_stored(2, c + tile * c_stride, c_stride_bytes);
  _tile_stored(3, c + tile * c_stride + tile, c_stride_bytes);
}

}  // namespace

LONGATTN_AMX_BF16 void bf16_tile_pair_product(const Bf16PairProduct& x, int first_row, int end_row) {
  // A's strip when copied: 32 rows of the pairs rounded up to 16, at most 32 x (depth / 2) words.
  thread_local std::vector<std::uint32_t> strip_copy;
  alignas(64) float products[block][block];
  configure_tiles();
  const int row_blocks = (end_row - first_row + block - 1) / block;
  for (int t = 0; t < row_blocks; ++t) {
    const int row = first_row + t * block;
    const Strip a = a_strip(x, row, strip_copy);
    for (int col = 0; col < x.cols; col += block) {
      const bool in_place = x.alpha == 1.0f && row + block <= end_row && col + block <= x.cols;
      block_products(x, a, row, col, in_place, products);
      if (!in_place) store_block(x, products, row, end_row, col);
    }
    bf16_prefetch_part(x, first_row, end_row, t, row_blocks);
  }
  _tile_release();  // the tile registers back to their initial state: no 8 KiB to save on a switch
}

#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#else

void bf16_tile_pair_product(const Bf16PairProduct&, int, int) {
  throw Error("longattn attention: bf16 tile products are not available in this build");
}

#endif

}  // namespace detail
}  // namespace longattn
