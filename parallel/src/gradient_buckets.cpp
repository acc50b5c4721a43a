// GradientBuckets: gradients packed into buckets in the order backward finishes them; a bucket's
// nonblocking all-reduce starts when its last gradient is ready.
#include "longattn/parallel/gradient_buckets.hpp"

#include <algorithm>
#include <cstring>

namespace longattn::parallel {

GradientBuckets::GradientBuckets(Communicator communicator, const GradientBucketOptions& options)
    : comm_(std::move(communicator)), options_(options) {
  comm_.guarded("longattn::parallel::GradientBuckets", [&] {
    require(options.bucket_bytes >= 1, "longattn::parallel::GradientBuckets", "options.bucket_bytes",
            options.bucket_bytes, "at least one byte");
  });
}

GradientBuckets::~GradientBuckets() = default;  // each bucket's Request waits for its reduction

// Buckets are laid out as gradients come: consecutive gradients of one type and one kind fill a
// bucket up to bucket_bytes; a gradient that alone reaches bucket_bytes is a bucket of its own.
// Buckets that store their gradients get their buffer when they open (their gradients' Views
// must exist from the start), at bucket_bytes, or the gradient's size when alone.
int GradientBuckets::add_gradient(void* data, std::size_t count, DataType type, bool stored) {
  const char* where = "longattn::parallel::GradientBuckets::add";
  comm_.guarded(where, [&] {
    require(!frozen_, where, "this", "a set of buckets already in use",
            "every gradient added before the first ready() or wait()");
    require(count >= 1, where, "count", count, "at least one element");
    require(stored || data != nullptr, where, "data", "nullptr", "a gradient of " + std::to_string(count) + " elements");
    require(options_.op != ReduceOp::average || type == DataType::float32 || type == DataType::float64, where, "type",
            to_string(type), "float or double to average");
  });
  const std::size_t bytes = count * size_of(type);
  const bool alone = bytes >= options_.bucket_bytes;
  if (alone || !open_ || buckets_.back().type != type || buckets_.back().stores_gradients != stored ||
      open_bytes_ + bytes > options_.bucket_bytes) {
    buckets_.emplace_back();
    Bucket& opened = buckets_.back();
    opened.type = type;
    opened.stores_gradients = stored;
    opened.alone = alone;
    if (stored)
      opened.buffer = memory::PooledView<Kokkos::View<unsigned char*, Kokkos::HostSpace>>(
          memory::default_pool<Kokkos::HostSpace>(), alone ? bytes : options_.bucket_bytes);
    open_ = !alone;
    open_bytes_ = 0;
  }
  Bucket& bucket = buckets_.back();
  Gradient g{data, count, type, int(buckets_.size()) - 1, bucket.count};
  if (stored) g.data = bucket.buffer.data() + g.offset * size_of(type);
  bucket.count += count;
  bucket.members.push_back(int(gradients_.size()));
  open_bytes_ += bytes;
  gradients_.push_back(g);
  return int(gradients_.size()) - 1;
}

// The first step begins: the buckets of kept gradients get the buffer they are packed into
// (a kept gradient alone is reduced where it is).
void GradientBuckets::freeze() {
  for (Bucket& bucket : buckets_) {
    if (!bucket.stores_gradients && !bucket.alone)
      bucket.buffer = memory::PooledView<Kokkos::View<unsigned char*, Kokkos::HostSpace>>(
          memory::default_pool<Kokkos::HostSpace>(), bucket.count * size_of(bucket.type));
    bucket.pending = int(bucket.members.size());
  }
  ready_.assign(gradients_.size(), false);
  open_ = false;
  frozen_ = true;
}

// Packs a bucket of kept gradients (nothing to do for the others) and starts its reduction:
// nonblocking when it can overlap the rest of backward; blocking when wait() gets to it, as
// there is nothing left to overlap and MPI's blocking collectives are the faster ones.
void GradientBuckets::start(Bucket& bucket, bool blocking) {
  const std::size_t element = size_of(bucket.type);
  void* data = bucket.alone && !bucket.stores_gradients ? gradients_[std::size_t(bucket.members.front())].data
                                                        : static_cast<void*>(bucket.buffer.data());
  if (!bucket.stores_gradients && !bucket.alone)
    for (const int m : bucket.members) {
      const Gradient& g = gradients_[std::size_t(m)];
      std::memcpy(static_cast<unsigned char*>(data) + g.offset * element, g.data, g.count * element);
    }
  if (blocking && options_.hierarchical)
    comm_.hierarchical_all_reduce(data, data, bucket.count, bucket.type, options_.op);
  else if (blocking)
    comm_.all_reduce(data, data, bucket.count, bucket.type, options_.op);
  else
    bucket.request = comm_.iall_reduce(data, data, bucket.count, bucket.type, options_.op, options_.hierarchical);
  bucket.started = true;
}

// MPI moves nonblocking collectives forward only inside MPI calls: each ready() tests them.
void GradientBuckets::progress() {
  for (Bucket& bucket : buckets_)
    if (bucket.started) bucket.request.test();
}

void GradientBuckets::ready(int index) {
  const char* where = "longattn::parallel::GradientBuckets::ready";
  if (!frozen_) freeze();
  comm_.guarded(where, [&] {
    if (index < 0 || std::size_t(index) >= gradients_.size())
      throw_invalid_argument(where, "index", index, "a gradient from 0 to " + std::to_string(int(gradients_.size()) - 1));
    require(!ready_[std::size_t(index)], where, "index", index, "a gradient not yet ready in this step");
  });
  ready_[std::size_t(index)] = true;
  Bucket& bucket = buckets_[std::size_t(gradients_[std::size_t(index)].bucket)];
  if (--bucket.pending == 0) start(bucket, false);
  progress();
}

void GradientBuckets::wait() {
  if (!frozen_) freeze();
  for (Bucket& bucket : buckets_)
    if (!bucket.started) start(bucket, true);  // gradients never marked ready count as final now
  for (Bucket& bucket : buckets_) {
    bucket.request.wait();
    if (!bucket.stores_gradients && !bucket.alone) {
      const std::size_t element = size_of(bucket.type);
      const unsigned char* reduced = bucket.buffer.data();
      for (const int m : bucket.members) {
        const Gradient& g = gradients_[std::size_t(m)];
        std::memcpy(g.data, reduced + g.offset * element, g.count * element);
      }
    }
    bucket.started = false;
    bucket.pending = int(bucket.members.size());
  }
  std::fill(ready_.begin(), ready_.end(), false);
}

std::size_t GradientBuckets::buckets_started() const {
  return std::size_t(std::count_if(buckets_.begin(), buckets_.end(), [](const Bucket& b) { return b.started; }));
}

}  // namespace longattn::parallel
