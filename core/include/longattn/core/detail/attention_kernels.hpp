// The fused attention kernels (FlashAttention-2 algorithm) as Kokkos team functors:
//   ForwardKernel       one team per (batch, head, query block): O and LSE
//   DeltaKernel         Delta[b,h,i] = sum_d dO[i][d] O[i][d] (backward's softmax correction)
//   KeyGradientKernel   one team per (batch, head, key block): dK and dV
//   QueryGradientKernel one team per (batch, head, query block): dQ
//   KeyGradientKernel<..., true>  the one-pass form: one team per (batch, head) walks all its
//                       key blocks and also accumulates dQ (FlashAttention-2's 5 products)
// The backward pass has two forms, both without atomics and deterministic. Two passes (dK/dV,
// then dQ) each own their outputs, at the price of computing S and dP in both (7 block
// products); they spread over B H (blocks) teams. One pass owns a whole head: its dQ rows are
// summed in place, in the order of the key blocks, by the one team that owns them; it needs B H
// teams to keep the threads busy (attention.hpp chooses).
//
// Scores are kept in log2 units: the resident Q block is pre-multiplied by scale * log2(e), so
// the softmax is exp2 of differences, and LSE is converted to the natural log on output.
// Every product is detail::tile_mma on team scratch; only block loads and stores touch the
// (possibly strided) global views. The tile configuration Tiles (attention_tiles.hpp) sets the
// block, the micro-tiles and the team size; every stage is a TeamThreadRange over the team, and a
// team barrier separates a stage that writes scratch from the next that reads it, so the kernels
// are the same for one thread per team (the host's SimdTiles) and many (ThreadTiles). The kernels
// are templated on the storage type S of the tensors (float, double, bfloat16, float16) and compute
// in T = accumulate_t<S>: 16-bit tensors are converted on load and rounded on store; scratch, LSE
// and Delta are float. bfloat16 tensors on a host space may instead run the block products on
// the CPU's bf16 dot products (the bf16 path, below).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__SANITIZE_THREAD__)
#define LONGATTN_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LONGATTN_TSAN 1
#endif
#endif
#if defined(LONGATTN_TSAN) && !defined(__CUDA_ARCH__)
#define LONGATTN_TSAN_ANNOTATE 1
#include <sanitizer/tsan_interface.h>
#endif

#include "longattn/core/attention_tiles.hpp"
#include "longattn/core/dense_blocks.hpp"
#include "longattn/core/half.hpp"
#include "longattn/core/detail/bf16_pair_product.hpp"
#include "longattn/core/detail/tile_mma.hpp"
#include "longattn/kokkos_compat.hpp"

namespace longattn::detail {

template <class T, class ExecSpace>
using Tensor4 = Kokkos::View<T****, Kokkos::LayoutStride, typename ExecSpace::memory_space,
                             Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
template <class T, class ExecSpace>
using Tensor3 = Kokkos::View<T***, Kokkos::LayoutStride, typename ExecSpace::memory_space,
                             Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

// index clamped to [0, L].
KOKKOS_INLINE_FUNCTION int clamp_to_block(std::int64_t index, int L) {
  return index < 0 ? 0 : index > L ? L : static_cast<int>(index);
}

// Sizes and masking rule shared by all kernels. A key at global position key_offset + j is
// visible to the query at query_offset + i unless causal and key position > query position.
struct AttentionGeometry {
  int batch = 0, heads = 0, queries = 0, keys = 0, head_dim = 0;
  std::int64_t query_offset = 0, key_offset = 0;
  bool causal = false;

  // Whether the block pair has any masked entry (then the kernel masks it, row by row).
  KOKKOS_INLINE_FUNCTION bool needs_mask(int query_first, int key_first, int key_count) const {
    return causal && key_offset + key_first + key_count - 1 > query_offset + query_first;
  }
  // The masked entries of a block of L queries from query_first and L keys from key_first, a row
  // at a time: a key's row (queries along it) is masked on a prefix, a query's row on a suffix.
  // Of the queries, how many from the first cannot see `key`.
  KOKKOS_INLINE_FUNCTION int queries_not_seeing(int key, int query_first, int L) const {
    return causal ? clamp_to_block(key_offset + key - query_offset - query_first, L) : 0;
  }
  // Of the keys, the first one `query` cannot see (L: none).
  KOKKOS_INLINE_FUNCTION int first_key_not_seen(int query, int key_first, int L) const {
    return causal ? clamp_to_block(query_offset + query - key_offset - key_first + 1, L) : L;
  }
};

// Carves 64-byte aligned arrays out of a team's scratch (whole cache lines, aligned vector loads).
template <class Member>
struct ScratchArena {
  static constexpr int alignment = 64;
  const Member& team;
  int level;
  template <class T>
  KOKKOS_INLINE_FUNCTION T* take(int count) const {
    return static_cast<T*>(team.team_scratch(level).get_shmem_aligned(count * sizeof(T), alignment));
  }
  static constexpr std::size_t bytes(std::size_t count, std::size_t element) {
    return count * element + alignment;
  }
};

// The team barrier of the kernels: team.team_barrier(), which under ThreadSanitizer also tells
// TSan what it guarantees. Kokkos' host barriers synchronize through atomics TSan does not see,
// so without this every read of scratch after a barrier would be reported; with it, a missing
// barrier still is. Each member releases a sync object on arrival and acquires it on leaving.
// Two objects, alternating: a member past this barrier that reaches the next one must not
// release into the object a slower member has yet to acquire. A third one stands for the
// rendezvous Kokkos holds between a team's work items (no member starts the next block before
// all have finished this one): acquired when the kernel's operator() starts, released when it
// ends. `team_memory`: an address this team, and no other team running at the same time, owns
// (its first scratch array).
template <class Member>
class TeamBarrier {
 public:
  KOKKOS_INLINE_FUNCTION TeamBarrier(const Member& team, const void* team_memory)
      : team_(team), sync_(static_cast<const char*>(team_memory)) {
#ifdef LONGATTN_TSAN_ANNOTATE
    __tsan_acquire(const_cast<char*>(sync_ + 2));
#endif
  }
  KOKKOS_INLINE_FUNCTION ~TeamBarrier() {
#ifdef LONGATTN_TSAN_ANNOTATE
    __tsan_release(const_cast<char*>(sync_ + 2));
#endif
  }
  TeamBarrier(const TeamBarrier&) = delete;
  TeamBarrier& operator=(const TeamBarrier&) = delete;

  KOKKOS_INLINE_FUNCTION void operator()() {
#ifdef LONGATTN_TSAN_ANNOTATE
    void* sync = const_cast<char*>(sync_ + (count_++ & 1));
    __tsan_release(sync);
    team_.team_barrier();
    __tsan_acquire(sync);
#else
    (void)sync_, (void)count_;
    team_.team_barrier();
#endif
  }

