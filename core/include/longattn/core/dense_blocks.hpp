// The block-pattern concept of the attention kernels, and DenseBlocks, its dense instance.
//
// Sequences are cut into blocks of `block` tokens (the kernel's tile,
// attention_block_size<ExecSpace, T>(); the last block of a sequence may be shorter). A block
// pattern says which (query block, key block) pairs the kernels visit; the kernels take any type
// with these members (device-callable):
//   int query_blocks(), key_blocks()                        the grid
//   BlockList visited_key_blocks(int b, int h, int qb)      the key blocks query block qb of
//                                                           (batch b, head h) visits, ascending
//   BlockList visiting_query_blocks(int b, int h, int kb)   the transpose, which the dK/dV pass walks
// and `int block_size()` (tokens per block), `int pattern_batch()`, `int pattern_heads()` (how
// many batch entries and heads have a pattern of their own: 1, shared by all, or the tensors'
// extent). A pattern with a `memory_space` must be accessible from the execution space. DenseBlocks is the full list (up to the diagonal when causal); a
// block-sparse layout (block_sparse_layout.hpp) is a shorter one. A pattern only chooses which
// blocks are visited: element-wise causal masking inside a visited block follows
// AttentionOptions, so a pattern that visits more blocks than needed is still exact, one that
// visits fewer leaves keys out on purpose.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace longattn {

// A list of block indices: `count` entries, either stored (`indices`) or the consecutive run
// first, first + 1, ... (indices == nullptr).
struct BlockList {
  const int* indices = nullptr;
  int first = 0;
  int count = 0;
  KOKKOS_INLINE_FUNCTION int operator[](int n) const { return indices ? indices[n] : first + n; }
};

struct DenseBlocks {
  int block = 64;
  int queries = 0;  // Nq
  int keys = 0;     // Nk
  std::int64_t query_offset = 0;  // global position of the first query
  std::int64_t key_offset = 0;    // global position of the first key
  bool causal = false;

  KOKKOS_INLINE_FUNCTION int block_size() const { return block; }
  KOKKOS_INLINE_FUNCTION int pattern_batch() const { return 1; }
  KOKKOS_INLINE_FUNCTION int pattern_heads() const { return 1; }
  KOKKOS_INLINE_FUNCTION int query_blocks() const { return (queries + block - 1) / block; }
  KOKKOS_INLINE_FUNCTION int key_blocks() const { return (keys + block - 1) / block; }

  // Causal: query block qb sees local keys up to (its last query's global position) - key_offset.
  KOKKOS_INLINE_FUNCTION BlockList visited_key_blocks(int /*b*/, int /*h*/, int query_block) const {
    BlockList list;
    list.count = key_blocks();
    if (!causal) return list;
    const int last_query = (query_block + 1) * block < queries ? (query_block + 1) * block - 1 : queries - 1;
    const std::int64_t last_key = query_offset + last_query - key_offset;
    const std::int64_t count = last_key < 0 ? 0 : last_key / block + 1;
    if (count < list.count) list.count = static_cast<int>(count);
    return list;
  }

  // Causal: key block kb is seen by local queries from (its first key's global position) - query_offset.
  KOKKOS_INLINE_FUNCTION BlockList visiting_query_blocks(int /*b*/, int /*h*/, int key_block) const {
    BlockList list;
    if (causal) {
      const std::int64_t first_query = key_offset + std::int64_t(key_block) * block - query_offset;
      list.first = first_query <= 0 ? 0
                   : first_query >= queries ? query_blocks()
                                            : static_cast<int>(first_query / block);
    }
    list.count = query_blocks() - list.first;
    return list;
  }
};

}  // namespace longattn
