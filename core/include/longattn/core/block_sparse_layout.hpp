// BlockSparseLayout: the (query block, key block) pairs that block-sparse attention visits, as
// block-CSR (one row per query block: its key blocks, ascending) and the transpose (one column
// per key block: the query blocks that visit it, which the dK/dV pass walks). The attention
// kernels take it where they take DenseBlocks (dense_blocks.hpp):
//
//   attention_forward(exec, q, k, v, o, lse, opts, layout)
//   attention_backward(exec, q, k, v, o, d_o, lse, dq, dk, dv, opts, layout)
//
// visit only the kept blocks, so their cost is proportional to kept_blocks(). A layout holds one
// pattern per (batch entry, head), or one shared by all batch entries and/or heads (shape.batch,
// shape.heads = 1). Row r = (b * shape.heads + h) * query_blocks + qb.
//
// Built from block-CSR on the host (mirrored to the execution space's memory) or already in that
// memory; either way validated (offsets non-decreasing from 0 to the entry count, each row's key
// blocks ascending, in range, without duplicates), then transposed by a Kokkos kernel on the
// execution space. Pattern builders (local window, dilated, global + local, random, from a block
// mask, content-adaptive top-k) are in block_sparse_patterns.hpp.
#pragma once

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "longattn/core/attention.hpp"  // detail::AttentionKernels (the ETI declarations below)
#include "longattn/core/dense_blocks.hpp"
#include "longattn/core/detail/eti.hpp"
#include "longattn/error.hpp"

namespace longattn {

// The grid a layout covers.
struct BlockSparseShape {
  int block = 64;            // tokens per block: attention_block_size<ExecSpace, T>()
  std::int64_t queries = 0;  // Nq, tokens
  std::int64_t keys = 0;     // Nk, tokens
  int batch = 1;             // batch entries with a pattern of their own: 1 (shared) or B
  int heads = 1;             // heads with a pattern of their own: 1 (shared) or H