 private:
  const Member& team_;
  const char* sync_;
  int count_ = 0;
};

// Tokens in the block that starts at `first` (the last block of a sequence may be short).
KOKKOS_INLINE_FUNCTION int tokens_in_block(int first, int tokens, int block_tokens) {
  return tokens - first < block_tokens ? tokens - first : block_tokens;
}

// Tokens [first, first + count) of a sequence.
struct BlockSpan {
  int first, count;
};

// The block a team works on: league rank -> (batch, head, block), and the block's tokens.
// `heaviest_last` hands out the last blocks first (under a causal mask late query blocks see
// the most keys, early key blocks are seen by the most queries).
struct TeamBlock {
  int b, h, block, first, count;
};
KOKKOS_INLINE_FUNCTION TeamBlock team_block(int league_rank, int blocks, int heads, int tokens,
                                            int block_tokens, bool heaviest_last) {
  TeamBlock t;
  const int n = league_rank % blocks;
  t.block = heaviest_last ? blocks - 1 - n : n;
  t.h = league_rank / blocks % heads;
  t.b = league_rank / blocks / heads;
  t.first = t.block * block_tokens;
  t.count = tokens_in_block(t.first, tokens, block_tokens);
  return t;
}

// Copies rows [first, first + count) of two tensors' (b, h) slices to scratch, row-major [row][d].
template <class Member, class T, class A, class B>
KOKKOS_INLINE_FUNCTION void load_rows(const Member& team, const A& a, const B& b_tensor, int b, int h,
                                      int first, int count, int head_dim, T* a_rows, T* b_rows) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, count), [&](int j) {
    for (int d = 0; d < head_dim; ++d) {
      a_rows[j * head_dim + d] = a(b, first + j, h, d);
      b_rows[j * head_dim + d] = b_tensor(b, first + j, h, d);
    }
  });
}

// Rows [first, ...) of a tensor's (b, h) slice where they are, as a row-major [count][D] array
// of T, when the tile configuration reads rows in place and the head's rows lie together in
// T (head-major copies, attention.hpp); else nullptr (then the kernel copies them to scratch).
template <class Tiles, class T, class Tensor>
KOKKOS_INLINE_FUNCTION const T* rows_in_place(const Tensor& x, int b, int h, int first) {
  if constexpr (reads_rows_in_place<Tiles>::value && std::is_same_v<typename Tensor::value_type, const T>) {
    if (x.stride(3) == 1 && x.stride(1) == x.extent(3)) return &x(b, first, h, 0);
  } else {
    (void)x, (void)b, (void)h, (void)first;
  }
  return nullptr;
}

// Prefetches part `part` of `parts` of rows [first, first + count) of a tensor's (b, h) slice,
// a cache line at a time (ForWrite: for writing). Called from tile_mma's after_tile hook with the
// next block's rows, and before a block is loaded or stored.
template <bool ForWrite = false, class Tensor>
KOKKOS_INLINE_FUNCTION void prefetch_rows(const Tensor& x, int b, int h, int first, int count,
                                          int head_dim, int part, int parts) {
  constexpr int line = 64 / sizeof(typename Tensor::value_type);
  const int begin = first + part * count / parts, end = first + (part + 1) * count / parts;
  for (int j = begin; j < end; ++j)
    for (int d = 0; d < head_dim; d += line) prefetch<ForWrite>(&x(b, j, h, d));
}

// Copies rows [first, first + count) of a tensor's (b, h) slice to scratch transposed, [d][L]
// (tokens along the lanes), times `factor`; lanes from `count` on are zero. A thread reads whole
// rows: a block's column walks rows H D elements apart, which share one L1 set at D = 128 and
// evict each other before the next column comes back to them.
template <int L, class Member, class T, class Tensor>
KOKKOS_INLINE_FUNCTION void load_transposed(const Member& team, const Tensor& x, int b, int h, int first,
                                            int count, int head_dim, T factor, T* out) {
  // Every line is asked for first: each load feeds head_dim scattered stores, which fill the
  // store buffer, so the loads alone would wait on their misses one at a time.
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, count),
                       [&](int i) { prefetch_rows(x, b, h, first + i, 1, head_dim, 0, 1); });
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, L), [&](int i) {
    if (i < count)
      for (int d = 0; d < head_dim; ++d) out[d * L + i] = x(b, first + i, h, d) * factor;
    else
      for (int d = 0; d < head_dim; ++d) out[d * L + i] = T(0);
  });
}

// Writes rows [first, first + count) of a tensor's (b, h) slice from the columns of a transposed
// scratch block t[D][L] (tokens along the lanes): row j = factor(j) t[.][j], plus what the row
// holds when accumulating, converted to the tensor's type. Each column is gathered into a row of
// `rows` (scratch of [count][D], free to overwrite) and written as a row: with the head dim
// contiguous a loop of vector stores, where one store per value, to lines that miss, fills the
// store buffer. The rows' lines are asked for first.
template <int L, class Member, class Tensor, class T, class Factor>
KOKKOS_INLINE_FUNCTION void store_transposed(const Member& team, const Tensor& x, int b, int h, int first, int count,
                                             int head_dim, const T* t, const Factor& factor, bool accumulate,
                                             T* rows) {
  using S = typename Tensor::value_type;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, count),
                       [&](int j) { prefetch_rows<true>(x, b, h, first + j, 1, head_dim, 0, 1); });
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, count), [&](int j) {
    T* row = rows + j * head_dim;
    const T f = factor(j);
    for (int d = 0; d < head_dim; ++d) row[d] = t[d * L + j] * f;
    if (x.stride(3) == 1) {
      S* out = &x(b, first + j, h, 0);
      if (accumulate)
        for (int d = 0; d < head_dim; ++d) out[d] = S(T(out[d]) + row[d]);
      else
        for (int d = 0; d < head_dim; ++d) out[d] = S(row[d]);
    } else {
      for (int d = 0; d < head_dim; ++d) x(b, first + j, h, d) = S((accumulate ? T(x(b, first + j, h, d)) : T(0)) + row[d]);
    }
  });
}

// Sets `count` scratch values to zero (the accumulators of a block).
template <class Member, class T>
KOKKOS_INLINE_FUNCTION void zero_scratch(const Member& team, T* values, int count) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, count), [&](int i) { values[i] = T(0); });
}

template <class T>
KOKKOS_INLINE_FUNCTION constexpr T log2_e() { return T(1.4426950408889634074); }
template <class T>
KOKKOS_INLINE_FUNCTION constexpr T ln_2() { return T(0.69314718055994530942); }
template <class T>
KOKKOS_INLINE_FUNCTION constexpr T minus_infinity() { return -math::infinity<T>(); }

// ---------------------------------------------------------------------------------------------
// The bf16 path: bfloat16 tensors on a host space where the CPU's bf16 dot products are in use
// (bf16_dot_products.hpp) run the block products on them (bf16_pair_product.hpp), with float
// accumulators; masks, softmax and the running statistics stay in float as in the float path.
// A product's operands are words of two bf16, pairs along its depth:
//   rows          [count][D2 / 2] words (x[j][2q], x[j][2q+1]): the tensor's rows as they are;
//                 D2 = D rounded up to even, the padding 0
//   row pairs     [ceil(count / 2)][D] words (x[2p][d], x[2p+1][d]): pairs along the tokens,
//                 a missing odd row 0
//   column pairs  [D2 / 2][L] words (x[i][2q], x[i][2q+1]): pairs along d, tokens along the
//                 lanes, lanes from count on 0
// Probabilities and dS are rounded to bf16 for the products that take them, as FlashAttention
// does on GPUs; the softmax sums take the float values. The softmax scale multiplies S after its
// product (the alpha of the product), so that Q enters the product exactly.
template <class ExecSpace, class S>
inline constexpr bool bf16_products_compiled =
#ifdef LONGATTN_VECTOR_EXTENSIONS
    std::is_same_v<S, bfloat16> && Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;
