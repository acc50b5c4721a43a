#pragma once
// The estimate of one plan: memory per GPU, FLOPs, time per step, days and cost; and the search
// over layouts. Every number carries the formula it came from, for the report.
#include <string>
#include <vector>

#include "longattn/plan/inputs.hpp"

namespace longattn::plan {

// What the attention of a model computes per sequence, independent of the layout.
struct AttentionWork {
  enum class Kind { dense, dilated, block_sparse } kind = Kind::dense;
  std::string spec;          // normalized spec text
  double scores = 0;         // (query, key) scores per sequence, all heads, as the kernels compute them
  // Context parallelism: how many other ranks' key/value shards a rank needs (c - 1 for dense;
  // fewer for a local block-sparse window), and for dilated attention each configuration's
  // segment length, rate and heads (segments longer than a shard all-gather their keys), the
  // heads of its largest pass (one kernel call's, with every r-th token of a sequence) and the
  // scores of its passes (their kernels run on segments of segment / rate tokens).
  double key_reach_tokens = 0;  // how far back (and ahead, non-causal) a query reaches; 0: everywhere
  struct DilatedLevel { double segment, rate, heads, pass_heads, scores; };
  std::vector<DilatedLevel> dilated_levels;
};
AttentionWork attention_work(const ModelConfig& model);  // throws Error for a bad spec

// A number and how it was computed.
struct Term {
  std::string name;
  double value = 0;
  std::string formula;
};

struct Estimate {
  Plan plan;
  double parameters = 0;            // whole model
  double parameters_per_gpu = 0;    // the largest pipeline stage / t, before ZeRO
  std::vector<Term> memory;         // bytes per GPU: parameters ... communication buffers
  double memory_total = 0, memory_usable = 0;
  bool fits = false;

  std::vector<Term> flops;          // per token: dense part 6 Psi, attention; per step: model, hardware
  double model_flops_per_step = 0, hardware_flops_per_step = 0;
  double attention_flops_per_step = 0;  // the attention's part of the hardware FLOPs

  std::vector<Term> elements;       // per step on a GPU: the elements each ElementClass processes
  std::vector<Term> time;           // seconds per step: compute, element-wise kernels, bubble, exposed communication
  double products_seconds = 0, attention_seconds = 0;  // the "compute" term's two parts
  double step_seconds = 0, steps = 0, days = 0, gpu_hours = 0, cost = 0;
  double mfu = 0;                   // model FLOPs / (step time x GPUs x peak)
  double micro_batches = 0;         // per pipeline per step
  std::string verdict;
};

// The estimate for plan.layout (validated; throws Error for a layout that cannot run).
Estimate estimate(const Plan& plan);
Estimate estimate(const Plan& plan, const AttentionWork& work);

// Layouts of the plan's GPU count that fit in memory, fastest first: tensor parallel within a
// node (dividing heads, hidden and FFN sizes), pipeline stages dividing the layers, context
// parallel sizes dividing the sequence, ZeRO 0-3, recomputation none/selective/full, micro-
// batches of 1, 2, 4 or 8 sequences. `rejected` counts layouts that do not fit; `smallest`
// is the one needing the least memory (for the verdict when none fits).
struct SearchResult {
  std::vector<Estimate> best;  // at most `keep`, fastest first
  std::size_t evaluated = 0, fitting = 0;
  Estimate smallest;
};
SearchResult search(const Plan& plan, std::size_t keep);

}  // namespace longattn::plan
