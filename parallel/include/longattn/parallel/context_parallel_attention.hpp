#pragma once
// ContextParallelAttention: the AttentionRunner (core/attention_runner.hpp) of one rank of a
// context-parallel group. A MultiheadAttention module given one sees this rank's shard of each
// sequence and computes attention over the whole sequence:
//
//   auto runner = std::make_shared<parallel::ContextParallelAttention<Exec, float>>(exec, group, tokens, spec, causal);
//   layer.set_attention_runner(runner);     // x holds the tokens of runner->segments()
//
//   dense, block_sparse   ring attention over a RingPlan made once here (zigzag sharding when
//                         causal, so every rank has the same work; contiguous otherwise)
//   dilated               distributed dilated attention (contiguous sharding: local segments stay
//                         local, the spanning ones all-gather their dilated keys)
//   auto                  resolved for the global sequence length first
//
// The ranks' tokens must split into whole attention blocks (64 tokens for float on the host).
// Content-adaptive block-sparse patterns (top_k) choose blocks from the global Q and K, which no
// rank holds: refused. Host memory (MPI).
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
  using typename Base::Heads;
  using typename Base::Lse;

  // Collective over `group`: `tokens` is the global sequence length. ring.sharding is ignored
  // (the attention kind decides it, see above).
  ContextParallelAttention(const ExecSpace& exec, const Communicator& group, std::int64_t tokens,
                           const AttentionSpec& spec, bool causal, RingOptions ring = {})
      : group_(group), tokens_(tokens), spec_(resolve_attention_spec(spec, tokens)) {
    const char* where = "longattn::parallel::ContextParallelAttention";
    const int block = attention_block_size<ExecSpace, T>();
    if (spec_.kind == AttentionSpec::Kind::dilated) {
      sharding_ = Sharding::contiguous;
      group_.checked(where, [&] { segments_ = shard_segments(tokens, group.size(), group.rank(), sharding_, block); });
      return;
    }
    sharding_ = causal ? Sharding::zigzag : Sharding::contiguous;
    ring.sharding = sharding_;
    if (spec_.kind == AttentionSpec::Kind::block_sparse) {
      group_.checked(where, [&] {
        require(spec_.block_sparse.pattern != BlockSparsePattern::top_k, where, "spec", to_string(spec_),
                "a fixed block-sparse pattern (top_k needs the whole sequence's Q and K)");
      });
      BlockSparseShape shape;
      shape.block = block;
      shape.queries = shape.keys = tokens;
      plan_.emplace(exec, group, block_sparse_layout(exec, spec_.block_sparse, shape, causal), causal, ring);
    } else {
      plan_.emplace(group, tokens, block, causal, ring);
    }
    segments_ = plan_->segments();
  }

  const AttentionSpec& spec() const { return spec_; }  // resolved
  Sharding sharding() const { return sharding_; }
  std::int64_t tokens() const { return tokens_; }
  const std::vector<Segment>& segments() const { return segments_; }  // this rank's tokens, in local order
  // Seconds this rank waited for ring transfers since the last reset (distributed dilated
  // attention's all-gathers are blocking collectives inside its passes: not separated).
  double wait_seconds() const { return plan_ ? plan_->timings().wait_seconds : 0.0; }
  void reset_timings() const {
    if (plan_) plan_->reset_timings();
  }

  // The module's spec must be the one this runner was made for.
  void forward(const ExecSpace& exec, const AttentionSpec& spec, const Heads& q, const Heads& k, const Heads& v,
               const Heads& o, const Lse& lse, const AttentionOptions& opts) override {
    check_spec(spec, opts);
    if (plan_) ring_attention_forward(exec, *plan_, q, k, v, o, lse, opts);
    else dilated_attention_forward(exec, group_, q, k, v, o, lse, spec_.dilated, opts);
  }
  void backward(const ExecSpace& exec, const AttentionSpec& spec, const Heads& q, const Heads& k, const Heads& v,
                const Heads& o, const Heads& d_o, const Lse& lse, const Heads& dq, const Heads& dk, const Heads& dv,
                const AttentionOptions& opts) override {
    check_spec(spec, opts);
    if (plan_) ring_attention_backward(exec, *plan_, q, k, v, o, d_o, lse, dq, dk, dv, opts);
    else dilated_attention_backward(exec, group_, q, k, v, o, d_o, lse, dq, dk, dv, spec_.dilated, opts);
  }

 private:
  void check_spec(const AttentionSpec& spec, const AttentionOptions& opts) const {
    const char* where = "longattn::parallel::ContextParallelAttention";
    const std::string made_for = to_string(spec_);
    require(to_string(resolve_attention_spec(spec, tokens_)) == made_for, where, "the module's attention spec",
            to_string(spec), "the spec this runner was made for, " + made_for);
    require(!plan_ || opts.causal == plan_->causal(), where, "opts.causal", opts.causal ? "true" : "false",
            "the causal setting of the runner's ring plan");
  }

  Communicator group_;
  std::int64_t tokens_;
  AttentionSpec spec_;
  Sharding sharding_ = Sharding::contiguous;
  std::optional<RingPlan<ExecSpace>> plan_;
  std::vector<Segment> segments_;
};

}  // namespace longattn::parallel