#else
    false;
#endif

// The bits of a bfloat16 (the bf16 path's kernels compile for every storage type; they run for
// bfloat16 only).
template <class S>
KOKKOS_INLINE_FUNCTION std::uint16_t bf16_bits_of(const S& x) {
  if constexpr (std::is_same_v<S, bfloat16>)
    return x.bits;
  else
    return bfloat16_bits(float(x));
}
KOKKOS_INLINE_FUNCTION int bf16_padded(int head_dim) { return head_dim + head_dim % 2; }
// A float scratch array as the bf16 products' output (they run for float accumulators only).
template <class T>
KOKKOS_INLINE_FUNCTION float* bf16_output(T* c) {
  if constexpr (std::is_same_v<T, float>) {
    return c;
  } else {
    (void)c;
    return nullptr;
  }
}

// Rows [first, first + count) of a tensor's (b, h) slice as bf16 rows, D2 / 2 words each.
template <class Member, class Tensor>
KOKKOS_INLINE_FUNCTION void load_bf16_rows(const Member& team, const Tensor& x, int b, int h, int first, int count,
                                           int head_dim, std::uint32_t* out) {
  using S = typename Tensor::non_const_value_type;  // the inputs are views of const
  const int words = bf16_padded(head_dim) / 2;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, count), [&](int j) {
    std::uint32_t* row = out + j * words;
    if (std::is_same_v<S, bfloat16> && x.stride(3) == 1) {
      std::memcpy(row, &x(b, first + j, h, 0), head_dim * sizeof(S));
      if (head_dim % 2 == 1) row[words - 1] &= 0xffffu;
    } else {
      for (int q = 0; q < words; ++q)
        row[q] = bf16_pair(bf16_bits_of(x(b, first + j, h, 2 * q)),
                           2 * q + 1 < head_dim ? bf16_bits_of(x(b, first + j, h, 2 * q + 1)) : 0);
    }
  });
}

// The same rows as row pairs. With the head dim contiguous, two rows are zipped a vector at a time.
template <class Member, class Tensor>
KOKKOS_INLINE_FUNCTION void load_bf16_row_pairs(const Member& team, const Tensor& x, int b, int h, int first,
                                                int count, int head_dim, std::uint32_t* out) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, (count + 1) / 2), [&](int p) {
    const int even = first + 2 * p;
    const bool odd = 2 * p + 1 < count;
    std::uint32_t* row = out + p * head_dim;
    if (x.stride(3) == 1) {
      const auto* e = &x(b, even, h, 0);
      const auto* o = odd ? &x(b, even + 1, h, 0) : e;
      for (int d = 0; d < head_dim; ++d) row[d] = bf16_pair(bf16_bits_of(e[d]), odd ? bf16_bits_of(o[d]) : 0);
    } else {
      for (int d = 0; d < head_dim; ++d)
        row[d] = bf16_pair(bf16_bits_of(x(b, even, h, d)), odd ? bf16_bits_of(x(b, even + 1, h, d)) : 0);
    }
  });
}

// The same rows as column pairs, tokens along L lanes.
template <int L, class Member, class Tensor>
KOKKOS_INLINE_FUNCTION void load_bf16_column_pairs(const Member& team, const Tensor& x, int b, int h, int first,
                                                   int count, int head_dim, std::uint32_t* out) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, (head_dim + 1) / 2), [&](int q) {
    const bool odd = 2 * q + 1 < head_dim;
    for (int i = 0; i < L; ++i)
      out[q * L + i] = i < count ? bf16_pair(bf16_bits_of(x(b, first + i, h, 2 * q)),
                                             odd ? bf16_bits_of(x(b, first + i, h, 2 * q + 1)) : 0)
                                 : 0;
  });
}

// Float scratch rows [0, count) of `cols` values (a multiple of W), row stride ld, as row pairs
// (ld words apart) rounded to bf16.
template <class P, class Member, class T>
KOKKOS_INLINE_FUNCTION void store_bf16_row_pairs(const Member& team, const T* rows, int count, int cols, int ld,
                                                 Bf16Rounding rounding, std::uint32_t* out) {
  constexpr int W = P::width;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, (count + 1) / 2 * (cols / W)), [&](int item) {
    const int p = item / (cols / W), c = item % (cols / W) * W;
    const P odd = 2 * p + 1 < count ? P::load(rows + (2 * p + 1) * ld + c) : P::broadcast(T(0));
    store_bf16_pairs(P::load(rows + 2 * p * ld + c), odd, out + p * ld + c, rounding);
  });
}

// The same rows as bf16 rows (pairs along the columns), cols / 2 words each, ld / 2 apart; cols
// a multiple of 2W.
template <class P, class Member, class T>
KOKKOS_INLINE_FUNCTION void store_bf16_rows(const Member& team, const T* rows, int count, int cols, int ld,
                                            Bf16Rounding rounding, std::uint32_t* out) {
  constexpr int W = P::width;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, count * (cols / (2 * W))), [&](int item) {
    const int i = item / (cols / (2 * W)), c = item % (cols / (2 * W)) * 2 * W;
    store_bf16_in_order(P::load(rows + i * ld + c), P::load(rows + i * ld + c + W), out + i * (ld / 2) + c / 2,
                        rounding);
  });
}

// C = [C +] alpha A B on bf16 pairs (bf16_pair_product.hpp), the team's threads taking strips of
// whole micro-tile rows. The prefetches (rows `next` of a tensor's (b, h) slice: the next
// block's) go with the rows.
template <class Member, class Tensor>
KOKKOS_INLINE_FUNCTION void bf16_tile_mma(const Member& team, Bf16PairProduct product, const Tensor& prefetched,
                                          int b, int h, BlockSpan next, int head_dim) {
#ifdef LONGATTN_VECTOR_EXTENSIONS
  if (next.count > 0) {
    product.prefetch = reinterpret_cast<const char*>(&prefetched(b, next.first, h, 0));
    product.prefetch_stride = std::ptrdiff_t(prefetched.stride(1) * sizeof(typename Tensor::value_type));
    product.prefetch_rows = next.count;
    product.prefetch_row_bytes = int(head_dim * sizeof(typename Tensor::value_type));
  }
  constexpr int R = bf16_pair_tile_rows;
  const int tiles = (product.rows + R - 1) / R, threads = team.team_size();
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, threads), [&](int t) {
    const int first = t * tiles / threads * R, last = (t + 1) * tiles / threads * R;
    const int end = last < product.rows ? last : product.rows;
    if (first < end) bf16_pair_product(product, first, end);
  });
