// longattn-plan's formulas against values worked by hand from the papers they come from, its
// end-to-end estimates against results the papers report, its block-sparse work counts against
// the core's layouts, the search, and its errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <limits>

#include "longattn/core/block_sparse_patterns.hpp"
#include "longattn/core/dilated_attention.hpp"
#include "longattn/error.hpp"
#include "longattn/plan/estimate.hpp"
#include "longattn/plan/formulas.hpp"

using namespace longattn::plan;
using Catch::Matchers::Contains;

namespace {

// Megatron-LM's GPT configurations (Narayanan21 Table 1; Korthikanti22 Table 3): learned
// positions, V = 51200, s = 2048, f = 4h.
ModelConfig megatron(std::int64_t layers, std::int64_t hidden, std::int64_t heads) {
  ModelConfig m;
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.vocabulary = 51200;
  m.sequence = 2048;
  m.positions = Positions::learned;
  m.causal = false;  // the papers count all s^2 scores
  return m;
}

double relative_error(double value, double expected) { return std::abs(value - expected) / std::abs(expected); }

const Term& term(const std::vector<Term>& terms, const std::string& name) {
  for (const Term& t : terms)
    if (t.name == name) return t;
  FAIL("no term " << name);
  return terms.front();
}

}  // namespace

TEST_CASE("Narayanan21: parameter counts of the 175B and 1T GPT configurations", "[plan]") {
  for (const auto& [layers, hidden, heads, billions] :
       {std::tuple{96, 12288, 96, 174.6}, std::tuple{128, 25600, 160, 1008.0}}) {
    const ModelConfig m = megatron(layers, hidden, heads);
    const double l = layers, h = hidden, V = 51200, s = 2048;
    // P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)), plus the final LayerNorm the paper leaves out.
    const double paper = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h));
    CHECK(model_parameters(m) == Approx(paper + 2 * h).epsilon(1e-12));
    CHECK(model_parameters(m) / 1e9 == Approx(billions).epsilon(5e-4));  // as Table 1 prints it
  }
}

TEST_CASE("Narayanan21 Eq. 3 and Korthikanti22: FLOPs per iteration", "[plan]") {
  Plan plan;
  plan.model = megatron(96, 12288, 96);
  plan.training.global_batch_tokens = 1536 * 2048;
  plan.training.recompute = Recompute::full;
  plan.cluster.gpus = 1024;
  plan.cluster.gpu = gpu_by_name("a100");
  plan.layout = {8, 8, 16, 1, 1, 1};
  const Estimate e = estimate(plan);
  const double B = 1536, s = 2048, L = 96, h = 12288, V = 51200;
  // Hardware FLOPs with full recomputation: Eq. 3 (ours counts the fused backward's recomputed
  // scores, 18 against 16 per layer and score, and the biases: within 0.5%).
  CHECK(relative_error(e.hardware_flops_per_step, narayanan_flops_per_iteration(B, s, L, h, V)) < 5e-3);
  // Model FLOPs: 72 B s L h^2 (1 + s/(6h) + V/(12 L h)).
  CHECK(relative_error(e.model_flops_per_step, korthikanti_model_flops_per_iteration(B, s, L, h, V)) < 5e-3);
  // Causal attention computes half the scores.
  Plan causal = plan;
  causal.model.causal = true;
  const double attention = term(e.flops, "attention per token").value;
  CHECK(term(estimate(causal).flops, "attention per token").value == Approx(attention * 2049.0 / 4096).epsilon(1e-9));
}

TEST_CASE("Narayanan21 Eq. 4: training time of the 175B and 1T runs (34 and 84 days)", "[plan]") {
  // 175B: 300B tokens, 1024 A100s at 140 TFLOP/s each; 1T: 450B tokens, 3072 A100s at 163.
  struct Run {
    std::int64_t layers, hidden, heads, gpus, tp, pp, dp, batch;
    double tokens, achieved, days;
  };
  for (const Run& run : {Run{96, 12288, 96, 1024, 8, 8, 16, 1536, 300e9, 140e12, 34},
                         Run{128, 25600, 160, 3072, 8, 64, 6, 3072, 450e9, 163e12, 84}}) {
    Plan plan;
    plan.model = megatron(run.layers, run.hidden, run.heads);
    plan.training.tokens = run.tokens;
    plan.training.global_batch_tokens = run.batch * 2048;
    plan.training.recompute = Recompute::full;
    plan.cluster.gpus = run.gpus;
    plan.cluster.gpu = gpu_by_name("a100");
    plan.layout = {run.tp, run.pp, run.dp, 1, 1, 1};
    plan.efficiency = uniform_efficiency(run.achieved / 312e12);
    const Estimate e = estimate(plan);
    const double eq4_days = narayanan_training_seconds(run.tokens, e.parameters, double(run.gpus), run.achieved) / 86400;
    CHECK(eq4_days == Approx(run.days).epsilon(0.01));  // the paper rounds to whole days
    // The X of Eq. 4 is achieved end to end, so the planner's compute time alone matches Eq. 3's
    // FLOPs at X (to 0.5%), and Eq. 4, which drops Eq. 3's s/(6h) and V/(16 L h), to 4%.
    const double compute_days = term(e.time, "compute").value * e.steps / 86400;
    const double eq3_days = e.steps *
                            narayanan_flops_per_iteration(double(run.batch), 2048, double(run.layers), double(run.hidden), 51200) /
                            (double(run.gpus) * run.achieved) / 86400;
    CHECK(relative_error(compute_days, eq3_days) < 5e-3);
    CHECK(relative_error(compute_days, eq4_days) < 0.04);
    CHECK(e.days > compute_days);  // plus bubble and exposed communication
  }
}

