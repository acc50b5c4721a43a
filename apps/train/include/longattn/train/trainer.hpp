// The training loop of longattn-train: a grid of tensor-, context- and data-parallel ranks
// trains a Transformer (model.hpp) on a Dataset (data.hpp) with AdamW (optimizer.hpp).
//
//   world of W ranks = dp x cp x tp, tp innermost (a tensor-parallel group on neighbouring
//   ranks, so within a node): rank r is tensor rank r % tp, context rank (r / tp) % cp of
//   data-parallel group r / (tp cp)
//   each step: the tp ranks of a group run the same tokens, each with its part of every block
//   (model.hpp: H / tp heads, 4E / tp MLP features); the global batch (`batch` sequences) is
//   split over the dp groups; a context group splits each of its sequences' tokens over its cp
//   ranks, whose attention is ring attention (or distributed dilated attention); a rank runs
//   its batch / dp sequences as micro-batches of `micro_batch` sequences, forward and backward
//   each, accumulating gradients; during the last micro-batch's backward every rank's parameter
//   gradients are summed by the bucketed hierarchical all-reduce over the dp x cp ranks that
//   hold the same parameters (the same tensor rank); they then take the same AdamW step (with
//   ZeRO 1: each updates its shard of the parameters, and an all-gather over them gives each
//   all of them; with ZeRO 2 each micro-batch's gradients are reduce-scattered instead, during
//   its backward, and each rank keeps only its shard of them).
//
// The loss is the mean over the global batch's weighted tokens whatever dp, cp and tp are, so a
// run gives the same losses on any grid (up to rounding). The model, its gradients and the
// optimizer's moments live in the memory of the execution space, which runs every kernel:
// Kokkos::DefaultExecutionSpace (the GPU in a CUDA build: ring attention, the tp all-reduces and
// the buckets then go through NCCL). Batches are made on the host and copied over; checkpoints
// are host copies.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "longattn/parallel/communicator.hpp"
#include "longattn/plan/inputs.hpp"
#include "longattn/train/data.hpp"
#include "longattn/train/model.hpp"
#include "longattn/train/optimizer.hpp"

