#include "longattn/plan/inputs.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "longattn/error.hpp"

namespace longattn::plan {

const std::vector<GpuSpec>& gpu_table() {
  static const std::vector<GpuSpec> table = {
      //  name   bf16 FLOP/s  TF32 FLOP/s  HBM bytes  HBM B/s   NVLink B/s  network B/s  per node
      {"h100", 989.4e12, 494.7e12, 80e9, 3.35e12, 450e9, 50e9, 8},
      {"h200", 989.4e12, 494.7e12, 141e9, 4.8e12, 450e9, 50e9, 8},
      {"a100", 312e12, 156e12, 80e9, 2.039e12, 300e9, 25e9, 8},
  };
  return table;
}

std::string gpu_names() {
  std::string names;
  for (const GpuSpec& gpu : gpu_table()) names += (names.empty() ? "" : ", ") + gpu.name;
  return names;
}

const GpuSpec& gpu_by_name(const std::string& name) {
  for (const GpuSpec& gpu : gpu_table())
    if (gpu.name == name) return gpu;
  throw_invalid_argument("longattn-plan", "gpu", "\"" + name + "\"", "one of " + gpu_names());
}

namespace {

const char* where = "longattn-plan";

void require_positive(double value, const char* name) {
  require(value > 0 && std::isfinite(value), where, name, value, "a positive finite number");
}
// A rate below `least` is no device: times become infinite, and a bubble of 0 times them NaN.
void require_rate(double value, double least, const char* name, const char* expected) {
  require(value >= least && std::isfinite(value), where, name, value, expected);
}
void require_fraction(double value, const char* name) {
  // Below 0.1% a rate is no estimate: times become infinite (and a price of 0 times them NaN).
  require(value >= 1e-3 && value <= 1, where, name, value, "a fraction in [0.001, 1]");
}

// Counts from 1 to 2^bits: far beyond any model or cluster, and small enough that the formulas'
// products of them stay inside 64-bit integers.
void require_count(std::int64_t value, int bits, const char* name) {
  require(value >= 1 && value <= (std::int64_t(1) << bits), where, name, value,
          "a count from 1 to 2^" + std::to_string(bits));
}

}  // namespace

void validate_inputs(const Plan& plan) {
  const ModelConfig& m = plan.model;
  require_count(m.layers, 16, "layers");
  require_count(m.hidden, 20, "hidden");
  require_count(m.heads, 20, "heads");
  require_count(m.vocabulary, 24, "vocabulary");
  require_count(m.sequence, 40, "sequence");
  require(m.ffn >= 0 && m.ffn <= (std::int64_t(1) << 22), where, "ffn", m.ffn,
          "a positive FFN size up to 2^22, or 0 for 4 x hidden");
  require(m.hidden % m.heads == 0, where, "heads", m.heads,
          "a divisor of hidden = " + std::to_string(m.hidden) + " (head dimension hidden / heads)");

  const TrainingConfig& t = plan.training;
  require_positive(t.tokens, "tokens");
  require(t.global_batch_tokens >= m.sequence && t.global_batch_tokens <= (std::int64_t(1) << 50) &&
              t.global_batch_tokens % m.sequence == 0,
          where,
          "global-batch-tokens", t.global_batch_tokens,
          "a whole number of sequences of " + std::to_string(m.sequence) + " tokens, up to 2^50");

  const ClusterConfig& c = plan.cluster;
  require_count(c.gpus, 24, "gpus");
  require_rate(c.gpu.peak_flops_16bit, 1e6, "gpu-peak-tflops", "a finite rate of at least 1e6 FLOP/s");
  require_rate(c.gpu.peak_flops_tf32, 1e6, "gpu-peak-tf32-tflops", "a finite rate of at least 1e6 FLOP/s");
  require_positive(c.gpu.memory_bytes, "gpu-memory-gb");
  require_rate(c.gpu.nvlink_bandwidth, 1e3, "nvlink-gbps", "a finite rate of at least 1e3 bytes/s");
  require_rate(c.gpu.network_bandwidth, 1e3, "network-gbps", "a finite rate of at least 1e3 bytes/s");
  require_count(c.gpu.gpus_per_node, 10, "gpus-per-node");
  require(c.price_per_gpu_hour >= 0, where, "price", c.price_per_gpu_hour, "a price >= 0 per GPU-hour");
  require_fraction(c.comm_efficiency, "comm-efficiency");
  require(c.memory_reserve >= 0 && c.memory_reserve < 1, where, "memory-reserve", c.memory_reserve,
          "a fraction in [0, 1)");

  const Efficiency& e = plan.efficiency;
  require_fraction(e.matmul, "efficiency.matmul");
  require_fraction(e.attention_dense, "efficiency.attention.dense");
  require_fraction(e.attention_dilated, "efficiency.attention.dilated");
  require_fraction(e.attention_block_sparse, "efficiency.attention.block_sparse");
}

void validate_layout(const Plan& plan) {
  const Layout& l = plan.layout;
  const ModelConfig& m = plan.model;
  require_positive(double(l.tensor), "tp");
  require_positive(double(l.pipeline), "pp");
  require_positive(double(l.data), "dp");
  require_positive(double(l.context), "cp");
  // The product, stopped once it passes the GPU count (it could overflow otherwise).
  std::int64_t gpus = 1;
  for (const std::int64_t factor : {l.tensor, l.pipeline, l.data, l.context})
    gpus = factor > plan.cluster.gpus / gpus ? plan.cluster.gpus + 1 : gpus * factor;
  std::ostringstream product;
  product << l.tensor << " x " << l.pipeline << " x " << l.data << " x " << l.context << " = "
          << (gpus > plan.cluster.gpus ? "more than " + std::to_string(plan.cluster.gpus) : std::to_string(gpus));
  require(gpus == plan.cluster.gpus, where, "tp x pp x dp x cp", product.str(),
          "the GPU count " + std::to_string(plan.cluster.gpus));
  require(plan.cluster.gpu.gpus_per_node % l.tensor == 0, where, "tp", l.tensor,
          "a divisor of the GPUs per node (" + std::to_string(plan.cluster.gpu.gpus_per_node) +
              "): tensor parallelism stays on NVLink");
  require(m.heads % l.tensor == 0 && m.hidden % l.tensor == 0 && m.ffn_size() % l.tensor == 0, where, "tp", l.tensor,
          "a divisor of heads (" + std::to_string(m.heads) + "), hidden (" + std::to_string(m.hidden) +
              ") and ffn (" + std::to_string(m.ffn_size()) + ")");
  require(m.layers % l.pipeline == 0, where, "pp", l.pipeline,
          "a divisor of layers = " + std::to_string(m.layers) + " (equal stages)");
  require(m.sequence % l.context == 0, where, "cp", l.context,
          "a divisor of sequence = " + std::to_string(m.sequence) + " (equal shards)");
  require(l.zero_stage >= 0 && l.zero_stage <= 3, where, "zero", l.zero_stage, "a ZeRO stage 0, 1, 2 or 3");
  require_positive(double(l.micro_batch), "micro-batch");
  const std::int64_t sequences = plan.training.global_batch_tokens / m.sequence;
  require(l.micro_batch <= sequences / l.data && sequences % (l.data * l.micro_batch) == 0, where, "micro-batch",
          l.micro_batch,
          "a size such that dp x micro-batch (" + std::to_string(l.data) + " x " + std::to_string(l.micro_batch) +
              ") divides the " + std::to_string(sequences) + " sequences of a global batch");
}

Efficiency uniform_efficiency(double mfu) {
  Efficiency e;
  e.matmul = e.attention_dense = e.attention_dilated = e.attention_block_sparse = mfu;
  e.source = "--mfu";
  require_fraction(mfu, "mfu");
  return e;
}

Efficiency read_calibration(const std::string& path) {
  std::ifstream in(path);
  require(bool(in), where, "calibration", "\"" + path + "\"", "a readable JSON file");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& error) {
    throw_invalid_argument(where, "calibration", "\"" + path + "\"", std::string("valid JSON (") + error.what() + ")");
  }
  const auto number = [&](const nlohmann::json& object, const char* key, const std::string& name, double most = 1) {
    require(object.is_object() && object.contains(key) && object[key].is_number(), where, "calibration",
            "\"" + path + "\"", "a number at \"" + name + "\"");
    const double value = object[key].get<double>();
    require(value > 0 && value <= most, where, "calibration " + name, value,
            most == 1 ? "a fraction of peak in (0, 1]" : "a fraction of peak in (0, 2]");
    return value;
  };
  Efficiency e;
  e.matmul = number(j, "matmul", "matmul");
  const nlohmann::json attention = j.is_object() && j.contains("attention") ? j["attention"] : nlohmann::json();
  e.attention_dense = number(attention, "dense", "attention.dense");
  e.attention_dilated = number(attention, "dilated", "attention.dilated");
  e.attention_block_sparse = number(attention, "block_sparse", "attention.block_sparse");
  if (j.contains("matmul_shapes")) {
    const nlohmann::json& shapes = j["matmul_shapes"];
    for (const auto& [key, table] : {std::pair<const char*, std::vector<Efficiency::Product>*>{"fp32", &e.matmul_fp32},
                                     {"16bit", &e.matmul_16bit}, {"fp16", &e.matmul_fp16}}) {
      const std::string name = std::string("matmul_shapes.") + key;
      if (table == &e.matmul_fp16 && shapes.is_object() && !shapes.contains(key)) continue;  // optional
      require(shapes.is_object() && shapes.contains(key) && shapes[key].is_array(), where, "calibration",
              """ + path + """, "an array at \"" + name + "\"");
      for (const nlohmann::json& row : shapes[key]) {
        require(row.is_array() && row.size() == 4 && row[0].is_number() && row[1].is_number() && row[2].is_number(),
                where, "calibration " + name, row.dump(), "[m, n, k, efficiency] with sizes >= 1");
        const double m = row[0].get<double>(), n = row[1].get<double>(), k = row[2].get<double>();
        require(m >= 1 && n >= 1 && k >= 1, where, "calibration " + name, row.dump(), "[m, n, k, efficiency] with sizes >= 1");
        // 16-bit products on a CPU are fractions of its FP32 FMA peak, which AVX512-BF16's dot
        // products (two products a lane) exceed by up to 2x.
        table->push_back({m, n, k, number(nlohmann::json{{"e", row[3]}}, "e", name + " efficiency",
                                          table == &e.matmul_fp32 ? 1 : 2)});
      }
    }
  }
  // Tables by precision ({"fp32": ..., "bf16": ..., "fp16": ...}): each one given, with its key.
  const auto each_precision = [&](const char* tables, const auto& read) {
    if (!j.contains(tables)) return;
    for (const Precision precision : {Precision::bf16, Precision::fp16, Precision::fp32})
      if (j[tables].is_object() && j[tables].contains(to_string(precision)))
        read(precision, to_string(precision), j[tables][to_string(precision)]);
  };
  each_precision("element_costs", [&](Precision precision, const char* key, const nlohmann::json& row) {
    ElementCosts values{};
    for (int c = 0; c < element_class_count; ++c) {
      const char* name = to_string(ElementClass(c));
      const std::string field = std::string("element_costs.") + key + "." + name;
      require(row.is_object() && row.contains(name) && row[name].is_number(), where, "calibration",
              "\"" + path + "\"", "a number at \"" + field + "\"");
      values[std::size_t(c)] = row[name].get<double>();
      require(values[std::size_t(c)] >= 0, where, "calibration " + field, values[std::size_t(c)],
              "a cost >= 0 (FLOP times per element)");
    }
    e.element_costs[std::size_t(precision)] = values;
  });
  each_precision("element_rates", [&](Precision precision, const char* key, const nlohmann::json& rate) {
    const std::string field = std::string("element_rates.") + key;
    require(rate.is_number() && rate.get<double>() > 0, where, "calibration " + field, rate.dump(),
            "elements per second > 0 (longattn-train's element probe)");
    e.element_rates[std::size_t(precision)] = rate.get<double>();
  });
  each_precision("attention_by_head_dim", [&](Precision precision, const char* key, const nlohmann::json& rows) {
    const std::string name = std::string("attention_by_head_dim.") + key;
    require(rows.is_array(), where, "calibration", "\"" + path + "\"", "an array at \"" + name + "\"");
    for (const nlohmann::json& row : rows) {
      require(row.is_array() && row.size() == 2 && row[0].is_number() && row[0].get<double>() >= 1, where,
              "calibration " + name, row.dump(), "[head dimension, efficiency] with a head dimension >= 1");
      e.attention_by_head_dim[std::size_t(precision)].push_back(
          {row[0].get<double>(), number(nlohmann::json{{"e", row[1]}}, "e", name + " efficiency")});
    }
  });
  each_precision("attention_by_length", [&](Precision precision, const char* key, const nlohmann::json& rows) {
    const std::string name = std::string("attention_by_length.") + key;
    require(rows.is_array(), where, "calibration", "\"" + path + "\"", "an array at \"" + name + "\"");
    for (const nlohmann::json& row : rows) {
      require(row.is_array() && row.size() == 2 && row[0].is_number() && row[0].get<double>() >= 1 &&
                  row[1].is_number() && row[1].get<double>() > 0 && row[1].get<double>() <= 4,
              where, "calibration " + name, row.dump(), "[tokens, factor] with tokens >= 1 and a factor in (0, 4]");
      e.attention_by_length[std::size_t(precision)].push_back({row[0].get<double>(), row[1].get<double>()});
    }
  });
  each_precision("attention_factors", [&](Precision precision, const char* key, const nlohmann::json& row) {
    Efficiency::AttentionFactors values;
    for (const auto& [name, value] :
         {std::pair<const char*, double*>{"dilated", &values.dilated}, {"block_sparse", &values.block_sparse},
          {"ring", &values.ring}, {"dilated_ring", &values.dilated_ring}}) {
      const std::string field = std::string("attention_factors.") + key + "." + name;
      if (value == &values.dilated_ring && row.is_object() && !row.contains(name)) continue;  // optional
      require(row.is_object() && row.contains(name) && row[name].is_number(), where, "calibration",
              "\"" + path + "\"", "a number at \"" + field + "\"");
      *value = row[name].get<double>();
      require(*value > 0 && *value <= 4, where, "calibration " + field, *value, "a factor in (0, 4]");
    }
    e.attention_factors[std::size_t(precision)] = values;
  });
  e.source = path + (j.contains("source") && j["source"].is_string() ? " (" + j["source"].get<std::string>() + ")" : "");
  return e;
}

