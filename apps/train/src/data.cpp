#include "longattn/train/data.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>

#include "longattn/error.hpp"

namespace longattn::train {

std::string to_string(Task task) { return task == Task::text ? "text" : "long_range"; }

Dataset::Dataset(const DataConfig& config, std::int64_t context) : config_(config), context_(context) {
  const char* where = "longattn-train";
  require(context >= 2, where, "context", context, "at least 2 tokens");
  if (config.task == Task::long_range) {
    require(config.pairs >= 1 && config.pairs <= 64, where, "pairs", config.pairs, "a count in [1, 64] (64 distinct keys)");
    require(config.queries >= 1 && config.queries <= config.pairs, where, "queries", config.queries,
            "a count in [1, pairs = " + std::to_string(config.pairs) + "]");
    require(2 * std::int64_t(config.pairs + config.queries) < context, where, "pairs + queries",
            config.pairs + config.queries, "fewer than context / 2 = " + std::to_string(context / 2) + " (room for filler)");
    return;
  }
  require(config.validation > 0 && config.validation < 1, where, "validation", config.validation,
          "a fraction in (0, 1)");
  std::ifstream in(config.text, std::ios::binary);
  require(bool(in), where, "text", "\"" + config.text + "\"", "a readable file");
  text_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  train_bytes_ = std::size_t(std::floor(double(text_.size()) * (1 - config.validation)));
  const std::size_t need = std::size_t(context) + 1;
  require(train_bytes_ >= need && text_.size() - train_bytes_ >= need, where, "text",
          "\"" + config.text + "\" (" + std::to_string(text_.size()) + " bytes)",
          "a file whose train and validation parts each hold one sequence of context + 1 = " + std::to_string(need) +
              " bytes");
}

std::size_t Dataset::bytes(Split split) const {
  return split == Split::train ? train_bytes_ : text_.size() - train_bytes_;
}

void Dataset::fill_long_range(std::mt19937_64& rng, int* s) const {
  const std::int64_t n = context_ + 1;
  const int P = config_.pairs, Q = config_.queries;
  std::vector<int> keys(64);
  for (int i = 0; i < 64; ++i) keys[std::size_t(i)] = 128 + i;
  std::shuffle(keys.begin(), keys.end(), rng);
  std::vector<int> values(static_cast<std::size_t>(P));
  for (int i = 0; i < P; ++i) {
    values[std::size_t(i)] = 'a' + int(rng() % 26);
    s[2 * i] = keys[std::size_t(i)];
    s[2 * i + 1] = values[std::size_t(i)];
  }
  for (std::int64_t t = 2 * P; t < n - 2 * Q; ++t) s[t] = '0' + int(rng() % 10);
  // Distinct keys: a value asked twice could be copied from the first answer, nearby.
  std::vector<int> asked(static_cast<std::size_t>(P));
  for (int i = 0; i < P; ++i) asked[std::size_t(i)] = i;
  std::shuffle(asked.begin(), asked.end(), rng);
  for (int q = 0; q < Q; ++q) {
    const std::size_t i = std::size_t(asked[std::size_t(q)]);
    s[n - 2 * Q + 2 * q] = keys[i];
    s[n - 2 * Q + 2 * q + 1] = values[i];
  }
}

HostBatch Dataset::sample(Split split, std::mt19937_64& rng, std::int64_t sequences) const {
  const std::int64_t N = context_;
  HostBatch batch;
  batch.sequences = sequences;
  batch.tokens = N;
  batch.inputs.resize(std::size_t(sequences * N));
  batch.targets.resize(batch.inputs.size());
  batch.weights.assign(batch.inputs.size(), 0.0f);
  std::vector<int> s(std::size_t(N + 1));
  for (std::int64_t b = 0; b < sequences; ++b) {
    if (config_.task == Task::text) {
      const std::size_t begin = split == Split::train ? 0 : train_bytes_;
      const std::size_t offset = begin + std::size_t(rng() % std::uint64_t(bytes(split) - std::size_t(N)));
      for (std::int64_t t = 0; t <= N; ++t) s[std::size_t(t)] = text_[offset + std::size_t(t)];
    } else {
      fill_long_range(rng, s.data());
    }
    for (std::int64_t t = 0; t < N; ++t) {
      const std::size_t i = std::size_t(b * N + t);
      batch.inputs[i] = s[std::size_t(t)];
      batch.targets[i] = s[std::size_t(t + 1)];
      // long_range: the inputs at N - 2Q + 2q are the queried keys, their targets the values.
      const bool counted = config_.task == Task::text ||
                           (t >= N - 2 * config_.queries + 1 && (t - (N - 2 * config_.queries + 1)) % 2 == 0);
      batch.weights[i] = counted ? 1.0f : 0.0f;
    }
  }
  batch.weighted_tokens = config_.task == Task::text ? double(sequences * N) : double(sequences * config_.queries);
  return batch;
}

}  // namespace longattn::train
