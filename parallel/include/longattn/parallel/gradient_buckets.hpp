#pragma once
// GradientBuckets: the data-parallel all-reduce of a model's gradients, fused into buckets and
// overlapped with backward.
//
//   parallel::GradientBuckets<Exec> buckets(context, grid.data);  // 25 MiB buckets, average
//   for (auto& p : parameters) buckets.add(p.gradient);          // in the order backward finishes them
//   // each step:
//   ...backward of the last layer...  buckets.ready(i);          // gradient i is final
//   ...                                                          // a full bucket starts reducing
//   buckets.wait();                                              // all reduced, written back
//
// Small gradients would each pay an all-reduce's latency; a bucket holds consecutive ones in one
// buffer of about `bucket_bytes` and reduces it with one nonblocking call, started as soon as
// its last gradient is marked ready, while backward goes on with the layers before. How a bucket
// holds its gradients (one element type and one way per bucket):
// - packed: gradients registered with add(data, count) live where the caller keeps them and are
//   copied into their bucket's buffer and back;
// - stored: gradients made with add<T>(count) live in the bucket's buffer itself (the model uses
//   the returned View as its gradient), so nothing is copied (PyTorch DDP's
//   gradient_as_bucket_view);
// - in place: gradients registered with add_back_to_back(data, counts) lie one after the other in
//   the caller's memory; a bucket of consecutive ones is that stretch of memory, reduced where it
//   lies, with no buffer. A gradient registered with add(data, count) that alone fills a bucket
//   is reduced in place too.
// Buckets are laid out from the registrations' sizes and order alone (never from where memory
// happens to lie), so every rank lays them out alike.
//
// Precision: float gradients can travel in 16 bits (options.reduce_type bfloat16 or float16: half
// the bytes): each bucket is rounded into a 16-bit copy, that copy is all-reduced (sums rounded
// at each addition) and widened back into the float gradients. Packed ones are rounded straight
// into the copy (no float buffer), so such a bucket holds half the memory of a float one; in
// place, the copy is all the memory a bucket holds.
//
// Memory: gradients and buckets are in the memory of the context's space (ExecSpace, the host's
// by default); copies run on its instance. Host memory reduces through MPI (nonblocking, tested
// on each ready() so that MPI moves it on); a GPU's memory through the communicator's transport
// for it (NCCL on the instance's stream, or MPI on pinned host copies).
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "longattn/core/convert.hpp"
#include "longattn/core/execution_context.hpp"
#include "longattn/memory/pooled_view.hpp"
#include "longattn/parallel/communicator.hpp"

namespace longattn::parallel {

struct GradientBucketOptions {
  std::size_t bucket_bytes = std::size_t(25) << 20;  // as PyTorch DDP
  ReduceOp op = ReduceOp::average;
  bool hierarchical = true;  // reduce-scatter / all-reduce / all-gather over the nodes
  // What float32 gradients are reduced in: float32, bfloat16 or float16. Other types: their own.
  DataType reduce_type = DataType::float32;
};

template <class ExecSpace = Kokkos::DefaultHostExecutionSpace>
class GradientBuckets {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using Context = ExecutionContext<ExecSpace>;

  GradientBuckets(const Context& context, Communicator communicator, const GradientBucketOptions& options = {})
      : context_(context), comm_(std::move(communicator)), options_(options) {
    comm_.guarded(where_, [&] {
      require(options.bucket_bytes >= 1, where_, "options.bucket_bytes", options.bucket_bytes, "at least one byte");
      require(options.reduce_type == DataType::float32 || options.reduce_type == DataType::bfloat16 ||
                  options.reduce_type == DataType::float16,
              where_, "options.reduce_type", to_string(options.reduce_type), "float32, bfloat16 or float16");
    });
  }
  // On the space's default instance and pool.
  explicit GradientBuckets(Communicator communicator, const GradientBucketOptions& options = {})
      : GradientBuckets(Context(), std::move(communicator), options) {}
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;
  ~GradientBuckets() = default;  // each bucket's Request waits for its reduction

