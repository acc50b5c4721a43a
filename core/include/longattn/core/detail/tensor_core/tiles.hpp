// What the tensor-core kernels share: their view of the tensors (raw pointers and strides, the
// head dim contiguous), the 16-byte copies between global memory and padded shared-memory tiles
// (fragments.hpp), float tiles rounded to TF32 where they land, and the walk over the union of
// two query blocks' key blocks.
#pragma once

#include <Kokkos_Core.hpp>

#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "longattn/core/dense_blocks.hpp"
#include "longattn/core/half.hpp"
#include "longattn/core/detail/attention_kernels.hpp"
#include "longattn/core/detail/tensor_core/fragments.hpp"
#include "longattn/core/detail/tensor_core/warp_ops.hpp"

namespace longattn::detail::tensor_core {

// Tokens per block: the block patterns' unit (dense_blocks.hpp), as in the portable kernels.
inline constexpr int block_tokens = 64;

// The dynamic shared memory a CTA may take on an H100 (227 KiB, opted in; sm_80: 163 KiB).
inline constexpr std::size_t max_shared_bytes = 227 * 1024;

// The smaller of two counts, as an int (the second one is).
KOKKOS_INLINE_FUNCTION int min_int(std::int64_t a, std::int64_t b) { return int(a < b ? a : b); }

// A [B, N, H, D] tensor with the head dim contiguous (stride 1) and rows of 16-byte chunks.
template <class S>
struct Tensor {
  S* data = nullptr;
  std::int64_t batch_stride = 0, token_stride = 0, head_stride = 0;
  KOKKOS_INLINE_FUNCTION S* row(int b, std::int64_t token, int h) const {
    return data + b * batch_stride + token * token_stride + h * head_stride;
  }
};

// A [B, H, N] array of float (LSE, Delta) with any strides.
template <class T>
struct Rows {
  T* data = nullptr;
  std::int64_t batch_stride = 0, head_stride = 0, token_stride = 0;
  KOKKOS_INLINE_FUNCTION T& operator()(int b, int h, std::int64_t token) const {
    return data[b * batch_stride + h * head_stride + token * token_stride];
  }
};

struct alignas(8) FloatPair {
  float x, y;
};

struct alignas(16) Chunk {
  std::uint32_t words[4];
};

// 16 bytes of global memory, aligned to 16: one vector access on the device; memcpy on the host,
// where the bytes are also read and written as the tensors' own types.
KOKKOS_INLINE_FUNCTION Chunk load_chunk(const void* address) {
#ifdef __CUDA_ARCH__
  return *static_cast<const Chunk*>(address);
#else
  Chunk chunk;
  std::memcpy(&chunk, address, sizeof chunk);
  return chunk;
#endif
}
KOKKOS_INLINE_FUNCTION void store_chunk(void* address, const Chunk& chunk) {
#ifdef __CUDA_ARCH__
  *static_cast<Chunk*>(address) = chunk;
#else
  std::memcpy(address, &chunk, sizeof chunk);
#endif
}

// A staged chunk added to the chunk of a tensor it goes to, in float (a 16-bit sum rounded once
// more: the staged values are already rounded to S).
template <class Warp, class S>
KOKKOS_INLINE_FUNCTION Chunk add_chunks(const Chunk& before, const Chunk& staged) {
  Chunk sum;
  LONGATTN_WARP_UNROLL
  for (int w = 0; w < 4; ++w) {
    if constexpr (sizeof(S) == 2) {
      auto low = [](std::uint32_t word) { return float(S::from_bits(std::uint16_t(word & 0xffffu))); };
      auto high = [](std::uint32_t word) { return float(S::from_bits(std::uint16_t(word >> 16))); };
      sum.words[w] = Warp::template pack<operand_of<S>>(low(before.words[w]) + low(staged.words[w]),
                                                         high(before.words[w]) + high(staged.words[w]));
    } else {
      float x, y;
      memcpy(&x, &before.words[w], sizeof x);
      memcpy(&y, &staged.words[w], sizeof y);
      x += y;
      memcpy(&sum.words[w], &x, sizeof x);
    }
  }
  return sum;
}

// Stores the values x, y (columns c, c + 1 of a row of a tile) at `address`, rounded to S.
template <class Warp, class S>
KOKKOS_INLINE_FUNCTION void store_pair(char* address, float x, float y) {
  if constexpr (sizeof(S) == 2)
    Warp::store_shared(address, Warp::template pack<operand_of<S>>(x, y));
  else
    Warp::store_shared(address, FloatPair{x, y});
}

// Copies rows [0, Rows) from `first_row` (rows token_stride apart; a row of D values) into a
// [Rows][D] tile, all Threads threads of the CTA taking chunks in turn; rows from `count`
// on are zeros (cp.async with no source bytes). Asynchronous: Warp::cp_async_wait_all, then
// (float) round_tile, then a CTA barrier, before anyone reads the tile.
template <class Warp, int Rows, int D, int Threads, class S>
KOKKOS_INLINE_FUNCTION void load_tile(char* tile, const S* first_row, std::int64_t token_stride, int count,
                                      int thread) {
  constexpr int chunks = chunks_per_row<S>(D), rows_per_step = Threads / chunks;
  static_assert(Threads % chunks == 0 && Rows % rows_per_step == 0, "every thread copies the same chunk of its rows");
  // Thread t copies chunk t % chunks of rows t / chunks, + rows_per_step, ...: one running source
  // pointer (offsets precomputed per row would each hold two registers for the whole kernel).
  const int chunk = thread % chunks;
  int row = thread / chunks;
  const S* source = first_row + row * token_stride + chunk * chunk_values<S>;
  LONGATTN_WARP_UNROLL
  for (int n = 0; n < Rows / rows_per_step; ++n, row += rows_per_step, source += rows_per_step * token_stride) {
    const bool inside = row < count;
    Warp::cp_async_16(tile + tile_offset<S>(row, chunk * chunk_values<S>, D), inside ? source : first_row, inside);
  }
}

// A float tile that load_tile<Warp, Rows, D, Threads> filled, rounded to TF32 in place by the
// threads that copied it, after their cp_async_wait_all (the tensor cores take TF32 operands;
// rounding each value once here costs less than at every read). Nothing for 16-bit tiles.
template <class Warp, int Rows, int D, int Threads, class S>
KOKKOS_INLINE_FUNCTION void round_tile(char* tile, int thread) {
  if constexpr (sizeof(S) == 4) {
    constexpr int chunks = chunks_per_row<S>(D), rows_per_step = Threads / chunks;
    const int chunk = thread % chunks;
    LONGATTN_WARP_UNROLL
    for (int n = 0; n < Rows / rows_per_step; ++n) {
      const int row = thread / chunks + n * rows_per_step;
      char* address = tile + tile_offset<S>(row, chunk * chunk_values<S>, D);
      Chunk value = Warp::template load_shared<Chunk>(address);
      LONGATTN_WARP_UNROLL
      for (int w = 0; w < 4; ++w) {
        float x;
        memcpy(&x, &value.words[w], sizeof x);
        value.words[w] = Warp::tf32(x);
      }
      Warp::store_shared(address, value);
    }
  } else {
    (void)tile, (void)thread;
  }
}

// Rows [first, first + 64) of the (b, h) slices of two tensors (Q and dO, or K and V) into two
// tiles, zeros from the `tokens`-th row of the sequence on; round_block_pair after the wait.
template <class Warp, int D, int Threads, class S>
KOKKOS_INLINE_FUNCTION void load_block_pair(char* tile_x, const Tensor<const S>& x, char* tile_y,
                                            const Tensor<const S>& y, int b, int h, std::int64_t first,
                                            std::int64_t tokens, int thread) {
  const int count = min_int(tokens - first, block_tokens);
  load_tile<Warp, block_tokens, D, Threads>(tile_x, x.row(b, first, h), x.token_stride, count, thread);
  load_tile<Warp, block_tokens, D, Threads>(tile_y, y.row(b, first, h), y.token_stride, count, thread);
}
template <class Warp, int D, int Threads, class S>
KOKKOS_INLINE_FUNCTION void round_block_pair(char* tile_x, char* tile_y, int thread) {
  round_tile<Warp, block_tokens, D, Threads, S>(tile_x, thread);
  round_tile<Warp, block_tokens, D, Threads, S>(tile_y, thread);
}

// Writes rows [0, 16) of a warp's staging tile to rows first, first + 1, ... of a tensor
// (rows token_stride apart), up to `count` rows; with `accumulate`, adds what the rows hold
// (add_chunks). The warp's 32 lanes take the 16-byte chunks in turn.
template <class Warp, int D, class S>
KOKKOS_INLINE_FUNCTION void store_warp_rows(const char* tile, S* first_row, std::int64_t token_stride, int count,
                                            bool accumulate, int lane) {
  constexpr int chunks = chunks_per_row<S>(D);
  LONGATTN_WARP_UNROLL
  for (int n = 0; n < 16 * chunks / 32; ++n) {
    const int c = n * 32 + lane, row = c / chunks, chunk = c % chunks;
    if (row >= count) continue;
    const Chunk value = Warp::template load_shared<Chunk>(tile + tile_offset<S>(row, chunk * chunk_values<S>, D));
    S* out = first_row + row * token_stride + chunk * chunk_values<S>;
    store_chunk(out, accumulate ? add_chunks<Warp, S>(load_chunk(out), value) : value);
  }
}

// The union of two ascending lists of key blocks (those of a CTA's two query blocks), ascending.
struct BlockUnion {
  BlockList first, second;
  int i = 0, j = 0;
  KOKKOS_INLINE_FUNCTION bool next(int& block, bool& in_first, bool& in_second) {
    const int a = i < first.count ? first[i] : INT_MAX, b = j < second.count ? second[j] : INT_MAX;
    if (a == INT_MAX && b == INT_MAX) return false;
    block = a < b ? a : b;
    in_first = a == block;
    in_second = b == block;
    i += in_first ? 1 : 0;
    j += in_second ? 1 : 0;
    return true;
  }
};
}  // namespace longattn::detail::tensor_core
