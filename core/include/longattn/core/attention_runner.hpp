// AttentionRunner: how a MultiheadAttention module runs its attention step on the [B, N, H, D]
// views of Q, K, V. The default, LocalAttention, runs the spec on this process's tokens
// (run_attention_forward / run_attention_backward). A context-parallel group plugs in ring
// attention instead (parallel/context_parallel_attention.hpp), where N is this rank's shard and
// the result is attention over the whole sequence. Everything else in the module (projections,
// sub-LayerNorm, parameters) is per token and does not change.
#pragma once

#include <Kokkos_Core.hpp>

#include "longattn/core/attention.hpp"
#include "longattn/core/attention_spec.hpp"

namespace longattn {

template <class ExecSpace, class T>
class AttentionRunner {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using Heads = Kokkos::View<T****, Kokkos::LayoutRight, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using Lse = Kokkos::View<T***, memory_space>;  // [B, H, N]

  virtual ~AttentionRunner() = default;
  virtual void forward(const ExecSpace& exec, const AttentionSpec& spec, const Heads& q, const Heads& k,
                       const Heads& v, const Heads& o, const Lse& lse, const AttentionOptions& opts) = 0;
  virtual void backward(const ExecSpace& exec, const AttentionSpec& spec, const Heads& q, const Heads& k,
                        const Heads& v, const Heads& o, const Heads& d_o, const Lse& lse, const Heads& dq,
                        const Heads& dk, const Heads& dv, const AttentionOptions& opts) = 0;
};

// The spec over the tokens this process holds.
template <class ExecSpace, class T>
class LocalAttention final : public AttentionRunner<ExecSpace, T> {
 public:
  using Base = AttentionRunner<ExecSpace, T>;
  using typename Base::Heads;
  using typename Base::Lse;
  void forward(const ExecSpace& exec, const AttentionSpec& spec, const Heads& q, const Heads& k, const Heads& v,
               const Heads& o, const Lse& lse, const AttentionOptions& opts) override {
    run_attention_forward(exec, spec, q, k, v, o, lse, opts);
  }
  void backward(const ExecSpace& exec, const AttentionSpec& spec, const Heads& q, const Heads& k, const Heads& v,
                const Heads& o, const Heads& d_o, const Lse& lse, const Heads& dq, const Heads& dk, const Heads& dv,
                const AttentionOptions& opts) override {
    run_attention_backward(exec, spec, q, k, v, o, d_o, lse, dq, dk, dv, opts);
  }
};

}  // namespace longattn
