#pragma once
// GradientBuckets: the data-parallel all-reduce of a model's gradients, fused into buckets and
// overlapped with backward.
//
//   parallel::GradientBuckets buckets(grid.data);            // 25 MiB buckets, average
//   for (auto& p : parameters) buckets.add(p.gradient);      // in the order backward finishes them
//   // each step:
//   ...backward of the last layer...  buckets.ready(i);      // gradient i is final
//   ...                                                      // a full bucket starts reducing
//   buckets.wait();                                          // all reduced, written back
//
// Small gradients would each pay an all-reduce's latency; a bucket holds consecutive ones in one
// buffer of about `bucket_bytes` and reduces it with one (nonblocking) call, started as soon as
// its last gradient is marked ready, while backward goes on with the layers before. Gradients
// registered with add(data, count) live where the caller keeps them and are copied into their
// bucket and back; gradients made with add<T>(count) live in the bucket itself (the model
// uses the returned View as its gradient), so nothing is copied (PyTorch DDP's
// gradient_as_bucket_view). A gradient larger than a bucket is reduced in place, alone. A bucket
// holds one element type and one kind. Host memory (MPI); on GPUs the stream-ordered NCCL
// all-reduce overlaps by itself.
#include <cstddef>
#include <vector>

#include "longattn/memory/pooled_view.hpp"
#include "longattn/parallel/communicator.hpp"

namespace longattn::parallel {

struct GradientBucketOptions {
  std::size_t bucket_bytes = std::size_t(25) << 20;  // as PyTorch DDP
  ReduceOp op = ReduceOp::average;
  bool hierarchical = true;  // reduce-scatter / all-reduce / all-gather over the nodes
};

class GradientBuckets {
 public:
  explicit GradientBuckets(Communicator communicator, const GradientBucketOptions& options = {});
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;
  ~GradientBuckets();  // waits for what is in flight

  // Registers a gradient of `count` elements that the caller keeps (host memory); returns its
  // index. Gradients are registered before the first step, in the order backward makes them final.
  template <class T>
  int add(T* data, std::size_t count) {
    return add_gradient(data, count, data_type_of<T>(), false);
  }
  // A gradient of `count` elements stored in its bucket: use the View as the gradient. Its index
  // is the next one (gradients() - 1 after the call).
  template <class T>
  Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> add(std::size_t count) {
    const int index = add_gradient(nullptr, count, data_type_of<T>(), true);
    return Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
        static_cast<T*>(gradients_[std::size_t(index)].data), count);
  }
  template <class View>
  int add(const View& gradient) {
    static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename View::memory_space>::accessible,
                  "GradientBuckets: gradients in host memory");
    require(gradient.span_is_contiguous(), "longattn::parallel::GradientBuckets::add", "gradient", gradient.label(),
            "a contiguous View");
    return add(gradient.data(), gradient.size());
  }

  // Gradient `index` is final for this step. When it completes its bucket, the bucket's
  // all-reduce starts; in-flight reductions are progressed either way.
  void ready(int index);
  // Completes the step: buckets not yet started are reduced now (blocking: nothing is left to
  // overlap), every reduction is waited for and written back into the gradients. The next step
  // starts with all gradients not ready.
  void wait();

  std::size_t gradients() const { return gradients_.size(); }
  std::size_t buckets() const { return buckets_.size(); }
  std::size_t buckets_started() const;  // this step, so far
  const GradientBucketOptions& options() const { return options_; }

 private:
  struct Gradient {
    void* data;
    std::size_t count;
    DataType type;
    int bucket = -1;
    std::size_t offset = 0;  // elements, in the bucket's buffer
  };
  struct Bucket {
    std::vector<int> members;
    std::size_t count = 0;  // elements
    DataType type = DataType::float32;
    bool stores_gradients = false;  // members live in `buffer` (made with add<T>(count))
    bool alone = false;             // one gradient of bucket_bytes or more
    int pending = 0;                // members not yet ready this step
    memory::PooledView<Kokkos::View<unsigned char*, Kokkos::HostSpace>> buffer;
    Request request;
    bool started = false;
  };

  int add_gradient(void* data, std::size_t count, DataType type, bool stored);
  void freeze();  // before the first step: copy buffers for the buckets of kept gradients
  void start(Bucket& bucket, bool blocking);
  void progress();

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
