#include "longattn/plan/estimate.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <set>

#include "longattn/core/attention_spec.hpp"
#include "longattn/error.hpp"
#include "longattn/plan/formulas.hpp"

namespace longattn::plan {

namespace {

constexpr double gib = 1024.0 * 1024.0 * 1024.0;
constexpr double bucket_bytes = 25.0 * 1024 * 1024;  // parallel::GradientBuckets' default

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.4g", value);
  return text;
}

// Key blocks kept for query block qb of n blocks, as the core's pattern builders keep them
// (block_sparse_patterns.hpp), counted in closed form: a 1M-token layout has 2^28 blocks.
double kept_key_blocks(const BlockSparseConfig& config, std::int64_t qb, std::int64_t n, std::int64_t block,
                       bool causal) {
  const std::int64_t allowed = causal ? qb + 1 : n;
  // Blocks at distance d (in blocks) are within `radius` tokens when block d - (block - 1) <= radius.
  const auto window = [&](std::int64_t radius) {
    const std::int64_t d = (radius + block - 1) / block;
    return std::pair<std::int64_t, std::int64_t>{std::max<std::int64_t>(0, qb - d),
                                                 causal ? qb : std::min(n - 1, qb + d)};
  };
  switch (config.pattern) {
    case BlockSparsePattern::full: return double(allowed);
    case BlockSparsePattern::local_window: {
      const auto [lo, hi] = window(config.radius);
      return double(hi - lo + 1);
    }
    case BlockSparsePattern::dilated: {
      const std::set<std::int64_t> rates(config.rates.begin(), config.rates.end());
      double kept = 1;
      for (const std::int64_t r : rates) kept += (qb - r >= 0) + (!causal && qb + r < n);
      return kept;
    }
    case BlockSparsePattern::global_local: {
      const std::int64_t global = (config.global_tokens + block - 1) / block;
      if (qb < global) return double(allowed);
      const auto [lo, hi] = window(config.radius);
      return double(hi - lo + 1 + std::min(global, lo));
    }
    case BlockSparsePattern::random:
      return double(std::max<std::int64_t>(1, std::min(allowed, std::int64_t(std::llround(config.density * allowed)))));
    case BlockSparsePattern::top_k: return double(std::min(config.top_k, allowed));
  }
  return double(allowed);
}

// How far (tokens) a query's keys reach; 0 when some reach every position.
double block_sparse_reach(const BlockSparseConfig& config, std::int64_t block) {
  switch (config.pattern) {
    case BlockSparsePattern::local_window: return double(config.radius + block);
    case BlockSparsePattern::dilated:
      return double((*std::max_element(config.rates.begin(), config.rates.end()) + 1) * block);
    default: return 0;
  }
}

// The group of `size` ranks `stride` apart stays in one node when stride x size ranks tile a node.
double link_bandwidth(const ClusterConfig& cluster, std::int64_t stride, std::int64_t size) {
  const bool inside = cluster.gpu.gpus_per_node % (stride * size) == 0;
  return (inside ? cluster.gpu.nvlink_bandwidth : cluster.gpu.network_bandwidth) * cluster.comm_efficiency;
}

double attention_efficiency(const Efficiency& e, AttentionWork::Kind kind) {
  switch (kind) {
    case AttentionWork::Kind::dense: return e.attention_dense;
    case AttentionWork::Kind::dilated: return e.attention_dilated;
    case AttentionWork::Kind::block_sparse: return e.attention_block_sparse;
  }
  return e.attention_dense;
}

}  // namespace

AttentionWork attention_work(const ModelConfig& model) {
  // Shorthand: block_sparse:density=F is the random pattern (a fraction of the allowed blocks).
  std::string text = model.attention;
  const auto first = text.find_first_not_of(" \t");
  if (first != std::string::npos && text.compare(first, 13, "block_sparse:") == 0 &&
      text.find("pattern=") == std::string::npos)
    text = "block_sparse:pattern=random;" + text.substr(first + 13);
  const AttentionSpec spec = resolve_attention_spec(parse_attention_spec(text), model.sequence);
  const double s = double(model.sequence), a = double(model.heads);
  AttentionWork work;
  work.spec = to_string(spec);
  switch (spec.kind) {
    case AttentionSpec::Kind::automatic:  // resolved above
    case AttentionSpec::Kind::dense:
      work.kind = AttentionWork::Kind::dense;
      work.scores = a * (model.causal ? s * (s + 1) / 2 : s * s);
      break;
    case AttentionSpec::Kind::dilated: {
      work.kind = AttentionWork::Kind::dilated;
      validate_dilated_config(spec.dilated, int(model.heads), "longattn-plan: attention");
      work.scores = dilated_attention_scores(model.sequence, int(model.heads), spec.dilated, model.causal);
      const auto passes = dilated::passes(spec.dilated, int(model.heads));
      for (std::size_t i = 0; i < spec.dilated.segment_lengths.size(); ++i) {
        double heads = 0, pass_heads = 0, scores = 0;
        for (const dilated::Pass& pass : passes) {
          if (pass.config != int(i)) continue;
          heads += pass.head_count;
          pass_heads = std::max(pass_heads, double(pass.head_count));
          scores += dilated::pass_scores(pass, model.sequence, model.causal);
        }
        work.dilated_levels.push_back(
            {double(spec.dilated.segment_lengths[i]), double(spec.dilated.dilation_rates[i]), heads, pass_heads, scores});
      }
      break;
    }
    case AttentionSpec::Kind::block_sparse: {
      work.kind = AttentionWork::Kind::block_sparse;
      const std::int64_t block = BlockSparseShape{}.block;
      const std::int64_t n = (model.sequence + block - 1) / block;
      double blocks = 0;
      for (std::int64_t qb = 0; qb < n; ++qb) blocks += kept_key_blocks(spec.block_sparse, qb, n, block, model.causal);
      work.scores = a * blocks * double(block) * double(block);
      work.key_reach_tokens = block_sparse_reach(spec.block_sparse, block);
      break;
    }
  }
  return work;
}