#else
  (void)team, (void)product, (void)prefetched, (void)b, (void)h, (void)next, (void)head_dim;
  Kokkos::abort("longattn attention: the bf16 path is not compiled for this space");
#endif
}

// The lane-wise maximum of `start` and rows [0, count) of a pack-wide column (rows ld apart).
// Four independent chains: one would wait out a max's latency on every row (4% of the forward
// pass at D = 64). The maximum is the same in any order.
template <class P, class T>
KOKKOS_INLINE_FUNCTION P column_max(const T* column, int ld, int count, P start) {
  P chains[4] = {start, start, start, start};
  int j = 0;
  for (; j + 4 <= count; j += 4)
    LONGATTN_UNROLL for (int c = 0; c < 4; ++c) chains[c] = max(chains[c], P::load(column + (j + c) * ld));
  for (; j < count; ++j) chains[0] = max(chains[0], P::load(column + j * ld));
  return max(max(chains[0], chains[1]), max(chains[2], chains[3]));
}

// The pieces the three kernels share: the next visited block (whose rows are prefetched during
// this block's products), the visited block's rows, and the two product shapes, each on either
// path. A product's operands are the float path's scratch (or rows in place) and the bf16 path's
// words of two bf16; the bf16 ones are null on the float path.
// Block n + 1 of a visit list, or an empty span after the last.
KOKKOS_INLINE_FUNCTION BlockSpan next_visit(const BlockList& visits, int n, int tokens, int block_tokens) {
  if (n + 1 >= visits.count) return {0, 0};
  const int first = visits[n + 1] * block_tokens;
  return {first, tokens_in_block(first, tokens, block_tokens)};
}

// A visited block's rows of two tensors (K and V, or Q and dO) for the float products, [count][D]:
// in place where both lie so (rows_in_place), else copied into the two scratch arrays.
template <class T>
struct RowBlocks {
  const T* a;
  const T* b;
};
template <class Tiles, class Member, class T, class A, class B>
KOKKOS_INLINE_FUNCTION RowBlocks<T> block_rows(const Member& team, const A& a, const B& b_tensor, int b, int h,
                                               BlockSpan rows, int head_dim, T* a_scratch, T* b_scratch) {
  const RowBlocks<T> in_place{rows_in_place<Tiles, T>(a, b, h, rows.first),
                              rows_in_place<Tiles, T>(b_tensor, b, h, rows.first)};
  if (in_place.a != nullptr && in_place.b != nullptr) return in_place;
  load_rows(team, a, b_tensor, b, h, rows.first, rows.count, head_dim, a_scratch, b_scratch);
  return {a_scratch, b_scratch};
}

template <class T>
struct ProductOperands {
  const T* a;                 // float path: A's rows [.][D] (scores) or [depth][D] (accumulations)
  const T* b;                 // float path: Bt[D][L] (scores) or B[depth][L] (accumulations)
  const std::uint32_t* a_bf16;  // bf16 path: A's rows (scores) or row pairs (accumulations)
  const std::uint32_t* b_bf16;  // bf16 path: Bt's column pairs (scores) or B's row pairs (accumulations)
  float bf16_alpha;           // bf16 path: the scale the float path has folded into Bt (scores), else 1
};

// Out[r][c] = sum_d A[r][d] Bt[d][c] for r < rows, c < L, into scratch [rows][L]: a block pair's
// scores S (or dP), with the block's scale. Rows `next` of `prefetched` are fetched meanwhile.
template <class Shape, class Member, class T, class Tensor>
KOKKOS_INLINE_FUNCTION void block_scores(const Member& team, int rows, int head_dim, const ProductOperands<T>& in,
                                         T* out, const Tensor& prefetched, int b, int h, BlockSpan next) {
  constexpr int L = Shape::block;
  if (in.a_bf16 != nullptr) {
    const int words = bf16_padded(head_dim) / 2;
    bf16_tile_mma(team, {in.a_bf16, words, 1, in.b_bf16, L, bf16_output(out), L, rows, L, words, in.bf16_alpha, false},
                  prefetched, b, h, next, head_dim);
  } else {
    tile_mma<Shape>(team, rows, L, head_dim, in.a, head_dim, 1, in.b, L, out, L, false, [&](int tile, int tiles) {
      if (next.count > 0) prefetch_rows(prefetched, b, h, next.first, next.count, head_dim, tile, tiles);
    });
  }
}

// Out[d][c] += sum_j A[j][d] B[j][c] for j < depth, d < D, c < L, into scratch [D][L]: a block's
// share of a transposed accumulator (Ot, dQt, dKt, dVt). Rows `next` of `prefetched` are fetched
// meanwhile.
template <class Shape, class Member, class T, class Tensor>
KOKKOS_INLINE_FUNCTION void accumulate_transposed(const Member& team, int depth, int head_dim,
                                                  const ProductOperands<T>& in, T* out, const Tensor& prefetched,
                                                  int b, int h, BlockSpan next) {
  constexpr int L = Shape::block;
  if (in.a_bf16 != nullptr) {
    bf16_tile_mma(team,
                  {in.a_bf16, 1, head_dim, in.b_bf16, L, bf16_output(out), L, head_dim, L, (depth + 1) / 2,
                   in.bf16_alpha, true},
                  prefetched, b, h, next, head_dim);
  } else {
    tile_mma<Shape>(team, head_dim, L, depth, in.a, 1, head_dim, in.b, L, out, L, true, [&](int tile, int tiles) {
      if (next.count > 0) prefetch_rows(prefetched, b, h, next.first, next.count, head_dim, tile, tiles);
    });
  }
}

// St[j][i] = -inf where query q_first + i (along the lanes) does not see key k_first + j, then
// a barrier; nothing where every query of the block sees every key.
template <int L, class Member, class T>
KOKKOS_INLINE_FUNCTION void mask_key_major_scores(const Member& team, TeamBarrier<Member>& barrier,
                                                  const AttentionGeometry& geo, int q_first, int k_first, int k_count,
                                                  T* st) {
  if (!geo.needs_mask(q_first, k_first, k_count)) return;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, k_count), [&](int j) {
    const int masked = geo.queries_not_seeing(k_first + j, q_first, L);
    for (int i = 0; i < masked; ++i) st[j * L + i] = minus_infinity<T>();
  });
  barrier();
}

// ---------------------------------------------------------------------------------------------
// Forward. Scratch (L = block tokens, D = head dim): Qt[D][L] (queries along lanes), K and V
// blocks [L][D] (unless read in place, rows_in_place), St[L][L] (scores, then probabilities, key-major), Ot[D][L] (unnormalized
// output), running max m[L] and sum l[L]. The bf16 path takes Q as column pairs, K as rows, V
// as row pairs and the probabilities as row pairs Pp[L/2][L] instead of Qt, K, V and St's.
template <class ExecSpace, class S, class Pattern, class Tiles>
struct ForwardKernel {
  using T = accumulate_t<S>;
  using Shape = typename Tiles::template shape<T>;
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using P = Pack<T, Shape::lanes>;
  static constexpr int L = Shape::block;
  static constexpr int W = Shape::lanes;
  static constexpr int team_size = Tiles::team_size;
  static_assert(L % (Shape::packs * W) == 0, "a block is a whole number of micro-tile columns");

