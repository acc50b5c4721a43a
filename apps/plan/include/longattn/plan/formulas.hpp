#pragma once
// The planner's formulas, each from its source, in the papers' symbols:
//   L layers, h hidden size, a heads, f FFN size, V vocabulary, s sequence length, b micro-batch
//   (sequences), t tensor-parallel size, Psi parameters.
//
// [Narayanan21] D. Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
//   Clusters Using Megatron-LM", SC 2021: parameter count, FLOPs per iteration (Eq. 3), training
//   time (Eq. 4), pipeline bubble (p - 1) / m.
// [Korthikanti22] V. Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
//   Models", MLSys 2023 (arXiv 2205.05198): activation memory per layer (Section 4, Table 2: the
//   34 s b h that longattn's layer also keeps), model FLOPs 72 B s L h^2 (1 + s/(6h) + V/(12 L h)).
// [Rajbhandari20] S. Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
//   Parameter Models", SC 2020: model-state memory (2 + 2 + K) Psi and its ZeRO stages.
#include <algorithm>
#include <cstdint>

#include "longattn/plan/inputs.hpp"

namespace longattn::plan {

// ---- Parameters [Narayanan21]: 12 L h^2 (1 + 13/(12 h) + (V + s)/(12 L h)) for f = 4h -------
// One layer: Q, K, V and output projections with biases (4h^2 + 4h), the MLP (2hf + f + h) and
// two LayerNorms (4h); MAGNETO's sub-LayerNorm adds 2h.
inline double layer_parameters(double h, double f, bool sub_layer_norm = false) {
  return 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h + (sub_layer_norm ? 2 * h : 0);
}
inline double layer_parameters(const ModelConfig& m) {
  return layer_parameters(double(m.hidden), double(m.ffn_size()), m.sub_layer_norm);
}
// Token embedding (tied with the LM head, or the head's own V h + V beside it) and, if learned,
// position embeddings.
inline double embedding_parameters(const ModelConfig& m) {
  const double V = double(m.vocabulary), h = double(m.hidden);
  return V * h + (m.tied_embeddings ? 0.0 : V * h + V) + (m.positions == Positions::learned ? double(m.sequence) * h : 0.0);
}
// The whole model: layers, embeddings and the final LayerNorm (2h, which Megatron's formula omits).
inline double model_parameters(const ModelConfig& m) {
  return double(m.layers) * layer_parameters(m) + embedding_parameters(m) + 2.0 * m.hidden;
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

// ---- Activation memory of longattn's layer (apps/train/include/longattn/train/model.hpp) -----
// Per micro-batch on one rank: `rows` = s b tokens (s = sequence / cp), e bytes per element, t
// tensor ranks (h/t, f/t, a/t are a rank's part), `replicated` = rows / t under sequence
// parallelism, else rows: the rows of the tensors outside the split sublayers. Memory that the
// fused attention never stores (the scores) does not enter; for 16-bit elements, t = 1 and
// MAGNETO's sub-LayerNorm the kept bytes are 34 s b h and a few bytes a row (32 s b h without
// it), as Korthikanti22's "34 s b h" (Table 2, without the 5 a s^2 b of an unfused attention core).
struct LayerShape {
  double rows, replicated, h, f, a, t, e;
  bool sub_layer_norm;  // MAGNETO: the attention's output normalized (Z and its row statistics)
};
// Kept for backward without recomputation: x, LN1(x), x2 = x + attention, LN2(x2) (replicated
// rows of h) and their norms' mean and rstd (16 B a row); the attention's Q, K, V, output A and
// Z (h/t each), its LSE (4 a/t B a row), Z's statistics (8 B a row) and a row of ones; the MLP's
// u and GELU(u) (f/t each).
inline double layer_kept_bytes(const LayerShape& x) {
  const double sub = x.sub_layer_norm ? 1 : 0;
  return x.replicated * (4 * x.h * x.e + 16) +
         x.rows * (x.e * x.h / x.t * (4 + sub) + 4 * x.a / x.t + 8 * sub + x.e + 2 * x.e * x.f / x.t);
}
// What selective recomputation does not keep (recomputed in backward): A, Z, the LSE and Z's statistics.
inline double attention_output_bytes(const LayerShape& x) {
  const double sub = x.sub_layer_norm ? 1 : 0;
  return x.rows * (x.e * x.h / x.t * (1 + sub) + 4 * x.a / x.t + 8 * sub);
}
// Backward's buffers for the whole pass: the gradients of a layer's input, residual and norm
// output (3 replicated rows of h), of the MLP's hidden layer (f/t) and a row of ones.
inline double backward_buffer_bytes(const LayerShape& x) {
  return x.e * (3 * x.replicated * x.h + x.rows * x.f / x.t + x.rows);
}
// The attention's backward: the gradients of its output projection's input, of A (sub-LN) and
// of Q, K, V (h/t each) and Delta (4 a/t B a row); the kernels' own dQ sums are apart
// (KernelCopies::attention_dq_sum).
inline double attention_backward_bytes(const LayerShape& x) {
  const double sub = x.sub_layer_norm ? 1 : 0;
  return x.rows * (x.e * x.h / x.t * (4 + sub) + 4 * x.a / x.t);
}

// A 16-bit matrix product's operand copies (KernelCopies::Gemm) for a linear layer of R rows, I
// inputs and O outputs; its forward (A = x, B = W, C = y), dW (dy^T x) and dx (dy W) products
// copy the same three matrices: float copies of all three (4 (R I + R O + I O) bytes), or bf16
// panels of A and B along the product's depth (I, R and O respectively).
inline double gemm_copy_bytes(KernelCopies::Gemm gemm, double R, double I, double O) {
  switch (gemm) {
    case KernelCopies::Gemm::none: return 0;
    case KernelCopies::Gemm::float_operands: return 4 * (R * I + R * O + I * O);
    case KernelCopies::Gemm::bf16_panels: return 2 * std::max({(R + O) * I, (O + I) * R, (R + I) * O});
  }
  return 0;
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
// gradient_bytes: per gradient (the precision's, or 4 for fp32 gradients of a 16-bit model).
inline ModelStateBytes model_state_bytes(double psi, double data_parallel, int zero_stage, Precision p, Optimizer o,
                                         double gradient_bytes) {
  const double nd = data_parallel;
  return {psi * parameter_bytes(p) / (zero_stage >= 3 ? nd : 1), psi * gradient_bytes / (zero_stage >= 2 ? nd : 1),
          psi * optimizer_bytes_per_parameter(o, p) / (zero_stage >= 1 ? nd : 1)};
}
inline ModelStateBytes model_state_bytes(double psi, double data_parallel, int zero_stage, Precision p, Optimizer o) {
  return model_state_bytes(psi, data_parallel, zero_stage, p, o, parameter_bytes(p));
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