Estimate estimate(const Plan& plan) { return estimate(plan, attention_work(plan.model)); }

Estimate estimate(const Plan& plan, const AttentionWork& work) {
  validate_inputs(plan);
  validate_layout(plan);
  const ModelConfig& model = plan.model;
  const TrainingConfig& training = plan.training;
  const ClusterConfig& cluster = plan.cluster;
  const Layout& layout = plan.layout;

  const double L = double(model.layers), h = double(model.hidden), a = double(model.heads);
  const double f = double(model.ffn_size()), V = double(model.vocabulary), s = double(model.sequence);
  const double D = h / a;
  const double t = double(layout.tensor), p = double(layout.pipeline), d = double(layout.data);
  const double c = double(layout.context), b = double(layout.micro_batch), gpus = double(layout.gpus());
  const double n_dp = d * c;  // ranks holding the same parameters
  const double sequences = double(training.global_batch_tokens) / s;
  const double micro_batches = sequences / (d * b);
  const double s_local = s / c;
  const double element = parameter_bytes(training.precision);  // activations, parameters, gradients
  const double peak = training.precision == Precision::fp32 ? cluster.gpu.peak_flops_tf32 : cluster.gpu.peak_flops_16bit;
  const bool full = training.recompute == Recompute::full;
  // Full recomputation runs every layer's forward again in backward but the model's last, whose
  // activations backward takes first and keeps (longattn-train); with pipeline stages a stage's
  // backward does not follow its forward, and every layer is recomputed. `recomputed` is the
  // fraction of a stage's layers run twice.
  const double recomputed = !full ? 0 : p == 1 ? (L - 1) / L : 1;
  const bool dilated = work.kind == AttentionWork::Kind::dilated;

  Estimate e;
  e.plan = plan;
  e.micro_batches = micro_batches;
  e.parameters = model_parameters(model);

  // ---- Memory per GPU, in the categories longattn-train's pool counts (memory::Category) ------
  const double per_layer = layer_parameters(model);
  // The blocks' parameters split over tp; the embeddings, output layer and final norm too when
  // vocab-parallel.
  const double vocab_split = layout.vocab_parallel ? t : 1;
  const double first_stage = L / p * per_layer / t + (embedding_parameters(model) + (p == 1 ? 2 * h : 0)) / vocab_split;
  const double last_stage = p == 1 ? first_stage : L / p * per_layer / t + (V * h + 2 * h) / vocab_split;
  e.parameters_per_gpu = std::max(first_stage, last_stage);
  const double gradient_bytes = training.fp32_gradients ? 4 : element;
  const ModelStateBytes states = model_state_bytes(e.parameters_per_gpu, n_dp, layout.zero_stage, training.precision,
                                                   training.optimizer, gradient_bytes);
  const std::string psi = "Psi_gpu = " + number(e.parameters_per_gpu) + " (largest stage: layers / tp, embeddings " +
                          (layout.vocab_parallel ? "/ tp)" : "whole)");
  const std::string zero_over = " / (dp x cp)";
  e.memory.push_back({"parameters", states.parameters,
                      psi + " x " + number(parameter_bytes(training.precision)) + " B" +
                          (layout.zero_stage >= 3 ? zero_over : "") + "  [ZeRO]"});
  // ZeRO 2 also holds one layer's (or the embeddings') whole gradients while backward makes them.
  const double largest_group = std::max(per_layer / t, embedding_parameters(model) / vocab_split);
  const double gradient_group = layout.zero_stage >= 2 && n_dp > 1 ? largest_group * gradient_bytes : 0;
  e.memory.push_back({"gradients", states.gradients + gradient_group,
                      "Psi_gpu x " + number(gradient_bytes) + " B" + (layout.zero_stage >= 2 ? zero_over : "") +
                          "  [ZeRO]" + (gradient_group > 0 ? " + one layer's gradients while backward makes them" : "")});
  e.memory.push_back({"optimizer states", states.optimizer,
                      "Psi_gpu x K, K = " + number(optimizer_bytes_per_parameter(training.optimizer, training.precision)) +
                          " B (" + to_string(training.optimizer) + ", " + to_string(training.precision) + ")" +
                          (layout.zero_stage >= 1 ? zero_over : "") + "  [ZeRO]"});

  // One micro-batch's rows on this rank; the tensors outside the split sublayers are split over
  // the sequence too with sequence parallelism.
  const bool sp = layout.sequence_parallel;
  const double rows = b * s_local;
  const LayerShape shape{rows, sp ? rows / t : rows, h, f, a, t, element, model.sub_layer_norm};
  const double kept_layer = layer_kept_bytes(shape), outputs = attention_output_bytes(shape);
  const double input_only = element * shape.replicated * h;  // full recomputation keeps each layer's input
  const double layer_activations = full ? input_only
                                   : training.recompute == Recompute::selective ? kept_layer - outputs
                                                                                : kept_layer;
  // The head: the final norm's input and output, its statistics, and the logits (which the loss's
  // backward overwrites with their gradient).
  const double head_rows = shape.replicated;
  const double logits = head_rows * (element * (2 * h + V / vocab_split) + 8);
  const double in_flight = std::min(p, micro_batches);
  // Selective recomputation: the layer being computed holds its attention outputs until its projection.
  const double computing = training.recompute == Recompute::selective ? outputs : 0;
  const double activations =
      computing + (p == 1 ? L * layer_activations + logits
                          : std::max(in_flight * L / p * layer_activations, L / p * layer_activations + logits));
  const char* recompute_formula = full ? "its input x"
                                  : training.recompute == Recompute::selective
                                      ? "x, LN1, x2, LN2 (s b h each), Q, K, V (s b h / t each), u, GELU(u) (s b f / t each)"
                                      : "x, LN1, x2, LN2 (s b h each), Q, K, V, A (s b h / t each), u, GELU(u) (s b f / t "
                                        "each), LSE";
  e.memory.push_back({"activations", activations,
                      std::string("per layer ") + recompute_formula + (sp ? ", s b h terms / t (sequence parallel)" : "") +
                          " (s = seq/cp = " + number(s_local) +
                          ") x layers/pp x min(pp, micro-batches) in flight, + the head's s b (2 h + V" +
                          (layout.vocab_parallel ? " / t" : "") + ")" +
                          (computing > 0 ? " + the attention outputs of the layer being computed" : "") +
                          "  [Korthikanti22's 34 s b h]"});

  // Backward's workspaces: its buffers for the whole pass (and under full recomputation the
  // layer recomputed, kept whole); then either a layer's attention backward (its buffers, the
  // recomputed outputs under selective recomputation, the kernels' dQ sums, a 16-bit ring's
  // fp32 accumulators; dilated attention's merge buffers live in the forward pass only) beside
  // the attention's head-major copies, or a matrix product's operand copies: the two never run
  // at once, so the whole takes the larger.
  const double recomputed_layer = full ? kept_layer - input_only : 0;
  const double pass_buffers = backward_buffer_bytes(shape) + recomputed_layer;
  // The attention kernel calls' tensors, in elements (tokens x heads x D): dense attention's
  // hold all its rows (a ring step's piece is half a zigzag shard); a dilated pass's one
  // sequence's selected tokens of the pass's heads, s_local / r queries and as many keys, or
  // under context parallelism a spanning segment's / r. "Apart": they hold each head's rows
  // apart (more than one head in the tensor, or every r-th token).
  double keys_apart = 0, queries = 0, queries_apart = 0;  // the largest call's
  const auto add_call = [&](double key_elements, double query_elements, bool apart) {
    queries = std::max(queries, query_elements);
    if (!apart) return;
    keys_apart = std::max(keys_apart, key_elements);
    queries_apart = std::max(queries_apart, query_elements);
  };
  const double ring_piece = model.causal ? 0.5 : 1.0;  // of a shard: one zigzag half where causal
  if (!dilated) {
    const double elements = rows * (c > 1 ? ring_piece : 1.0) * (h / t);
    add_call(elements, elements, a / t > 1);
  } else {
    for (const auto& level : work.dilated_levels) {
      const double features = std::ceil(level.pass_heads / t) * D, segment = std::min(level.segment, s);
      add_call(std::max(segment, s_local) / level.rate * features, s_local / level.rate * features,
               level.rate > 1 || a / t > 1);
    }
  }
  // The one-pass backward's fp32 dQ sums beside dq (KernelCopies::attention_dq_sum): for 16-bit
  // dq, or float dq whose heads' rows are apart where the kernels stream head-major copies.
  const double dq_sum = !plan.copies.attention_dq_sum ? 0
                        : element < 4                 ? 4 * queries
                                                      : (plan.copies.head_major_attention ? 4 * queries_apart : 0);
  double attention_workspace = attention_backward_bytes(shape) + dq_sum +
                               (training.recompute == Recompute::selective ? outputs : 0);
  std::string workspace_formula = "s b (3 h + f / t): backward's gradient buffers";
  if (full) workspace_formula += " + the recomputed layer";
  workspace_formula += " + the attention backward's gradient buffers (5 s b h / t) and Delta";
  if (dq_sum > 0) workspace_formula += " + its one-pass form's fp32 dQ sum of a kernel call";
  if (training.recompute == Recompute::selective) workspace_formula += " + its recomputed outputs";
  if (c > 1 && !dilated && element < 4) {  // and a step's part of dQ in 16 bits (a ring piece)
    attention_workspace += rows * (h / t) * (3 * 4 + element * ring_piece);
    workspace_formula += " + the 16-bit ring's fp32 dQ, dK, dV and a step's part of dQ";
  }
  // A 16-bit matrix product's workspace (cuBLAS's) and the attention's are never held at once.
  const double gemm_workspace = element < 4 ? plan.copies.gemm_workspace_bytes : 0;
  if (gemm_workspace > attention_workspace) workspace_formula += ", or a 16-bit matrix product's workspace if larger";
  e.memory.push_back({"workspaces", pass_buffers + std::max(attention_workspace, gemm_workspace), workspace_formula});

  // Transient copies: the attention's head-major copies and 16-bit matrix products' operand
  // copies (the largest of the layer's products: Q, K, V and output projections, the MLP, the
  // head). A kernel call copies two of its Q, K, V, dO at a time where they hold each head's
  // rows apart (above).
  const double head_major = plan.copies.head_major_attention ? 2 * element * keys_apart : 0;
  double gemm_copies = 0;
  if (element < 4)
    for (const auto& [R, I, O] : {std::array<double, 3>{rows, h, 3 * h / t}, {rows, h / t, h}, {rows, h, f / t},
                                  {rows, f / t, h}, {head_rows, h, V / vocab_split}})
      gemm_copies = std::max(gemm_copies, gemm_copy_bytes(plan.copies.gemm, R, I, O));
  e.memory.push_back({"transient copies", std::max(head_major, gemm_copies),
                      "the larger of the attention's head-major copies (" + number(head_major) +
                          " B) and a 16-bit matrix product's operand copies (" + number(gemm_copies) + " B)"});

  // Communication buffers while a layer's backward runs, and as backward ends (after the
  // optimizer's step under ZeRO 1 and 2: the parameters all-gathered one tensor at a time).
  // The context-parallel attention's buffers exist only while a layer's attention runs.
  double during = 0, end = 0, attention_during = 0;
  std::string buffer_formula;
  const auto add_buffer = [&](double during_bytes, double end_bytes, const std::string& what) {
    during += during_bytes;
    end += end_bytes;
    buffer_formula += (buffer_formula.empty() ? "" : " + ") + what;
  };
  const auto add_attention_buffer = [&](double bytes, const std::string& what) {
    attention_during += bytes;
    buffer_formula += (buffer_formula.empty() ? "" : " + ") + what;
  };
  if (c > 1 && !dilated)  // 16-bit: a step's part of dK, dV in the model's type too
    add_attention_buffer(rows * (h / t) * (4 * element + 8 + (element < 4 ? 2 * element : 0)),
                         "ring: K/V pieces in flight and a dK/dV piece");
  if (c > 1 && dilated) {
    double largest = 0;
    for (const auto& level : work.dilated_levels) {
      const double segment = std::min(level.segment, s);
      if (segment > s_local) largest = std::max(largest, 2 * (2 * segment / level.rate * b * level.pass_heads * D * element));
    }
    // Pass by pass (the heads of one offset; tensor parallelism does not split dilated attention),
    // parallel/dilated_attention.hpp holds two buffers of them at a time: the gathered parts and
    // the keys and values laid out; the keys and values and their gradients; the gradients and
    // the same laid out rank by rank.
    if (largest > 0) add_attention_buffer(largest, "two buffers of a spanning segment's dilated K/V (gathered, laid out, gradients)");
  }
  if (t > 1 && sp) add_buffer(4 * rows * h * element, 0, "sequence parallelism: gathered s b h and its staging, twice");
  // The data-parallel reduction. longattn's buckets (ZeRO 0 and 1) reduce the fp32 gradients where
  // they lie, and hold a copy of every one (for the whole step) only to reduce them in 16 bits;
  // ZeRO 2 reduce-scatters them bucket by bucket from the head's gradients on (2 buckets of 25 MiB
  // in flight while layers run, or all the gradients if fewer) and holds them all, with the
  // 1/(dp x cp) piece received, as backward ends; ZeRO 3 streams 2 buckets of 25 MiB.
  const double reduce_bytes = training.fp32_gradient_reduce ? 4 : element;
  if (n_dp > 1 && layout.zero_stage <= 1 && reduce_bytes < 4) {
    const double copy = e.parameters_per_gpu * reduce_bytes;
    add_buffer(copy, copy, "a 16-bit bucket copy of every gradient");
  }
  if (n_dp > 1 && layout.zero_stage == 2) {
    const double all = e.parameters_per_gpu * reduce_bytes;
    add_buffer(std::min(all, 2 * bucket_bytes), all * (1 + 1 / n_dp), "the gradients reduce-scattered with the piece received");
  }
  if (n_dp > 1 && (layout.zero_stage == 1 || layout.zero_stage == 2)) {
    // After the step, beside ZeRO 1's buckets; ZeRO 2's are given back by then.
    const double largest_tensor = std::max({f * h / t, 3 * h * h / t, V * h / vocab_split,
                                            model.positions == Positions::learned ? s * h : 0.0});
    const double gathered = largest_tensor * element * (1 + 1 / n_dp);
    buffer_formula += std::string(buffer_formula.empty() ? "" : " + ") + "the largest parameter tensor all-gathered";
    end = layout.zero_stage == 1 ? end + gathered : std::max(end, gathered);
  }
  if (layout.zero_stage >= 3 && n_dp > 1) {
    const double streamed = std::min(2 * bucket_bytes, e.parameters_per_gpu * reduce_bytes) + 2 * per_layer / t * element;
    add_buffer(streamed, streamed, "2 gradient buckets of 25 MiB and ZeRO-3's 2 layers' gathered parameters");
  }
  e.memory.push_back({"communication buffers", std::max(during + attention_during, end),
                      buffer_formula.empty() ? "none (one GPU per replica)"
                                             : "the larger of a layer's backward's and backward's end's: " + buffer_formula});

  // The whole: the model's state and the activations, and the largest of three moments: a
  // layer's attention backward (its workspaces, head-major copies and ring or dilated buffers), a
  // layer's matrix product (its operand copies), both beside backward's buffers and with ZeRO 2
  // one layer's gradients; and backward's end (its buffers, the largest group's gradients).
  const double layer_group = gradient_group > 0 ? per_layer / t * gradient_bytes : 0;
  const double attention_moment = attention_workspace + head_major + attention_during;
  const double product_moment = gemm_copies + gemm_workspace;
  e.memory_total = states.total() + activations +
                   std::max(pass_buffers + layer_group + during + std::max(attention_moment, product_moment),
                            backward_buffer_bytes(shape) + end + gradient_group);
  e.memory_usable = cluster.gpu.memory_bytes * (1 - cluster.memory_reserve);
  e.fits = e.memory_total <= e.memory_usable;

  // ---- FLOPs: model (forward + backward = 3 forward) and hardware (what the GPUs execute) ----
  // Per token: dense part 6 Psi; attention 3 x layers x 4 D x scores / s. The fused backward
  // recomputes the scores (10 D per score against the forward's 4 D); full recomputation adds a
  // forward of the recomputed layers (2 Psi_layers + 4 D scores / s per layer).
  const double attention_forward = L * attention_flops_per_score(D) * work.scores / s;  // per token
  const double dense_model = 6 * e.parameters, attention_model = 3 * attention_forward;
  const double dense_hw = dense_model + 2 * recomputed * L * per_layer;
  const double attention_hw = attention_forward * (1 + 2.5 + recomputed);
  const double tokens_per_step = double(training.global_batch_tokens);
  e.model_flops_per_step = (dense_model + attention_model) * tokens_per_step;
  e.hardware_flops_per_step = (dense_hw + attention_hw) * tokens_per_step;
  e.attention_flops_per_step = attention_hw * tokens_per_step;
  e.flops.push_back({"dense per token", dense_model, "6 Psi  [Narayanan21]"});
  e.flops.push_back({"attention per token", attention_model,
                     "3 x layers x 4 D x scores / s, " + work.spec + ": " + number(work.scores / a / s) +
                         " scores per query and head"});
  e.flops.push_back({"model per step", e.model_flops_per_step, "per token x global batch tokens"});
  e.flops.push_back({"hardware per step", e.hardware_flops_per_step,
                     std::string("+ the fused backward's recomputed scores") + (full ? " + full recomputation" : "")});

  // ---- Time per step ------------------------------------------------------------------------
  // Attention: dense at this head dimension, times the kind's factor (and the ring's under context
  // parallelism) where the calibration measured them, else the kind's efficiency against dense's.
  // Dense attention runs at its sequence length's factor; dilated attention's passes each at their
  // segments' (segment / rate tokens), weighted by their scores; block-sparse attention's blocks
  // do not depend on the length.
  const std::optional<Efficiency::AttentionFactors>& factors =
      plan.efficiency.attention_factors[std::size_t(training.precision)];
  const double kind_factor = !factors ? attention_efficiency(plan.efficiency, work.kind) / plan.efficiency.attention_dense
                             : work.kind == AttentionWork::Kind::dilated      ? factors->dilated
                             : work.kind == AttentionWork::Kind::block_sparse ? factors->block_sparse
                                                                              : 1.0;
  const double ring_factor = !factors || c == 1 ? 1.0 : dilated ? factors->dilated_ring : factors->ring;
  const auto length_factor = [&](double tokens) {
    return plan.efficiency.attention_length_factor(tokens, training.precision);
  };
  double inverse_length_factor = 1;  // block-sparse
  if (work.kind == AttentionWork::Kind::dense) inverse_length_factor = 1 / length_factor(s);
  if (dilated) {
    inverse_length_factor = 0;
    for (const auto& level : work.dilated_levels)
      inverse_length_factor += level.scores / work.scores / length_factor(level.segment / level.rate);
  }
  const double e_attention = std::min(1.0, plan.efficiency.dense_attention_at(D, training.precision) * kind_factor *
                                               ring_factor / inverse_length_factor);
  // The matrix products of one micro-batch on a rank of a stage, each at the efficiency of its
  // shape: a linear layer's forward (rows x O x I), dW (O x I x rows) and dx (rows x I x O), the
  // forward again for the layers full recomputation runs twice. Tensor-parallel layers see all rows (gathered under
  // sequence parallelism); the head the replicated ones, or all of them split over V, its time
  // spread over the stages as the FLOP counts [Narayanan21] spread it.
  const Efficiency& efficiency = plan.efficiency;
  const bool sixteen_bit = training.precision != Precision::fp32;
  double products_seconds = 0;
  const auto linear = [&](double R, double I, double O, double count, double recomputed_share) {
    const auto seconds = [&](double m, double n, double k) {
      return 2 * m * n * k / (peak * efficiency.matmul_at(m, n, k, training.precision));
    };
    products_seconds += count * (seconds(R, O, I) * (1 + recomputed_share) + seconds(O, I, R) + seconds(R, I, O));
  };
  for (const auto& [I, O] : {std::pair<double, double>{h, 3 * h / t}, {h / t, h}, {h, f / t}, {f / t, h}})
    linear(rows, I, O, L / p, recomputed);
  linear(layout.vocab_parallel ? rows : head_rows, h, V / vocab_split, 1 / p, 0);
  e.products_seconds = micro_batches * products_seconds;
  e.attention_seconds = tokens_per_step * attention_hw / (gpus * peak * e_attention);
  const double compute = e.products_seconds + e.attention_seconds;

  // Tensor parallelism's collectives on s b h a layer, as longattn-train runs them: with sequence
  // parallelism 4 forward (the attention's and the MLP's input gathered, their outputs reduce-
  // scattered), 6 backward (their inputs gathered again, dy gathered, dx reduce-scattered) and
  // 3 in a recomputed forward; without, an all-reduce of each sublayer's output forward and of
  // its input's gradient backward (4 all-gathers / reduce-scatters each way), again when
  // recomputing.
  const double tensor_operations_per_layer = sp ? 10 + 3 * recomputed : 8 + 4 * recomputed;

  // The element-wise kernels of one micro-batch (ElementClass), by the elements they process: the
  // layers' norms (LN1, LN2 on replicated rows of h; the sub-LayerNorm on h / t) and GELU (f / t),
  // forward again for the layers full recomputation runs twice and the sub-LayerNorm under selective; the row kernels
  // (bias adds and their gradients on every linear layer's output) forward and backward, forward
  // the MLP's residual add (the attention's residual adds into LN2 forward, both backward into
  // the norms' dx), under sequence parallelism the reorder of every gathered or scattered s b h
  // (tensor_operations_per_layer), and under ZeRO 2 the gradients' copies into the reduce-
  // scatter's buckets; with rotary positions the angles of Q's and K's turns (one a token and
  // pair of features, each turning the pair in every head of Q and K: forward, backward and in
  // recomputed layers); the final norm, the embeddings and the loss (the head's rows, V / vocab
  // split).
  const double Rr = shape.replicated, sub = model.sub_layer_norm ? 1 : 0;
  const double forward_passes = 1 + recomputed, layers_here = L / p;
  const double norms = 2 * Rr * h + sub * rows * h / t;
  const double bias_elements = rows * (3 * h / t + 2 * h + f / t), residual_elements = Rr * h;
  const double reordered = sp && t > 1 ? tensor_operations_per_layer * rows * h : 0;
  const bool zero_sharded = layout.zero_stage >= 1 && n_dp > 1;  // each rank steps its 1/(dp x cp) of Psi_gpu
  std::array<double, element_class_count> elements{};
  elements[int(ElementClass::norm_forward)] =
      micro_batches * (layers_here * (norms * forward_passes +
                                      (training.recompute == Recompute::selective ? sub * rows * h / t : 0)) +
                       Rr * h / p);
  elements[int(ElementClass::norm_backward)] = micro_batches * (layers_here * norms + Rr * h / p);
  elements[int(ElementClass::gelu_forward)] = micro_batches * layers_here * rows * f / t * forward_passes;
  elements[int(ElementClass::gelu_backward)] = micro_batches * layers_here * rows * f / t;
  // ZeRO 2 copies every gradient into its bucket's blocks after each micro-batch's backward pass.
  const double zero2_pack = layout.zero_stage == 2 && n_dp > 1 ? e.parameters_per_gpu : 0;
  elements[int(ElementClass::rows)] =
      micro_batches *
      (layers_here * (bias_elements * (forward_passes + 1) + residual_elements * forward_passes + reordered) +
       2 * Rr * h / p + zero2_pack);
  elements[int(ElementClass::rotary)] =
      model.positions == Positions::rotary ? micro_batches * layers_here * (forward_passes + 1) * rows * D / 2 : 0;
  elements[int(ElementClass::loss)] = micro_batches * head_rows * V / vocab_split / p;
  elements[int(ElementClass::optimizer)] = e.parameters_per_gpu / (zero_sharded ? n_dp : 1);
  const std::optional<ElementCosts>& costs = efficiency.element_costs[std::size_t(training.precision)];
  double element_seconds = 0, optimizer_seconds = 0;  // the optimizer's once a step, not per micro-batch
  for (int k = 0; k < element_class_count; ++k) {
    const double cost = costs ? (*costs)[std::size_t(k)] : 0, seconds = elements[std::size_t(k)] * cost / peak;
    e.elements.push_back({to_string(ElementClass(k)), elements[std::size_t(k)],
                          costs ? "x " + number(cost) + " FLOP times per element" : "not timed"});
    element_seconds += seconds;
    if (ElementClass(k) == ElementClass::optimizer) optimizer_seconds = seconds;
  }

  const double per_micro_batch = (compute + element_seconds - optimizer_seconds) / micro_batches;
  const double forward_share = (2 * e.parameters + attention_forward) / (dense_hw + attention_hw);
  const double forward_mb = per_micro_batch * forward_share, backward_mb = per_micro_batch - forward_mb;
  e.time.push_back({"compute", compute,
                    "micro-batches x the matrix products' FLOPs / (peak x efficiency: " +
                        ((sixteen_bit ? efficiency.matmul_16bit : efficiency.matmul_fp32).empty()
                             ? "matmul " + number(efficiency.matmul)
                             : std::string("each product's shape's, measured")) +
                        ") + attention FLOPs / (GPUs x peak x " + number(e_attention) + ")"});
  e.time.push_back({"element-wise kernels", element_seconds,
                    costs ? std::string("norms, GELU, row kernels, the loss and the optimizer: their elements "
                                        "(the estimate's `elements`) x each class's measured cost / peak")
                          : std::string("not counted: no element-wise costs for ") + to_string(training.precision) +
                                " in the efficiencies (" + efficiency.source + ")"});
  e.time.push_back({"pipeline bubble", pipeline_bubble_fraction(p, micro_batches) * compute,
                    "(pp - 1) / micro-batches x compute, micro-batches = " + number(micro_batches) + "  [Narayanan21]"});

  // Tensor parallel: all-gathers / reduce-scatters of s b h (an all-reduce counts two), not
  // overlapped (tensor_operations_per_layer).
  double tensor_time = 0;
  if (t > 1) {
    tensor_time = micro_batches * L / p * tensor_operations_per_layer *
                  all_gather_seconds(b * s_local * h * element, t, link_bandwidth(cluster, 1, layout.tensor));
  }
  e.time.push_back({"tensor-parallel communication", tensor_time,
                    "micro-batches x layers/pp x " + number(tensor_operations_per_layer) +
                        " all-gathers/reduce-scatters of s b h (exposed)"});

  // Context parallel. Ring: each step's K/V piece overlaps the attention of the previous one,
  // only the excess is exposed. Dilated: spanning segments all-gather their dilated K/V.
  double context_time = 0;
  std::string context_formula = "none (cp = 1)";
  if (c > 1) {
    const double bandwidth = link_bandwidth(cluster, layout.tensor, layout.context);
    const double attention_layer_mb = attention_flops_per_score(D) * work.scores * b / (t * c) / (peak * e_attention);
    double per_layer_mb = 0;
    if (!dilated) {
      double steps = c - 1;
      if (work.key_reach_tokens > 0)
        steps = std::min(c - 1, std::ceil(work.key_reach_tokens / s_local) * (model.causal ? 1 : 2));
      const double piece = 2 * b * s_local * (h / t) * element;
      const double compute_step = attention_layer_mb / (steps + 1);
      const double forward = steps * std::max(0.0, piece / bandwidth - compute_step);
      const double backward = steps * std::max(0.0, (piece + 2 * b * s_local * (h / t) * 4) / bandwidth - 2.5 * compute_step);
      per_layer_mb = forward * (1 + recomputed) + backward;
      context_formula = "ring: " + number(steps) + " steps per layer, K/V transfer beyond the attention it overlaps";
    } else {
      for (const auto& level : work.dilated_levels) {
        const double segment = std::min(level.segment, s);
        if (segment <= s_local) continue;
        const double group = std::min(c, std::ceil(segment / s_local));
        const double contribution = 2 * b * s_local / level.rate * (level.heads / t) * D;
        const double gather = all_gather_seconds(group * contribution * element, group, bandwidth);
        const double scatter = reduce_scatter_seconds(group * contribution * 4, group, bandwidth);
        per_layer_mb += gather * (1 + recomputed) + gather + scatter;
      }
      context_formula = "dilated: all-gather of dilated K/V for segments longer than a shard (exposed)";
    }
    context_time = micro_batches * L / p * per_layer_mb;
  }
  e.time.push_back({"context-parallel communication", context_time, context_formula});

  // Data parallel over dp x cp ranks: ZeRO 0 all-reduces at the end of backward, 1 reduce-
  // scatters gradients and all-gathers parameters, 2 reduce-scatters every micro-batch, 3 also
  // gathers parameters for every micro-batch's forward and backward. Each overlaps the compute
  // beside it; the excess is exposed.
  double data_time = 0;
  if (n_dp > 1) {
    const double bandwidth = link_bandwidth(cluster, layout.tensor, layout.data * layout.context);
    const double scatter = reduce_scatter_seconds(e.parameters_per_gpu * element, n_dp, bandwidth);
    const double gather = all_gather_seconds(e.parameters_per_gpu * element, n_dp, bandwidth);
    const auto excess = [](double comm, double overlapped) { return std::max(0.0, comm - overlapped); };
    switch (layout.zero_stage) {
      case 0: data_time = excess(scatter + gather, backward_mb); break;
      case 1: data_time = excess(scatter, backward_mb) + excess(gather, forward_mb); break;
      case 2: data_time = micro_batches * excess(scatter, backward_mb) + excess(gather, forward_mb); break;
      default: data_time = micro_batches * (excess(gather, forward_mb) + excess(gather + scatter, backward_mb)); break;
    }
  }
  e.time.push_back({"data-parallel communication", data_time,
                    "ZeRO-" + std::to_string(layout.zero_stage) + " gradient/parameter collectives of Psi_gpu over dp x cp = " +
                        number(n_dp) + " ranks, beyond the overlapped compute"});

  double pipeline_time = 0;
  if (p > 1)
    pipeline_time = 2 * (p - 1) * b * s_local * h / t * element /
                    link_bandwidth(cluster, layout.tensor * layout.context * layout.data, layout.pipeline);
  e.time.push_back({"pipeline transfers", pipeline_time, "2 (pp - 1) activations of s b h / t on the critical path"});

  for (const Term& term : e.time) e.step_seconds += term.value;
  e.steps = std::ceil(training.tokens / tokens_per_step);
  e.days = e.steps * e.step_seconds / 86400;
  e.gpu_hours = gpus * e.steps * e.step_seconds / 3600;
  e.cost = e.gpu_hours * cluster.price_per_gpu_hour;
  e.mfu = e.model_flops_per_step / (e.step_seconds * gpus * peak);

  char text[256];
  if (e.fits) {
    std::snprintf(text, sizeof(text), "fits: %.1f GiB of %.1f GiB usable per GPU; %.1f days, $%.3gM", e.memory_total / gib,
                  e.memory_usable / gib, e.days, e.cost / 1e6);
  } else {
    const auto largest = std::max_element(e.memory.begin(), e.memory.end(),
                                          [](const Term& x, const Term& y) { return x.value < y.value; });
    std::snprintf(text, sizeof(text),
                  "does NOT fit: needs %.1f GiB per GPU, %.1f GiB usable (largest part: %s, %.1f GiB); "
                  "change the layout or run --search",
                  e.memory_total / gib, e.memory_usable / gib, largest->name.c_str(), largest->value / gib);
  }
  e.verdict = text;
  return e;
}