TEST_CASE("Narayanan21: pipeline bubble (p - 1) / m of the 1T run", "[plan]") {
  Plan plan;
  plan.model = megatron(128, 25600, 160);
  plan.training.global_batch_tokens = 3072 * 2048;
  plan.training.recompute = Recompute::full;
  plan.cluster.gpus = 3072;
  plan.cluster.gpu = gpu_by_name("a100");
  plan.layout = {8, 64, 6, 1, 1, 1};
  const Estimate e = estimate(plan);
  CHECK(e.micro_batches == 512);
  CHECK(pipeline_bubble_fraction(64, 512) == Approx(63.0 / 512));
  CHECK(term(e.time, "pipeline bubble").value == Approx(63.0 / 512 * term(e.time, "compute").value));
}

TEST_CASE("longattn's layer keeps Korthikanti22's 34 s b h; recomputation, tp and sequence parallelism split it", "[plan]") {
  // GPT-3 175B's layer (s 2048, b 1, h 12288, a 96), 16-bit; first without the sub-LayerNorm.
  const double rows = 2048, h = 12288, a = 96, sbh = rows * h;
  LayerShape x{rows, rows, h, 4 * h, a, 1, 2, false};
  const double per_row = 16 + 4 * a + 2;  // the norms' statistics, the LSE, a row of ones
  CHECK(layer_kept_bytes(x) == 32 * sbh + rows * per_row);
  x.sub_layer_norm = true;  // MAGNETO's Z and its statistics: Korthikanti's 34 s b h
  CHECK(layer_kept_bytes(x) == 34 * sbh + rows * (per_row + 8));
  // Selective recomputation drops A, Z, the LSE and Z's statistics: 30 s b h + small.
  CHECK(layer_kept_bytes(x) - attention_output_bytes(x) == 30 * sbh + rows * (16 + 2));
  x.sub_layer_norm = false;
  x.t = 8;  // Q, K, V, A, u, GELU(u) split; x, LN1, x2, LN2 (8 s b h) whole
  CHECK(layer_kept_bytes(x) == sbh * (8 + 24.0 / 8) + rows * (16 + 4 * a / 8 + 2));
  x.replicated = rows / 8;  // sequence parallelism splits those too
  CHECK(layer_kept_bytes(x) == sbh * 32 / 8 + rows / 8 * 16 + rows * (4 * a / 8 + 2));
  x.sub_layer_norm = true;
  CHECK(layer_kept_bytes(x) == sbh * 34 / 8 + rows / 8 * 16 + rows * (4 * a / 8 + 8 + 2));
  CHECK(attention_output_bytes(x) == rows * (2 * 2 * h / 8 + 4 * a / 8 + 8));
  // Backward's buffers: 3 s b h whole (here split) and s b f / t, a row of ones.
  CHECK(backward_buffer_bytes(x) == 2 * (3 * rows / 8 * h + rows * 4 * h / 8 + rows));
  CHECK(attention_backward_bytes(x) == rows * (2 * h / 8 * 5 + 4 * a / 8));
}

TEST_CASE("a 16-bit matrix product's operand copies", "[plan]") {
  using Gemm = KernelCopies::Gemm;
  CHECK(gemm_copy_bytes(Gemm::none, 4096, 1024, 4096) == 0);
  CHECK(gemm_copy_bytes(Gemm::float_operands, 4096, 1024, 4096) == 4 * (4096.0 * 1024 + 4096.0 * 4096 + 1024.0 * 4096));
  // bf16 panels along the depth of the largest of forward (I), dW (R) and dx (O).
  CHECK(gemm_copy_bytes(Gemm::bf16_panels, 100, 10, 1000) == 2 * (100.0 + 10) * 1000);
}