double Efficiency::matmul_at(double m, double n, double k, Precision precision) const {
  const std::vector<Product>& table = precision == Precision::fp32                         ? matmul_fp32
                                      : precision == Precision::fp16 && !matmul_fp16.empty() ? matmul_fp16
                                                                                             : matmul_16bit;
  double best = matmul, distance = std::numeric_limits<double>::infinity();
  for (const Product& p : table) {
    const double d = std::pow(std::log(m / p.m), 2) + std::pow(std::log(n / p.n), 2) + std::pow(std::log(k / p.k), 2);
    if (d < distance) {
      distance = d;
      best = p.efficiency;
    }
  }
  return best;
}

namespace {
// The value of the row whose key is nearest `key` in log distance; `otherwise` for an empty table.
template <class Row>
double nearest_in_log(const std::vector<Row>& table, double key, double Row::*row_key, double Row::*value,
                      double otherwise) {
  if (table.empty()) return otherwise;
  const Row* nearest = &table.front();
  for (const Row& row : table)
    if (std::abs(std::log(key / row.*row_key)) < std::abs(std::log(key / nearest->*row_key))) nearest = &row;
  return nearest->*value;
}
}  // namespace

double Efficiency::dense_attention_at(double head_dim, Precision precision) const {
  return nearest_in_log(attention_by_head_dim[std::size_t(precision)], head_dim, &HeadDim::head_dim,
                        &HeadDim::efficiency, attention_dense);
}

double Efficiency::attention_length_factor(double tokens, Precision precision) const {
  return nearest_in_log(attention_by_length[std::size_t(precision)], tokens, &Length::tokens, &Length::factor, 1.0);
}

const char* to_string(ElementClass value) {
  static constexpr const char* names[element_class_count] = {"norm_forward", "norm_backward", "gelu_forward",
                                                             "gelu_backward", "rows", "rotary", "loss", "optimizer"};
  return names[int(value)];
}
const char* to_string(Positions value) { return value == Positions::rotary ? "rotary" : "learned"; }
const char* to_string(Precision value) {
  return value == Precision::bf16 ? "bf16" : value == Precision::fp16 ? "fp16" : "fp32";
}
const char* to_string(Optimizer value) {
  return value == Optimizer::adam ? "adam" : value == Optimizer::sgd_momentum ? "sgd_momentum" : "sgd";
}
const char* to_string(Recompute value) {
  return value == Recompute::none ? "none" : value == Recompute::selective ? "selective" : "full";
}

}  // namespace longattn::plan