  Tensor4<const S, ExecSpace> q, k, v;
  Tensor4<S, ExecSpace> o;
  Tensor3<T, ExecSpace> lse;
  AttentionGeometry geo;
  Pattern pattern;
  T scale_log2;  // softmax scale * log2(e)
  T output_scale;
  bool accumulate;  // continue the softmax of the (o, lse) already there (AttentionOptions::accumulate_output)
  int scratch_level;
  static constexpr bool bf16_compiled = bf16_products_compiled<ExecSpace, S>;
  bool bf16_products = false;  // the bf16 path (only where bf16_compiled)
  Bf16Rounding bf16_rounding = Bf16Rounding::integer;  // how it rounds P and dS to bf16

  static std::size_t scratch_bytes(int head_dim) {
    using A = ScratchArena<Member>;
    const std::size_t D = head_dim, e = sizeof(T);
    const std::size_t bf16_path = bf16_compiled ? 3 * A::bytes(D * L + L, 2) + A::bytes(L * L, 2) : 0;
    return 4 * A::bytes(D * L, e) + A::bytes(L * L, e) + 2 * A::bytes(L, e) + bf16_path;
  }
  int league_size() const { return geo.batch * geo.heads * pattern.query_blocks(); }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const int D = geo.head_dim;
    const TeamBlock mine = team_block(team.league_rank(), pattern.query_blocks(), geo.heads, geo.queries, L, true);
    const int b = mine.b, h = mine.h, qb = mine.block, q_first = mine.first, q_count = mine.count;

    const ScratchArena<Member> arena{team, scratch_level};
    T* qt = arena.template take<T>(D * L);
    T* ks = arena.template take<T>(L * D);
    T* vs = arena.template take<T>(L * D);
    T* st = arena.template take<T>(L * L);
    T* ot = arena.template take<T>(D * L);
    T* m = arena.template take<T>(L);
    T* l = arena.template take<T>(L);
    const bool pairs = bf16_compiled && bf16_products;
    const int D2 = bf16_padded(D);
    std::uint32_t* q_pairs = pairs ? arena.template take<std::uint32_t>(D2 / 2 * L) : nullptr;
    std::uint32_t* k_rows = pairs ? arena.template take<std::uint32_t>(L * D2 / 2) : nullptr;
    std::uint32_t* v_pairs = pairs ? arena.template take<std::uint32_t>(L / 2 * D) : nullptr;
    std::uint32_t* p_pairs = pairs ? arena.template take<std::uint32_t>(L / 2 * L) : nullptr;
    TeamBarrier<Member> barrier(team, qt);

    if (pairs)
      load_bf16_column_pairs<L>(team, q, b, h, q_first, q_count, D, q_pairs);
    else
      load_transposed<L>(team, q, b, h, q_first, q_count, D, scale_log2, qt);
    // The running softmax starts empty (m = -inf, l = 0, Ot = 0), or, when accumulating, as the
    // result already in (o, lse): m = lse in log2 units, l = 1, Ot = o / output_scale. Merging
    // then happens here, in the same online softmax, with no partial buffers.
    zero_scratch(team, ot, D * L);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, L), [&](int i) {
      const T previous = accumulate && i < q_count ? lse(b, h, q_first + i) : minus_infinity<T>();
      const bool empty = previous == minus_infinity<T>();
      m[i] = empty ? minus_infinity<T>() : previous * log2_e<T>();
      l[i] = empty ? T(0) : T(1);
      if (!empty)
        for (int d = 0; d < D; ++d) ot[d * L + i] = o(b, q_first + i, h, d) / output_scale;
    });
    barrier();

    const BlockList visited = pattern.visited_key_blocks(b, h, qb);
    const int visits = visited.count;
    for (int n = 0; n < visits; ++n) {
      const int k_first = visited[n] * L;
      const int k_count = tokens_in_block(k_first, geo.keys, L);
      RowBlocks<T> kv{nullptr, nullptr};  // K and V rows, float path
      if (pairs) {
        load_bf16_rows(team, k, b, h, k_first, k_count, D, k_rows);
        load_bf16_row_pairs(team, v, b, h, k_first, k_count, D, v_pairs);
      } else {
        kv = block_rows<Tiles>(team, k, v, b, h, {k_first, k_count}, D, ks, vs);
      }
      barrier();
      // The next block's K rows are fetched during this product, its V rows during the other.
      const BlockSpan next = next_visit(visited, n, geo.keys, L);
      // St[j][i] = sum_d K[j][d] Qt[d][i]
      block_scores<Shape>(team, k_count, D, {kv.a, qt, k_rows, q_pairs, float(scale_log2)}, st, k, b, h, next);
      barrier();
      mask_key_major_scores<L>(team, barrier, geo, q_first, k_first, k_count, st);
      // Online softmax, one pack of queries at a time: new max, rescale l and Ot by
      // 2^(m_old - m_new), probabilities into St.
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, L / W), [&](int pack) {
        const int i = pack * W;
        const P m_old = P::load(m + i);
        const P m_new = column_max(st + i, L, k_count, m_old);
        // Rows with every key masked so far keep m = -inf; subtract 0 there, not -inf.
        const P m_ref = select_equal(m_new, minus_infinity<T>(), P::broadcast(T(0)));
        const P alpha = exp2(m_old - m_ref);
        P sum = P::broadcast(T(0)), even = sum;
        for (int j = 0; j < k_count; ++j) {
          const P p = exp2(P::load(st + j * L + i) - m_ref);
          sum = sum + p;
          if (!pairs)
            p.store(st + j * L + i);
          else if (j % 2 == 0)
            even = p;
          else
            store_bf16_pairs(even, p, p_pairs + j / 2 * L + i, bf16_rounding);
        }
        if (pairs && k_count % 2 == 1)
          store_bf16_pairs(even, P::broadcast(T(0)), p_pairs + k_count / 2 * L + i, bf16_rounding);
        fma(P::load(l + i), alpha, sum).store(l + i);
        m_new.store(m + i);
        if (!all_lanes_equal(alpha, T(1)))  // no query's maximum moved: Ot stays as it is
          for (int d = 0; d < D; ++d) (P::load(ot + d * L + i) * alpha).store(ot + d * L + i);
      });
      barrier();
      // Ot[d][i] += sum_j V[j][d] Pt[j][i]
      accumulate_transposed<Shape>(team, k_count, D, {kv.b, st, v_pairs, p_pairs, 1.0f}, ot, v, b, h, next);
      barrier();
    }

    // O = output_scale Ot / l; LSE = ln(2) (m + log2 l). A query that sees no key gets O = 0,
    // LSE = -inf; a NaN denominator (NaN inputs, overflowed scores) stays NaN in both. Each
    // query's column of Ot is gathered into its row of the K block's scratch (free now), then
    // stored as a row.
    auto inverse = [&](int i) {
      const T sum = l[i];
      return sum > T(0) ? output_scale / sum : sum == T(0) ? T(0) : sum;
    };
    store_transposed<L>(team, o, b, h, q_first, q_count, D, ot, inverse, false, ks);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, q_count), [&](int i) {
      const T sum = l[i];
      lse(b, h, q_first + i) =
          sum > T(0) ? (m[i] + math::log2(sum)) * ln_2<T>() : sum == T(0) ? minus_infinity<T>() : sum;
    });
  }
};

