// What longattn-plan predicts for a longattn-train run: the planner's estimate for the trainer's
// model (learned positions, 256 bytes of vocabulary, MLP 4E, an LM head of its own), precision,
// recomputation, grid (dp x cp, no tensor or pipeline parallelism), ZeRO stage and micro-batch.
// The trainer prints its memory per rank beside the pool's measured high-water mark.
#pragma once

#include "longattn/plan/estimate.hpp"
#include "longattn/train/trainer.hpp"

namespace longattn::train {

// Throws longattn::Error where the planner cannot describe the run (its validation).
plan::Estimate planner_estimate(const TrainConfig& config, int ranks);

}  // namespace longattn::train