  int query_blocks() const { return static_cast<int>((queries + block - 1) / block); }
  int key_blocks() const { return static_cast<int>((keys + block - 1) / block); }
  std::int64_t patterns() const { return std::int64_t(batch) * heads; }
  std::int64_t rows() const { return patterns() * query_blocks(); }
  std::int64_t columns() const { return patterns() * key_blocks(); }
};

inline bool operator==(const BlockSparseShape& a, const BlockSparseShape& b) {
  return a.block == b.block && a.queries == b.queries && a.keys == b.keys && a.batch == b.batch &&
         a.heads == b.heads;
}

inline void validate_block_sparse_shape(const BlockSparseShape& shape, const std::string& where) {
  constexpr std::int64_t limit = std::int64_t(1) << 30;
  require(shape.block > 0, where, "shape.block", shape.block, "a positive number of tokens per block");
  require(shape.queries > 0 && shape.queries < limit, where, "shape.queries", shape.queries,
          "a query count in [1, 2^30)");
  require(shape.keys > 0 && shape.keys < limit, where, "shape.keys", shape.keys, "a key count in [1, 2^30)");
  require(shape.batch > 0, where, "shape.batch", shape.batch, "1 (one pattern for all) or the batch size");
  require(shape.heads > 0, where, "shape.heads", shape.heads, "1 (one pattern for all) or the head count");
  require(shape.rows() < limit && shape.columns() < limit, where, "shape.batch * shape.heads",
          shape.patterns(), "fewer than 2^30 rows and columns of blocks in all");
}

namespace detail {

// Whether `value` is among the ascending entries [begin, end) (binary search).
KOKKOS_INLINE_FUNCTION bool sorted_contains(const int* entries, std::int64_t begin, std::int64_t end, int value) {
  std::int64_t low = begin, high = end;
  while (low < high) {
    const std::int64_t middle = low + (high - low) / 2;
    if (entries[middle] < value)
      low = middle + 1;
    else
      high = middle;
  }
  return low < end && entries[low] == value;
}

// The first row of a block-CSR whose offsets decrease or leave [0, entry count], or whose entries
// are not ascending in [0, key_blocks); `rows` if none. One pass on the execution space; a row's
// entries are read only once its offsets are known to be inside the entries.
template <class ExecSpace, class Offsets, class Indices>
std::int64_t first_invalid_row(const ExecSpace& exec, std::int64_t rows, int key_blocks, const Offsets& offsets,
                               const Indices& entries) {
  std::int64_t first_bad = 0;
  const std::int64_t count = std::int64_t(entries.extent(0));
  Kokkos::parallel_reduce(
      "longattn::BlockSparseLayout::validate", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, rows),
      KOKKOS_LAMBDA(std::int64_t row, std::int64_t & bad) {
        const std::int64_t begin = offsets(row), end = offsets(row + 1);
        bool ok = 0 <= begin && begin <= end && end <= count;
        for (std::int64_t n = begin; ok && n < end; ++n)
          ok = entries(n) >= 0 && entries(n) < key_blocks && (n == begin || entries(n - 1) < entries(n));
        if (!ok && row < bad) bad = row;
      },
      Kokkos::Min<std::int64_t>(first_bad));  // the reducer starts from the largest int64
  return first_bad < rows ? first_bad : rows;
}

// The transpose of a block-CSR of `patterns` x query_blocks rows over key_blocks columns: column
// (pattern, kb) lists the query blocks whose row holds kb, ascending. Counted, scanned into
// offsets, then filled, each by binary search of the rows (deterministic, no atomics).
template <class ExecSpace, class Offsets, class Indices>
void transpose_block_csr(const ExecSpace& exec, std::int64_t patterns, int query_blocks, int key_blocks,
                         const Offsets& rows, const Indices& entries, Offsets& column_offsets,
                         Indices& transposed) {
  using Policy = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
  const std::int64_t columns = patterns * key_blocks;
  column_offsets = Offsets(Kokkos::view_alloc(exec, "longattn::BlockSparseLayout::column_offsets"), columns + 1);
  transposed = Indices(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "longattn::BlockSparseLayout::query_blocks"),
                       entries.extent(0));
  const Offsets offsets = column_offsets;
  const Indices out = transposed;
  Kokkos::parallel_for(
      "longattn::BlockSparseLayout::count_columns", Policy(exec, 0, columns), KOKKOS_LAMBDA(std::int64_t column) {
        const std::int64_t first_row = column / key_blocks * query_blocks;
        const int kb = static_cast<int>(column % key_blocks);
        std::int64_t count = 0;
        for (int qb = 0; qb < query_blocks; ++qb)
          count += sorted_contains(entries.data(), rows(first_row + qb), rows(first_row + qb + 1), kb) ? 1 : 0;
        offsets(column + 1) = count;
      });
  Kokkos::parallel_scan(
      "longattn::BlockSparseLayout::scan_columns", Policy(exec, 0, columns + 1),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t & sum, bool final) {
        sum += offsets(i);
        if (final) offsets(i) = sum;
      });
  Kokkos::parallel_for(
      "longattn::BlockSparseLayout::fill_columns", Policy(exec, 0, columns), KOKKOS_LAMBDA(std::int64_t column) {
        const std::int64_t first_row = column / key_blocks * query_blocks;
        const int kb = static_cast<int>(column % key_blocks);
        std::int64_t next = offsets(column);
        for (int qb = 0; qb < query_blocks; ++qb)
          if (sorted_contains(entries.data(), rows(first_row + qb), rows(first_row + qb + 1), kb)) out(next++) = qb;
      });
  exec.fence();
}

}  // namespace detail

template <class ExecSpace>
class BlockSparseLayout {
 public:
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;
  using Offsets = Kokkos::View<std::int64_t*, memory_space>;
  using Indices = Kokkos::View<int*, memory_space>;

  BlockSparseLayout() = default;

