#include "longattn/plan/report.hpp"

#include <algorithm>
#include <cstdio>
#include <string>

namespace longattn::plan {

namespace {

constexpr double gib = 1024.0 * 1024.0 * 1024.0;

std::string format(const char* pattern, double value) {
  char text[64];
  std::snprintf(text, sizeof(text), pattern, value);
  return text;
}

std::string duration(double seconds) {
  if (seconds >= 86400) return format("%.1f days", seconds / 86400);
  if (seconds >= 3600) return format("%.1f h", seconds / 3600);
  if (seconds >= 1) return format("%.2f s", seconds);
  return format("%.1f ms", seconds * 1e3);
}

std::string right(const std::string& text, std::size_t width) {
  return std::string(width - std::min(width, text.size()), ' ') + text;
}

std::string layout_text(const Estimate& e) {
  const Layout& l = e.plan.layout;
  char text[160];
  std::snprintf(text, sizeof(text), "tp %lld pp %lld dp %lld cp %lld zero %d mb %lld recompute %s",
                (long long)l.tensor, (long long)l.pipeline, (long long)l.data, (long long)l.context, l.zero_stage,
                (long long)l.micro_batch, to_string(e.plan.training.recompute));
  return text;
}

}  // namespace

void print_inputs(std::ostream& out, const Plan& plan) {
  const ModelConfig& m = plan.model;
  const TrainingConfig& t = plan.training;
  const ClusterConfig& c = plan.cluster;
  out << "model     layers " << m.layers << ", hidden " << m.hidden << ", heads " << m.heads << ", ffn " << m.ffn_size()
      << ", vocabulary " << m.vocabulary << ", sequence " << m.sequence << ", attention " << m.attention
      << (m.causal ? " (causal)" : " (not causal)") << ", " << to_string(m.positions) << " positions\n"
      << "training  " << format("%.4g", t.tokens) << " tokens, global batch " << t.global_batch_tokens << " tokens, "
      << to_string(t.precision) << ", " << to_string(t.optimizer) << "\n"
      << "cluster   " << c.gpus << " x " << c.gpu.name << " (" << format("%.1f", c.gpu.peak_flops_16bit / 1e12)
      << " TFLOP/s bf16, " << format("%.0f", c.gpu.memory_bytes / 1e9) << " GB, NVLink "
      << format("%.0f", c.gpu.nvlink_bandwidth / 1e9) << " GB/s, network " << format("%.0f", c.gpu.network_bandwidth / 1e9)
      << " GB/s per GPU, " << c.gpu.gpus_per_node << " per node), $" << format("%.2f", c.price_per_gpu_hour)
      << " per GPU-hour\n"
      << "efficiency matmul " << plan.efficiency.matmul << ", attention dense " << plan.efficiency.attention_dense
      << " / dilated " << plan.efficiency.attention_dilated << " / block-sparse " << plan.efficiency.attention_block_sparse
      << ": " << plan.efficiency.source << "\n";
}

void print_estimate(std::ostream& out, const Estimate& e) {
  out << "layout    " << layout_text(e) << "\n\n";
  out << "parameters " << format("%.4g", e.parameters) << " (" << format("%.4g", e.parameters_per_gpu)
      << " per GPU before ZeRO)\n\n";
  out << "memory per GPU\n";
  for (const Term& term : e.memory)
    out << format("  %8.2f GiB  ", term.value / gib) << term.name << ": " << term.formula << "\n";
  out << format("  %8.2f GiB  total, ", e.memory_total / gib) << format("%.2f GiB usable", e.memory_usable / gib)
      << "\n\nFLOPs\n";
  for (const Term& term : e.flops) out << format("  %10.4g  ", term.value) << term.name << ": " << term.formula << "\n";
  out << "\ntime per step\n";
  for (const Term& term : e.time)
    out << "  " << right(duration(term.value), 10) << "  " << term.name << ": " << term.formula << "\n";
  out << "  " << right(duration(e.step_seconds), 10) << "  step (" << format("%.0f", e.steps)
      << " steps), MFU " << format("%.3f", e.mfu) << " of peak end to end\n\n";
  out << "total     " << format("%.1f days", e.days) << ", " << format("%.4g GPU-hours", e.gpu_hours) << ", "
      << format("$%.4gM", e.cost / 1e6) << "\n";
  out << "verdict   " << e.verdict << "\n";
}

void print_ranking(std::ostream& out, const std::vector<Estimate>& ranked) {
  out << "   GPUs  layout                                                   GiB/GPU   step      days   cost       MFU\n";
  for (const Estimate& e : ranked) {
    char line[256];
    std::snprintf(line, sizeof(line), "  %5lld  %-55s  %6.1f  %8s  %6.1f  $%7.3gM  %.3f\n", (long long)e.plan.cluster.gpus,
                  layout_text(e).c_str(), e.memory_total / gib, duration(e.step_seconds).c_str(), e.days, e.cost / 1e6,
                  e.mfu);
    out << line;
  }
}

nlohmann::json to_json(const Plan& plan) {
  const ModelConfig& m = plan.model;
  const TrainingConfig& t = plan.training;
  const ClusterConfig& c = plan.cluster;
  const Layout& l = plan.layout;
  return {{"model",
           {{"layers", m.layers}, {"hidden", m.hidden}, {"heads", m.heads}, {"ffn", m.ffn_size()},
            {"vocabulary", m.vocabulary}, {"sequence", m.sequence}, {"attention", m.attention}, {"causal", m.causal},
            {"positions", to_string(m.positions)}}},
          {"training",
           {{"tokens", t.tokens}, {"global_batch_tokens", t.global_batch_tokens}, {"precision", to_string(t.precision)},
            {"optimizer", to_string(t.optimizer)}, {"recompute", to_string(t.recompute)}}},
          {"cluster",
           {{"gpus", c.gpus}, {"gpu", c.gpu.name}, {"peak_flops_16bit", c.gpu.peak_flops_16bit},
            {"peak_flops_tf32", c.gpu.peak_flops_tf32}, {"memory_bytes", c.gpu.memory_bytes},
            {"nvlink_bandwidth", c.gpu.nvlink_bandwidth}, {"network_bandwidth", c.gpu.network_bandwidth},
            {"gpus_per_node", c.gpu.gpus_per_node}, {"price_per_gpu_hour", c.price_per_gpu_hour},
            {"comm_efficiency", c.comm_efficiency}, {"memory_reserve", c.memory_reserve}}},
          {"layout",
           {{"tp", l.tensor}, {"pp", l.pipeline}, {"dp", l.data}, {"cp", l.context}, {"zero", l.zero_stage},
            {"micro_batch", l.micro_batch}, {"sequence_parallel", l.sequence_parallel},
            {"vocab_parallel", l.vocab_parallel}}},
          {"efficiency",
           {{"matmul", plan.efficiency.matmul},
            {"attention",
             {{"dense", plan.efficiency.attention_dense},
              {"dilated", plan.efficiency.attention_dilated},
              {"block_sparse", plan.efficiency.attention_block_sparse}}},
            {"source", plan.efficiency.source}}}};
}

nlohmann::json to_json(const Estimate& e) {
  const auto terms = [](const std::vector<Term>& list) {
    nlohmann::json out = nlohmann::json::array();
    for (const Term& term : list) out.push_back({{"name", term.name}, {"value", term.value}, {"formula", term.formula}});
    return out;
  };
  return {{"inputs", to_json(e.plan)},
          {"parameters", e.parameters},
          {"parameters_per_gpu", e.parameters_per_gpu},
          {"memory_bytes", terms(e.memory)},
          {"memory_total_bytes", e.memory_total},
          {"memory_usable_bytes", e.memory_usable},
          {"fits", e.fits},
          {"flops", terms(e.flops)},
          {"time_seconds", terms(e.time)},
          {"micro_batches", e.micro_batches},
          {"step_seconds", e.step_seconds},
          {"steps", e.steps},
          {"days", e.days},
          {"gpu_hours", e.gpu_hours},
          {"cost", e.cost},
          {"mfu", e.mfu},
          {"verdict", e.verdict}};
}

}  // namespace longattn::plan
