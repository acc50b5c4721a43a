// What longattn-plan predicts for a longattn-train run: the planner's estimate for the trainer's
// model (learned positions, 256 bytes of vocabulary, MLP 4E, an LM head of its own), precision,
// recomputation, grid (dp x cp, no tensor or pipeline parallelism), ZeRO stage and micro-batch.
// The trainer prints its memory per rank beside the pool's measured high-water mark, and its
// compute time per step (on devices of the ranks' measured FMA peak, with config.efficiency)
// beside the steps' measured time less their communication.
#pragma once

#include "longattn/plan/estimate.hpp"
#include "longattn/train/trainer.hpp"

namespace longattn::train {

// Throws longattn::Error where the planner cannot describe the run (its validation).
// peak_flops: all ranks' FMA peak (0: the GPU table's).
plan::Estimate planner_estimate(const TrainConfig& config, int ranks, double peak_flops = 0);

// The estimate's time term of that name (0 when absent).
double time_term(const plan::Estimate& estimate, const std::string& name);

}  // namespace longattn::train