  // Registers a gradient of `count` elements that the caller keeps (in the space's memory);
  // returns its index. Gradients are registered before the first step, in the order backward
  // makes them final.
  template <class T>
  int add(T* data, std::size_t count) {
    return add_gradient(data, count, data_type_of<T>(), Holding::packed, false);
  }
  // A gradient of `count` elements stored in its bucket: use the View as the gradient. Its index
  // is the next one (gradients() - 1 after the call).
  template <class T>
  Kokkos::View<T*, memory_space, Kokkos::MemoryUnmanaged> add(std::size_t count) {
    const int index = add_gradient(nullptr, count, data_type_of<T>(), Holding::stored, false);
    return Kokkos::View<T*, memory_space, Kokkos::MemoryUnmanaged>(
        static_cast<T*>(gradients_[std::size_t(index)].data), count);
  }
  // Registers consecutive gradients that lie back to back from `data`: counts[0] elements, then
  // counts[1], ... (in the space's memory, kept by the caller), in the order backward makes them
  // final; returns the first one's index. Their buckets are reduced where they lie; a bucket
  // never joins them with gradients of another registration.
  template <class T>
  int add_back_to_back(T* data, const std::vector<std::size_t>& counts) {
    comm_.guarded(add_where_, [&] {  // all checked first: a refused registration adds nothing
      require(!counts.empty(), add_where_, "counts", "empty", "the sizes of one or more gradients");
      for (std::size_t i = 0; i < counts.size(); ++i)
        require(counts[i] >= 1, add_where_, "counts[" + std::to_string(i) + "]", counts[i], "at least one element");
    });
    const int first = int(gradients_.size());
    for (std::size_t i = 0; i < counts.size(); ++i) {
      add_gradient(data, counts[i], data_type_of<T>(), Holding::in_place, i > 0);
      data += counts[i];
    }
    return first;
  }
  template <class View>
  int add(const View& gradient) {
    static_assert(std::is_same_v<typename View::memory_space, memory_space>,
                  "GradientBuckets: gradients in the memory space of its execution space");
    comm_.guarded(add_where_, [&] {
      require(gradient.span_is_contiguous(), add_where_, "gradient", gradient.label(), "a contiguous View");
    });
    return add(gradient.data(), gradient.size());
  }

  // Gradient `index` is final for this step (the work that made it may still be queued on the
  // instance). When it completes its bucket, the bucket's all-reduce starts; in-flight
  // reductions are progressed either way.
  void ready(int index) {
    const char* where = "longattn::parallel::GradientBuckets::ready";
    if (!frozen_) freeze();
    comm_.guarded(where, [&] {
      if (index < 0 || std::size_t(index) >= gradients_.size())
        throw_invalid_argument(where, "index", index,
                               "a gradient from 0 to " + std::to_string(int(gradients_.size()) - 1));
      require(!ready_[std::size_t(index)], where, "index", index, "a gradient not yet ready in this step");
    });
    ready_[std::size_t(index)] = true;
    Bucket& bucket = buckets_[std::size_t(gradients_[std::size_t(index)].bucket)];
    if (--bucket.pending == 0) start(bucket, false);
    for (Bucket& b : buckets_)
      if (b.started) b.request.test();
  }

  // Completes the step: buckets not yet started are reduced now (gradients never marked ready
  // count as final), every reduction is waited for and written back into the gradients, and
  // the instance is fenced. The next step starts with all gradients not ready.
  void wait() {
    if (!frozen_) freeze();
    for (Bucket& bucket : buckets_)
      if (!bucket.started) start(bucket, true);
    for (Bucket& bucket : buckets_) {
      bucket.request.wait();
      if (bucket.narrowed()) narrow_or_widen(bucket, false);
      else if (bucket.holding == Holding::packed)
        for (const int m : bucket.members) {
          const Gradient& g = gradients_[std::size_t(m)];
          Kokkos::deep_copy(context_.exec(), bytes(g.data, g.count * size_of(g.type)),
                            bytes(bucket.buffer.data() + g.offset * size_of(g.type), g.count * size_of(g.type)));
        }
      bucket.started = false;
      bucket.pending = int(bucket.members.size());
    }
    context_.exec().fence();
    std::fill(ready_.begin(), ready_.end(), false);
  }