// ---------------------------------------------------------------------------------------------
// Delta[b, h, i] = sum_d dO[b,i,h,d] O[b,i,h,d]: the row sums that turn dP into dS.
template <class ExecSpace, class S>
struct DeltaKernel {
  using T = accumulate_t<S>;
  Tensor4<const S, ExecSpace> o, d_o;
  Kokkos::View<T***, typename ExecSpace::memory_space> delta;  // [B, H, Nq]
  int heads, queries, head_dim;

  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t row) const {
    const int i = static_cast<int>(row % queries);
    const int h = static_cast<int>(row / queries % heads);
    const int b = static_cast<int>(row / queries / heads);
    T sum = 0;
    for (int d = 0; d < head_dim; ++d) sum += T(d_o(b, i, h, d)) * T(o(b, i, h, d));
    delta(b, h, i) = sum;
  }
};

// Loads the per-query values of the backward pass for queries [first, first + count): LSE in
// log2 units and Delta. A query that sees no key (LSE = -inf) gets +inf, so that every one of
// its probabilities 2^(s - lse2) is 0.
template <class T, class Lse, class Delta>
KOKKOS_INLINE_FUNCTION void load_row_statistics(const Lse& lse, const Delta& delta, int b, int h,
                                                int i, T& lse2, T& row_delta) {
  const T value = lse(b, h, i);
  lse2 = value == minus_infinity<T>() ? -minus_infinity<T>() : value * log2_e<T>();
  row_delta = delta(b, h, i);
}

// ---------------------------------------------------------------------------------------------
// dK and dV, and in the one-pass form (WithQueryGradient) dQ too. Keys along lanes. Scratch:
// Kt[D][L] (times scale * log2(e)), Vt[D][L] (times output_scale), the query block's Q and dO
// [L][D] (unless read in place, rows_in_place), S[L][L] (then P), dP[L][L]
// (then dS), dKt[D][L], dVt[D][L], lse2[L], delta[L]; one pass adds the key block's rows
// K[L][D] (times the softmax scale) for dQ[i][d] += sum_j dS[i][j] K[j][d], a product with the
// head dim along the lanes (so D is a multiple of packs x lanes) into dq_sum's rows. The bf16
// path takes K and V as column pairs, Q and dO as rows and as row pairs, P and dS as row pairs
// (one pass: also dS as rows and K as row pairs); the scales go into the products' alpha.
template <class ExecSpace, class S, class Pattern, class Tiles, bool WithQueryGradient = false>
struct KeyGradientKernel {
  using T = accumulate_t<S>;
  using Shape = typename Tiles::template shape<T>;
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using P = Pack<T, Shape::lanes>;
  static constexpr int L = Shape::block;
  static constexpr int W = Shape::lanes;
  static constexpr int team_size = Tiles::team_size;
  static_assert(L % (Shape::packs * W) == 0, "a block is a whole number of micro-tile columns");
  static_assert(L % (2 * W) == 0, "dS's bf16 rows take a block's columns two packs at a time");

  Tensor4<const S, ExecSpace> q, k, v, d_o;
  Tensor3<const T, ExecSpace> lse;
  Kokkos::View<T***, typename ExecSpace::memory_space> delta;
  Tensor4<S, ExecSpace> dk, dv;
  AttentionGeometry geo;
  Pattern pattern;
  T scale_log2;
  T output_scale;  // d(output_scale O)/dO: dO enters every product times output_scale
  bool accumulate;  // add into dk, dv
  int scratch_level;
  // One pass only: dQ's sums (dq itself, or a workspace in T), the head dim contiguous, added to.
  Tensor4<T, ExecSpace> dq_sum = {};
  T scale = T(0);

  // The head dims the one-pass form takes: dQ's product has them along its micro-tile columns.
  static constexpr int head_dim_multiple = Shape::packs * W;

  static constexpr bool bf16_compiled = bf16_products_compiled<ExecSpace, S>;
  bool bf16_products = false;  // the bf16 path (only where bf16_compiled)
  Bf16Rounding bf16_rounding = Bf16Rounding::integer;  // how it rounds P and dS to bf16

  static std::size_t scratch_bytes(int head_dim) {
    using A = ScratchArena<Member>;
    const std::size_t D = head_dim, e = sizeof(T), words = (D * L + L) / 2;
    const std::size_t bf16_path =
        bf16_compiled ? (WithQueryGradient ? 7 : 6) * A::bytes(words, 4) + (WithQueryGradient ? 3 : 2) * A::bytes(L * L / 2, 4)
                      : 0;
    return (WithQueryGradient ? 7 : 6) * A::bytes(D * L, e) + 2 * A::bytes(L * L, e) + 2 * A::bytes(L, e) + bf16_path;
  }
  int league_size() const { return geo.batch * geo.heads * (WithQueryGradient ? 1 : pattern.key_blocks()); }

