// Pattern builders for block-sparse attention: each returns a BlockSparseLayout on the
// execution space. Token i of the queries and token i of the keys are taken to be the same
// position (the diagonal); `causal` drops the key blocks that lie wholly after a query block's
// last token (masking inside the diagonal block stays the kernel's, through
// AttentionOptions::causal). Radii and global tokens are in tokens and rounded out to whole
// blocks: every pair the definition asks for is kept, and pairs up to block - 1 tokens further.
//
//   full_layout            every block (the dense pattern as a layout)
//   local_window_layout    key blocks holding a key within `radius` tokens of one of the queries
//   dilated_blocks_layout  the diagonal and the key blocks at distances +-r (in blocks) for r in rates
//   global_local_layout    the first `global_tokens` attend to all and are attended by all, plus a
//                          local window
//   random_layout          per query block, round(density * allowed blocks) key blocks (at least
//                          one), drawn without replacement from a seeded generator (deterministic)
//   mask_layout            from a user's block mask [batch][heads][query blocks][key blocks]
//   top_k_layout           content-adaptive: per (batch, head, query block) the k key blocks with
//                          the largest pooled score mean(q block) . mean(k block), the diagonal
//                          always kept; computed by a Kokkos kernel, deterministic (ties go to the
//                          lower block). The selection is not differentiated: gradients flow
//                          through the attention over the selected blocks only, as in routing
//                          and top-k sparse attention.
//
// block_sparse_layout(exec, config, q, k, causal) builds the layout a BlockSparseConfig names for
// q and k (the form modules and attention specs use).
#pragma once

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "longattn/core/attention.hpp"
#include "longattn/core/block_sparse_layout.hpp"
#include "longattn/core/execution_context.hpp"
#include "longattn/error.hpp"

