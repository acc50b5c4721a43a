#pragma once
// The planner's formulas, each from its source, in the papers' symbols:
//   L layers, h hidden size, a heads, f FFN size, V vocabulary, s sequence length, b micro-batch
//   (sequences), t tensor-parallel size, Psi parameters.
//
// [Narayanan21] D. Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
//   Clusters Using Megatron-LM", SC 2021: parameter count, FLOPs per iteration (Eq. 3), training
//   time (Eq. 4), pipeline bubble (p - 1) / m.
// [Korthikanti22] V. Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
//   Models", MLSys 2023 (arXiv 2205.05198): activation memory per layer (Section 4, Table 2),
//   model FLOPs 72 B s L h^2 (1 + s/(6h) + V/(12 L h)).
// [Rajbhandari20] S. Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
//   Parameter Models", SC 2020: model-state memory (2 + 2 + K) Psi and its ZeRO stages.
#include <cstdint>

#include "longattn/plan/inputs.hpp"

namespace longattn::plan {

// ---- Parameters [Narayanan21]: 12 L h^2 (1 + 13/(12 h) + (V + s)/(12 L h)) for f = 4h -------
// One layer: Q, K, V and output projections with biases (4h^2 + 4h), the MLP (2hf + f + h) and
// two LayerNorms (4h).
inline double layer_parameters(double h, double f) { return 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h; }
// Token embedding (tied with the LM head) and, if learned, position embeddings.
inline double embedding_parameters(const ModelConfig& m) {
  return double(m.vocabulary) * m.hidden + (m.positions == Positions::learned ? double(m.sequence) * m.hidden : 0.0);
}
// The whole model: layers, embeddings and the final LayerNorm (2h, which Megatron's formula omits).
inline double model_parameters(const ModelConfig& m) {
  return double(m.layers) * layer_parameters(m.hidden, m.ffn_size()) + embedding_parameters(m) + 2.0 * m.hidden;
}

// ---- FLOPs ----------------------------------------------------------------------------------
// Forward matmul FLOPs per token of one layer: projections 2 x 4h^2, MLP 2 x 2hf (24 h^2 for
// f = 4h). Attention core: 4 D FLOPs per (query, key) score (Q K^T and P V), so a layer's is
// 4 (h/a) x scores, with 4 h s^2 per sequence for dense non-causal attention. LM head 2 h V.
inline double layer_matmul_flops_per_token(double h, double f) { return 8 * h * h + 4 * h * f; }
inline double attention_flops_per_score(double head_dim) { return 4 * head_dim; }
inline double logits_flops_per_token(double h, double vocabulary) { return 2 * h * vocabulary; }

// [Narayanan21] Eq. 3: FLOPs per iteration of B sequences with full recomputation (forward,
// backward = 2 x forward, recomputed forward; the LM head is not recomputed), f = 4h, dense
// attention counted over all s^2 scores.
inline double narayanan_flops_per_iteration(double B, double s, double L, double h, double V) {
  return 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h));
}
// [Korthikanti22]: model FLOPs (no recomputation counted) per iteration.
inline double korthikanti_model_flops_per_iteration(double B, double s, double L, double h, double V) {
  return 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h));
}
// [Narayanan21] Eq. 4: end-to-end training time ~ 8 T Psi / (n X) for T tokens, n GPUs at X
// FLOP/s each (full recomputation).
inline double narayanan_training_seconds(double tokens, double parameters, double gpus, double flops_per_gpu) {
  return 8 * tokens * parameters / (gpus * flops_per_gpu);
}

