// Checkpoints of longattn-train: one file, written atomically.
//
//   line 1   "longattn-checkpoint 1"
//   line 2   JSON metadata (what the run was: model, data, batch; where it is: step, RNG state),
//            with the payload's size and FNV-1a 64 checksum
//   rest     the payload: raw bytes (parameters and optimizer moments, in the trainer's order)
//
// write_checkpoint writes PATH.tmp (made anew), fsyncs it, renames it over PATH and fsyncs the
// directory: a crash or a kill leaves the old checkpoint or the new one, never half of one (a
// half PATH.tmp at most, which the next write replaces). read_checkpoint refuses a
// file that is not one, is cut short or fails its checksum, with a longattn::Error saying which.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace longattn::train {

struct Checkpoint {
  nlohmann::json metadata;
  std::vector<unsigned char> payload;
};

std::uint64_t fnv1a64(const unsigned char* data, std::size_t size);

// `temporary_suffix` names the temporary (PATH + suffix); writers that may run at once give
// different ones.
void write_checkpoint(const std::string& path, const Checkpoint& checkpoint,
                      const std::string& temporary_suffix = ".tmp");
Checkpoint read_checkpoint(const std::string& path);

// Where a training run written to a checkpoint stands, read from its metadata and checked field
// by field (the metadata is not checksummed, and a checkpoint may come from anywhere).
struct ResumePoint {
  int step = 0;                      // 0-based step to start from
  std::int64_t optimizer_steps = 0;
  double loss_scale = 0;             // > 0 when written by an fp16 run
  int good_steps = 0;
  std::mt19937_64 rng;               // the engine that draws the next step's batch
};
// For a run of `steps` steps; throws longattn::Error naming the field and `path`.
ResumePoint resume_point(const nlohmann::json& metadata, int steps, const std::string& path);

}  // namespace longattn::train