namespace longattn {

enum class BlockSparsePattern { full, local_window, dilated, global_local, random, top_k };

inline const char* to_string(BlockSparsePattern pattern) {
  switch (pattern) {
    case BlockSparsePattern::full: return "full";
    case BlockSparsePattern::local_window: return "local_window";
    case BlockSparsePattern::dilated: return "dilated";
    case BlockSparsePattern::global_local: return "global_local";
    case BlockSparsePattern::random: return "random";
    case BlockSparsePattern::top_k: return "top_k";
  }
  return "unknown";
}

// A named pattern and its parameters (only those of the pattern are read).
struct BlockSparseConfig {
  BlockSparsePattern pattern = BlockSparsePattern::local_window;
  std::int64_t radius = 0;           // local_window, global_local: tokens on each side
  std::vector<std::int64_t> rates;   // dilated: block distances kept besides the diagonal
  std::int64_t global_tokens = 0;    // global_local: the first tokens, global
  double density = 0.1;              // random: fraction of each query block's allowed key blocks
  std::uint64_t seed = 0;            // random
  std::int64_t top_k = 0;            // top_k: key blocks per query block
};

// Equal when they name the same blocks: the pattern and the fields it reads.
inline bool operator==(const BlockSparseConfig& a, const BlockSparseConfig& b) {
  if (a.pattern != b.pattern) return false;
  switch (a.pattern) {
    case BlockSparsePattern::full: return true;
    case BlockSparsePattern::local_window: return a.radius == b.radius;
    case BlockSparsePattern::dilated: return a.rates == b.rates;
    case BlockSparsePattern::global_local: return a.global_tokens == b.global_tokens && a.radius == b.radius;
    case BlockSparsePattern::random: return a.density == b.density && a.seed == b.seed;
    case BlockSparsePattern::top_k: return a.top_k == b.top_k;
  }
  return false;
}

inline void validate_block_sparse_config(const BlockSparseConfig& config, const std::string& where) {
  switch (config.pattern) {
    case BlockSparsePattern::full: return;
    case BlockSparsePattern::local_window:
      require(config.radius >= 0, where, "radius", config.radius, "a radius of at least 0 tokens");
      return;
    case BlockSparsePattern::dilated:
      require(!config.rates.empty(), where, "rates", "empty", "at least one block distance");
      for (std::size_t i = 0; i < config.rates.size(); ++i)
        require(config.rates[i] > 0, where, "rates[" + std::to_string(i) + "]", config.rates[i],
                "a positive block distance");
      return;
    case BlockSparsePattern::global_local:
      require(config.global_tokens >= 0, where, "global_tokens", config.global_tokens, "at least 0 tokens");
      require(config.radius >= 0, where, "radius", config.radius, "a radius of at least 0 tokens");
      return;
    case BlockSparsePattern::random:
      require(config.density > 0 && config.density <= 1, where, "density", config.density,
              "a fraction in (0, 1]");
      return;
    case BlockSparsePattern::top_k:
      require(config.top_k > 0, where, "top_k", config.top_k, "at least 1 key block per query block");
      return;
  }
  throw_invalid_argument(where, "pattern", int(config.pattern), "one of the BlockSparsePattern values");
}

namespace detail {

// First and last token of block `index` of a sequence of `tokens`.
inline std::int64_t first_token(const BlockSparseShape& shape, int index) { return std::int64_t(index) * shape.block; }
inline std::int64_t last_token(const BlockSparseShape& shape, int index, std::int64_t tokens) {
  return std::min(first_token(shape, index) + shape.block, tokens) - 1;
}

// Whether causal attention can see any key of key block kb from query block qb.
inline bool causally_visible(const BlockSparseShape& shape, int qb, int kb) {
  return first_token(shape, kb) <= last_token(shape, qb, shape.queries);
}

// Whether some query of qb and some key of kb are at most `radius` tokens apart.
inline bool within_radius(const BlockSparseShape& shape, int qb, int kb, std::int64_t radius) {
  const std::int64_t gap = std::max({std::int64_t(0), first_token(shape, kb) - last_token(shape, qb, shape.queries),
                                     first_token(shape, qb) - last_token(shape, kb, shape.keys)});
  return gap <= radius;
}

// Block-CSR of every (pattern, query block) row from `keep(pattern, qb, kb)`, then the layout.
template <class ExecSpace, class Keep>
BlockSparseLayout<ExecSpace> layout_from_rule(const ExecSpace& exec, const BlockSparseShape& shape, bool causal,
                                              Keep&& keep) {
  std::vector<std::int64_t> offsets{0};
  std::vector<int> entries;
  for (std::int64_t pattern = 0; pattern < shape.patterns(); ++pattern)
    for (int qb = 0; qb < shape.query_blocks(); ++qb) {
      for (int kb = 0; kb < shape.key_blocks(); ++kb)
        if ((!causal || causally_visible(shape, qb, kb)) && keep(pattern, qb, kb)) entries.push_back(kb);
      offsets.push_back(std::int64_t(entries.size()));
    }
  return BlockSparseLayout<ExecSpace>(exec, shape, offsets, entries);
}

}  // namespace detail

template <class ExecSpace>
BlockSparseLayout<ExecSpace> full_layout(const ExecSpace& exec, const BlockSparseShape& shape, bool causal) {
  validate_block_sparse_shape(shape, "longattn::full_layout");
  return detail::layout_from_rule(exec, shape, causal, [](std::int64_t, int, int) { return true; });
}

template <class ExecSpace>
BlockSparseLayout<ExecSpace> local_window_layout(const ExecSpace& exec, const BlockSparseShape& shape,
                                                 std::int64_t radius, bool causal) {
  const char* where = "longattn::local_window_layout";
  validate_block_sparse_shape(shape, where);
  require(radius >= 0, where, "radius", radius, "a radius of at least 0 tokens");
  return detail::layout_from_rule(exec, shape, causal, [&](std::int64_t, int qb, int kb) {
    return detail::within_radius(shape, qb, kb, radius);
  });
}

template <class ExecSpace>
BlockSparseLayout<ExecSpace> dilated_blocks_layout(const ExecSpace& exec, const BlockSparseShape& shape,
                                                   const std::vector<std::int64_t>& rates, bool causal) {
  const char* where = "longattn::dilated_blocks_layout";
  validate_block_sparse_shape(shape, where);
  BlockSparseConfig config;
  config.pattern = BlockSparsePattern::dilated;
  config.rates = rates;
  validate_block_sparse_config(config, where);
  return detail::layout_from_rule(exec, shape, causal, [&](std::int64_t, int qb, int kb) {
    const std::int64_t distance = std::abs(std::int64_t(kb) - qb);
    return distance == 0 || std::find(rates.begin(), rates.end(), distance) != rates.end();
  });
}

template <class ExecSpace>
BlockSparseLayout<ExecSpace> global_local_layout(const ExecSpace& exec, const BlockSparseShape& shape,
                                                 std::int64_t global_tokens, std::int64_t radius, bool causal) {
  const char* where = "longattn::global_local_layout";
  validate_block_sparse_shape(shape, where);
  require(global_tokens >= 0, where, "global_tokens", global_tokens, "at least 0 tokens");
  require(radius >= 0, where, "radius", radius, "a radius of at least 0 tokens");
  const std::int64_t global_blocks = (global_tokens + shape.block - 1) / shape.block;
  return detail::layout_from_rule(exec, shape, causal, [&](std::int64_t, int qb, int kb) {
    return qb < global_blocks || kb < global_blocks || detail::within_radius(shape, qb, kb, radius);
  });
}

template <class ExecSpace>
BlockSparseLayout<ExecSpace> random_layout(const ExecSpace& exec, const BlockSparseShape& shape, double density,
                                           std::uint64_t seed, bool causal) {
  const char* where = "longattn::random_layout";
  validate_block_sparse_shape(shape, where);
  require(density > 0 && density <= 1, where, "density", density, "a fraction in (0, 1]");
  // mt19937_64's sequence is fixed by the standard; the draws use it directly (no
  // distribution objects, whose results differ between standard libraries).
  std::mt19937_64 generator(seed);
  std::vector<std::int64_t> offsets{0};
  std::vector<int> entries, allowed;
  for (std::int64_t pattern = 0; pattern < shape.patterns(); ++pattern)
    for (int qb = 0; qb < shape.query_blocks(); ++qb) {
      allowed.clear();
      for (int kb = 0; kb < shape.key_blocks(); ++kb)
        if (!causal || detail::causally_visible(shape, qb, kb)) allowed.push_back(kb);
      const std::size_t kept =
          std::max<std::size_t>(1, std::min(allowed.size(), std::size_t(std::llround(density * allowed.size()))));
      // Partial Fisher-Yates: the first `kept` entries become a uniform sample.
      for (std::size_t i = 0; i < kept && i < allowed.size(); ++i)
        std::swap(allowed[i], allowed[i + generator() % (allowed.size() - i)]);
      const std::size_t first = entries.size();
      entries.insert(entries.end(), allowed.begin(), allowed.begin() + std::min(kept, allowed.size()));
      std::sort(entries.begin() + first, entries.end());
      offsets.push_back(std::int64_t(entries.size()));
    }
  return BlockSparseLayout<ExecSpace>(exec, shape, offsets, entries);
}

// mask[((b * shape.heads + h) * query_blocks + qb) * key_blocks + kb] != 0 keeps block (qb, kb)
// of pattern (b, h).
template <class ExecSpace>
BlockSparseLayout<ExecSpace> mask_layout(const ExecSpace& exec, const BlockSparseShape& shape,
                                         const std::vector<std::uint8_t>& mask) {
  const char* where = "longattn::mask_layout";
  validate_block_sparse_shape(shape, where);
  const std::int64_t size = shape.rows() * shape.key_blocks();
  require(std::int64_t(mask.size()) == size, where, "mask.size()", mask.size(),
          std::to_string(size) + " (batch * heads * query blocks * key blocks of the shape)");
  return detail::layout_from_rule(exec, shape, false, [&](std::int64_t pattern, int qb, int kb) {
    return mask[std::size_t((pattern * shape.query_blocks() + qb) * shape.key_blocks() + kb)] != 0;
  });
}

namespace detail {

// Means of each block's tokens, per (batch, head): out[(b * H + h) * blocks + n][d].
template <class ExecSpace, class X, class Out>
void pool_blocks(const ExecSpace& exec, const X& x, int block, const Out& out) {
  using T = typename Out::value_type;
  const int heads = x.extent(2), head_dim = x.extent(3), tokens = x.extent(1);
  const int blocks = (tokens + block - 1) / block;
  Kokkos::parallel_for(
      "longattn::top_k_layout::pool",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, std::int64_t(out.extent(0)) * head_dim),
      KOKKOS_LAMBDA(std::int64_t item) {
        const int d = static_cast<int>(item % head_dim);
        const std::int64_t row = item / head_dim;
        const int n = static_cast<int>(row % blocks), h = static_cast<int>(row / blocks % heads);
        const int b = static_cast<int>(row / blocks / heads);
        const int first = n * block, last = first + block < tokens ? first + block : tokens;
        T sum = 0;
        for (int i = first; i < last; ++i) sum += x(b, i, h, d);
        out(row, d) = sum / T(last - first);
      });
}

// Whether candidate a (score, block) ranks below candidate b: lower score, or equal score and a
// higher block (ties go to the lower block).
template <class T>
KOKKOS_INLINE_FUNCTION bool ranks_below(T score_a, int block_a, T score_b, int block_b) {
  return score_a < score_b || (score_a == score_b && block_a > block_b);
}

// Restores the min-heap (by ranks_below) of `size` entries below `node`.
template <class T>
KOKKOS_INLINE_FUNCTION void sift_down(T* scores, int* blocks, int size, int node) {
  for (;;) {
    int smallest = node;
    for (int child = 2 * node + 1; child <= 2 * node + 2 && child < size; ++child)
      if (ranks_below(scores[child], blocks[child], scores[smallest], blocks[smallest])) smallest = child;
    if (smallest == node) return;
    const T score = scores[node];
    scores[node] = scores[smallest];
    scores[smallest] = score;
    const int block = blocks[node];
    blocks[node] = blocks[smallest];
    blocks[smallest] = block;
    node = smallest;
  }
}

// Sorts `size` ints ascending in place (heapsort: no recursion, no extra memory, device-safe).
KOKKOS_INLINE_FUNCTION void sort_ascending(int* values, int size) {
  auto sift = [values](int node, int end) {
    for (;;) {
      int largest = node;
      for (int child = 2 * node + 1; child <= 2 * node + 2 && child < end; ++child)
        if (values[child] > values[largest]) largest = child;
      if (largest == node) return;
      const int value = values[node];
      values[node] = values[largest];
      values[largest] = value;
      node = largest;
    }
  };
  for (int node = size / 2 - 1; node >= 0; --node) sift(node, size);
  for (int end = size - 1; end > 0; --end) {
    const int value = values[0];
    values[0] = values[end];
    values[end] = value;
    sift(0, end);
  }
}

}  // namespace detail

