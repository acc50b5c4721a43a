// longattn-plan: what training a model with long-context attention costs. Memory per GPU,
// FLOPs, time per step, days and dollars for a model, a training run, a cluster and a parallel
// layout, every number with its formula; --search ranks the layouts that fit.
//
//   longattn-plan                                   the 1T-parameter model on 400 H100s, 2K context
//   longattn-plan --sequence 1048576 --attention "dilated:w=2048,...;r=1,..." --cp 64
//   longattn-plan --search --gpus 400,2000 --rank-by cost
//   longattn-plan --config plan.json --json out.json   (keys: the long option names)
#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "longattn/apps/cli_config.hpp"
#include "longattn/error.hpp"
#include "longattn/plan/estimate.hpp"
#include "longattn/plan/report.hpp"

using namespace longattn::plan;

int main(int argc, char** argv) {
  CLI::App app{"longattn-plan: memory, FLOPs, time and cost of training a transformer with long-context attention "
               "(formulas: Narayanan et al. 2021, Korthikanti et al. 2022, Rajbhandari et al. 2020; docs/feasibility.md)"};
  app.name("longattn-plan");
  app.option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);

  Plan plan;
  std::vector<std::int64_t> gpu_counts{plan.cluster.gpus};
  std::string gpu_name = "h100", calibration, json_path, config_path, rank_by = "time";
  double mfu = 0, peak_tflops = 0, peak_tf32_tflops = 0, memory_gb = 0, nvlink = 0, network = 0;
  std::int64_t gpus_per_node = 0, top = 5;
  bool do_search = false;
  plan.layout = {8, 1, 0, 1, 1, 1};  // dp 0: GPUs / (tp x pp x cp)

  // Named choices: the option holds the name, checked against the map's keys.
  const std::map<std::string, Positions> positions{{"rotary", Positions::rotary}, {"learned", Positions::learned}};
  const std::map<std::string, Precision> precisions{
      {"bf16", Precision::bf16}, {"fp16", Precision::fp16}, {"fp32", Precision::fp32}};
  const std::map<std::string, Optimizer> optimizers{
      {"adam", Optimizer::adam}, {"sgd_momentum", Optimizer::sgd_momentum}, {"sgd", Optimizer::sgd}};
  const std::map<std::string, Recompute> recomputes{
      {"none", Recompute::none}, {"selective", Recompute::selective}, {"full", Recompute::full}};
  std::string positions_name = to_string(plan.model.positions), precision_name = to_string(plan.training.precision);
  std::string optimizer_name = to_string(plan.training.optimizer), recompute_name = to_string(plan.training.recompute);
  const auto names = [](const auto& map) {
    std::vector<std::string> keys;
    for (const auto& entry : map) keys.push_back(entry.first);
    return CLI::IsMember(keys);
  };

  app.add_option("--config", config_path, "JSON file of options (keys: the long option names)");
  // Model
  app.add_option("--layers", plan.model.layers, "transformer layers L")->group("Model");
  app.add_option("--hidden", plan.model.hidden, "hidden size h")->group("Model");
  app.add_option("--heads", plan.model.heads, "attention heads a (dividing h)")->group("Model");
  app.add_option("--ffn", plan.model.ffn, "FFN size f (0: 4h)")->group("Model");
  app.add_option("--vocabulary", plan.model.vocabulary, "vocabulary size V")->group("Model");
  app.add_option("--sequence", plan.model.sequence, "sequence length s (context, tokens)")->group("Model");
  app.add_option("--attention", plan.model.attention,
                 "dense | dilated:w=<lengths>;r=<rates>[;mode=head_groups] | block_sparse:density=<fraction> | "
                 "block_sparse:pattern=<name>;<fields> | auto (the core's attention specs)")
      ->group("Model");
  app.add_option("--causal", plan.model.causal, "causal (decoder) attention")->group("Model");
  app.add_option("--positions", positions_name, "rotary (no parameters) or learned (s h parameters)")
      ->check(names(positions))->group("Model");
  // Training
  app.add_option("--tokens", plan.training.tokens, "training tokens")->group("Training");
  app.add_option("--global-batch-tokens", plan.training.global_batch_tokens, "tokens per optimizer step")->group("Training");
  app.add_option("--precision", precision_name, "bf16/fp16 (mixed, fp32 optimizer states) or fp32 (TF32 math)")
      ->check(names(precisions))->group("Training");
  app.add_option("--optimizer", optimizer_name, "adam, sgd_momentum or sgd")
      ->check(names(optimizers))->group("Training");
  app.add_option("--recompute", recompute_name, "activation recomputation: none, selective or full")
      ->check(names(recomputes))->group("Training");
  // Cluster
  app.add_option("--gpus", gpu_counts, "GPU count (with --search, a comma-separated list)")->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)->group("Cluster");
  app.add_option("--gpu", gpu_name, "GPU kind: " + gpu_names())->group("Cluster");
  app.add_option("--gpu-peak-tflops", peak_tflops, "override: dense bf16 TFLOP/s")->group("Cluster");
  app.add_option("--gpu-peak-tf32-tflops", peak_tf32_tflops, "override: dense TF32 TFLOP/s")->group("Cluster");
  app.add_option("--gpu-memory-gb", memory_gb, "override: HBM in GB")->group("Cluster");
  app.add_option("--nvlink-gb-s", nvlink, "override: NVLink GB/s per GPU and direction")->group("Cluster");
  app.add_option("--network-gb-s", network, "override: network GB/s per GPU and direction")->group("Cluster");
  app.add_option("--gpus-per-node", gpus_per_node, "override: GPUs per node")->group("Cluster");
  app.add_option("--price", plan.cluster.price_per_gpu_hour, "USD per GPU-hour")->group("Cluster");
  app.add_option("--comm-efficiency", plan.cluster.comm_efficiency, "achieved fraction of link bandwidth")->group("Cluster");
  app.add_option("--memory-reserve", plan.cluster.memory_reserve, "fraction of HBM kept free")->group("Cluster");
  // Layout
  app.add_option("--tp", plan.layout.tensor, "tensor-parallel size (within a node)")->group("Layout");
  app.add_option("--pp", plan.layout.pipeline, "pipeline stages")->group("Layout");
  app.add_option("--dp", plan.layout.data, "data-parallel size (0: GPUs / (tp x pp x cp))")->group("Layout");
  app.add_option("--cp", plan.layout.context, "context-parallel (ring attention) size")->group("Layout");
  app.add_option("--zero", plan.layout.zero_stage, "ZeRO stage 0-3")->group("Layout");
  app.add_option("--micro-batch", plan.layout.micro_batch, "sequences per micro-batch")->group("Layout");
  app.add_option("--sequence-parallel", plan.layout.sequence_parallel,
                 "with tp > 1, norms and residuals split over the sequence too (Megatron-LM; false: whole on each "
                 "tensor rank, as longattn-train without --sequence-parallel)")->group("Layout");
  app.add_option("--vocab-parallel", plan.layout.vocab_parallel,
                 "with tp > 1, embeddings and output layer split over the vocabulary (false: whole on each tensor "
                 "rank, as longattn-train)")->group("Layout");
  // Efficiency, search, output
  app.add_option("--mfu", mfu, "kernel efficiency while computing, fraction of peak (default 0.45)")->group("Efficiency");
  app.add_option("--calibration", calibration, "JSON of measured efficiencies (perf_tests/write_calibration.py)")
      ->group("Efficiency");
  app.add_flag("--search", do_search, "rank the layouts that fit instead of estimating one")->group("Search");
  app.add_option("--top", top, "layouts to print with --search")->group("Search");
  app.add_option("--rank-by", rank_by, "time or cost")->check(CLI::IsMember({"time", "cost"}))->group("Search");
  app.add_option("--json", json_path, "also write the estimate(s) as JSON to this file");

  try {
    longattn::apps::parse_with_config(app, argc, argv, "longattn-plan");
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  } catch (const longattn::Error& error) {
    std::cerr << "error: " << error.what() << "\n";
    return 2;
  }

  try {
    plan.model.positions = positions.at(positions_name);
    plan.training.precision = precisions.at(precision_name);
    plan.training.optimizer = optimizers.at(optimizer_name);
    plan.training.recompute = recomputes.at(recompute_name);
    plan.cluster.gpu = gpu_by_name(gpu_name);
    GpuSpec& gpu = plan.cluster.gpu;
    if (app.count("--gpu-peak-tflops")) gpu.peak_flops_16bit = peak_tflops * 1e12;
    if (app.count("--gpu-peak-tf32-tflops")) gpu.peak_flops_tf32 = peak_tf32_tflops * 1e12;
    if (app.count("--gpu-memory-gb")) gpu.memory_bytes = memory_gb * 1e9;
    if (app.count("--nvlink-gb-s")) gpu.nvlink_bandwidth = nvlink * 1e9;
    if (app.count("--network-gb-s")) gpu.network_bandwidth = network * 1e9;
    if (app.count("--gpus-per-node")) gpu.gpus_per_node = gpus_per_node;
    if (app.count("--calibration") && app.count("--mfu"))
      longattn::throw_invalid_argument("longattn-plan", "mfu", mfu, "either --mfu or --calibration, not both");
    if (app.count("--calibration")) plan.efficiency = read_calibration(calibration);
    if (app.count("--mfu")) plan.efficiency = uniform_efficiency(mfu);
    longattn::require(do_search || gpu_counts.size() == 1, "longattn-plan", "gpus", gpu_counts.size(),
                      "one GPU count (a list only with --search)");
    longattn::require(top >= 1, "longattn-plan", "top", top, "at least 1");

    nlohmann::json json;
    if (!do_search) {
      plan.cluster.gpus = gpu_counts[0];
      Layout& layout = plan.layout;
      if (layout.data == 0) {
        const std::int64_t others = layout.tensor * layout.pipeline * layout.context;
        longattn::require(others > 0 && plan.cluster.gpus % others == 0, "longattn-plan", "dp", "0 (derived)",
                          "tp x pp x cp = " + std::to_string(others) + " to divide the " +
                              std::to_string(plan.cluster.gpus) + " GPUs (or give --dp)");
        layout.data = plan.cluster.gpus / others;
      }
      const Estimate e = estimate(plan);
      print_inputs(std::cout, plan);
      print_estimate(std::cout, e);
      json = to_json(e);
    } else {
      print_inputs(std::cout, plan);
      std::vector<Estimate> ranked;
      json["searches"] = nlohmann::json::array();
      for (const std::int64_t gpus : gpu_counts) {
        plan.cluster.gpus = gpus;
        const SearchResult result = search(plan, std::size_t(top));
        std::cout << "search    " << gpus << " GPUs: " << result.evaluated << " layouts, " << result.fitting
                  << " fit in memory\n";
        if (result.fitting == 0 && result.evaluated > 0)
          std::cout << "          none fits; the least memory: " << result.smallest.verdict << "\n";
        ranked.insert(ranked.end(), result.best.begin(), result.best.end());
        json["searches"].push_back({{"gpus", gpus}, {"evaluated", result.evaluated}, {"fitting", result.fitting}});
      }
      std::sort(ranked.begin(), ranked.end(), [&](const Estimate& x, const Estimate& y) {
        return rank_by == "cost" ? x.cost < y.cost : x.days < y.days;
      });
      if (ranked.size() > std::size_t(top)) ranked.resize(std::size_t(top));
      json["ranked"] = nlohmann::json::array();
      for (const Estimate& e : ranked) json["ranked"].push_back(to_json(e));
      if (ranked.empty()) {
        std::cout << "verdict   no layout fits in memory on " << (gpu_counts.size() == 1 ? "these" : "any of these")
                  << " GPU counts\n";
      } else {
        std::cout << "\nbest " << ranked.size() << " by " << rank_by << ":\n";
        print_ranking(std::cout, ranked);
        std::cout << "\nthe best in detail:\n";
        print_estimate(std::cout, ranked.front());
      }
    }
    if (!json_path.empty()) {
      std::ofstream out(json_path);
      longattn::require(bool(out), "longattn-plan", "json", "\"" + json_path + "\"", "a writable file");
      out << json.dump(2) << "\n";
    }
  } catch (const longattn::Error& error) {
    std::cerr << "error: " << error.what() << "\n";
    return 2;
  }
  return 0;
}