TEST_CASE("Rajbhandari20: model-state memory of Figure 1 and Table 1", "[plan]") {
  // Figure 1: Psi = 7.5B, N_d = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
  const double psi = 7.5e9;
  const double expected[] = {120e9, 31.4e9, 16.6e9, 1.9e9};
  for (int stage = 0; stage <= 3; ++stage)
    CHECK(model_state_bytes(psi, 64, stage, Precision::bf16, Optimizer::adam).total() ==
          Approx(expected[stage]).margin(0.05e9));
  // Table 1: a 1T-parameter model on 1024 GPUs with all three: 15.6 GB per device.
  CHECK(model_state_bytes(1e12, 1024, 3, Precision::bf16, Optimizer::adam).total() == Approx(15.6e9).margin(0.05e9));
  // fp32 training keeps no master copy: 4 + 4 + 8 bytes for Adam.
  CHECK(model_state_bytes(1, 1, 0, Precision::fp32, Optimizer::adam).total() == 16);
  CHECK(model_state_bytes(1, 1, 0, Precision::bf16, Optimizer::sgd).total() == 8);
}

TEST_CASE("block-sparse work is the core layouts' kept blocks", "[plan]") {
  using Exec = Kokkos::DefaultHostExecutionSpace;
  const std::int64_t tokens = 64 * 37 + 19;  // odd: a short last block
  struct Case {
    std::string spec;
    longattn::BlockSparseConfig config;
  };
  std::vector<Case> cases;
  const auto add = [&](std::string spec, auto&& set) {
    Case c{spec, {}};
    set(c.config);
    cases.push_back(c);
  };
  using P = longattn::BlockSparsePattern;
  add("block_sparse:pattern=full", [](auto& c) { c.pattern = P::full; });
  add("block_sparse:pattern=local_window;radius=200", [](auto& c) { c.pattern = P::local_window, c.radius = 200; });
  add("block_sparse:pattern=local_window;radius=0", [](auto& c) { c.pattern = P::local_window, c.radius = 0; });
  add("block_sparse:pattern=dilated;rates=1,3,8,3", [](auto& c) { c.pattern = P::dilated, c.rates = {1, 3, 8, 3}; });
  add("block_sparse:pattern=global_local;global=100;radius=64",
      [](auto& c) { c.pattern = P::global_local, c.global_tokens = 100, c.radius = 64; });
  add("block_sparse:pattern=random;density=0.3", [](auto& c) { c.pattern = P::random, c.density = 0.3; });
  add("block_sparse:density=0.05", [](auto& c) { c.pattern = P::random, c.density = 0.05; });
  for (const Case& c : cases)
    for (const bool causal : {false, true}) {
      INFO(c.spec << (causal ? " causal" : ""));
      ModelConfig m;
      m.sequence = tokens;
      m.heads = 4;
      m.hidden = 256;
      m.attention = c.spec;
      m.causal = causal;
      Kokkos::View<float****, Exec> q("q", 1, tokens, 1, 8);
      const auto layout = longattn::block_sparse_layout(Exec(), c.config, q, q, causal);
      CHECK(attention_work(m).scores == double(layout.kept_blocks()) * 64 * 64 * m.heads);
    }
}

TEST_CASE("dense and dilated work, and what context parallelism and recomputation change", "[plan]") {
  Plan plan;
  plan.model.sequence = 1 << 20;
  plan.model.attention = "dilated:w=2048,8192,65536,1048576;r=1,4,32,512";
  plan.training.global_batch_tokens = 4 << 20;
  plan.cluster.gpus = 256;
  plan.layout = {8, 1, 1, 32, 1, 1};
  const AttentionWork work = attention_work(plan.model);
  CHECK(work.scores == longattn::dilated_attention_scores(1 << 20, 160, {{2048, 8192, 65536, 1048576}, {1, 4, 32, 512}}, true));
  REQUIRE(work.dilated_levels.size() == 4);
  CHECK(work.dilated_levels[3].heads == 160);  // longnet: every head every configuration
  const Estimate base = estimate(plan, work);
  CHECK(term(base.time, "context-parallel communication").value > 0);  // 65536 and 1M span shards of 32768

  Plan wider = plan;  // twice the context parallelism: half the activations per GPU
  wider.cluster.gpus = 512;
  wider.layout.context = 64;
  CHECK(term(estimate(wider).memory, "activations").value ==
        Approx(term(base.memory, "activations").value / 2).epsilon(0.01));

  double previous = 1e300;
  for (const Recompute r : {Recompute::none, Recompute::selective, Recompute::full}) {
    Plan p = plan;
    p.training.recompute = r;
    const double bytes = term(estimate(p).memory, "activations").value;
    CHECK(bytes < previous);
    previous = bytes;
  }
  Plan fast_network = plan;  // with a network too fast to see, nothing is exposed
  fast_network.cluster.gpu.network_bandwidth = fast_network.cluster.gpu.nvlink_bandwidth = 1e30;
  const Estimate quiet = estimate(fast_network);
  CHECK(term(quiet.time, "context-parallel communication").value < 1e-9);
  CHECK(quiet.step_seconds < base.step_seconds);

  Plan dense = plan;  // ring attention for dense: 1M-token dense attention is mostly compute
  dense.model.attention = "dense";
  const Estimate d = estimate(dense);
  // 1M-token dense attention: 2.1e13 FLOPs per token against the dense part's 6e12.
  CHECK(term(d.flops, "attention per token").value > 3 * term(d.flops, "dense per token").value);
  CHECK(d.model_flops_per_step > 4 * base.model_flops_per_step);
  CHECK(term(d.memory, "communication buffers").formula.find("ring") != std::string::npos);
}