// Content-adaptive top-k: row (b, h, qb) keeps min(top_k, allowed) key blocks, allowed = all key
// blocks, or those up to the diagonal when causal: the diagonal and the top_k - 1 others with the
// largest pooled score. q and k are [B, N, H, D] (Nq = Nk); the layout has a pattern per (b, h).
// Cost: B H (N / block)^2 D multiply-adds for the scores, plus the transpose. `on`: an instance,
// or an ExecutionContext whose pool the pooled blocks and scores come from.
template <class On, class Q, class K>
BlockSparseLayout<execution_space_of<On>> top_k_layout(const On& on, const Q& q, const K& k, std::int64_t top_k,
                                                       bool causal) {
  using ExecSpace = execution_space_of<On>;
  const auto& context = context_of(on);
  const ExecSpace& exec = context.exec();
  using T = std::remove_const_t<typename Q::value_type>;
  using Memory = typename ExecSpace::memory_space;
  const char* where = "longattn::top_k_layout";
  static_assert(Q::rank == 4 && K::rank == 4, "q and k are rank-4 views [batch, tokens, heads, head dim]");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename Q::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<ExecSpace, typename K::memory_space>::accessible,
                "longattn::top_k_layout: q or k is not accessible from the execution space");
  if constexpr (!std::is_same_v<T, float> && !std::is_same_v<T, double>)
    throw_invalid_argument(where, "q's value type", detail::scalar_name<T>(), "float or double");
  detail::check_view<ExecSpace, T>(where, "k", k);
  require(top_k > 0, where, "top_k", top_k, "at least 1 key block per query block");
  const std::int64_t B = q.extent(0), N = q.extent(1), H = q.extent(2), D = q.extent(3);
  longattn::check_extents(where, "k", k, {B, N, H, D}, "the extents of q: top-k needs Nq = Nk");
  require(D > 0, where, "q.extent(3)", D, "a head dim of at least 1");
  BlockSparseShape shape;
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) shape.block = attention_block_size<ExecSpace, T>();
  shape.queries = N;
  shape.keys = N;
  shape.batch = static_cast<int>(B);
  shape.heads = static_cast<int>(H);
  validate_block_sparse_shape(shape, where);

  // Row sizes depend on the shape only: offsets on the host.
  const int blocks = shape.query_blocks();
  std::vector<std::int64_t> offsets{0};
  for (std::int64_t row = 0; row < shape.rows(); ++row) {
    const int qb = static_cast<int>(row % blocks);
    const std::int64_t allowed = causal ? qb + 1 : blocks;
    offsets.push_back(offsets.back() + std::min(top_k, allowed));
  }
  using Layout = BlockSparseLayout<ExecSpace>;
  typename Layout::Offsets row_offsets(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "longattn::top_k_layout::row_offsets"),
                                       offsets.size());
  Kokkos::deep_copy(exec, row_offsets,
                    Kokkos::View<const std::int64_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(offsets.data(), offsets.size()));
  typename Layout::Indices entries(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "longattn::top_k_layout::key_blocks"),
                                   offsets.back());

  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    const std::int64_t rows = shape.rows();
    const memory::CategoryScope scope(memory::Category::workspaces);
    const auto pooled_q_memory = context.template allocate<Kokkos::View<T**, Memory>>(rows, D);
    const auto pooled_k_memory = context.template allocate<Kokkos::View<T**, Memory>>(rows, D);
    const auto scores_memory = context.template allocate<Kokkos::View<T*, Memory>>(offsets.back());
    const auto pooled_q = pooled_q_memory.view();
    const auto pooled_k = pooled_k_memory.view();
    const auto scores = scores_memory.view();
    detail::pool_blocks(exec, q, shape.block, pooled_q);
    detail::pool_blocks(exec, k, shape.block, pooled_k);
    // One thread per row: a min-heap of the best top_k - 1 off-diagonal candidates in the row's
    // own entries, then the diagonal, then sorted.
    Kokkos::parallel_for(
        "longattn::top_k_layout::select", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, rows),
        KOKKOS_LAMBDA(std::int64_t row) {
          const int qb = static_cast<int>(row % blocks);
          const std::int64_t first_key_row = row - qb;
          const std::int64_t begin = row_offsets(row);
          const int kept = static_cast<int>(row_offsets(row + 1) - begin);
          int* chosen = entries.data() + begin;
          T* chosen_scores = scores.data() + begin;
          const int others = kept - 1;
          int size = 0;
          const int candidates = causal ? qb : blocks;
          for (int kb = 0; kb < candidates && others > 0; ++kb) {
            if (kb == qb) continue;
            T score = 0;
            for (int d = 0; d < D; ++d) score += pooled_q(row, d) * pooled_k(first_key_row + kb, d);
            if (size < others) {  // fill, then heapify once full
              chosen_scores[size] = score;
              chosen[size++] = kb;
              if (size == others)
                for (int node = others / 2 - 1; node >= 0; --node) detail::sift_down(chosen_scores, chosen, others, node);
            } else if (detail::ranks_below(chosen_scores[0], chosen[0], score, kb)) {
              chosen_scores[0] = score;
              chosen[0] = kb;
              detail::sift_down(chosen_scores, chosen, others, 0);
            }
          }
          chosen[others] = qb;
          detail::sort_ascending(chosen, kept);
        });
  }
  return Layout(exec, shape, row_offsets, entries);
}