  // From block-CSR on the host: row r lists key_blocks[row_offsets[r], row_offsets[r + 1]).
  BlockSparseLayout(const ExecSpace& exec, const BlockSparseShape& shape,
                    const std::vector<std::int64_t>& row_offsets, const std::vector<int>& key_blocks)
      : BlockSparseLayout(exec, shape, to_memory<Offsets>(exec, "longattn::BlockSparseLayout::row_offsets", row_offsets),
                          to_memory<Indices>(exec, "longattn::BlockSparseLayout::key_blocks", key_blocks)) {}

  // From block-CSR already in the execution space's memory: kept, not copied (leave it unchanged
  // while the layout is in use: the transpose is built from it here).
  BlockSparseLayout(const ExecSpace& exec, const BlockSparseShape& shape, const Offsets& row_offsets,
                    const Indices& key_blocks)
      : shape_(shape), row_offsets_(row_offsets), key_blocks_(key_blocks) {
    validate_block_sparse_shape(shape, where);
    validate(exec);
    detail::transpose_block_csr(exec, shape.patterns(), shape.query_blocks(), shape.key_blocks(), row_offsets_,
                                key_blocks_, column_offsets_, query_blocks_);
    block_ = shape.block;
    query_block_count_ = shape.query_blocks();
    key_block_count_ = shape.key_blocks();
    batch_ = shape.batch;
    heads_ = shape.heads;
  }

  const BlockSparseShape& shape() const { return shape_; }
  std::int64_t kept_blocks() const { return std::int64_t(key_blocks_.extent(0)); }
  // Kept pairs over all (query block, key block) pairs of every pattern.
  double density() const {
    return double(kept_blocks()) / (double(shape_.rows()) * double(shape_.key_blocks()));
  }
  // The block-CSR and its transpose, in the execution space's memory.
  const Offsets& row_offsets() const { return row_offsets_; }
  const Indices& key_blocks_of_rows() const { return key_blocks_; }
  const Offsets& column_offsets() const { return column_offsets_; }
  const Indices& query_blocks_of_columns() const { return query_blocks_; }

  // The block-pattern concept of the kernels (dense_blocks.hpp).
  KOKKOS_INLINE_FUNCTION int block_size() const { return block_; }
  KOKKOS_INLINE_FUNCTION int query_blocks() const { return query_block_count_; }
  KOKKOS_INLINE_FUNCTION int key_blocks() const { return key_block_count_; }
  KOKKOS_INLINE_FUNCTION int pattern_batch() const { return batch_; }
  KOKKOS_INLINE_FUNCTION int pattern_heads() const { return heads_; }
  KOKKOS_INLINE_FUNCTION BlockList visited_key_blocks(int b, int h, int query_block) const {
    const std::int64_t row = pattern(b, h) * query_block_count_ + query_block;
    return list(key_blocks_.data(), row_offsets_(row), row_offsets_(row + 1));
  }
  KOKKOS_INLINE_FUNCTION BlockList visiting_query_blocks(int b, int h, int key_block) const {
    const std::int64_t column = pattern(b, h) * key_block_count_ + key_block;
    return list(query_blocks_.data(), column_offsets_(column), column_offsets_(column + 1));
  }

 private:
  static constexpr const char* where = "longattn::BlockSparseLayout";

  KOKKOS_INLINE_FUNCTION std::int64_t pattern(int b, int h) const {
    return std::int64_t(batch_ == 1 ? 0 : b) * heads_ + (heads_ == 1 ? 0 : h);
  }
  KOKKOS_INLINE_FUNCTION static BlockList list(const int* entries, std::int64_t begin, std::int64_t end) {
    BlockList out;
    out.indices = entries + begin;
    out.count = static_cast<int>(end - begin);
    return out;
  }

