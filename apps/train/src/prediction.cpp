#include "longattn/train/prediction.hpp"

#include <Kokkos_Core.hpp>

#include "longattn/core/attention.hpp"
#include "longattn/core/attention_spec.hpp"
#include "longattn/core/bf16_dot_products.hpp"
#include "longattn/core/gemm.hpp"

namespace longattn::train {

plan::Estimate planner_estimate(const TrainConfig& c, int ranks, double peak_flops, double element_rate) {
  plan::Plan p;
  p.model.layers = c.model.layers;
  p.model.hidden = c.model.embed;
  p.model.heads = c.model.heads;
  p.model.ffn = c.model.hidden();
  p.model.vocabulary = ModelConfig::vocab;
  p.model.sequence = c.model.context;
  p.model.attention = to_string(c.model.attention);
  p.model.causal = true;
  p.model.positions =
      c.model.positions == PositionEncoding::learned ? plan::Positions::learned : plan::Positions::rotary;
  p.model.tied_embeddings = false;  // the head has its own weights and bias
  p.model.sub_layer_norm = true;    // MultiheadAttention's MAGNETO sub-LayerNorm
  p.training.global_batch_tokens = c.batch * c.model.context;
  p.training.tokens = double(c.steps) * double(p.training.global_batch_tokens);
  p.training.precision = c.precision == Precision::fp32   ? plan::Precision::fp32
                         : c.precision == Precision::bf16 ? plan::Precision::bf16
                                                          : plan::Precision::fp16;
  p.training.optimizer = plan::Optimizer::adam;
  p.training.fp32_gradients = true;  // accumulate_t: float for every model type
  p.training.fp32_gradient_reduce = c.grad_reduce == GradientReduce::fp32;
  // The copies longattn's kernels make on this build's execution space.
  using Exec = Kokkos::DefaultExecutionSpace;
  const bool host = Kokkos::SpaceAccessibility<Exec, Kokkos::HostSpace>::accessible;
  p.copies.head_major_attention = host;  // AttentionOptions::head_major_copies' default, on the CPU
  if (c.precision != Precision::fp32) {
    // cuBLAS reads the operands in place, in a workspace of its own (gemm_workspace_bytes).
    p.copies.gemm_workspace_bytes = double(gemm_workspace_bytes<Exec>());
    p.copies.gemm = gemm_workspace_bytes<Exec>() > 0 ? plan::KernelCopies::Gemm::none
                    : host && c.precision == Precision::bf16 && bf16_dot_products_in_use()
                        ? plan::KernelCopies::Gemm::bf16_panels
                        : plan::KernelCopies::Gemm::float_operands;
  }
  p.training.recompute = c.model.recompute == Recompute::none        ? plan::Recompute::none
                         : c.model.recompute == Recompute::selective ? plan::Recompute::selective
                                                                     : plan::Recompute::full;
  // The devices only set what fits and how fast; the memory per rank does not depend on them.
  p.cluster.gpus = ranks;
  p.cluster.gpu.gpus_per_node = ranks;
  if (peak_flops > 0) {  // each rank a "GPU" of its cores' FMA peak, in every precision (no tensor cores)
    p.cluster.gpu.name = "the ranks' cores";
    p.cluster.gpu.peak_flops_tf32 = p.cluster.gpu.peak_flops_16bit = peak_flops / ranks;
  }
  p.efficiency = c.efficiency;
  for (std::size_t precision = 0; precision < p.efficiency.element_costs.size(); ++precision) {
    const double calibrated_rate = p.efficiency.element_rates[precision];
    if (p.efficiency.element_costs[precision] && calibrated_rate > 0 && element_rate > 0)
      for (double& cost : *p.efficiency.element_costs[precision]) cost *= calibrated_rate / element_rate;
  }
  p.layout.tensor = c.tp;
  // The trainer's tp splits the blocks' matrices, and with --sequence-parallel the tokens
  // between them; the embeddings and head are whole (model.hpp).
  p.layout.sequence_parallel = c.sequence_parallel;
  p.layout.vocab_parallel = false;
  p.layout.context = c.cp;
  p.layout.data = ranks / (c.tp * c.cp);
  p.layout.zero_stage = c.zero;
  const std::int64_t per_rank = c.batch / p.layout.data;
  p.layout.micro_batch = c.micro_batch > 0 ? c.micro_batch : per_rank;
  // The CPU's attention backward form: the dense call's (dilated passes and ring pieces make
  // calls of other sizes; on one thread a rank, as the planner's check runs, it depends on the
  // head dim alone). On a GPU the tensor cores' one-pass form sums dQ too.
  const auto one_pass = [&](auto element) {
    return attention_backward_one_pass<decltype(element)>(Exec(), int(p.layout.micro_batch), c.model.heads / c.tp,
                                                          c.model.embed / c.model.heads);
  };
  p.copies.attention_dq_sum = !host || (c.precision == Precision::fp32   ? one_pass(float())
                                        : c.precision == Precision::bf16 ? one_pass(bfloat16())
                                                                         : one_pass(float16()));
  return plan::estimate(p);
}

double time_term(const plan::Estimate& estimate, const std::string& name) {
  for (const plan::Term& term : estimate.time)
    if (term.name == name) return term.value;
  return 0;
}

}  // namespace longattn::train
