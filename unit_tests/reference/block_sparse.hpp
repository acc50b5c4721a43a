#pragma once
// Block-sparse patterns written from their definitions (block_sparse_patterns.hpp), at token
// level where the definition is in tokens, for the tests to compare the builders with; and a
// layout read back to the host as a block mask, the token mask the reference attention takes.
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "longattn/core/block_sparse_layout.hpp"
#include "longattn/core/block_sparse_patterns.hpp"
#include "reference/attention.hpp"

namespace longattn::test {

// keep[((b * heads + h) * query_blocks + qb) * key_blocks + kb]
struct BlockMask {
  int block = 64, batch = 1, heads = 1, query_blocks = 0, key_blocks = 0;
  std::vector<std::uint8_t> keep;

  BlockMask(int block_tokens, int batch_, int heads_, std::int64_t queries, std::int64_t keys)
      : block(block_tokens), batch(batch_), heads(heads_), query_blocks(int((queries + block - 1) / block)),
        key_blocks(int((keys + block - 1) / block)),
        keep(std::size_t(batch_) * heads_ * query_blocks * key_blocks, 0) {}
  std::uint8_t& at(int b, int h, int qb, int kb) {
    return keep[((std::size_t(b) * heads + h) * query_blocks + qb) * key_blocks + kb];
  }
  bool kept(int b, int h, int qb, int kb) const {
    return keep[((std::size_t(batch == 1 ? 0 : b) * heads + (heads == 1 ? 0 : h)) * query_blocks + qb) * key_blocks +
                kb] != 0;
  }
  std::size_t count() const { return std::size_t(std::count(keep.begin(), keep.end(), std::uint8_t(1))); }
  // The equivalent token mask of the reference attention.
  ReferenceOptions options(bool causal) const {
    ReferenceOptions opts;
    opts.causal = causal;
    const BlockMask copy = *this;
    opts.mask = [copy](std::size_t b, std::size_t h, std::size_t i, std::size_t j) {
      return copy.kept(int(b), int(h), int(i / copy.block), int(j / copy.block));
    };
    return opts;
  }
};

// A layout's rows as a block mask; `consistent` says whether its transpose lists the same pairs,
// each column ascending, and kept_blocks() counts them.
template <class Layout>
BlockMask read_layout(const Layout& layout, bool& consistent) {
  const BlockSparseShape& shape = layout.shape();
  BlockMask mask(shape.block, shape.batch, shape.heads, shape.queries, shape.keys);
  consistent = false;
  const auto rows = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), layout.row_offsets());
  const auto entries = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), layout.key_blocks_of_rows());
  const auto columns = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), layout.column_offsets());
  const auto transposed = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), layout.query_blocks_of_columns());
  const int QB = mask.query_blocks, KB = mask.key_blocks;
  for (int p = 0; p < shape.batch * shape.heads; ++p)
    for (int qb = 0; qb < QB; ++qb)
      for (auto n = rows(p * QB + qb); n < rows(p * QB + qb + 1); ++n) mask.at(p / shape.heads, p % shape.heads, qb, entries(n)) = 1;
  BlockMask from_columns = mask;
  std::fill(from_columns.keep.begin(), from_columns.keep.end(), 0);
  for (int p = 0; p < shape.batch * shape.heads; ++p)
    for (int kb = 0; kb < KB; ++kb)
      for (auto n = columns(p * KB + kb); n < columns(p * KB + kb + 1); ++n) {
        if (n > columns(p * KB + kb) && transposed(n - 1) >= transposed(n)) return mask;  // not ascending
        from_columns.at(p / shape.heads, p % shape.heads, transposed(n), kb) = 1;
      }
  consistent = from_columns.keep == mask.keep && std::size_t(layout.kept_blocks()) == mask.count();
  return mask;
}

