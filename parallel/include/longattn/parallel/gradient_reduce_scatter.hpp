#pragma once
// GradientReduceScatter: ZeRO stage 2's gradient reduction (Rajbhandari et al. 2020): each of the
// R ranks that hold the same parameters keeps only its piece of every gradient, summed over them.
//
//   parallel::GradientReduceScatter<Exec> reduce(context, ranks);     // 25 MiB buckets
//   for (auto& g : gradients) reduce.add(g.count, piece_of_g);        // in the order backward finishes them
//   // each backward pass (each micro-batch):
//   ...gradient i final at data...  reduce.ready(i, data);            // data may be reused once it returns
//   reduce.wait();                                                    // every piece += its sum over the ranks
//
// Pieces as ZeRO cuts them (shard_piece): a gradient of C elements in R pieces of S = ceil(C / R),
// rank r's [r S, min(C, (r + 1) S)) - the last ones shorter or empty. A bucket holds consecutive
// gradients up to about bucket_bytes, laid out rank by rank: block r holds every member's piece
// r, each padded to its S (zeros), so one reduce-scatter of the bucket gives each rank its
// pieces of all its members. ready() copies the gradient into its bucket there and then (the
// caller's gradient memory is free again: a model can hold its gradients only while backward
// makes them), and a bucket whose members are all ready starts its nonblocking reduce-scatter,
// overlapping the rest of backward.
//
// Memory: a bucket's buffers come from the context's pool when its first gradient is ready and go
// back when its reduction has been added into the pieces; at most buckets_in_flight reductions
// are in flight (starting one more first completes the oldest), so a rank holds about
// buckets_in_flight + 1 buckets (and 1/R of each for what it receives), not all gradients.
//
// Gradients are float. They travel in float, or in bfloat16/float16 (options.reduce_type: half
// the bytes; packed rounded, sums rounded at each addition, widened when added into the piece).
// Host memory reduces through MPI (MPI_Ireduce_scatter_block), a GPU's memory through the
// communicator's transport for it (NCCL on the instance's stream, or MPI on pinned host copies);
// copies run on the context's instance.
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <deque>
#include <string>
#include <vector>

#include "longattn/core/execution_context.hpp"
#include "longattn/core/half.hpp"
#include "longattn/memory/pooled_view.hpp"
#include "longattn/parallel/communicator.hpp"

namespace longattn::parallel {

// Rank `rank`'s piece of `count` elements cut over `ranks` (ZeRO's layout).
struct ShardPiece {
  std::size_t size;   // S = ceil(count / ranks): every rank's piece before the last ones
  std::size_t begin;  // min(count, rank S)
  std::size_t count;  // min(count, begin + S) - begin
};
inline ShardPiece shard_piece(std::size_t count, int ranks, int rank) {
  require(ranks >= 1, "longattn::parallel::shard_piece", "ranks", ranks, "at least 1");
  require(rank >= 0 && rank < ranks, "longattn::parallel::shard_piece", "rank", rank,
          "a rank from 0 to " + std::to_string(ranks - 1));
  const std::size_t S = (count + std::size_t(ranks) - 1) / std::size_t(ranks);
  const std::size_t begin = std::min(count, std::size_t(rank) * S);
  return {S, begin, std::min(count, begin + S) - begin};
}

namespace detail {

// blocks[r block + offset + j] = V(data[r S + j]) for rank r's piece of a gradient of `count`
// elements (zero past its end), every rank r. One index j a thread, the ranks in its loop: no
// division per element (a flat index cut as i / S and i % S ran at 8 ns an element on a CPU).
template <class ExecSpace, class V>
void pack_blocks(const ExecSpace& exec, const float* data, std::size_t count, std::size_t S, std::size_t ranks,
                 V* blocks, std::size_t block, std::size_t offset) {
  Kokkos::parallel_for(
      "longattn::parallel::GradientReduceScatter::pack",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, std::int64_t(S)),
      KOKKOS_LAMBDA(std::int64_t j) {
        for (std::size_t r = 0; r < ranks; ++r) {
          const std::size_t k = r * S + std::size_t(j);
          blocks[r * block + offset + std::size_t(j)] = k < count ? V(data[k]) : V(0.0f);
        }
      });
}

// piece[j] += float(sums[j]), j < count.
template <class ExecSpace, class V>
void add_widened(const ExecSpace& exec, const V* sums, float* piece, std::size_t count) {
  Kokkos::parallel_for(
      "longattn::parallel::GradientReduceScatter::add",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, std::int64_t(count)),
      KOKKOS_LAMBDA(std::int64_t j) { piece[j] += float(sums[j]); });
}

}  // namespace detail

struct GradientReduceScatterOptions {
  std::size_t bucket_bytes = std::size_t(25) << 20;  // as GradientBuckets (counted in float)
  ReduceOp op = ReduceOp::sum;
  DataType reduce_type = DataType::float32;  // or bfloat16, float16
  int buckets_in_flight = 2;
};

