// TensorParallelGroup: core's FeatureGroup (feature_group.hpp) over the ranks of a Communicator,
// the group a tensor-parallel layer's features are split over (Megatron-LM):
//
//   auto tp = world.split(/*color=*/data_rank, /*key=*/tensor_rank);   // ranks within a node
//   auto features = std::make_shared<parallel::TensorParallelGroup<Exec>>(tp);
//   MultiheadAttention<Exec, float> layer(ctx, E, H, options, features);  // H / tp heads here
//
// sum() is an all-reduce of the elements in exec's memory, gather() an all-gather and
// reduce_scatter() a reduce-scatter (sequence parallelism), through the communicator's transport
// for exec's memory (Communicator::transport: MPI on host memory; NCCL on exec's stream or MPI
// on pinned host copies on a GPU's). It counts the wall time its calls take
// (seconds()): the transfers on the host; on a GPU only the launches.
#pragma once

#include <Kokkos_Core.hpp>

#include <chrono>
#include <utility>

#include "longattn/core/feature_group.hpp"
#include "longattn/parallel/communicator.hpp"

namespace longattn::parallel {

template <class ExecSpace>
class TensorParallelGroup final : public FeatureGroup<ExecSpace> {
 public:
  explicit TensorParallelGroup(Communicator ranks) : ranks_(std::move(ranks)) {}

  int size() const override { return ranks_.size(); }
  int rank() const override { return ranks_.rank(); }
  const Communicator& communicator() const { return ranks_; }

  void sum(const ExecSpace& exec, float* data, std::size_t count) const override { reduce(exec, data, count); }
  void sum(const ExecSpace& exec, double* data, std::size_t count) const override { reduce(exec, data, count); }
  void sum(const ExecSpace& exec, bfloat16* data, std::size_t count) const override { reduce(exec, data, count); }
  void sum(const ExecSpace& exec, float16* data, std::size_t count) const override { reduce(exec, data, count); }
  void gather(const ExecSpace& exec, const float* part, float* whole, std::size_t count) const override {
    all_gather(exec, part, whole, count);
  }
  void gather(const ExecSpace& exec, const double* part, double* whole, std::size_t count) const override {
    all_gather(exec, part, whole, count);
  }
  void gather(const ExecSpace& exec, const bfloat16* part, bfloat16* whole, std::size_t count) const override {
    all_gather(exec, part, whole, count);
  }
  void gather(const ExecSpace& exec, const float16* part, float16* whole, std::size_t count) const override {
    all_gather(exec, part, whole, count);
  }
  void reduce_scatter(const ExecSpace& exec, const float* whole, float* part, std::size_t count) const override {
    scatter(exec, whole, part, count);
  }
  void reduce_scatter(const ExecSpace& exec, const double* whole, double* part, std::size_t count) const override {
    scatter(exec, whole, part, count);
  }
  void reduce_scatter(const ExecSpace& exec, const bfloat16* whole, bfloat16* part, std::size_t count) const override {
    scatter(exec, whole, part, count);
  }
  void reduce_scatter(const ExecSpace& exec, const float16* whole, float16* part, std::size_t count) const override {
    scatter(exec, whole, part, count);
  }

  double seconds() const { return seconds_; }
  void reset_seconds() { seconds_ = 0; }

 private:
  template <class V>
  void reduce(const ExecSpace& exec, V* data, std::size_t count) const {
    using Values = Kokkos::View<V*, typename ExecSpace::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    timed([&] { ranks_.all_reduce(exec, Values(data, count), ReduceOp::sum); });
  }
  template <class V>
  void all_gather(const ExecSpace& exec, const V* part, V* whole, std::size_t count) const {
    timed([&] { ranks_.all_gather(exec, part, whole, count, data_type_of<V>()); });
  }
  template <class V>
  void scatter(const ExecSpace& exec, const V* whole, V* part, std::size_t count) const {
    timed([&] { ranks_.reduce_scatter(exec, whole, part, count, data_type_of<V>(), ReduceOp::sum); });
  }
  template <class F>
  void timed(F&& collective) const {
    const auto start = std::chrono::steady_clock::now();
    collective();
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  Communicator ranks_;
  mutable double seconds_ = 0;
};

}  // namespace longattn::parallel
