// What a reference implementation needs to train longattn-train's run step for step
// (perf_tests/reference_train.py: the same model in PyTorch): the initial weights and every
// step's global batch. Written by a one-rank run given --export-reference DIR:
//
//   DIR/reference.json  {"groups": [{"name", "offset", "count", "decay"}, ...]  the parameter groups
//                        in the model's order (model.hpp; decay: AdamW decays them),
//                        "sequences": B, "tokens": N}
//   DIR/weights.bin     the groups' initial values, float32, one after the other (offsets in values)
//   DIR/batches.bin     per step: inputs int32 [B, N], targets int32 [B, N], loss weights float32 [B, N]
//
// The run's own --json holds its losses to compare with.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "longattn/train/data.hpp"

namespace longattn::train {

struct NamedValues {
  std::string name;
  std::vector<float> values;
  bool decay;
};

class ReferenceExport {
 public:
  // Creates `directory` (and its parents) and writes reference.json and weights.bin; throws
  // longattn::Error naming --export-reference when it cannot.
  ReferenceExport(const std::string& directory, const std::vector<NamedValues>& groups, std::int64_t sequences,
                  std::int64_t tokens);
  // Appends one step's global batch to batches.bin (flushed: a run that stops keeps its steps).
  void append(const HostBatch& batch);

 private:
  std::string directory_;
  std::int64_t sequences_, tokens_;
  std::ofstream batches_;
};

}  // namespace longattn::train