  struct Scratch {
    T *kt, *vt, *ks, *qs, *dos, *s, *dp, *dkt, *dvt, *lse2, *delta_rows;
    // The bf16 path's operands (words of two bf16), null in the float path.
    std::uint32_t *k_pairs, *v_pairs, *k_row_pairs, *q_rows, *do_rows, *q_row_pairs, *do_row_pairs, *p_pairs,
        *ds_pairs, *ds_rows;
  };

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const int D = geo.head_dim;
    const ScratchArena<Member> arena{team, scratch_level};
    Scratch x;
    x.kt = arena.template take<T>(D * L);
    x.vt = arena.template take<T>(D * L);
    x.ks = WithQueryGradient ? arena.template take<T>(L * D) : nullptr;
    x.qs = arena.template take<T>(L * D);
    x.dos = arena.template take<T>(L * D);
    x.s = arena.template take<T>(L * L);
    x.dp = arena.template take<T>(L * L);
    x.dkt = arena.template take<T>(D * L);
    x.dvt = arena.template take<T>(D * L);
    x.lse2 = arena.template take<T>(L);
    x.delta_rows = arena.template take<T>(L);
    const bool pairs = bf16_compiled && bf16_products;
    const int words = (D * L + L) / 2;
    auto take_words = [&](bool wanted, int count) {
      return pairs && wanted ? arena.template take<std::uint32_t>(count) : nullptr;
    };
    x.k_pairs = take_words(true, words);
    x.v_pairs = take_words(true, words);
    x.k_row_pairs = take_words(WithQueryGradient, words);
    x.q_rows = take_words(true, words);
    x.do_rows = take_words(true, words);
    x.q_row_pairs = take_words(true, words);
    x.do_row_pairs = take_words(true, words);
    x.p_pairs = take_words(true, L * L / 2);
    x.ds_pairs = take_words(true, L * L / 2);
    x.ds_rows = take_words(WithQueryGradient, L * L / 2);
    TeamBarrier<Member> barrier(team, x.kt);
    if constexpr (WithQueryGradient) {
      const int b = team.league_rank() / geo.heads, h = team.league_rank() % geo.heads;
      for (int kb = 0; kb < pattern.key_blocks(); ++kb) key_block(team, x, barrier, b, h, kb);
    } else {
      const TeamBlock mine = team_block(team.league_rank(), pattern.key_blocks(), geo.heads, geo.keys, L, false);
      key_block(team, x, barrier, mine.b, mine.h, mine.block);
    }
  }

  KOKKOS_INLINE_FUNCTION void key_block(const Member& team, const Scratch& x, TeamBarrier<Member>& barrier, int b,
                                        int h, int kb) const {
    const int D = geo.head_dim;
    const int k_first = kb * L, k_count = tokens_in_block(k_first, geo.keys, L);
    T *kt = x.kt, *vt = x.vt, *qs = x.qs, *dos = x.dos, *s = x.s, *dp = x.dp, *dkt = x.dkt, *dvt = x.dvt,
      *lse2 = x.lse2, *delta_rows = x.delta_rows;

    const bool pairs = x.k_pairs != nullptr;
    barrier();  // the previous key block's stores are done with dKt and dVt
    if (pairs) {
      load_bf16_column_pairs<L>(team, k, b, h, k_first, k_count, D, x.k_pairs);
      load_bf16_column_pairs<L>(team, v, b, h, k_first, k_count, D, x.v_pairs);
      if (WithQueryGradient) load_bf16_row_pairs(team, k, b, h, k_first, k_count, D, x.k_row_pairs);
    } else {
      load_transposed<L>(team, k, b, h, k_first, k_count, D, scale_log2, kt);
      load_transposed<L>(team, v, b, h, k_first, k_count, D, output_scale, vt);
      if constexpr (WithQueryGradient)
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, k_count), [&](int j) {
          for (int d = 0; d < D; ++d) x.ks[j * D + d] = T(k(b, k_first + j, h, d)) * scale;
        });
    }
    zero_scratch(team, dkt, D * L);
    zero_scratch(team, dvt, D * L);

    const BlockList visiting = pattern.visiting_query_blocks(b, h, kb);
    const int visits = visiting.count;
    for (int n = 0; n < visits; ++n) {
      const int q_first = visiting[n] * L;
      const int q_count = tokens_in_block(q_first, geo.queries, L);
      barrier();  // the previous block's products are done with qs, dos, s, dp
      RowBlocks<T> q_do{nullptr, nullptr};  // Q and dO rows, float path
      if (pairs) {
        load_bf16_rows(team, q, b, h, q_first, q_count, D, x.q_rows);
        load_bf16_rows(team, d_o, b, h, q_first, q_count, D, x.do_rows);
        load_bf16_row_pairs(team, q, b, h, q_first, q_count, D, x.q_row_pairs);
        load_bf16_row_pairs(team, d_o, b, h, q_first, q_count, D, x.do_row_pairs);
      } else {
        q_do = block_rows<Tiles>(team, q, d_o, b, h, {q_first, q_count}, D, qs, dos);
      }
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, q_count), [&](int i) {
        load_row_statistics(lse, delta, b, h, q_first + i, lse2[i], delta_rows[i]);
      });
      barrier();
      // The next query block's Q rows are fetched during the first product, dO rows during the second.
      const BlockSpan next = next_visit(visiting, n, geo.queries, L);
      // S[i][j] = sum_d Q[i][d] Kt[d][j];  dP[i][j] = sum_d dO[i][d] Vt[d][j]
      block_scores<Shape>(team, q_count, D, {q_do.a, kt, x.q_rows, x.k_pairs, float(scale_log2)}, s, q, b, h, next);
      block_scores<Shape>(team, q_count, D, {q_do.b, vt, x.do_rows, x.v_pairs, float(output_scale)}, dp, d_o, b, h,
                          next);
      barrier();
      // Keys past the end of the sequence are masked too: their lanes hold zero-padded K.
      if (geo.needs_mask(q_first, k_first, k_count) || k_count < L) {
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, q_count), [&](int i) {
          const int seen = geo.first_key_not_seen(q_first + i, k_first, L);
          for (int j = seen < k_count ? seen : k_count; j < L; ++j) s[i * L + j] = minus_infinity<T>();
        });
        barrier();
      }
      // P = 2^(S - lse2);  dS = P (dP - Delta)
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, q_count * (L / W)), [&](int item) {
        const int i = item / (L / W), j = (item % (L / W)) * W;
        const P p = exp2(P::load(s + i * L + j) - P::broadcast(lse2[i]));
        p.store(s + i * L + j);
        (p * (P::load(dp + i * L + j) - P::broadcast(delta_rows[i]))).store(dp + i * L + j);
      });
      barrier();
      if (pairs) {
        store_bf16_row_pairs<P>(team, s, q_count, L, L, bf16_rounding, x.p_pairs);
        store_bf16_row_pairs<P>(team, dp, q_count, L, L, bf16_rounding, x.ds_pairs);
        if (WithQueryGradient) store_bf16_rows<P>(team, dp, q_count, L, L, bf16_rounding, x.ds_rows);
        barrier();
      }
      // dVt[d][j] += sum_i dO[i][d] P[i][j];  dKt[d][j] += sum_i Q[i][d] dS[i][j]
      // (one pass: the next query block's dQ rows are fetched during the second).
      accumulate_transposed<Shape>(team, q_count, D, {q_do.b, s, x.do_row_pairs, x.p_pairs, 1.0f}, dvt, d_o, b, h,
                                   {0, 0});
      accumulate_transposed<Shape>(team, q_count, D, {q_do.a, dp, x.q_row_pairs, x.ds_pairs, 1.0f}, dkt, dq_sum, b,
                                   h, {next.first, WithQueryGradient ? next.count : 0});
      // dQ[i][d] += sum_j dS[i][j] K[j][d] scale, into dq_sum's rows (this team owns the head's).
      if constexpr (WithQueryGradient) {
        T* dq_rows = &dq_sum(b, q_first, h, 0);
        const int ld = int(dq_sum.stride(1));
        if (pairs)
          bf16_tile_mma(team, {x.ds_rows, L / 2, 1, x.k_row_pairs, D, bf16_output(dq_rows), ld, q_count, D,
                               (k_count + 1) / 2, float(scale), true},
                        dq_sum, b, h, {0, 0}, D);
        else
          tile_mma<Shape>(team, q_count, D, k_count, dp, L, 1, x.ks, D, dq_rows, ld, true);
      }
    }
    barrier();

    // dK = scale * dS^T Q, dV = output_scale * P^T dO (the products took Q and dO as they are),
    // through the Q and dO blocks' scratch, free now.
    const T dk_scale = scale_log2 * ln_2<T>();
    store_transposed<L>(team, dk, b, h, k_first, k_count, D, dkt, [&](int) { return dk_scale; }, accumulate, qs);
    store_transposed<L>(team, dv, b, h, k_first, k_count, D, dvt, [&](int) { return output_scale; }, accumulate, dos);
  }
};

