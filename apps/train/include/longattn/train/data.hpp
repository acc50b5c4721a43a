// What longattn-train learns from: the bytes of a text file, or a synthetic long-range task.
//
//   text        any file read as bytes (default: the GPL-3 text every Debian machine has); the
//               first (1 - validation) of it trains, the rest validates. A sequence is N + 1
//               consecutive bytes from a random offset: inputs the first N, targets the last N,
//               every token counts in the loss.
//   long_range  key-value recall over the whole sequence: `pairs` pairs (key, value) at the start,
//               random filler, and at the end `queries` distinct keys of them again; the loss counts only
//               the prediction of each queried key's value, which sits N - 2 (pairs + queries)
//               filler tokens back: only attention that reaches that far can learn it (keys are
//               bytes 128-191, values 'a'-'z', filler '0'-'9').
//
// A global batch is drawn on every rank from the same generator, so ranks agree on it without
// communication and each takes its part (its sequences, its tokens).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace longattn::train {

enum class Task { text, long_range };
std::string to_string(Task task);

struct DataConfig {
  Task task = Task::text;
  std::string text = "/usr/share/common-licenses/GPL-3";
  double validation = 0.1;  // fraction of the text
  int pairs = 1;            // long_range (more pairs: associative recall, learned much later)
  int queries = 1;          // long_range
};

enum class Split { train, validation };

// A global batch on the host: [sequences][tokens], row-major.
struct HostBatch {
  std::int64_t sequences = 0, tokens = 0;
  std::vector<int> inputs, targets;
  std::vector<float> weights;
  double weighted_tokens = 0;  // the loss's normalizer: the sum of the weights
};

class Dataset {
 public:
  // Reads the text (task text); throws longattn::Error naming the option on bad input (a missing
  // file, a split too short for one sequence, a task that does not fit the context).
  Dataset(const DataConfig& config, std::int64_t context);

  const DataConfig& config() const { return config_; }
  std::int64_t context() const { return context_; }
  std::size_t bytes(Split split) const;  // text: bytes in the split

  // `sequences` sequences of the split drawn with `rng`.
  HostBatch sample(Split split, std::mt19937_64& rng, std::int64_t sequences) const;

 private:
  void fill_long_range(std::mt19937_64& rng, int* sequence) const;  // context + 1 tokens

  DataConfig config_;
  std::int64_t context_;
  std::vector<unsigned char> text_;
  std::size_t train_bytes_ = 0;
};

}  // namespace longattn::train