namespace {

std::vector<std::int64_t> divisors(std::int64_t n) {
  std::vector<std::int64_t> out;
  for (std::int64_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      out.push_back(i);
      if (i * i != n) out.push_back(n / i);
    }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

SearchResult search(const Plan& plan, std::size_t keep) {
  validate_inputs(plan);
  const AttentionWork work = attention_work(plan.model);
  const ModelConfig& m = plan.model;
  const std::int64_t gpus = plan.cluster.gpus;
  const std::int64_t sequences = plan.training.global_batch_tokens / m.sequence;
  SearchResult result;
  bool have_smallest = false;
  for (const std::int64_t tp : divisors(gpus)) {
    if (plan.cluster.gpu.gpus_per_node % tp || m.heads % tp || m.hidden % tp || m.ffn_size() % tp) continue;
    for (const std::int64_t pp : divisors(gpus / tp)) {
      if (m.layers % pp) continue;
      for (const std::int64_t cp : divisors(gpus / (tp * pp))) {
        if (m.sequence % cp) continue;
        const std::int64_t dp = gpus / (tp * pp * cp);
        for (const std::int64_t micro_batch : {1, 2, 4, 8}) {
          if (sequences % (dp * micro_batch)) continue;
          for (const Recompute recompute : {Recompute::none, Recompute::selective, Recompute::full})
            for (int zero = 0; zero <= 3; ++zero) {
              if (zero > 0 && dp * cp == 1) continue;  // nothing to partition over
              Plan candidate = plan;
              candidate.layout = {tp, pp, dp, cp, zero, micro_batch};
              candidate.training.recompute = recompute;
              Estimate e = estimate(candidate, work);
              ++result.evaluated;
              if (!have_smallest || e.memory_total < result.smallest.memory_total) {
                result.smallest = e;
                have_smallest = true;
              }
              if (!e.fits) continue;
              ++result.fitting;
              result.best.push_back(std::move(e));
              std::sort(result.best.begin(), result.best.end(), [](const Estimate& x, const Estimate& y) {
                return x.step_seconds != y.step_seconds ? x.step_seconds < y.step_seconds : x.memory_total < y.memory_total;
              });
              if (result.best.size() > keep) result.best.pop_back();
            }
        }
      }
    }
  }
  return result;
}

}  // namespace longattn::plan