template <class ExecSpace = Kokkos::DefaultHostExecutionSpace>
class GradientReduceScatter {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using Context = ExecutionContext<ExecSpace>;

  GradientReduceScatter(const Context& context, Communicator ranks, const GradientReduceScatterOptions& options = {})
      : context_(context), comm_(std::move(ranks)), options_(options) {
    comm_.guarded(where_, [&] {
      require(options.bucket_bytes >= 1, where_, "options.bucket_bytes", options.bucket_bytes, "at least one byte");
      require(options.reduce_type == DataType::float32 || options.reduce_type == DataType::bfloat16 ||
                  options.reduce_type == DataType::float16,
              where_, "options.reduce_type", to_string(options.reduce_type), "float32, bfloat16 or float16");
      require(options.buckets_in_flight >= 1, where_, "options.buckets_in_flight", options.buckets_in_flight,
              "at least 1");
    });
  }
  GradientReduceScatter(const GradientReduceScatter&) = delete;
  GradientReduceScatter& operator=(const GradientReduceScatter&) = delete;
  ~GradientReduceScatter() = default;  // each bucket's Request waits for its reduction

  // Registers a gradient of `count` elements, before the first ready(); this rank's piece of its
  // sum over the ranks (shard_piece(count, ranks, rank).count elements, the caller's, in the space's
  // memory) is added into `piece` by each reduction. Returns its index.
  int add(std::size_t count, float* piece) {
    const ShardPiece mine = shard_piece(count, comm_.size(), comm_.rank());
    comm_.guarded(add_where_, [&] {
      require(ready_.empty(), add_where_, "this", "a reduction already in use",
              "every gradient added before the first ready()");
      require(count >= 1, add_where_, "count", count, "at least one element");
      require(piece != nullptr || mine.count == 0, add_where_, "piece", "nullptr",
              "this rank's piece of " + std::to_string(mine.count) + " elements");
    });
    const std::size_t ranks = std::size_t(comm_.size()), element = size_of(options_.reduce_type);
    if (buckets_.empty() || (buckets_.back().block + mine.size) * ranks * element > options_.bucket_bytes)
      buckets_.emplace_back();
    Bucket& bucket = buckets_.back();
    gradients_.push_back({count, mine, piece, int(buckets_.size()) - 1, bucket.block});
    bucket.block += mine.size;
    bucket.members.push_back(int(gradients_.size()) - 1);
    return int(gradients_.size()) - 1;
  }

  // Gradient `index` is final at `data` (its count elements, in the space's memory): copied into
  // its bucket (queued on the instance, so later work there may overwrite `data`). A bucket
  // whose members are all ready starts its reduce-scatter; finished ones are added into their
  // pieces and give their memory back.
  void ready(int index, const float* data) {
    const char* where = "longattn::parallel::GradientReduceScatter::ready";
    if (ready_.empty()) start_pass();
    comm_.guarded(where, [&] {
      if (index < 0 || std::size_t(index) >= gradients_.size())
        throw_invalid_argument(where, "index", index,
                               "a gradient from 0 to " + std::to_string(int(gradients_.size()) - 1));
      require(!ready_[std::size_t(index)], where, "index", index, "a gradient not yet ready in this pass");
      require(data != nullptr, where, "data", "nullptr", "the gradient's elements");
    });
    ready_[std::size_t(index)] = true;
    const Gradient& g = gradients_[std::size_t(index)];
    Bucket& bucket = buckets_[std::size_t(g.bucket)];
    if (bucket.send.data() == nullptr) {
      bucket.send = make_buffer(bucket.block * std::size_t(comm_.size()));
      bucket.pending = int(bucket.members.size());
    }
    pack(g, data, bucket);
    if (--bucket.pending == 0) start(bucket);
    while (!in_flight_.empty() && buckets_[std::size_t(in_flight_.front())].request.test()) complete_oldest();
  }

  // Completes the pass: every gradient must have been marked ready; every reduction is waited
  // for and added into its pieces; the instance is fenced. The next pass starts with none ready.
  void wait() {
    const char* where = "longattn::parallel::GradientReduceScatter::wait";
    comm_.guarded(where, [&] {
      for (std::size_t i = 0; i < ready_.size(); ++i)
        require(ready_[i], where, "gradient " + std::to_string(i), "not ready", "ready() for every gradient");
      require(!ready_.empty() || gradients_.empty(), where, "this", "a pass without ready()",
              "ready() for every gradient before wait()");
    });
    while (!in_flight_.empty()) complete_oldest();
    context_.exec().fence();
    ready_.clear();
  }