// ---------------------------------------------------------------------------------------------
// dQ. Queries along lanes, like the forward pass. Scratch: Qt[D][L] (scaled), dOt[D][L], K and
// V blocks [L][D] (unless read in place), St[L][L] (then P), dPt[L][L] (then dS), dQt[D][L], lse2[L], delta[L]. The
// bf16 path takes Q and dO as column pairs, K and V as rows, K as row pairs and dS as row pairs.
template <class ExecSpace, class S, class Pattern, class Tiles>
struct QueryGradientKernel {
  using T = accumulate_t<S>;
  using Shape = typename Tiles::template shape<T>;
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using P = Pack<T, Shape::lanes>;
  static constexpr int L = Shape::block;
  static constexpr int W = Shape::lanes;
  static constexpr int team_size = Tiles::team_size;
  static_assert(L % (Shape::packs * W) == 0, "a block is a whole number of micro-tile columns");

  Tensor4<const S, ExecSpace> q, k, v, d_o;
  Tensor3<const T, ExecSpace> lse;
  Kokkos::View<T***, typename ExecSpace::memory_space> delta;
  Tensor4<S, ExecSpace> dq;
  AttentionGeometry geo;
  Pattern pattern;
  T scale;
  T scale_log2;
  T output_scale;
  bool accumulate;  // add into dq
  int scratch_level;

  static constexpr bool bf16_compiled = bf16_products_compiled<ExecSpace, S>;
  bool bf16_products = false;  // the bf16 path (only where bf16_compiled)
  Bf16Rounding bf16_rounding = Bf16Rounding::integer;  // how it rounds P and dS to bf16

  static std::size_t scratch_bytes(int head_dim) {
    using A = ScratchArena<Member>;
    const std::size_t D = head_dim, e = sizeof(T), words = (D * L + L) / 2;
    const std::size_t bf16_path = bf16_compiled ? 5 * A::bytes(words, 4) + A::bytes(L * L / 2, 4) : 0;
    return 5 * A::bytes(D * L, e) + 2 * A::bytes(L * L, e) + 2 * A::bytes(L, e) + bf16_path;
  }
  int league_size() const { return geo.batch * geo.heads * pattern.query_blocks(); }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const int D = geo.head_dim;
    const TeamBlock mine = team_block(team.league_rank(), pattern.query_blocks(), geo.heads, geo.queries, L, true);
    const int b = mine.b, h = mine.h, qb = mine.block, q_first = mine.first, q_count = mine.count;

    const ScratchArena<Member> arena{team, scratch_level};
    T* qt = arena.template take<T>(D * L);
    T* dot = arena.template take<T>(D * L);
    T* ks = arena.template take<T>(L * D);
    T* vs = arena.template take<T>(L * D);
    T* st = arena.template take<T>(L * L);
    T* dpt = arena.template take<T>(L * L);
    T* dqt = arena.template take<T>(D * L);
    T* lse2 = arena.template take<T>(L);
    T* delta_rows = arena.template take<T>(L);
    const bool pairs = bf16_compiled && bf16_products;
    const int words = (D * L + L) / 2;
    std::uint32_t* q_pairs = pairs ? arena.template take<std::uint32_t>(words) : nullptr;
    std::uint32_t* do_pairs = pairs ? arena.template take<std::uint32_t>(words) : nullptr;
    std::uint32_t* k_rows = pairs ? arena.template take<std::uint32_t>(words) : nullptr;
    std::uint32_t* v_rows = pairs ? arena.template take<std::uint32_t>(words) : nullptr;
    std::uint32_t* k_row_pairs = pairs ? arena.template take<std::uint32_t>(words) : nullptr;
    std::uint32_t* ds_pairs = pairs ? arena.template take<std::uint32_t>(L * L / 2) : nullptr;
    TeamBarrier<Member> barrier(team, qt);

    if (pairs) {
      load_bf16_column_pairs<L>(team, q, b, h, q_first, q_count, D, q_pairs);
      load_bf16_column_pairs<L>(team, d_o, b, h, q_first, q_count, D, do_pairs);
    } else {
      load_transposed<L>(team, q, b, h, q_first, q_count, D, scale_log2, qt);
      load_transposed<L>(team, d_o, b, h, q_first, q_count, D, output_scale, dot);
    }
    zero_scratch(team, dqt, D * L);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, L), [&](int i) {
      if (i < q_count) {
        load_row_statistics(lse, delta, b, h, q_first + i, lse2[i], delta_rows[i]);
      } else {  // padded lanes: probability 0
        lse2[i] = -minus_infinity<T>();
        delta_rows[i] = T(0);
      }
    });

    const BlockList visited = pattern.visited_key_blocks(b, h, qb);
    const int visits = visited.count;
    for (int n = 0; n < visits; ++n) {
      const int k_first = visited[n] * L;
      const int k_count = tokens_in_block(k_first, geo.keys, L);
      barrier();
      RowBlocks<T> kv{nullptr, nullptr};  // K and V rows, float path
      if (pairs) {
        load_bf16_rows(team, k, b, h, k_first, k_count, D, k_rows);
        load_bf16_rows(team, v, b, h, k_first, k_count, D, v_rows);
        load_bf16_row_pairs(team, k, b, h, k_first, k_count, D, k_row_pairs);
      } else {
        kv = block_rows<Tiles>(team, k, v, b, h, {k_first, k_count}, D, ks, vs);
      }
      barrier();
      const BlockSpan next = next_visit(visited, n, geo.keys, L);
      // St[j][i] = sum_d K[j][d] Qt[d][i];  dPt[j][i] = sum_d V[j][d] dOt[d][i]
      block_scores<Shape>(team, k_count, D, {kv.a, qt, k_rows, q_pairs, float(scale_log2)}, st, k, b, h, next);
      block_scores<Shape>(team, k_count, D, {kv.b, dot, v_rows, do_pairs, float(output_scale)}, dpt, v, b, h, next);
      barrier();
      mask_key_major_scores<L>(team, barrier, geo, q_first, k_first, k_count, st);
      // dSt = 2^(St - lse2) (dPt - Delta)
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, k_count * (L / W)), [&](int item) {
        const int j = item / (L / W), i = (item % (L / W)) * W;
        const P p = exp2(P::load(st + j * L + i) - P::load(lse2 + i));
        (p * (P::load(dpt + j * L + i) - P::load(delta_rows + i))).store(dpt + j * L + i);
      });
      barrier();
      // dQt[d][i] += sum_j K[j][d] dSt[j][i]
      if (pairs) {
        store_bf16_row_pairs<P>(team, dpt, k_count, L, L, bf16_rounding, ds_pairs);
        barrier();
      }
      accumulate_transposed<Shape>(team, k_count, D, {kv.a, dpt, k_row_pairs, ds_pairs, 1.0f}, dqt, k, b, h, {0, 0});
    }
    barrier();

    store_transposed<L>(team, dq, b, h, q_first, q_count, D, dqt, [&](int) { return scale; }, accumulate, ks);
  }
};

}  // namespace longattn::detail