// The layout a fixed pattern names for a shape (every pattern but top_k, which needs q and k).
template <class ExecSpace>
BlockSparseLayout<ExecSpace> block_sparse_layout(const ExecSpace& exec, const BlockSparseConfig& config,
                                                 const BlockSparseShape& shape, bool causal) {
  const char* where = "longattn::block_sparse_layout";
  validate_block_sparse_config(config, where);
  switch (config.pattern) {
    case BlockSparsePattern::full: return full_layout(exec, shape, causal);
    case BlockSparsePattern::local_window: return local_window_layout(exec, shape, config.radius, causal);
    case BlockSparsePattern::dilated: return dilated_blocks_layout(exec, shape, config.rates, causal);
    case BlockSparsePattern::global_local:
      return global_local_layout(exec, shape, config.global_tokens, config.radius, causal);
    case BlockSparsePattern::random: return random_layout(exec, shape, config.density, config.seed, causal);
    case BlockSparsePattern::top_k: break;
  }
  throw_invalid_argument(where, "config.pattern", "top_k", "a fixed pattern (top_k chooses blocks from q and k)");
}

// The layout a config names, for attention of q against k (`on` as for top_k_layout).
template <class On, class Q, class K>
BlockSparseLayout<execution_space_of<On>> block_sparse_layout(const On& on, const BlockSparseConfig& config, const Q& q,
                                                              const K& k, bool causal) {
  using ExecSpace = execution_space_of<On>;
  validate_block_sparse_config(config, "longattn::block_sparse_layout");
  if (config.pattern == BlockSparsePattern::top_k) return top_k_layout(on, q, k, config.top_k, causal);
  using T = std::remove_const_t<typename Q::value_type>;
  BlockSparseShape shape;
  if constexpr (detail::attention_scalar<T>) shape.block = attention_block_size<ExecSpace, T>();
  shape.queries = q.extent(1);
  shape.keys = k.extent(1);
  return block_sparse_layout(instance_of(on), config, shape, causal);
}

