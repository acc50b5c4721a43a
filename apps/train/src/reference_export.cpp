#include "longattn/train/reference_export.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "longattn/error.hpp"

namespace longattn::train {

namespace {

constexpr const char* option = "export-reference";

template <class Value>
void write_values(std::ofstream& out, const std::vector<Value>& values) {
  out.write(reinterpret_cast<const char*>(values.data()), std::streamsize(values.size() * sizeof(Value)));
}

}  // namespace

ReferenceExport::ReferenceExport(const std::string& directory, const std::vector<NamedValues>& groups,
                                 std::int64_t sequences, std::int64_t tokens)
    : directory_(directory), sequences_(sequences), tokens_(tokens) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  require(!error, "longattn-train", option, "\"" + directory + "\"", "a directory that can be made (" + error.message() + ")");
  nlohmann::json index = {{"sequences", sequences}, {"tokens", tokens}, {"groups", nlohmann::json::array()}};
  std::ofstream weights(directory + "/weights.bin", std::ios::binary);
  std::size_t offset = 0;
  for (const NamedValues& g : groups) {
    index["groups"].push_back({{"name", g.name}, {"offset", offset}, {"count", g.values.size()}, {"decay", g.decay}});
    write_values(weights, g.values);
    offset += g.values.size();
  }
  std::ofstream json(directory + "/reference.json");
  json << index.dump(1) << "\n";
  batches_.open(directory + "/batches.bin", std::ios::binary);
  require(weights.good() && json.good() && batches_.good(), "longattn-train", option, "\"" + directory + "\"",
          "a directory whose files can be written");
}

void ReferenceExport::append(const HostBatch& batch) {
  require(batch.sequences == sequences_ && batch.tokens == tokens_, "longattn::train::ReferenceExport::append",
          "batch", std::to_string(batch.sequences) + " x " + std::to_string(batch.tokens),
          std::to_string(sequences_) + " x " + std::to_string(tokens_) + " (the run's global batch)");
  write_values(batches_, batch.inputs);
  write_values(batches_, batch.targets);
  write_values(batches_, batch.weights);
  batches_.flush();
  require(batches_.good(), "longattn-train", option, "\"" + directory_ + "\"", "a directory whose files can be written");
}

}  // namespace longattn::train