TEST_CASE("search: every layout it returns fits, uses every GPU and is no slower than the next", "[plan]") {
  Plan plan;  // the 1T model, 2K context, on 400 H100s
  const SearchResult result = search(plan, 8);
  REQUIRE(result.fitting > 0);
  REQUIRE(!result.best.empty());
  for (std::size_t i = 0; i < result.best.size(); ++i) {
    const Estimate& e = result.best[i];
    CHECK(e.fits);
    CHECK(e.plan.layout.gpus() == 400);
    CHECK(e.memory_total <= e.memory_usable);
    if (i > 0) CHECK(result.best[i - 1].step_seconds <= e.step_seconds);
  }
  // The default layout (tp 8, dp 50, ZeRO-1) does not fit: parameters alone need 252 GB per GPU.
  plan.layout = {8, 1, 50, 1, 1, 1};
  const Estimate naive = estimate(plan);
  CHECK_FALSE(naive.fits);
  CHECK_THAT(naive.verdict, Contains("does NOT fit"));
  // A model that fits nowhere: 1T parameters on 8 GPUs.
  plan.cluster.gpus = 8;
  const SearchResult none = search(plan, 3);
  CHECK(none.fitting == 0);
  CHECK(none.best.empty());
  CHECK(none.evaluated > 0);
  CHECK_FALSE(none.smallest.fits);
}

TEST_CASE("bad input is refused with what is valid", "[plan][errors]") {
  const auto fails = [](auto&& change, const std::string& message) {
    Plan plan;
    plan.layout = {8, 1, 50, 1, 1, 1};
    change(plan);
    INFO(message);
    CHECK_THROWS_WITH(estimate(plan), Contains(message));
  };
  fails([](Plan& p) { p.model.heads = 7; }, "argument 'heads' is 7, expected a divisor of hidden = 25600");
  fails([](Plan& p) { p.model.layers = 0; }, "argument 'layers' is 0, expected a count from 1 to 2^16");
  fails([](Plan& p) { p.model.hidden = std::int64_t(1) << 61; },
        "argument 'hidden' is 2305843009213693952, expected a count from 1 to 2^20");  // found by fuzz_plan
  fails([](Plan& p) { p.cluster.gpu.memory_bytes = std::numeric_limits<double>::infinity(); },
        "argument 'gpu-memory-gb' is inf, expected a positive finite number");  // found by fuzz_plan
  fails([](Plan& p) { p.model.hidden = -5; }, "argument 'hidden' is -5");
  fails([](Plan& p) { p.layout.data = 49; }, "argument 'tp x pp x dp x cp' is 8 x 1 x 49 x 1 = 392, expected the GPU count 400");
  fails([](Plan& p) { p.layout = {3, 1, 50, 1, 1, 1}; p.cluster.gpus = 150; }, "argument 'tp' is 3, expected a divisor of the GPUs per node (8)");
  fails([](Plan& p) { p.layout = {8, 3, 50, 1, 1, 1}; p.cluster.gpus = 1200; }, "argument 'pp' is 3, expected a divisor of layers = 128");
  fails([](Plan& p) { p.layout.zero_stage = 4; }, "argument 'zero' is 4, expected a ZeRO stage 0, 1, 2 or 3");
  fails([](Plan& p) { p.training.global_batch_tokens = 1000; }, "argument 'global-batch-tokens' is 1000");
  fails([](Plan& p) { p.efficiency.matmul = 1.5; }, "argument 'efficiency.matmul' is 1.5, expected a fraction in [0.001, 1]");
  fails([](Plan& p) { p.cluster.comm_efficiency = 1e-300; },
        "argument 'comm-efficiency' is 1e-300, expected a fraction in [0.001, 1]");  // found by fuzz_plan
  fails([](Plan& p) { p.cluster.gpu.peak_flops_16bit = 1e-300; },  // found by fuzz_plan: an infinite step, NaN bubble
        "argument 'gpu-peak-tflops' is 1e-300, expected a finite rate of at least 1e6 FLOP/s");
  fails([](Plan& p) { p.model.attention = "sparse"; }, "dense, auto, dilated:w=");
  CHECK_THROWS_WITH(gpu_by_name("v100"), Contains("argument 'gpu' is \"v100\", expected one of h100, h200, a100"));
  CHECK_THROWS_WITH(uniform_efficiency(0), Contains("argument 'mfu' is 0"));
}

