// AttentionRunner: how a MultiheadAttention module runs its attention step on the [B, N, H, D]
// views of Q, K, V. A runner owns the attention it runs (a typed AttentionSpec and the causal
// setting); the module checks once, when given a runner, that it runs the module's attention.
// The default, LocalAttention, runs the spec on this process's tokens. A context-parallel group
// plugs in ring attention instead (parallel/context_parallel_attention.hpp), where N is this
// rank's shard and the result is attention over the whole sequence. Everything else in the
// module (projections, sub-LayerNorm, parameters) is per token and does not change.
//
// The tensors travel in named bundles (attention_tensors.hpp):
//
//   runner.forward(ctx, {q, k, v}, {o, lse});
//   runner.backward(ctx, {q, k, v}, {o, lse}, d_o, {dq, dk, dv});
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <memory>
#include <utility>

#include "longattn/core/attention.hpp"
#include "longattn/core/attention_spec.hpp"
#include "longattn/core/attention_tensors.hpp"
#include "longattn/core/block_sparse_patterns.hpp"
#include "longattn/core/dilated_attention.hpp"
#include "longattn/core/execution_context.hpp"

namespace longattn {

template <class ExecSpace, class T>
class AttentionRunner {
 public:
  using Context = ExecutionContext<ExecSpace>;
  using memory_space = typename ExecSpace::memory_space;
  using Heads = Kokkos::View<T****, Kokkos::LayoutRight, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using Lse = Kokkos::View<accumulate_t<T>***, memory_space>;  // [B, H, N], float for 16-bit T
  using Inputs = AttentionInputs<Heads>;
  using Outputs = AttentionOutputs<Heads, Lse>;
  using Gradients = AttentionGradients<Heads>;

  virtual ~AttentionRunner() = default;
  virtual const AttentionSpec& spec() const = 0;  // as made (auto: resolved per sequence)
  virtual bool causal() const = 0;
  virtual void forward(const Context& ctx, const Inputs& in, const Outputs& out) = 0;
  // Writes the gradients of sum(d_o * o) into grad.
  virtual void backward(const Context& ctx, const Inputs& in, const Outputs& out, const Heads& d_o,
                        const Gradients& grad) = 0;
};

// The spec over the tokens this process holds. `auto` is resolved for each sequence length once
// (and kept while the length stays); fixed block-sparse layouts come from a layout cache shared
// by default with every other LocalAttention of the execution space, so a model's layers and
// steps build each layout once.
template <class ExecSpace, class T>
class LocalAttention final : public AttentionRunner<ExecSpace, T> {
 public:
  using Base = AttentionRunner<ExecSpace, T>;
  using typename Base::Context;
  using typename Base::Gradients;
  using typename Base::Heads;
  using typename Base::Inputs;
  using typename Base::Outputs;
  using LayoutCache = BlockSparseLayoutCache<ExecSpace>;

  explicit LocalAttention(const AttentionSpec& spec = {}, bool causal = false,
                          std::shared_ptr<LayoutCache> layouts = shared_block_sparse_layouts<ExecSpace>())
      : spec_(spec), causal_(causal), layouts_(std::move(layouts)) {
    require(layouts_ != nullptr, "longattn::LocalAttention", "layouts", "nullptr", "a BlockSparseLayoutCache");
  }

  const AttentionSpec& spec() const override { return spec_; }
  bool causal() const override { return causal_; }

  void forward(const Context& ctx, const Inputs& in, const Outputs& out) override {
    const AttentionOptions opts = options();
    const AttentionSpec& concrete = resolved(in.q.extent(1));
    if (concrete.kind == AttentionSpec::Kind::dilated)
      dilated_attention_forward(ctx, in.q, in.k, in.v, out.o, out.lse, concrete.dilated, opts);
    else if (concrete.kind == AttentionSpec::Kind::block_sparse)
      attention_forward(ctx, in.q, in.k, in.v, out.o, out.lse, opts, layout(ctx, concrete, in));
    else
      attention_forward(ctx, in.q, in.k, in.v, out.o, out.lse, opts);
  }

  void backward(const Context& ctx, const Inputs& in, const Outputs& out, const Heads& d_o,
                const Gradients& grad) override {
    const AttentionOptions opts = options();
    const AttentionSpec& concrete = resolved(in.q.extent(1));
    if (concrete.kind == AttentionSpec::Kind::dilated)
      dilated_attention_backward(ctx, in.q, in.k, in.v, out.o, d_o, out.lse, grad.dq, grad.dk, grad.dv,
                                 concrete.dilated, opts);
    else if (concrete.kind == AttentionSpec::Kind::block_sparse)
      attention_backward(ctx, in.q, in.k, in.v, out.o, d_o, out.lse, grad.dq, grad.dk, grad.dv, opts,
                         layout(ctx, concrete, in));
    else
      attention_backward(ctx, in.q, in.k, in.v, out.o, d_o, out.lse, grad.dq, grad.dk, grad.dv, opts);
  }

 private:
  AttentionOptions options() const {
    AttentionOptions opts;
    opts.causal = causal_;
    return opts;
  }

  const AttentionSpec& resolved(std::int64_t tokens) {
    if (tokens != resolved_tokens_) {
      resolved_ = resolve_attention_spec(spec_, tokens);
      resolved_tokens_ = tokens;
    }
    return resolved_;
  }

  BlockSparseLayout<ExecSpace> layout(const Context& ctx, const AttentionSpec& concrete, const Inputs& in) const {
    if (concrete.block_sparse.pattern == BlockSparsePattern::top_k)  // chosen from q and k: every call
      return block_sparse_layout(ctx, concrete.block_sparse, in.q, in.k, causal_);
    BlockSparseShape shape;
    shape.block = attention_block_size<ExecSpace, T>();
    shape.queries = in.q.extent(1);
    shape.keys = in.k.extent(1);
    return layouts_->get(ctx.exec(), concrete.block_sparse, shape, causal_);
  }

  AttentionSpec spec_;
  bool causal_;
  std::shared_ptr<LayoutCache> layouts_;
  AttentionSpec resolved_;
  std::int64_t resolved_tokens_ = -1;
};

}  // namespace longattn
