// DenseBlocks: the key blocks each query block visits in dense attention (all of them, or up to
// the diagonal when causal), and the transpose (the query blocks that see a key block), which
// the dK/dV pass walks.
//
// The attention kernels take any "block pattern" with these four functions; dense is the full
// list, and a block-sparse layout is a shorter one:
//   int key_block_count(int query_block)           how many key blocks query_block visits
//   int key_block(int query_block, int n)          the n-th of them
//   int query_block_count(int key_block)           how many query blocks visit key_block
//   int query_block(int key_block, int n)          the n-th of them
// Blocks hold `block` tokens (the kernel's tile, attention_block_size<ExecSpace, T>()); the last
// one of a sequence may be shorter. A pattern only chooses which blocks are visited: element-wise
// causal masking inside a visited block follows AttentionOptions, so a pattern that visits more
// blocks than needed is still exact, one that visits fewer leaves keys out on purpose.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace longattn {

struct DenseBlocks {
  int block = 64;
  int queries = 0;  // Nq
  int keys = 0;     // Nk
  std::int64_t query_offset = 0;  // global position of the first query
  std::int64_t key_offset = 0;    // global position of the first key
  bool causal = false;

  KOKKOS_INLINE_FUNCTION int query_blocks() const { return (queries + block - 1) / block; }
  KOKKOS_INLINE_FUNCTION int key_blocks() const { return (keys + block - 1) / block; }

  // Causal: query block qb sees local keys up to (its last query's global position) - key_offset.
  KOKKOS_INLINE_FUNCTION int key_block_count(int query_block) const {
    if (!causal) return key_blocks();
    const int last_query = (query_block + 1) * block < queries ? (query_block + 1) * block - 1 : queries - 1;
    const std::int64_t last_key = query_offset + last_query - key_offset;
    if (last_key < 0) return 0;
    const std::int64_t count = last_key / block + 1;
    return count < key_blocks() ? static_cast<int>(count) : key_blocks();
  }
  KOKKOS_INLINE_FUNCTION int key_block(int /*query_block*/, int n) const { return n; }

  // Causal: key block kb is seen by local queries from (its first key's global position) - query_offset.
  KOKKOS_INLINE_FUNCTION int query_block_count(int key_block) const {
    return query_blocks() - first_query_block(key_block);
  }
  KOKKOS_INLINE_FUNCTION int query_block(int key_block, int n) const {
    return first_query_block(key_block) + n;
  }

 private:
  KOKKOS_INLINE_FUNCTION int first_query_block(int key_block) const {
    if (!causal) return 0;
    const std::int64_t first_query = key_offset + std::int64_t(key_block) * block - query_offset;
    if (first_query <= 0) return 0;
    if (first_query >= queries) return query_blocks();
    return static_cast<int>(first_query / block);
  }
};

}  // namespace longattn