TEST_CASE("calibration files: read, and refused when a value is missing or not a fraction", "[plan][errors]") {
  const std::string path = "longattn_plan_test_calibration.json";
  std::ofstream(path) << R"({"matmul": 0.6, "attention": {"dense": 0.5, "dilated": 0.4, "block_sparse": 0.3}, "source": "test"})";
  const Efficiency e = read_calibration(path);
  CHECK(e.matmul == 0.6);
  CHECK(e.attention_dilated == 0.4);
  CHECK_THAT(e.source, Contains("test"));
  std::ofstream(path) << R"({"matmul": 0.6, "attention": {"dense": 1.7, "dilated": 0.4, "block_sparse": 0.3}})";
  CHECK_THROWS_WITH(read_calibration(path), Contains("argument 'calibration attention.dense' is 1.7"));
  std::ofstream(path) << R"({"matmul": 0.6})";
  CHECK_THROWS_WITH(read_calibration(path), Contains("a number at \"attention.dense\""));
  // A table of products by shape: each product takes the nearest measured shape's efficiency.
  const std::string attention = R"("matmul": 0.6, "attention": {"dense": 0.5, "dilated": 0.4, "block_sparse": 0.3})";
  std::ofstream(path) << "{" << attention
                      << R"(, "matmul_shapes": {"fp32": [[256, 64, 64, 0.2], [4096, 1024, 1024, 0.8]], "16bit": [[256, 64, 64, 0.1]]}})";
  const Efficiency shaped = read_calibration(path);
  CHECK(shaped.matmul_at(300, 70, 60, Precision::fp32) == 0.2);
  CHECK(shaped.matmul_at(8192, 2048, 512, Precision::fp32) == 0.8);
  CHECK(shaped.matmul_at(8192, 2048, 512, Precision::bf16) == 0.1);
  CHECK(shaped.matmul_at(8192, 2048, 512, Precision::fp16) == 0.1);  // no fp16 table: the 16-bit one
  CHECK(e.matmul_at(8192, 2048, 512, Precision::bf16) == 0.6);  // no table: the one matmul efficiency
  // fp16 apart (a CPU's fp16 products run on float copies); 16-bit products may reach 2x a CPU's FP32 peak.
  std::ofstream(path) << "{" << attention
                      << R"(, "matmul_shapes": {"fp32": [[256, 64, 64, 0.2]], "16bit": [[256, 64, 64, 1.6]], "fp16": [[256, 64, 64, 0.15]]}})";
  const Efficiency halves = read_calibration(path);
  CHECK(halves.matmul_at(256, 64, 64, Precision::bf16) == 1.6);
  CHECK(halves.matmul_at(256, 64, 64, Precision::fp16) == 0.15);
  std::ofstream(path) << "{" << attention << R"(, "matmul_shapes": {"fp32": [[256, 64, 0.2]], "16bit": []}})";
  CHECK_THROWS_WITH(read_calibration(path), Contains("expected [m, n, k, efficiency] with sizes >= 1"));
  std::ofstream(path) << "{" << attention << R"(, "matmul_shapes": {"fp32": [[256, 64, 64, 1.5]], "16bit": []}})";
  CHECK_THROWS_WITH(read_calibration(path), Contains("matmul_shapes.fp32 efficiency' is 1.5"));
  std::ofstream(path) << "{" << attention << R"(, "matmul_shapes": {"fp32": []}})";
  CHECK_THROWS_WITH(read_calibration(path), Contains("an array at \"matmul_shapes.16bit\""));
  // Element-wise costs, per precision; a precision left out is not timed.
  const std::string classes = R"("norm_forward": 10, "norm_backward": 20, "gelu_forward": 30, "gelu_backward": 40,
                                 "rows": 5, "rotary": 8, "loss": 6)";
  std::ofstream(path) << "{" << attention << R"(, "element_costs": {"bf16": {)" << classes << R"(, "optimizer": 7}}})";
  const Efficiency costed = read_calibration(path);
  REQUIRE(costed.element_costs[int(Precision::bf16)]);
  CHECK((*costed.element_costs[int(Precision::bf16)])[int(ElementClass::gelu_backward)] == 40);
  CHECK((*costed.element_costs[int(Precision::bf16)])[int(ElementClass::optimizer)] == 7);
  CHECK((*costed.element_costs[int(Precision::bf16)])[int(ElementClass::rotary)] == 8);
  CHECK(costed.element_rates[int(Precision::bf16)] == 0);  // not recorded
  std::ofstream(path) << "{" << attention << R"(, "element_rates": {"fp16": 2.5e9}})";
  CHECK(read_calibration(path).element_rates[int(Precision::fp16)] == 2.5e9);
  std::ofstream(path) << "{" << attention << R"(, "element_rates": {"fp16": -1}})";
  CHECK_THROWS_WITH(read_calibration(path), Contains("element_rates.fp16") && Contains("elements per second > 0"));
  CHECK_FALSE(costed.element_costs[int(Precision::fp32)]);
  std::ofstream(path) << "{" << attention << R"(, "element_costs": {"fp16": {)" << classes << "}}}";
  CHECK_THROWS_WITH(read_calibration(path), Contains("a number at \"element_costs.fp16.optimizer\""));
  std::ofstream(path) << "{" << attention << R"(, "element_costs": {"fp32": {)" << classes << R"(, "optimizer": -1}}})";
  CHECK_THROWS_WITH(read_calibration(path), Contains("argument 'calibration element_costs.fp32.optimizer' is -1"));
  // Dense attention by head dimension: the nearest's, scaled by the kind's against dense's.
  std::ofstream(path) << "{" << attention << R"(, "attention_by_head_dim": {"fp32": [[16, 0.2], [128, 0.4]]}})";
  const Efficiency by_head = read_calibration(path);
  CHECK(by_head.dense_attention_at(20, Precision::fp32) == 0.2);
  CHECK(by_head.dense_attention_at(64, Precision::fp32) == 0.4);  // 64: nearer 128 in log
  CHECK(by_head.dense_attention_at(64, Precision::bf16) == 0.5);  // no bf16 table: attention_dense
  std::ofstream(path) << "{" << attention << R"(, "attention_factors": {"bf16": {"dilated": 0.5, "block_sparse": 0.7, "ring": 0.8}}})";
  const Efficiency factored = read_calibration(path);
  REQUIRE(factored.attention_factors[int(Precision::bf16)]);
  CHECK(factored.attention_factors[int(Precision::bf16)]->ring == 0.8);
  CHECK_FALSE(factored.attention_factors[int(Precision::fp16)]);
  std::ofstream(path) << "{" << attention << R"(, "attention_factors": {"fp16": {"dilated": 0.5, "block_sparse": 0.7}}})";
  CHECK_THROWS_WITH(read_calibration(path), Contains("a number at \"attention_factors.fp16.ring\""));
  CHECK(factored.attention_factors[int(Precision::bf16)]->dilated_ring == 1);  // optional: 1
  std::ofstream(path) << "{" << attention
                      << R"(, "attention_factors": {"bf16": {"dilated": 0.5, "block_sparse": 0.7, "ring": 0.8, "dilated_ring": 0.6}}})";
  CHECK(read_calibration(path).attention_factors[int(Precision::bf16)]->dilated_ring == 0.6);
  std::ofstream(path) << "{" << attention << R"(, "attention_factors": {"fp32": {"dilated": 0, "block_sparse": 1, "ring": 1}}})";
  CHECK_THROWS_WITH(read_calibration(path), Contains("argument 'calibration attention_factors.fp32.dilated' is 0"));
  // Dense attention by length: the nearest length's factor; none given, 1.
  std::ofstream(path) << "{" << attention << R"(, "attention_by_length": {"fp16": [[64, 0.4], [512, 1], [2048, 1.2]]}})";
  const Efficiency by_length = read_calibration(path);
  CHECK(by_length.attention_length_factor(100, Precision::fp16) == 0.4);
  CHECK(by_length.attention_length_factor(4096, Precision::fp16) == 1.2);
  CHECK(by_length.attention_length_factor(100, Precision::fp32) == 1);
  std::ofstream(path) << "{" << attention << R"(, "attention_by_length": {"fp32": [[64, 0]]}})";
  CHECK_THROWS_WITH(read_calibration(path), Contains("expected [tokens, factor] with tokens >= 1 and a factor in (0, 4]"));
  std::ofstream(path) << "{" << attention << R"(, "attention_by_head_dim": {"fp32": [[0, 0.2]]}})";
  CHECK_THROWS_WITH(read_calibration(path), Contains("expected [head dimension, efficiency] with a head dimension >= 1"));
  std::remove(path.c_str());
  CHECK_THROWS_WITH(read_calibration(path), Contains("a readable JSON file"));
}