  std::size_t gradients() const { return gradients_.size(); }
  std::size_t buckets() const { return buckets_.size(); }
  const GradientReduceScatterOptions& options() const { return options_; }
  // Bytes of the pool the buckets hold at most at once (the largest buckets_in_flight + 1 of
  // them, and the blocks they receive), as the pool counts them.
  std::size_t buffer_bytes() const {
    std::vector<std::size_t> sizes;
    for (const Bucket& b : buckets_)
      sizes.push_back(memory::block_bytes(buffer_size(b.block * std::size_t(comm_.size()))) +
                      memory::block_bytes(buffer_size(b.block)));
    std::sort(sizes.rbegin(), sizes.rend());
    std::size_t total = 0;
    for (std::size_t i = 0; i < sizes.size() && i < std::size_t(options_.buckets_in_flight) + 1; ++i) total += sizes[i];
    return total;
  }

 private:
  static constexpr const char* where_ = "longattn::parallel::GradientReduceScatter";
  static constexpr const char* add_where_ = "longattn::parallel::GradientReduceScatter::add";
  using Buffer = memory::PooledView<Kokkos::View<unsigned char*, memory_space>>;

  struct Gradient {
    std::size_t count;
    ShardPiece mine;
    float* piece;
    int bucket;
    std::size_t offset;  // elements, in each of its bucket's blocks
  };
  struct Bucket {
    std::vector<int> members;
    std::size_t block = 0;  // elements per rank: the members' S
    int pending = 0;        // members not yet ready in this pass
    Buffer send, received;  // R blocks, one block (while in use)
    Request request;
  };

  std::size_t buffer_size(std::size_t elements) const {
    return std::max<std::size_t>(1, elements) * size_of(options_.reduce_type);
  }
  Buffer make_buffer(std::size_t elements) const {
    const memory::CategoryScope scope(memory::Category::communication_buffers);
    return Buffer(context_.pool(), buffer_size(elements));
  }

  void start_pass() {
    comm_.guarded(where_, [&] {
      require(!gradients_.empty(), where_, "this", "no gradients", "add() before ready()");
    });
    ready_.assign(gradients_.size(), false);
  }

  // Gradient g into its bucket's blocks (detail::pack_blocks), in the reduce type.
  void pack(const Gradient& g, const float* data, const Bucket& bucket) const {
    const std::size_t ranks = std::size_t(comm_.size());
    unsigned char* out = bucket.send.data();
    if (options_.reduce_type == DataType::bfloat16)
      detail::pack_blocks(context_.exec(), data, g.count, g.mine.size, ranks, reinterpret_cast<bfloat16*>(out),
                          bucket.block, g.offset);
    else if (options_.reduce_type == DataType::float16)
      detail::pack_blocks(context_.exec(), data, g.count, g.mine.size, ranks, reinterpret_cast<float16*>(out),
                          bucket.block, g.offset);
    else
      detail::pack_blocks(context_.exec(), data, g.count, g.mine.size, ranks, reinterpret_cast<float*>(out),
                          bucket.block, g.offset);
  }

  void start(Bucket& bucket) {
    while (int(in_flight_.size()) >= options_.buckets_in_flight) complete_oldest();
    bucket.received = make_buffer(bucket.block);
    bucket.request = comm_.ireduce_scatter(context_.exec(), bucket.send.data(), bucket.received.data(), bucket.block,
                                           options_.reduce_type, options_.op);
    in_flight_.push_back(int(&bucket - buckets_.data()));
  }

  // The oldest reduction: waited for, added into its members' pieces, its buffers back to the pool.
  void complete_oldest() {
    Bucket& bucket = buckets_[std::size_t(in_flight_.front())];
    in_flight_.pop_front();
    bucket.request.wait();
    for (const int m : bucket.members) {
      const Gradient& g = gradients_[std::size_t(m)];
      if (g.mine.count == 0) continue;
      unsigned char* in = bucket.received.data();
      if (options_.reduce_type == DataType::bfloat16)
        detail::add_widened(context_.exec(), reinterpret_cast<const bfloat16*>(in) + g.offset, g.piece, g.mine.count);
      else if (options_.reduce_type == DataType::float16)
        detail::add_widened(context_.exec(), reinterpret_cast<const float16*>(in) + g.offset, g.piece, g.mine.count);
      else
        detail::add_widened(context_.exec(), reinterpret_cast<const float*>(in) + g.offset, g.piece, g.mine.count);
    }
    bucket.send = {};  // the pool takes them back in the instance's order: after the adds
    bucket.received = {};
  }

  Context context_;
  Communicator comm_;
  GradientReduceScatterOptions options_;
  std::vector<Gradient> gradients_;
  std::vector<Bucket> buckets_;  // laid out as gradients are added
  std::deque<int> in_flight_;    // started buckets, oldest first
  std::vector<bool> ready_;      // this pass; empty between passes
};

}  // namespace longattn::parallel