  std::size_t gradients() const { return gradients_.size(); }
  std::size_t buckets() const { return buckets_.size(); }
  std::size_t buckets_started() const {  // this step, so far
    return std::size_t(std::count_if(buckets_.begin(), buckets_.end(), [](const Bucket& b) { return b.started; }));
  }
  const GradientBucketOptions& options() const { return options_; }
  // Bytes of the buckets' buffers held from the context's pool (those packing kept gradients
  // exist from the first step on).
  std::size_t buffer_bytes() const {
    std::size_t total = 0;
    for (const Bucket& b : buckets_) total += b.buffer.bytes() + b.narrow.bytes();
    return total;
  }

 private:
  static constexpr const char* where_ = "longattn::parallel::GradientBuckets";
  static constexpr const char* add_where_ = "longattn::parallel::GradientBuckets::add";
  using Bytes = Kokkos::View<unsigned char*, memory_space, Kokkos::MemoryUnmanaged>;
  static Bytes bytes(void* data, std::size_t count) { return Bytes(static_cast<unsigned char*>(data), count); }

  struct Gradient {
    void* data;
    std::size_t count;
    DataType type;
    int bucket = -1;
    std::size_t offset = 0;  // elements, in the bucket's buffer
  };
  enum class Holding { packed, stored, in_place };  // see the top of this file
  struct Bucket {
    std::vector<int> members;
    std::size_t count = 0;  // elements
    DataType type = DataType::float32;
    Holding holding = Holding::packed;
    int pending = 0;  // members not yet ready this step
    // Packed and stored buckets' values.
    memory::PooledView<Kokkos::View<unsigned char*, memory_space>> buffer;
    // The 16-bit copy it is reduced in (options.reduce_type), for float32 buckets.
    memory::PooledView<Kokkos::View<unsigned char*, memory_space>> narrow;
    DataType reduced_as = DataType::float32;
    Request request;
    bool started = false;
    bool narrowed() const { return reduced_as != type; }
  };

  // Buckets are laid out as gradients come: consecutive gradients of one type, held one way, fill
  // a bucket up to bucket_bytes (in place: only those of one add_back_to_back, where `follows`
  // says the gradient comes right after the one before); a gradient that alone reaches
  // bucket_bytes is a bucket of its own. Buckets that store their gradients get their buffer when
  // they open (their gradients' Views must exist from the start), at bucket_bytes, or the
  // gradient's size when alone.
  int add_gradient(void* data, std::size_t count, DataType type, Holding holding, bool follows) {
    const char* where = add_where_;
    comm_.guarded(where, [&] {
      require(!frozen_, where, "this", "a set of buckets already in use",
              "every gradient added before the first ready() or wait()");
      require(count >= 1, where, "count", count, "at least one element");
      require(holding == Holding::stored || data != nullptr, where, "data", "nullptr",
              "a gradient of " + std::to_string(count) + " elements");
      require(options_.op != ReduceOp::average || type == DataType::float32 || type == DataType::float64, where,
              "type", to_string(type), "float or double to average");
    });
    const std::size_t size = count * size_of(type);
    const bool alone = size >= options_.bucket_bytes;
    if (alone && holding == Holding::packed) holding = Holding::in_place;
    const bool joins = open_ && !alone && buckets_.back().type == type && buckets_.back().holding == holding &&
                       (holding != Holding::in_place || follows) && open_bytes_ + size <= options_.bucket_bytes;
    if (!joins) {
      buckets_.emplace_back();
      Bucket& opened = buckets_.back();
      opened.type = type;
      opened.holding = holding;
      if (holding == Holding::stored) opened.buffer = make_buffer(alone ? size : options_.bucket_bytes);
      open_ = !alone;
      open_bytes_ = 0;
    }
    Bucket& bucket = buckets_.back();
    Gradient g{data, count, type, int(buckets_.size()) - 1, bucket.count};
    if (holding == Holding::stored) g.data = bucket.buffer.data() + g.offset * size_of(type);
    bucket.count += count;
    bucket.members.push_back(int(gradients_.size()));
    open_bytes_ += size;
    gradients_.push_back(g);
    return int(gradients_.size()) - 1;
  }

  memory::PooledView<Kokkos::View<unsigned char*, memory_space>> make_buffer(std::size_t size) const {
    const memory::CategoryScope scope(memory::Category::communication_buffers);
    return memory::PooledView<Kokkos::View<unsigned char*, memory_space>>(context_.pool(), size);
  }

