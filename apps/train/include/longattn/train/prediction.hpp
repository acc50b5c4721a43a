// What longattn-plan predicts for a longattn-train run: the planner's estimate for the trainer's
// model (learned positions, 256 bytes of vocabulary, MLP 4E, an LM head of its own, MAGNETO's
// sub-LayerNorm), precision (fp32 gradients), recomputation, grid (dp x cp x tp, no pipeline),
// ZeRO stage, micro-batch, the gradient reduction's type and the copies this build's kernels make
// (plan::KernelCopies). Its memory terms carry the names of the pool's categories
// (memory::Category), so that each measured category stands beside its prediction.
// The trainer prints its memory per rank beside the pool's measured high-water mark, and its
// compute time per step (on devices of the ranks' measured FMA peak, with config.efficiency)
// beside the steps' measured time less their communication.
#pragma once

#include "longattn/plan/estimate.hpp"
#include "longattn/train/trainer.hpp"

namespace longattn::train {

// Throws longattn::Error where the planner cannot describe the run (its validation).
// peak_flops: all ranks' FMA peak (0: the GPU table's). element_rate: the ranks' element-wise
// rate as the run starts (elements per second); where the calibration recorded its own, its
// element costs are scaled by the calibration's rate over this one (0: as calibrated).
plan::Estimate planner_estimate(const TrainConfig& config, int ranks, double peak_flops = 0, double element_rate = 0);

// The estimate's time term of that name (0 when absent).
double time_term(const plan::Estimate& estimate, const std::string& name);

}  // namespace longattn::train