// Layouts of fixed patterns depend on the shape and the pattern only: a model's layers and
// steps use the same few. BlockSparseLayoutCache builds each (config, shape, causal) once and
// hands out the same layout after (a layout is a handle: copies share its memory). Thread-safe;
// at most `capacity` layouts, the least recently used going first. top_k layouts depend on q and
// k and are never cached.
template <class ExecSpace>
class BlockSparseLayoutCache {
 public:
  explicit BlockSparseLayoutCache(std::size_t capacity = 32) : capacity_(capacity) {
    require(capacity > 0, "longattn::BlockSparseLayoutCache", "capacity", capacity, "at least 1 layout");
  }

  // The layout block_sparse_layout(exec, config, shape, causal) returns, built on the first call
  // (then fenced, so that every instance may use it) and shared after.
  BlockSparseLayout<ExecSpace> get(const ExecSpace& exec, const BlockSparseConfig& config,
                                   const BlockSparseShape& shape, bool causal) {
    const std::lock_guard<std::mutex> lock(mutex_);
    ++tick_;
    for (Entry& e : entries_)
      if (e.causal == causal && e.config == config && e.shape == shape) {
        e.used = tick_;
        return e.layout;
      }
    Entry entry{config, shape, causal, block_sparse_layout(exec, config, shape, causal), tick_};
    exec.fence();
    if (entries_.size() == capacity_)
      entries_.erase(std::min_element(entries_.begin(), entries_.end(),
                                      [](const Entry& a, const Entry& b) { return a.used < b.used; }));
    entries_.push_back(entry);
    ++builds_;
    return entry.layout;
  }

  std::size_t builds() const {  // layouts built so far
    const std::lock_guard<std::mutex> lock(mutex_);
    return builds_;
  }
  std::size_t size() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return entries_.size();
  }
  void clear() {
    const std::lock_guard<std::mutex> lock(mutex_);
    entries_.clear();
  }

 private:
  struct Entry {
    BlockSparseConfig config;
    BlockSparseShape shape;
    bool causal;
    BlockSparseLayout<ExecSpace> layout;
    std::uint64_t used;
  };
  std::size_t capacity_;
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
  std::uint64_t tick_ = 0;
  std::size_t builds_ = 0;
};

// The cache LocalAttention uses unless given another: one per execution space, made on first
// use and emptied at Kokkos::finalize (its layouts hold memory of the space).
template <class ExecSpace>
const std::shared_ptr<BlockSparseLayoutCache<ExecSpace>>& shared_block_sparse_layouts() {
  static const auto cache = [] {
    auto made = std::make_shared<BlockSparseLayoutCache<ExecSpace>>();
    Kokkos::push_finalize_hook([made] { made->clear(); });
    return made;
  }();
  return cache;
}

}  // namespace longattn