  // The first step begins: packed buckets get the buffer they are packed into, buckets reduced
  // in 16 bits their copy.
  void freeze() {
    for (Bucket& bucket : buckets_) {
      bucket.reduced_as = bucket.type == DataType::float32 ? options_.reduce_type : bucket.type;
      if (bucket.narrowed()) bucket.narrow = make_buffer(bucket.count * size_of(bucket.reduced_as));
      else if (bucket.holding == Holding::packed) bucket.buffer = make_buffer(bucket.count * size_of(bucket.type));
      bucket.pending = int(bucket.members.size());
    }
    ready_.assign(gradients_.size(), false);
    open_ = false;
    frozen_ = true;
  }

  // Packs a packed bucket (or rounds a bucket into its 16-bit copy; nothing to do for the
  // others) and starts its reduction:
  // nonblocking when it can overlap the rest of backward; on host memory blocking when wait()
  // gets to it, as there is nothing left to overlap and MPI's blocking collectives are faster.
  void start(Bucket& bucket, bool blocking) {
    const ExecSpace& exec = context_.exec();
    const std::size_t element = size_of(bucket.type);
    if (bucket.narrowed()) {
      narrow_or_widen(bucket, true);
    } else if (bucket.holding == Holding::packed) {
      for (const int m : bucket.members) {
        const Gradient& g = gradients_[std::size_t(m)];
        Kokkos::deep_copy(exec, bytes(bucket.buffer.data() + g.offset * element, g.count * element),
                          bytes(g.data, g.count * element));
      }
    }
    void* data = bucket.narrowed() ? static_cast<void*>(bucket.narrow.data()) : values(bucket);
    constexpr bool host_memory = Kokkos::SpaceAccessibility<Kokkos::HostSpace, memory_space>::accessible;
    if (host_memory && blocking) {
      exec.fence();
      if (options_.hierarchical) comm_.hierarchical_all_reduce(data, data, bucket.count, bucket.reduced_as, options_.op);
      else comm_.all_reduce(data, data, bucket.count, bucket.reduced_as, options_.op);
    } else {
      bucket.request =
          comm_.iall_reduce(exec, data, data, bucket.count, bucket.reduced_as, options_.op, options_.hierarchical);
    }
    bucket.started = true;
  }

  // Where a bucket's values are: its buffer, or in place from where its first gradient begins.
  void* values(const Bucket& bucket) const {
    return bucket.holding == Holding::in_place ? gradients_[std::size_t(bucket.members.front())].data
                                               : static_cast<void*>(bucket.buffer.data());
  }

  // A float32 bucket's values into its 16-bit copy (before the reduction) or back (after): packed
  // gradients straight from and into their own memory (such a bucket has no float buffer), the
  // others from and into the bucket's values.
  void narrow_or_widen(const Bucket& bucket, bool narrow) const {
    auto run = [&](auto* half) {
      auto one = [&](void* wide, std::size_t offset, std::size_t count) {
        if (narrow) longattn::convert(context_.exec(), static_cast<const float*>(wide), half + offset, count);
        else longattn::convert(context_.exec(), half + offset, static_cast<float*>(wide), count);
      };
      if (bucket.holding != Holding::packed) return one(values(bucket), 0, bucket.count);
      for (const int m : bucket.members) {
        const Gradient& g = gradients_[std::size_t(m)];
        one(g.data, g.offset, g.count);
      }
    };
    if (bucket.reduced_as == DataType::bfloat16) run(reinterpret_cast<bfloat16*>(bucket.narrow.data()));
    else run(reinterpret_cast<float16*>(bucket.narrow.data()));
  }

  Context context_;
  Communicator comm_;
  GradientBucketOptions options_;
  std::vector<Gradient> gradients_;
  std::vector<Bucket> buckets_;  // laid out as gradients are added
  std::size_t open_bytes_ = 0;   // bytes in the last bucket, while it takes more
  bool open_ = false;
  bool frozen_ = false;          // the first step has begun: no more gradients
  std::vector<bool> ready_;
};

}  // namespace longattn::parallel
