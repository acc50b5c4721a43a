// The training loop of longattn-train: a data-parallel x context-parallel grid of ranks trains a
// Transformer (model.hpp) on a Dataset (data.hpp) with AdamW (optimizer.hpp).
//
//   world of W ranks = dp x cp:  rank r is context rank r % cp of data-parallel group r / cp
//   each step: the global batch (`batch` sequences) is split over the dp groups; a context group
//   splits each of its sequences' tokens over its cp ranks, whose attention is ring attention
//   (or distributed dilated attention); every rank's parameter gradients are summed over the
//   world by the bucketed hierarchical all-reduce, overlapped with backward; every rank then
//   takes the same AdamW step.
//
// The loss is the mean over the global batch's weighted tokens whatever dp and cp are, so a run
// gives the same losses on any grid (up to rounding). The model, its gradients and the
// optimizer's moments live in the memory of the execution space, which runs every kernel:
// Kokkos::DefaultExecutionSpace (the GPU in a CUDA build: ring attention and the buckets then
// go through NCCL). Batches are made on the host and copied over; checkpoints are host copies.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "longattn/parallel/communicator.hpp"
#include "longattn/train/data.hpp"
#include "longattn/train/model.hpp"
#include "longattn/train/optimizer.hpp"

namespace longattn::train {

struct TrainConfig {
  ModelConfig model;
  DataConfig data;
  OptimizerConfig optimizer;
  int steps = 60;                   // the schedule's length
  std::int64_t batch = 16;          // sequences per step, over all data-parallel groups
  int cp = 1;                       // context-parallel ranks per sequence; dp = ranks / cp
  std::uint64_t data_seed = 1;      // the train and validation batches
  int eval_every = 20;              // steps between validation losses (0: only at the end)
  int eval_batches = 4;             // global batches per validation
  std::string checkpoint;           // file; empty: none
  int checkpoint_every = 0;         // steps (0: only when the run stops)
  bool resume = false;              // continue from `checkpoint`
  int stop_after = 0;               // stop after this step (a job's time limit); 0: run to `steps`
  double peak_gflops = 0;           // FMA peak of all ranks' cores; 0: measured at start
  bool quiet = false;               // no per-step lines
};

// Throws longattn::Error naming the option (sizes against the world, divisibility, ranges).
void validate(const TrainConfig& config, int world_size);

struct StepRecord {
  int step = 0;  // 1-based
  double loss = 0, lr = 0, gradient_norm = 0, seconds = 0;
  double tokens_per_second = 0, gflops = 0, peak_fraction = 0;
  double communication_share = 0;  // waiting for all-reduces and ring transfers, of the step
  std::size_t memory_bytes = 0;    // the memory pool's high-water mark, largest over ranks
};

struct EvalRecord {
  int step = 0;
  double loss = 0;
};

struct TrainResult {
  int dp = 1, cp = 1, first_step = 1;  // first_step > 1: resumed
  std::size_t parameters = 0;
  double flops_per_step = 0, peak_gflops = 0;
  std::vector<StepRecord> steps;
  std::vector<EvalRecord> evals;
  nlohmann::json to_json(const TrainConfig& config) const;
};

// Collective over `world`. Rank 0 prints to `log` (nullptr: nothing). Built for
// Kokkos::DefaultExecutionSpace (src/trainer.cpp).
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
TrainResult run_training(const TrainConfig& config, const parallel::Communicator& world, std::ostream* log);

}  // namespace longattn::train