// Whether causal attention lets some query of qb see some key of kb (token i and key i at the
// same position).
inline bool causal_pair_exists(const BlockMask& m, int qb, int kb, std::int64_t queries) {
  return std::int64_t(kb) * m.block <= std::min<std::int64_t>((qb + 1) * std::int64_t(m.block), queries) - 1;
}

// The blocks a static pattern keeps, from its definition: a block pair is kept iff some token
// pair in it is asked for (radii and global tokens rounded out to whole blocks, as documented).
inline BlockMask reference_static_pattern(const BlockSparseConfig& config, int block, std::int64_t queries,
                                          std::int64_t keys, bool causal) {
  BlockMask m(block, 1, 1, queries, keys);
  const std::int64_t global_end = (config.global_tokens + block - 1) / block * block;
  auto asked = [&](std::int64_t i, std::int64_t j) {
    switch (config.pattern) {
      case BlockSparsePattern::full: return true;
      case BlockSparsePattern::local_window: return std::abs(i - j) <= config.radius;
      case BlockSparsePattern::global_local:
        return i < global_end || j < global_end || std::abs(i - j) <= config.radius;
      case BlockSparsePattern::dilated: {
        const std::int64_t distance = std::abs(i / block - j / block);
        return distance == 0 || std::count(config.rates.begin(), config.rates.end(), distance) > 0;
      }
      default: return false;
    }
  };
  for (int qb = 0; qb < m.query_blocks; ++qb)
    for (int kb = 0; kb < m.key_blocks; ++kb) {
      bool any = false;
      for (std::int64_t i = std::int64_t(qb) * block; i < std::min<std::int64_t>((qb + 1) * std::int64_t(block), queries) && !any; ++i)
        for (std::int64_t j = std::int64_t(kb) * block; j < std::min<std::int64_t>((kb + 1) * std::int64_t(block), keys) && !any; ++j)
          any = asked(i, j) && (!causal || j <= i);
      m.at(0, 0, qb, kb) = any;
    }
  return m;
}

// Pooled score of (b, h, qb, kb): mean of the query block's q . mean of the key block's k.
inline double pooled_score(const HostTensor& q, const HostTensor& k, int block, int b, int h, int qb, int kb) {
  const std::size_t N = q.extent(1), D = q.extent(3);
  double score = 0;
  for (std::size_t d = 0; d < D; ++d) {
    double mean_q = 0, mean_k = 0;
    const std::size_t q_end = std::min(N, std::size_t(qb + 1) * block), k_end = std::min(N, std::size_t(kb + 1) * block);
    for (std::size_t i = std::size_t(qb) * block; i < q_end; ++i) mean_q += q(b, i, h, d);
    for (std::size_t j = std::size_t(kb) * block; j < k_end; ++j) mean_k += k(b, j, h, d);
    score += mean_q / double(q_end - std::size_t(qb) * block) * mean_k / double(k_end - std::size_t(kb) * block);
  }
  return score;
}

// Content-adaptive top-k from its definition: per (b, h, qb) the diagonal and the top_k - 1
// allowed others with the largest pooled score (ties to the lower block).
inline BlockMask reference_top_k(const HostTensor& q, const HostTensor& k, int block, std::int64_t top_k, bool causal) {
  const int B = q.extent(0), H = q.extent(2);
  BlockMask m(block, B, H, q.extent(1), k.extent(1));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int qb = 0; qb < m.query_blocks; ++qb) {
        std::vector<std::pair<double, int>> ranked;  // (-score, block): ascending = best first
        for (int kb = 0; kb < (causal ? qb : m.key_blocks); ++kb)
          if (kb != qb) ranked.push_back({-pooled_score(q, k, block, b, h, qb, kb), kb});
        std::sort(ranked.begin(), ranked.end());
        m.at(b, h, qb, qb) = 1;
        for (std::size_t n = 0; n + 1 < std::size_t(top_k) && n < ranked.size(); ++n) m.at(b, h, qb, ranked[n].second) = 1;
      }
  return m;
}

}  // namespace longattn::test
