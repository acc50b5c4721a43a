#pragma once
// ContextParallelAttention: the AttentionRunner (core/attention_runner.hpp) of one rank of a
// context-parallel group. A MultiheadAttention module given one sees this rank's shard of each
// sequence and computes attention over the whole sequence:
//
//   auto runner = std::make_shared<parallel::ContextParallelAttention<Exec, float>>(exec, group, tokens, spec, causal);
//   layer.set_attention_runner(runner);     // x holds the tokens of runner->segments()
//
// The runner is made for one attention (spec and causal setting: the module checks that they are
// its own when given the runner) and one global length; it keeps the spec resolved for it and,
// for ring attention, one plan (with the block-sparse layout) for every call.
//
//   dense, block_sparse   ring attention over a RingPlan made once here (zigzag sharding when
//                         causal, so every rank has the same work; contiguous otherwise)
//   dilated               distributed dilated attention (contiguous sharding: local segments stay
//                         local, the spanning ones all-gather their dilated keys)
//   auto                  resolved for the global sequence length first
//
// The ranks' tokens must split into whole attention blocks (attention_block_size of the space).
// Content-adaptive block-sparse patterns (top_k) choose blocks from the global Q and K, which no
// rank holds: refused. Any execution space, through the communicator's transport for its memory.
#include <Kokkos_Core.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "longattn/core/attention_runner.hpp"
#include "longattn/core/block_sparse_patterns.hpp"
#include "longattn/parallel/communicator.hpp"
#include "longattn/parallel/dilated_attention.hpp"
#include "longattn/parallel/ring_attention.hpp"
#include "longattn/parallel/sharding.hpp"

namespace longattn::parallel {

template <class ExecSpace, class T>
class ContextParallelAttention final : public AttentionRunner<ExecSpace, T> {
 public:
  using Base = AttentionRunner<ExecSpace, T>;
  using typename Base::Context;
  using typename Base::Gradients;
  using typename Base::Heads;
  using typename Base::Inputs;
  using typename Base::Outputs;

  // Collective over `group`: `tokens` is the global sequence length. ring.sharding is ignored
  // (the attention kind decides it, see above).
  ContextParallelAttention(const ExecSpace& exec, const Communicator& group, std::int64_t tokens,
                           const AttentionSpec& spec, bool causal, RingOptions ring = {})
      : group_(group), tokens_(tokens), spec_(spec), resolved_(resolve_attention_spec(spec, tokens)), causal_(causal) {
    const char* where = "longattn::parallel::ContextParallelAttention";
    const int block = attention_block_size<ExecSpace, T>();
    if (resolved_.kind == AttentionSpec::Kind::dilated) {
      sharding_ = Sharding::contiguous;
      group_.checked(where, [&] { segments_ = shard_segments(tokens, group.size(), group.rank(), sharding_, block); });
      return;
    }
    sharding_ = causal ? Sharding::zigzag : Sharding::contiguous;
    ring.sharding = sharding_;
    if (resolved_.kind == AttentionSpec::Kind::block_sparse) {
      group_.checked(where, [&] {
        require(resolved_.block_sparse.pattern != BlockSparsePattern::top_k, where, "spec", to_string(resolved_),
                "a fixed block-sparse pattern (top_k needs the whole sequence's Q and K)");
      });
      BlockSparseShape shape;
      shape.block = block;
      shape.queries = shape.keys = tokens;
      plan_.emplace(exec, group, block_sparse_layout(exec, resolved_.block_sparse, shape, causal), causal, ring);
    } else {
      plan_.emplace(group, tokens, block, causal, ring);
    }
    segments_ = plan_->segments();
  }

  const AttentionSpec& spec() const override { return spec_; }  // as made
  const AttentionSpec& resolved_spec() const { return resolved_; }  // for the global length
  bool causal() const override { return causal_; }
  Sharding sharding() const { return sharding_; }
  std::int64_t tokens() const { return tokens_; }
  const std::vector<Segment>& segments() const { return segments_; }  // this rank's tokens, in local order
  // Seconds this rank waited for ring transfers since the last reset (distributed dilated
  // attention's all-gathers are blocking collectives inside its passes: not separated).
  double wait_seconds() const { return plan_ ? plan_->timings().wait_seconds : 0.0; }
  void reset_timings() const {
    if (plan_) plan_->reset_timings();
  }

  void forward(const Context& ctx, const Inputs& in, const Outputs& out) override {
    if (plan_) ring_attention_forward(ctx, *plan_, in, out, options());
    else dilated_attention_forward(ctx, group_, in, out, resolved_.dilated, options());
  }
  void backward(const Context& ctx, const Inputs& in, const Outputs& out, const Heads& d_o,
                const Gradients& grad) override {
    if (plan_) ring_attention_backward(ctx, *plan_, in, out, d_o, grad, options());
    else dilated_attention_backward(ctx, group_, in, out, d_o, grad, resolved_.dilated, options());
  }

 private:
  AttentionOptions options() const {
    AttentionOptions opts;
    opts.causal = causal_;
    return opts;
  }

  Communicator group_;
  std::int64_t tokens_;
  AttentionSpec spec_, resolved_;
  bool causal_;
  Sharding sharding_ = Sharding::contiguous;
  std::optional<RingPlan<ExecSpace>> plan_;
  std::vector<Segment> segments_;
};

}  // namespace longattn::parallel