  template <class View, class Value>
  static View to_memory(const ExecSpace& exec, const std::string& label, const std::vector<Value>& host) {
    View out(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, label), host.size());
    Kokkos::deep_copy(exec, out, Kokkos::View<const Value*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                                     host.data(), host.size()));
    exec.fence();
    return out;
  }

  template <class View>
  static auto read_back(const View& view, std::int64_t begin, std::int64_t end) {
    return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(),
                                               Kokkos::subview(view, Kokkos::make_pair(begin, end)));
  }

  // Offsets from 0 to the entry count, non-decreasing; each row ascending and in range. The
  // first bad row is read back for the message.
  void validate(const ExecSpace& exec) const {
    const std::int64_t rows = shape_.rows();
    require(std::int64_t(row_offsets_.extent(0)) == rows + 1, where, "row_offsets.extent(0)",
            row_offsets_.extent(0),
            std::to_string(rows + 1) + " (batch * heads * query blocks + 1 of the shape)");
    const auto first = read_back(row_offsets_, 0, 1);
    const auto last = read_back(row_offsets_, rows, rows + 1);
    require(first(0) == 0, where, "row_offsets[0]", first(0), "0");
    require(last(0) == std::int64_t(key_blocks_.extent(0)), where, "row_offsets[" + std::to_string(rows) + "]",
            last(0), std::to_string(key_blocks_.extent(0)) + " (the number of key block entries)");
    const int key_block_count = shape_.key_blocks();
    const std::int64_t bad = detail::first_invalid_row(exec, rows, key_block_count, row_offsets_, key_blocks_);
    if (bad == rows) return;

    const auto bounds = read_back(row_offsets_, bad, bad + 2);
    if (bounds(1) < bounds(0))
      throw_invalid_argument(where, "row_offsets[" + std::to_string(bad + 1) + "]", bounds(1),
                             "at least row_offsets[" + std::to_string(bad) + "] = " + std::to_string(bounds(0)) +
                                 " (offsets never decrease)");
    // The rows before `bad` are valid, so bounds(0) is in [0, entries]; bounds(1) may be past them.
    const std::int64_t entries = std::int64_t(key_blocks_.extent(0));
    if (bounds(1) > entries)
      throw_invalid_argument(where, "row_offsets[" + std::to_string(bad + 1) + "]", bounds(1),
                             "at most " + std::to_string(entries) + " (the number of key block entries)");
    const int query_blocks = shape_.query_blocks();
    std::ostringstream row;
    row << "key blocks of row " << bad << " (batch " << bad / query_blocks / shape_.heads << ", head "
        << bad / query_blocks % shape_.heads << ", query block " << bad % query_blocks << ")";
    const auto list = read_back(key_blocks_, bounds(0), std::min(bounds(1), bounds(0) + 16));
    std::ostringstream value;
    value << "[";
    for (std::size_t n = 0; n < list.extent(0); ++n) value << (n ? ", " : "") << list(n);
    value << (bounds(1) - bounds(0) > 16 ? ", ...]" : "]");
    throw_invalid_argument(where, row.str(), value.str(),
                           "ascending key block indices in [0, " + std::to_string(key_block_count) +
                               ") without duplicates");
  }

  BlockSparseShape shape_;
  Offsets row_offsets_, column_offsets_;
  Indices key_blocks_, query_blocks_;
  // Copies of the shape that device code reads.
  int block_ = 0, query_block_count_ = 0, key_block_count_ = 0, batch_ = 1, heads_ = 1;
};

// The attention kernels over block-sparse layouts, compiled into liblongattn_core (detail/eti.hpp).
namespace detail {
#define LONGATTN_ATTENTION_SPARSE_ETI(SPACE, S) \
  extern template struct AttentionKernels<SPACE, S, BlockSparseLayout<SPACE>>;
LONGATTN_ETI_FOR_EACH(LONGATTN_ETI_STORAGE_TYPES, LONGATTN_ATTENTION_SPARSE_ETI)
#undef LONGATTN_ATTENTION_SPARSE_ETI
}  // namespace detail

}  // namespace longattn