// ---- Activation memory per layer and micro-batch [Korthikanti22, Section 4] -----------------
// Bytes with 16-bit activations:
//   no parallelism:                      s b h (34 + 5 a s / h)
//   tensor parallel t:                   s b h (10 + 24/t + 5 a s / (h t))
//   tensor + sequence parallel:          s b h (34/t + 5 a s / (h t))
//   selective recomputation (+ seq par): s b h 34 / t        (the 5 a s^2 b attention core recomputed)
//   full recomputation:                  2 s b h (/ t with sequence parallelism): the layer's input
// 5 a s^2 b is the unfused attention core (softmax output 2, dropout mask 1, dropout output 2 bytes
// per score). `attention_scores` generalizes a s^2 to the scores a sparse or dilated pattern
// computes. A fused kernel stores none of it, only the log-sum-exp (4 a s b bytes, fp32).
struct ActivationInputs {
  double s, b, h, a, t;
  double attention_scores;  // per sequence, all heads (a s^2 for dense non-causal)
  Recompute recompute;
  bool sequence_parallel;   // Megatron-LM's sequence parallelism alongside tensor parallelism
  bool fused_attention;     // true: the core stores the LSE, not the scores
};
inline double activation_bytes_per_layer(const ActivationInputs& x) {
  const double sbh = x.s * x.b * x.h;
  if (x.recompute == Recompute::full) return 2 * sbh / (x.sequence_parallel ? x.t : 1);
  const double linear = x.sequence_parallel ? 34 * sbh / x.t : sbh * (10 + 24 / x.t);
  if (x.recompute == Recompute::selective) return linear;
  const double core = x.fused_attention ? 4 * x.a * x.s * x.b / x.t : 5 * x.b * x.attention_scores / x.t;
  return linear + core;
}

// ---- Model states [Rajbhandari20] -----------------------------------------------------------
// Bytes per parameter: the parameters and gradients in the training precision, K for the
// optimizer states (mixed-precision Adam: fp32 master copy, momentum and variance, K = 12).
inline double parameter_bytes(Precision p) { return p == Precision::fp32 ? 4 : 2; }
inline double optimizer_bytes_per_parameter(Optimizer o, Precision p) {
  const double master = p == Precision::fp32 ? 0 : 4;  // fp32 copy when training in 16 bits
  switch (o) {
    case Optimizer::adam: return master + 8;
    case Optimizer::sgd_momentum: return master + 4;
    case Optimizer::sgd: return master;
  }
  return master;
}
struct ModelStateBytes {
  double parameters, gradients, optimizer;
  double total() const { return parameters + gradients + optimizer; }
};
// ZeRO stage 1 partitions optimizer states over the N_d data-parallel ranks, stage 2 also the
// gradients, stage 3 also the parameters: (2 + 2 + K) Psi -> 4 Psi + K Psi/N_d -> 2 Psi +
// (2 + K) Psi/N_d -> (4 + K) Psi/N_d for mixed precision.
inline ModelStateBytes model_state_bytes(double psi, double data_parallel, int zero_stage, Precision p, Optimizer o) {
  const double nd = data_parallel;
  return {psi * parameter_bytes(p) / (zero_stage >= 3 ? nd : 1), psi * parameter_bytes(p) / (zero_stage >= 2 ? nd : 1),
          psi * optimizer_bytes_per_parameter(o, p) / (zero_stage >= 1 ? nd : 1)};
}

// ---- Pipeline bubble [Narayanan21]: (p - 1) / m of the compute time, 1F1B schedule ----------
inline double pipeline_bubble_fraction(double p, double micro_batches) { return (p - 1) / micro_batches; }

// ---- Collectives: ring algorithms over n ranks, `bytes` the whole buffer --------------------
// All-gather and reduce-scatter move (n - 1)/n of it through each rank's link, all-reduce twice that.
inline double all_gather_seconds(double bytes, double n, double bandwidth) {
  return n > 1 ? (n - 1) / n * bytes / bandwidth : 0.0;
}
inline double reduce_scatter_seconds(double bytes, double n, double bandwidth) {
  return all_gather_seconds(bytes, n, bandwidth);
}
inline double all_reduce_seconds(double bytes, double n, double bandwidth) {
  return 2 * all_gather_seconds(bytes, n, bandwidth);
}

}  // namespace longattn::plan