namespace longattn::train {

// The training precision: fp32; or 16-bit parameters, activations and attention (bf16: float's
// range; fp16: IEEE half, with dynamic loss scaling) with fp32 gradients, master weights and
// AdamW moments.
enum class Precision { fp32, bf16, fp16 };
const char* to_string(Precision precision);
// "fp32", "bf16" or "fp16"; throws longattn::Error naming `option` otherwise.
Precision parse_precision(const std::string& text, const char* option = "precision");

// What the data-parallel all-reduce sums gradients in: fp32, or the model's 16-bit type (bf16
// or fp16 runs: half the bytes on the wire, each sum rounded to it).
enum class GradientReduce { fp32, model };
const char* to_string(GradientReduce reduce);
// "fp32" or "model"; throws longattn::Error naming `option` otherwise.
GradientReduce parse_gradient_reduce(const std::string& text, const char* option = "grad-reduce");

// fp16's dynamic loss scaling: the loss (so every gradient) is multiplied by `initial`; a step
// whose gradients overflow is skipped and the scale halved; after `window` good steps in a row
// it doubles.
struct LossScaleConfig {
  double initial = 65536;
  int window = 2000;
};

// The planner's default efficiencies, named for the trainer's output.
inline plan::Efficiency assumed_efficiency() {
  plan::Efficiency e;
  e.source = "the planner's assumed efficiencies";
  return e;
}

struct TrainConfig {
  ModelConfig model;
  DataConfig data;
  OptimizerConfig optimizer;
  Precision precision = Precision::fp32;
  LossScaleConfig loss_scale;       // fp16 only
  GradientReduce grad_reduce = GradientReduce::fp32;
  int steps = 60;                   // the schedule's length
  std::int64_t batch = 16;          // sequences per step, over all data-parallel groups
  std::int64_t micro_batch = 0;     // sequences per forward/backward on a rank; 0: all its batch / dp
  int cp = 1;                       // context-parallel ranks per sequence
  int tp = 1;                       // tensor-parallel ranks per layer (heads, MLP features split);
                                    // dp = ranks / (tp cp)
  bool sequence_parallel = false;   // with tp > 1: norms, residuals, embeddings and head on 1/tp of the tokens
  int zero = 0;                     // ZeRO stage: 0, 1 (AdamW's state sharded over the dp x cp ranks) or 2 (and the gradients), zero.hpp
  std::uint64_t data_seed = 1;      // the train and validation batches
  int eval_every = 20;              // steps between validation losses (0: only at the end)
  int eval_batches = 4;             // global batches per validation
  std::string checkpoint;           // file; empty: none
  int checkpoint_every = 0;         // steps (0: only when the run stops)
  bool resume = false;              // continue from `checkpoint`
  int stop_after = 0;               // stop after this step (a job's time limit); 0: run to `steps`
  double peak_gflops = 0;           // FMA peak of all ranks' cores; 0: measured at start
  plan::Efficiency efficiency = assumed_efficiency();  // longattn-plan's kernel efficiencies for the
                                    // compute-time prediction (--calibration: write_calibration.py's)
  std::int64_t memory_limit_mib = 0;  // the memory pool's limit per rank; 0: the machine's memory
  bool quiet = false;               // no per-step lines
  std::string export_reference;     // directory: initial weights and each step's batch (reference_export.hpp); 1 rank
};

// Throws longattn::Error naming the option (sizes against the world, divisibility, ranges).
void validate(const TrainConfig& config, int world_size);

// The phases of a step, each a Kokkos Tools region named "longattn-train: <phase>" (Kokkos
// Tools' space-time-stack, or Nsight Systems through the NVTX connector, show them) and timed
// on the host, a fence of the step's instance ending each. gradient reduction: waiting for the
// gradient all-reduces or reduce-scatters after backward, the sequence-parallel sums and the
// loss; optimizer: AdamW, with ZeRO's parameter all-gather. checkpoint and evaluation run after
// a step's time is taken and are not part of it.
enum class Phase { forward, backward, gradient_reduction, optimizer, checkpoint, evaluation };
inline constexpr int phase_count = 6;
const char* to_string(Phase phase);

struct StepRecord {
  int step = 0;  // 1-based
  double loss = 0, lr = 0, gradient_norm = 0, seconds = 0;
  double tokens_per_second = 0, gflops = 0, peak_fraction = 0;
  double communication_share = 0;  // waiting for all-reduces and ring transfers, of the step
  double loss_scale = 1;           // fp16: the scale this step's gradients carried
  bool skipped = false;            // fp16: the gradients overflowed; no update
  std::size_t memory_bytes = 0;    // the memory pool's high-water mark, largest over ranks (minus
                                   // model_state_bytes and bucket_bytes: activations and workspaces)
  std::array<double, phase_count> phase_seconds{};  // by Phase, the slowest rank's
};

struct EvalRecord {
  int step = 0;
  double loss = 0;
};

struct TrainResult {
  int dp = 1, cp = 1, tp = 1, first_step = 1;  // first_step > 1: resumed
  std::string transport;               // of the collectives on the model's memory (parallel::Transport)
  std::int64_t micro_batches = 1;      // per step on each rank
  std::size_t parameters = 0;          // the whole model's
  std::size_t model_state_bytes = 0;   // parameters, their gradients and AdamW's state (its shard
                                       // under ZeRO 1) of this rank's part of the model, per rank
  std::size_t bucket_bytes = 0;        // the gradient all-reduce's buffers, per rank
  // The pool's high-water mark of each memory::Category over the run (parameters, gradients, ...
  // in category.hpp's order), the largest over ranks; each category's own peak, so their sum may
  // exceed the whole's (StepRecord::memory_bytes).
  std::vector<std::pair<std::string, std::size_t>> memory_by_category;
  // Each category's bytes at the moment the categories together peaked, on the rank whose
  // high-water is the largest: what made the whole's peak.
  std::vector<std::pair<std::string, std::size_t>> memory_at_peak;
  double flops_per_step = 0, peak_gflops = 0;
  // Element-wise kernels' rate at the start, elements per second on a rank (the ranks' mean;
  // trainer.cpp, measure_element_rate).
  double element_rate = 0;
  // longattn-plan's memory per rank for this run (prediction.hpp), its terms by name; none when
  // the planner cannot describe the run.
  double predicted_memory_bytes = 0;
  std::vector<std::pair<std::string, double>> predicted_memory;
  // Its compute time per step on these ranks: hardware FLOPs / (ranks x FMA peak per rank x the
  // calibration's efficiencies), and the element-wise kernels where the calibration timed them;
  // its communication model (NVLink, InfiniBand) is not this machine's.
  double predicted_compute_seconds = 0;
  // Its parts: matrix products, attention, element-wise kernels.
  std::vector<std::pair<std::string, double>> predicted_compute_parts;
  // The elements each plan::ElementClass processes in a step on a rank (write_calibration.py
  // divides the class's measured time by them).
  std::vector<std::pair<std::string, double>> predicted_elements;
  double predicted_attention_flops = 0;  // the attention's FLOPs in a step on a rank (hardware: recomputed too)
  std::vector<StepRecord> steps;
  std::vector<EvalRecord> evals;
  nlohmann::json to_json(const TrainConfig& config) const;
};

// Collective over `world`. Rank 0 prints to `log` (nullptr: nothing). A step that fails on a
// rank (the memory limit reached, any longattn::Error before the optimizer's update) ends the
// run from that rank: it writes the last good state, the step's start, to config.checkpoint
// when there is one (not under ZeRO 1 with several ranks nor with tp > 1: no rank holds all of
// the state),
// then throws longattn::Error (one rank) or ends the job with MPI_Abort
// (several: the others may be waiting for it in a collective), its message naming the error,
// the step and the checkpoint. Built for
// Kokkos::DefaultExecutionSpace (src/trainer.cpp), the model in float, bfloat16 or float16 as
// config.precision says.
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
TrainResult run_training(const TrainConfig& config, const parallel::Communicator& world, std::ostream* log);

}  // namespace longattn::train