TEST_CASE("element-wise kernels: the elements of each class, worked by hand, at their measured costs", "[plan]") {
  // One layer of E 64, 2 heads, MLP 256, V 256, 128 tokens, 2 sequences a step in one micro-
  // batch, one GPU of 1 GFLOP/s, fp32, no recomputation, MAGNETO's sub-LayerNorm.
  Plan plan;
  plan.model.layers = 1;
  plan.model.hidden = 64;
  plan.model.heads = 2;
  plan.model.vocabulary = 256;
  plan.model.sequence = 128;
  plan.model.positions = Positions::learned;
  plan.model.tied_embeddings = false;
  plan.model.sub_layer_norm = true;
  plan.training.global_batch_tokens = 2 * 128;
  plan.training.precision = Precision::fp32;
  plan.training.recompute = Recompute::none;
  plan.cluster.gpus = 1;
  plan.cluster.gpu.peak_flops_tf32 = plan.cluster.gpu.peak_flops_16bit = 1e9;
  plan.layout = {1, 1, 1, 1, 0, 2};
  const double R = 256, h = 64, f = 256, V = 256;
  const auto count = [](const Estimate& e, ElementClass c) { return term(e.elements, to_string(c)).value; };
  Estimate e = estimate(plan);
  CHECK(count(e, ElementClass::norm_forward) == 3 * R * h + R * h);  // LN1, LN2, the sub-LN; the final norm
  CHECK(count(e, ElementClass::norm_backward) == 4 * R * h);
  CHECK(count(e, ElementClass::gelu_forward) == R * f);
  CHECK(count(e, ElementClass::gelu_backward) == R * f);
  // Bias adds on Q, K, V, the projection and the MLP, forward and backward; the MLP's residual
  // add forward (the others are in the norms' kernels); the embeddings.
  CHECK(count(e, ElementClass::rows) == 2 * R * (3 * h + 2 * h + f) + R * h + 2 * R * h);
  // Rotary positions turn Q and K forward and back, an angle a token and pair of features
  // (D = 32) for every head; and have no parameters.
  CHECK(count(e, ElementClass::rotary) == 0);
  plan.model.positions = Positions::rotary;
  CHECK(count(estimate(plan), ElementClass::rotary) == 2 * R * 32 / 2);
  CHECK(count(estimate(plan), ElementClass::rows) == count(e, ElementClass::rows));
  CHECK(e.parameters - estimate(plan).parameters == 128 * h);
  plan.model.positions = Positions::learned;
  // ZeRO 2 over two data-parallel GPUs (each its own sequence) copies every gradient into the
  // reduce-scatter's buckets once a micro-batch.
  plan.cluster.gpus = 2;
  plan.layout = {1, 1, 2, 1, 2, 1};
  const Estimate zero2 = estimate(plan);
  CHECK(count(zero2, ElementClass::rows) == (2 * (R / 2) * (3 * h + 2 * h + f) + (R / 2) * h + 2 * (R / 2) * h) +
                                                zero2.parameters_per_gpu);
  // Tensor parallelism over two GPUs: the blocks' matrices split; with sequence parallelism
  // also the norms' and residuals' rows, and every layer reorders the 10 s b h it gathers or
  // reduce-scatters (4 forward, 6 backward).
  plan.cluster.gpus = 2;
  plan.layout = {2, 1, 1, 1, 0, 2};
  plan.layout.vocab_parallel = false;
  const double split_bias_rows = 2 * R * (3 * h / 2 + 2 * h + f / 2);
  plan.layout.sequence_parallel = false;
  CHECK(count(estimate(plan), ElementClass::rows) == split_bias_rows + R * h + 2 * R * h);
  plan.layout.sequence_parallel = true;
  CHECK(count(estimate(plan), ElementClass::rows) == split_bias_rows + R / 2 * h + 10 * R * h + 2 * (R / 2) * h);
  plan.cluster.gpus = 1;
  plan.layout = {1, 1, 1, 1, 0, 2};
  CHECK(count(e, ElementClass::loss) == R * V);
  CHECK(count(e, ElementClass::optimizer) == e.parameters_per_gpu);
  CHECK(term(e.time, "element-wise kernels").value == 0);  // no costs: not counted
  // Costs c (FLOP times per element): seconds = elements x c / peak.
  ElementCosts costs{};
  costs[int(ElementClass::norm_forward)] = 10;
  costs[int(ElementClass::optimizer)] = 7;
  plan.efficiency.element_costs[int(Precision::fp32)] = costs;
  e = estimate(plan);
  CHECK(term(e.time, "element-wise kernels").value == Approx((10 * 4 * R * h + 7 * e.parameters_per_gpu) / 1e9));
  // Attention at its head dimension's measured efficiency (32: 0.25, then 0.125), times the kind's
  // factor; the ring's only under context parallelism.
  const auto compute = [&] { return term(estimate(plan).time, "compute").value; };
  const auto attention_seconds = [&](double efficiency) { return estimate(plan).attention_flops_per_step / 1e9 / efficiency; };
  plan.efficiency.attention_by_head_dim[int(Precision::fp32)] = {{32, 0.25}};
  const double at_quarter = compute();
  plan.efficiency.attention_by_head_dim[int(Precision::fp32)] = {{32, 0.125}};
  CHECK(compute() - at_quarter == Approx(attention_seconds(0.125) - attention_seconds(0.25)));
  plan.efficiency.attention_factors[int(Precision::fp32)] = Efficiency::AttentionFactors{0.5, 1, 0.25};
  CHECK(compute() - at_quarter == Approx(attention_seconds(0.125) - attention_seconds(0.25)));  // dense, cp 1
  plan.model.attention = "dilated:w=64,128;r=1,2";
  const double dilated_half = compute();
  plan.efficiency.attention_factors[int(Precision::fp32)]->dilated = 1;
  CHECK(dilated_half - compute() == Approx(attention_seconds(0.0625) - attention_seconds(0.125)));
  // By length: dense attention at its sequence's factor (128 tokens); dilated attention's passes
  // at their segments' (w / r tokens), weighted by their causal scores; block-sparse at none.
  const double dilated_at_one = compute();
  plan.efficiency.attention_by_length[int(Precision::fp32)] = {{64, 0.25}, {128, 0.5}, {512, 1}};
  CHECK(compute() - dilated_at_one == Approx(attention_seconds(0.125 * 0.25) - attention_seconds(0.125)));  // 64, 64
  plan.model.attention = "dilated:w=64,128;r=1,1";
  const double short_scores = 2 * 64 * 65 / 2, long_scores = 128 * 129 / 2;
  const double mixed = (short_scores + long_scores) / (short_scores / 0.25 + long_scores / 0.5);
  const double mixed_seconds = compute();
  plan.efficiency.attention_by_length[int(Precision::fp32)].clear();
  CHECK(mixed_seconds - compute() == Approx(attention_seconds(0.125 * mixed) - attention_seconds(0.125)));
  plan.model.attention = "dense";
  const double dense_at_one = compute();
  plan.efficiency.attention_by_length[int(Precision::fp32)] = {{64, 0.25}, {128, 0.5}, {512, 1}};
  CHECK(compute() - dense_at_one == Approx(attention_seconds(0.125 * 0.5) - attention_seconds(0.125)));
  plan.model.attention = "block_sparse:pattern=local_window;radius=64";
  const double sparse_by_length = compute();
  plan.efficiency.attention_by_length[int(Precision::fp32)].clear();
  CHECK(compute() == Approx(sparse_by_length));
  // Two context-parallel ranks: dense attention at the ring's factor, dilated at the dilated ring's.
  plan.cluster.gpus = 2;
  plan.layout.context = 2;
  plan.efficiency.attention_factors[int(Precision::fp32)]->dilated_ring = 0.5;
  for (const std::string attention : {"dense", "dilated:w=64,128;r=1,2"}) {
    plan.model.attention = attention;
    const double ring_seconds = compute();
    double& factor = attention == "dense" ? plan.efficiency.attention_factors[int(Precision::fp32)]->ring
                                          : plan.efficiency.attention_factors[int(Precision::fp32)]->dilated_ring;
    const double before = factor;  // 0.25, 0.5
    factor = 1;
    // Half the attention on each rank: the difference is half the one rank's.
    CHECK(ring_seconds - compute() == Approx((attention_seconds(0.125 * before) - attention_seconds(0.125)) / 2));
    factor = before;
  }
  plan.cluster.gpus = 1;
  plan.layout.context = 1;
  plan.model.attention = "dense";
  plan.efficiency.attention_by_head_dim[int(Precision::fp32)].clear();
  plan.efficiency.attention_factors[int(Precision::fp32)].reset();
  // Full recomputation runs every layer's forward again but the last (backward keeps its
  // activations): nothing more in one layer, two of three layers again in three; with pipeline
  // stages every layer. Selective recomputation the sub-LayerNorm only.
  plan.training.recompute = Recompute::full;
  CHECK(count(estimate(plan), ElementClass::norm_forward) == 3 * R * h + R * h);
  CHECK(count(estimate(plan), ElementClass::gelu_forward) == R * f);
  plan.model.layers = 3;
  CHECK(count(estimate(plan), ElementClass::norm_forward) == (3 + 2) * 3 * R * h + R * h);
  CHECK(count(estimate(plan), ElementClass::gelu_forward) == (3 + 2) * R * f);
  CHECK(count(estimate(plan), ElementClass::rows) == R * (3 * 2 + 2) * (3 * h + 2 * h + f) + R * h * (3 + 2) + 2 * R * h);
  const double recomputing_products = term(estimate(plan).time, "compute").value;
  plan.training.recompute = Recompute::none;
  const double products = term(estimate(plan).time, "compute").value;
  plan.training.recompute = Recompute::full;
  plan.cluster.gpus = 3;
  plan.layout.pipeline = 3;
  CHECK(count(estimate(plan), ElementClass::gelu_forward) == 2 * R * f);  // a stage's one layer, twice
  plan.cluster.gpus = 1;
  plan.layout.pipeline = 1;
  plan.model.layers = 1;
  CHECK(recomputing_products > products);
  plan.training.recompute = Recompute::selective;
  CHECK(count(estimate(plan), ElementClass::norm_forward) == 4 * R * h + R * h);
  // ZeRO 1 over 2 data-parallel ranks: each steps half the parameters.
  plan.training.global_batch_tokens = 4 * 128;
  plan.cluster.gpus = 2;
  plan.layout.data = 2;
  plan.layout.zero_stage = 1;
  e = estimate(plan);
  CHECK(count(e, ElementClass::optimizer) == e.parameters_per_gpu / 2);
  plan.training.precision = Precision::bf16;
  CHECK(term(estimate(plan).time, "element-wise kernels").value == 0);  // costs for fp32 only
}
