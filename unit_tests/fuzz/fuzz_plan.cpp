// libFuzzer target, structure-aware: longattn-plan's inputs after its command line or JSON config
// has parsed them (every field of a Plan: model, training, cluster, layout, efficiency, the
// attention spec's text), drawn by the fuzzer from plausible, extreme and non-finite values.
// Every plan is either refused by the planner's checks with longattn::Error or estimated (and
// printed, and searched on small clusters) without undefined behaviour: an overflow, a division
// by zero (UBSan), an exception other than longattn::Error, or a NaN in the figures it prints
// is a finding.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>

#include "longattn/error.hpp"
#include "longattn/plan/estimate.hpp"
#include "longattn/plan/report.hpp"

namespace {

using namespace longattn::plan;

std::int64_t integer(FuzzedDataProvider& in, std::int64_t typical) {
  switch (in.ConsumeIntegralInRange(0, 4)) {
    case 0: return typical;
    case 1: return in.ConsumeIntegralInRange<std::int64_t>(-2, 300);
    case 2: return std::int64_t(1) << in.ConsumeIntegralInRange(0, 62);
    case 3: return in.ConsumeIntegralInRange<std::int64_t>(1, 3) * typical;
    default: return in.ConsumeIntegral<std::int64_t>();
  }
}

double real(FuzzedDataProvider& in, double typical) {
  switch (in.ConsumeIntegralInRange(0, 4)) {
    case 0: return typical;
    case 1: return in.ConsumeProbability<double>();
    case 2: return in.PickValueInArray({0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity(), 1e300, 1e-300});
    case 3: return typical * in.ConsumeFloatingPointInRange<double>(0, 1e6);
    default: return in.ConsumeFloatingPoint<double>();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  Plan plan;
  ModelConfig& m = plan.model;
  m.layers = integer(in, 128);
  m.hidden = integer(in, 25600);
  m.heads = integer(in, 160);
  m.ffn = integer(in, 0);
  m.vocabulary = integer(in, 51200);
  m.sequence = integer(in, 2048);
  m.attention = in.PickValueInArray<std::string>({"dense", "auto", "dilated:w=2048,4096;r=1,2", "block_sparse:density=0.1",
                                                  "block_sparse:pattern=local_window;radius=512", ""});
  if (in.ConsumeBool()) m.attention = in.ConsumeRandomLengthString(48);
  m.causal = in.ConsumeBool();
  m.positions = in.ConsumeBool() ? Positions::rotary : Positions::learned;
  TrainingConfig& t = plan.training;
  t.tokens = real(in, 1e12);
  t.global_batch_tokens = integer(in, 4096000);
  t.precision = in.PickValueInArray({Precision::bf16, Precision::fp16, Precision::fp32});
  t.optimizer = in.PickValueInArray({Optimizer::adam, Optimizer::sgd_momentum, Optimizer::sgd});
  t.recompute = in.PickValueInArray({Recompute::none, Recompute::selective, Recompute::full});
  ClusterConfig& c = plan.cluster;
  c.gpus = integer(in, 400);
  c.gpu = gpu_table()[in.ConsumeIntegralInRange<std::size_t>(0, gpu_table().size() - 1)];
  if (in.ConsumeBool()) {  // --peak-tflops, --memory-gb, ... over the table's values
    c.gpu.peak_flops_16bit = real(in, c.gpu.peak_flops_16bit);
    c.gpu.memory_bytes = real(in, c.gpu.memory_bytes);
    c.gpu.nvlink_bandwidth = real(in, c.gpu.nvlink_bandwidth);
    c.gpu.network_bandwidth = real(in, c.gpu.network_bandwidth);
    c.gpu.gpus_per_node = integer(in, 8);
  }
  c.price_per_gpu_hour = real(in, 2.0);
  c.comm_efficiency = real(in, 0.75);
  c.memory_reserve = real(in, 0.1);
  Layout& l = plan.layout;
  l.tensor = integer(in, 8);
  l.pipeline = integer(in, 1);
  l.context = integer(in, 1);
  l.data = integer(in, 50);
  l.zero_stage = int(in.ConsumeIntegralInRange<std::int64_t>(-1, 4));
  l.micro_batch = integer(in, 1);
  const bool uniform = in.ConsumeBool();
  const double mfu = real(in, 0.45);
  const bool search_too = in.ConsumeBool();
  try {
    if (uniform) plan.efficiency = uniform_efficiency(mfu);  // --mfu
    validate_inputs(plan);
    if (search_too && plan.cluster.gpus <= 512) {
      const SearchResult result = search(plan, 3);
      std::ostringstream out;
      print_ranking(out, result.best);
    }
    validate_layout(plan);
    const Estimate e = estimate(plan);
    std::ostringstream out;
    print_estimate(out, e);
    (void)to_json(e).dump();
    if (std::isnan(e.memory_total) || std::isnan(e.step_seconds) || std::isnan(e.cost)) {  // a NaN printed as a figure
      std::fprintf(stderr, "NaN figures for the plan %s\n", to_json(plan).dump().c_str());
      std::abort();
    }
  } catch (const longattn::Error&) {
  }
  return 0;
}
