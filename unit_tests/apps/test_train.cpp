// longattn-train's pieces and its loop: the whole model's gradients by finite differences, the
// optimizer against its formulas, the data, checkpoints (atomic, refused when corrupted or
// mismatched, or with bad metadata; a failed write keeps the previous one), the loss falling on real text, recomputation and micro-batches against the plain
// step, bf16/fp16 against fp32 and fp16 loss scaling, and the grid: DP = 2 and CP = 2 (ring
// attention, distributed dilated attention, block-sparse ring) give the losses of one rank; ZeRO 1
// gives the losses of none, and its checkpoints resume on another grid; tensor parallelism (tp 2,
// also with cp 2 and ZeRO 1) trains the model of one rank, and its checkpoints resume at tp 1.
// Runs at 1 and 2 ranks, the ZeRO and tp cases also at 4; the grid comparisons need 2 or more
// (at 1 they say SKIP).
#include <catch2/catch.hpp>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <sstream>

#include "longattn/core/attention.hpp"
#include "longattn/core/bf16_dot_products.hpp"
#include "longattn/core/gemm.hpp"
#include "longattn/train/checkpoint.hpp"
#include "longattn/train/prediction.hpp"
#include "longattn/train/trainer.hpp"
#include "parallel/mpi_test_support.hpp"
#include "reference/random.hpp"

namespace {

using namespace longattn;
using namespace longattn::train;
using Host = Kokkos::DefaultHostExecutionSpace;

// One rank alone (a communicator of itself), for the single-rank side of a comparison.
parallel::Communicator self() {
  return test::throwing_world().split(test::throwing_world().rank(), 0);
}

TrainConfig tiny_config() {
  TrainConfig c;
  c.model.layers = 2;
  c.model.embed = 32;
  c.model.heads = 2;
  c.model.context = 64;
  c.batch = 4;
  c.steps = 5;
  c.optimizer.warmup = 2;
  c.eval_every = 0;
  c.eval_batches = 1;
  c.peak_gflops = 1;  // not measured: the tests compare losses, not rates
  c.quiet = true;
  return c;
}

std::vector<double> losses(const TrainResult& r) {
  std::vector<double> out;
  for (const StepRecord& s : r.steps) out.push_back(s.loss);
  return out;
}

void check_same_losses(const std::vector<double>& a, const std::vector<double>& b, double tolerance) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(a[i] == Approx(b[i]).epsilon(tolerance));
  }
}

// B sequences of n random bytes and targets at positions 0..n-1; a quarter of the tokens not
// counted (weight 0).
template <class Model>
typename Model::Batch random_batch(int B, int n, std::mt19937_64& rng) {
  typename Model::Batch batch{typename Model::TokenIds("inputs", B, n), typename Model::TokenIds("targets", B, n),
                              typename Model::Weights("weights", B, n), typename Model::Positions("positions", n)};
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < n; ++t) {
      batch.inputs(b, t) = int(rng() % 256);
      batch.targets(b, t) = int(rng() % 256);
      batch.weights(b, t) = rng() % 4 == 0 ? 0.0 : 1.0;
    }
  for (int t = 0; t < n; ++t) batch.positions(t) = t;
  return batch;
}

// A checkpoint path every rank agrees on.
std::string shared_path(const char* name) {
  return (std::filesystem::temp_directory_path() /
          ("longattn_test_" + std::to_string(test::shared_seed()) + "_" + name))
      .string();
}

// Efficiencies of matrix products and the three attention kinds, nothing measured by shape.
plan::Efficiency test_efficiency(double matmul, double dense, double dilated, double block_sparse) {
  plan::Efficiency e;
  e.matmul = matmul;
  e.attention_dense = dense;
  e.attention_dilated = dilated;
  e.attention_block_sparse = block_sparse;
  e.source = "test";
  return e;
}

}  // namespace

TEST_CASE("the whole model's gradients match finite differences", "[train][gradients]") {
  ModelConfig config;
  config.layers = 2;
  config.embed = 16;
  config.heads = 2;
  config.context = 70;  // not a multiple of the attention block
  config.seed = test::test_seed();
  const auto spec = GENERATE(as<std::string>{}, "dense", "dilated:w=32,64;r=1,2", "block_sparse:pattern=local_window;radius=64");
  config.attention = longattn::parse_attention_spec(spec);
  config.positions = GENERATE(PositionEncoding::learned, PositionEncoding::rotary);
  INFO("attention " << spec << ", " << to_string(config.positions) << " positions, seed " << config.seed);
  using Model = Transformer<Host, double>;
  Model model(config);
  const int B = 2, n = 70;
  std::mt19937_64 rng(config.seed + 1);
  const Model::Batch batch = random_batch<Model>(B, n, rng);
  const double normalizer = 97;
  model.zero_gradients();
  model.forward(batch, normalizer);
  int ready = 0;
  model.backward([&](int index) { CHECK(index == ready++); });
  CHECK(ready == int(model.parameter_groups().size()));
  // Central differences at a few entries of every parameter group.
  for (const auto& group : model.parameter_groups()) {
    for (int trial = 0; trial < 3; ++trial) {
      const std::size_t i = rng() % group.count;
      const double saved = group.values[i], h = 1e-5;
      group.values[i] = saved + h;
      const double plus = model.forward(batch, normalizer);
      group.values[i] = saved - h;
      const double minus = model.forward(batch, normalizer);
      group.values[i] = saved;
      const double numeric = (plus - minus) / (2 * h);
      INFO(group.name << "[" << i << "]: analytic " << group.gradients[i] << ", numeric " << numeric);
      CHECK(group.gradients[i] == Approx(numeric).margin(1e-8).epsilon(1e-5));
    }
  }
}

// Recomputation gives the same loss and gradients, bit for bit (the same kernels on the same
// inputs in double), and holds less memory at its peak: selective less than none, full less than
// selective.
TEST_CASE("recomputation gives the gradients of a model that keeps every activation", "[train][recompute]") {
  ModelConfig config;
  config.layers = 3;
  config.embed = 16;
  config.heads = 2;
  config.context = 70;
  config.seed = test::test_seed();
  const auto spec = GENERATE(as<std::string>{}, "dense", "dilated:w=32,64;r=1,2", "block_sparse:pattern=top_k;k=1");
  config.attention = longattn::parse_attention_spec(spec);
  config.positions = GENERATE(PositionEncoding::learned, PositionEncoding::rotary);  // rotary: Q, K turned again
  INFO("attention " << spec << ", " << to_string(config.positions) << " positions, seed " << config.seed);
  using Model = Transformer<Host, double>;
  const int B = 3, n = 70;
  std::mt19937_64 rng(config.seed + 1);
  const Model::Batch batch = random_batch<Model>(B, n, rng);
  struct Run {
    double loss;
    std::vector<double> gradients;
    std::size_t peak_bytes;  // the pool's high-water mark over forward and backward
  };
  auto run = [&](Recompute recompute) {
    config.recompute = recompute;
    memory::PoolOptions labelled;
    labelled.label = to_string(recompute);
    const memory::Pool<Kokkos::HostSpace> pool(labelled);
    Model model(ExecutionContext<Host>(Host(), pool), config);
    pool.reset_high_water();
    Run r{model.forward(batch, B * n), {}, 0};
    model.backward();
    r.peak_bytes = pool.stats().in_use_high_water_bytes;
    for (const auto& g : model.parameter_groups()) r.gradients.insert(r.gradients.end(), g.gradients, g.gradients + g.count);
    return r;
  };
  const Run none = run(Recompute::none), selective = run(Recompute::selective), full = run(Recompute::full);
  CHECK(selective.loss == none.loss);
  CHECK(full.loss == none.loss);
  CHECK(selective.gradients == none.gradients);
  CHECK(full.gradients == none.gradients);
  INFO("peak bytes: none " << none.peak_bytes << ", selective " << selective.peak_bytes << ", full " << full.peak_bytes);
  CHECK(selective.peak_bytes < none.peak_bytes);
  CHECK(full.peak_bytes < selective.peak_bytes);
}

// Per-block gradient memory (ZeRO 2's model): each group's gradients exist only inside its
// ready() call, equal to those a model keeping every gradient makes; afterwards the groups point
// nowhere, and the model holds less memory at once (one block's gradients, not all).
TEST_CASE("per-block gradient memory gives the kept gradients inside ready(), one block at a time", "[train][zero]") {
  ModelConfig config;
  config.layers = 3;
  config.embed = 16;
  config.heads = 2;
  config.context = 70;
  config.seed = test::test_seed();
  config.recompute = GENERATE(Recompute::none, Recompute::full);
  INFO("recompute " << to_string(config.recompute) << ", seed " << config.seed);
  using Model = Transformer<Host, double>;
  const int B = 2, n = 70;
  std::mt19937_64 rng(config.seed + 1);
  const Model::Batch batch = random_batch<Model>(B, n, rng);
  auto run = [&](GradientMemory memory, std::size_t& peak_bytes) {
    const memory::Pool<Kokkos::HostSpace> pool;
    Model model(ExecutionContext<Host>(Host(), pool), config, nullptr, memory);
    CHECK(model.gradient_memory() == memory);
    pool.reset_high_water();
    std::vector<std::vector<double>> gradients;
    model.forward(batch, B * n);
    model.backward([&](int i) {
      const auto& g = model.parameter_groups()[std::size_t(i)];
      REQUIRE(g.gradients != nullptr);
      gradients.emplace_back(g.gradients, g.gradients + g.count);
    });
    peak_bytes = pool.stats().in_use_high_water_bytes;
    for (const auto& g : model.parameter_groups()) CHECK((g.gradients == nullptr) == (memory == GradientMemory::per_block));
    // Stretches cover the groups in order; kept ones lie back to back, each group inside its own
    // (the gradient buckets reduce them where they lie).
    const auto stretches = model.gradient_stretches();
    REQUIRE(stretches.size() == std::size_t(config.layers + 2));
    int next_group = 0;
    for (std::size_t s = 0; s < stretches.size(); ++s) {
      CHECK(stretches[s].first_group == next_group);
      next_group += stretches[s].groups;
      if (memory == GradientMemory::per_block) continue;
      if (s > 0) CHECK(stretches[s].gradients == stretches[s - 1].gradients + stretches[s - 1].count);
      std::size_t counted = 0;
      for (int i = stretches[s].first_group; i < next_group; ++i) {
        const auto& g = model.parameter_groups()[std::size_t(i)];
        CHECK(g.gradients >= stretches[s].gradients);
        CHECK(g.gradients + g.count <= stretches[s].gradients + stretches[s].count);
        counted += g.count;
      }
      CHECK(counted == stretches[s].count);
    }
    CHECK(next_group == int(model.parameter_groups().size()));
    return gradients;
  };
  std::size_t kept_bytes = 0, per_block_bytes = 0;
  const auto kept = run(GradientMemory::kept, kept_bytes);
  const auto per_block = run(GradientMemory::per_block, per_block_bytes);
  CHECK(per_block == kept);
  INFO("peak bytes: kept " << kept_bytes << ", per block " << per_block_bytes);
  CHECK(per_block_bytes < kept_bytes);
}

TEST_CASE("AdamW and the schedule follow their formulas", "[train][optimizer]") {
  OptimizerConfig c;
  c.lr = 1e-2, c.min_lr = 1e-3, c.warmup = 4, c.weight_decay = 0.1, c.clip = 0.5;
  CHECK(learning_rate(c, 0, 20) == Approx(2.5e-3));
  CHECK(learning_rate(c, 3, 20) == Approx(1e-2));
  CHECK(learning_rate(c, 4, 20) == Approx(1e-2));
  CHECK(learning_rate(c, 12, 20) == Approx(1e-3 + 9e-3 * 0.5));  // half way: cos(pi/2) = 0
  CHECK(learning_rate(c, 20, 20) == Approx(1e-3));
  // Two groups, one decayed; two steps against a double-precision transcription.
  std::vector<float> w{0.5f, -1.0f, 2.0f}, g{0.3f, -0.4f, 1.2f};
  std::vector<ParameterGroup<float>> groups{{"matrix", w.data(), g.data(), 2, true}, {"bias", w.data() + 2, g.data() + 2, 1, false}};
  AdamW<Host, float> adam(c, groups);
  std::vector<double> rw(w.begin(), w.end()), m(3, 0), v(3, 0);
  for (int t = 1; t <= 2; ++t) {
    double norm = 0;
    for (float x : g) norm += double(x) * x;
    norm = std::sqrt(norm);
    const double scale = norm > c.clip ? c.clip / norm : 1, lr = 1e-2;
    CHECK(adam.step(lr) == Approx(norm));
    for (int i = 0; i < 3; ++i) {
      const double gi = g[std::size_t(i)] * scale;
      m[std::size_t(i)] = c.beta1 * m[std::size_t(i)] + (1 - c.beta1) * gi;
      v[std::size_t(i)] = c.beta2 * v[std::size_t(i)] + (1 - c.beta2) * gi * gi;
      const double mh = m[std::size_t(i)] / (1 - std::pow(c.beta1, t)), vh = v[std::size_t(i)] / (1 - std::pow(c.beta2, t));
      rw[std::size_t(i)] -= lr * (mh / (std::sqrt(vh) + c.eps) + (i < 2 ? c.weight_decay * rw[std::size_t(i)] : 0));
      CHECK(w[std::size_t(i)] == Approx(rw[std::size_t(i)]).epsilon(1e-5));
    }
  }
}

TEST_CASE("the long-range task asks for values stored at the start", "[train][data]") {
  DataConfig c;
  c.task = Task::long_range;
  c.pairs = 8;
  c.queries = 3;
  const Dataset data(c, 100);
  std::mt19937_64 rng(test::test_seed());
  const HostBatch batch = data.sample(Split::train, rng, 5);
  CHECK(batch.weighted_tokens == 15);
  for (std::int64_t b = 0; b < 5; ++b) {
    int counted = 0;
    for (std::int64_t t = 0; t < 100; ++t) {
      const std::size_t i = std::size_t(b * 100 + t);
      if (batch.weights[i] == 0) continue;
      ++counted;
      CHECK(t > 100 - 2 * 3 - 1);
      // The key at t was stored at the start with the value the target asks for.
      bool found = false;
      for (int p = 0; p < 8; ++p)
        found |= batch.inputs[std::size_t(b * 100 + 2 * p)] == batch.inputs[i] &&
                 batch.inputs[std::size_t(b * 100 + 2 * p + 1)] == batch.targets[i];
      CHECK(found);
    }
    CHECK(counted == 3);
  }
  c.pairs = 48;
  CHECK_THROWS_WITH(Dataset(c, 100), Catch::Contains("argument 'pairs + queries' is 51"));
}

TEST_CASE("the loss falls on real text", "[train][text]") {
  TrainConfig c = tiny_config();
  c.model.embed = 64;
  c.steps = 30;
  c.batch = 8;
  c.optimizer.lr = 3e-3;
  c.optimizer.warmup = 5;
  c.eval_every = 30;
  const TrainResult r = run_training(c, self(), nullptr);
  REQUIRE(r.steps.size() == 30);
  INFO("first loss " << r.steps.front().loss << ", last " << r.steps.back().loss);
  CHECK(r.steps.front().loss == Approx(std::log(256.0)).epsilon(0.05));  // uniform over bytes at the start
  CHECK(r.steps.back().loss < 0.6 * r.steps.front().loss);
  REQUIRE(r.evals.size() == 1);
  CHECK(r.evals[0].loss < 0.7 * r.steps.front().loss);
}

// Says SKIP (and the case checks nothing) unless the world has 2 ranks.
static bool two_ranks() {
  if (test::throwing_world().size() == 2) return true;
  WARN("SKIP: needs 2 MPI ranks, the world has " << test::throwing_world().size() << " (ctest's train_np2 runs it)");
  return false;
}

TEST_CASE("data parallel: 2 ranks give the losses of 1 with the same global batch", "[train][grid]") {
  if (!two_ranks()) return;
  TrainConfig c = tiny_config();
  const std::vector<double> one = losses(run_training(c, self(), nullptr));
  const TrainResult two = run_training(c, test::throwing_world(), nullptr);
  CHECK(two.dp == 2);
  check_same_losses(losses(two), one, 1e-4);
}

// ZeRO 1 against no ZeRO on the same ranks: each rank updates its shard of the parameters with
// its shard of AdamW's state, then all-gathers them; only the gradient norm's sum runs in another
// order. embed 33 over 3 heads: groups of odd sizes, so some ranks' pieces are shorter. bf16:
// the fp32 master weights are sharded too. At 4 ranks also dp 2 x cp 2 (ring attention).
TEST_CASE("ZeRO 1 and 2 give the losses of no ZeRO on the same ranks, with a shard of AdamW's memory (and of the "
          "gradients)", "[train][zero]") {
  const int ranks = test::throwing_world().size();
  if (ranks == 1) {
    WARN("SKIP: ZeRO needs 2 or more MPI ranks, the world has 1 (ctest's train_np2 and train_np4_zero run it)");
    return;
  }
  std::vector<int> cps{1};
  if (ranks % 2 == 0 && ranks > 2) cps.push_back(2);
  for (const int stage : {1, 2})
  for (const Precision precision : {Precision::fp32, Precision::bf16})
    for (const int cp : cps) {
      INFO("ZeRO " << stage << ", " << to_string(precision) << ", dp " << ranks / cp << " x cp " << cp);
      TrainConfig c = tiny_config();
      c.model.embed = 33;
      c.model.heads = 3;
      c.model.context = cp > 1 ? 256 : 64;  // zigzag: 4 chunks of one 64-token block
      c.precision = precision;
      c.steps = 3;
      c.cp = cp;
      c.optimizer.clip = 0.05;  // below these gradients' norms: every rank must clip by the global one
      const TrainResult none = run_training(c, test::throwing_world(), nullptr);
      c.zero = stage;
      const TrainResult zero = run_training(c, test::throwing_world(), nullptr);
      check_same_losses(losses(zero), losses(none), precision == Precision::fp32 ? 1e-5 : 1e-3);
      for (std::size_t i = 0; i < zero.steps.size(); ++i) {
        INFO("step " << i + 1);
        CHECK(zero.steps[i].gradient_norm > c.optimizer.clip);
        CHECK(zero.steps[i].gradient_norm == Approx(none.steps[i].gradient_norm).epsilon(1e-5));
      }
      // AdamW's moments (and master weights; under ZeRO 2 the float gradients) on 1/ranks of the
      // elements, give or take a piece's rounding.
      const std::size_t sharded_floats = (precision == Precision::fp32 ? 2 : 3) + (stage == 2 ? 1 : 0);
      const double saved = double(none.model_state_bytes) - double(zero.model_state_bytes);
      CHECK(saved == Approx(double(none.parameters * sharded_floats * sizeof(float)) * (1 - 1.0 / ranks)).epsilon(0.01));
      // The pool's high-water: under ZeRO 1 it falls by about as much as AdamW's state (the
      // all-gathers' staging is one group's size; both reduce the gradients where they lie).
      // Under ZeRO 2 the reduce-scatter's buffers hold this model's gradients (all in one bucket)
      // and the piece received as backward ends, about what sharding the gradients and moments
      // saves, so it falls by little; a larger model's gradients are in many buckets, 2 in flight.
      INFO("pool high-water: " << none.steps.back().memory_bytes << " bytes without ZeRO, "
                               << zero.steps.back().memory_bytes << " with; reduction buffers " << none.bucket_bytes
                               << " and " << zero.bucket_bytes << " bytes; parameters " << none.parameters);
      const double high_water_saved = double(none.steps.back().memory_bytes) - double(zero.steps.back().memory_bytes);
      if (stage == 1)
        CHECK(high_water_saved > 0.5 * double(none.parameters * sharded_floats * sizeof(float)) * (1 - 1.0 / ranks));
      else
        CHECK(high_water_saved > 0);
    }
}

// ZeRO 2 reduce-scatters each micro-batch's gradients as backward makes them (the model holds
// them only per block) and adds them into the pieces: with micro-batches, full recomputation and
// gradients reduced in 16 bits, the losses and clipped norms of no ZeRO.
TEST_CASE("ZeRO 2 with micro-batches, recomputation and 16-bit reduction: the losses of no ZeRO", "[train][zero]") {
  const auto world = test::throwing_world();
  if (world.size() == 1) {
    WARN("SKIP: ZeRO needs 2 or more MPI ranks, the world has 1 (ctest's train_np2 and train_np4_zero run it)");
    return;
  }
  for (const Precision precision : {Precision::fp32, Precision::bf16}) {
    INFO(to_string(precision));
    TrainConfig c = tiny_config();
    c.batch = 2 * world.size();
    c.micro_batch = 1;  // 2 micro-batches per rank
    c.model.recompute = Recompute::full;
    c.precision = precision;
    c.grad_reduce = GradientReduce::model;  // bf16: the buckets travel in 16 bits
    c.steps = 3;
    c.optimizer.clip = 0.05;
    const TrainResult none = run_training(c, world, nullptr);
    c.zero = 2;
    const TrainResult zero = run_training(c, world, nullptr);
    REQUIRE(zero.micro_batches == 2);
    const double tolerance = precision == Precision::fp32 ? 1e-5 : 1e-3;
    check_same_losses(losses(zero), losses(none), tolerance);
    for (std::size_t i = 0; i < zero.steps.size(); ++i) {
      INFO("step " << i + 1);
      CHECK(zero.steps[i].gradient_norm > c.optimizer.clip);
      CHECK(zero.steps[i].gradient_norm == Approx(none.steps[i].gradient_norm).epsilon(tolerance));
    }
  }
}

// A checkpoint holds AdamW's whole state whatever the grid: written by the world under ZeRO 1 or 2,
// resumed by one rank without it, and that one's resumed by the world under ZeRO 1 again, the
// losses are the uninterrupted run's.
TEST_CASE("a checkpoint written under ZeRO 1 or 2 resumes on one rank without it, and back",
          "[train][zero][checkpoint]") {
  const auto world = test::throwing_world();
  if (world.size() == 1) {
    WARN("SKIP: ZeRO needs 2 or more MPI ranks, the world has 1 (ctest's train_np2 and train_np4_zero run it)");
    return;
  }
  TrainConfig c = tiny_config();
  c.precision = Precision::bf16;  // master weights, moments: all sharded
  c.zero = GENERATE(1, 2);
  INFO("ZeRO " << c.zero);
  const std::vector<double> uninterrupted = losses(run_training(c, world, nullptr));
  c.checkpoint = shared_path("zero.ckpt");
  c.stop_after = 2;
  run_training(c, world, nullptr);
  c.resume = true;
  const parallel::Communicator alone_rank = self();  // collective: every rank splits
  if (world.rank() == 0) {
    TrainConfig one = c;
    one.zero = 0;
    one.stop_after = 4;
    const TrainResult alone = run_training(one, alone_rank, nullptr);
    REQUIRE(alone.first_step == 3);
    check_same_losses(losses(alone), {uninterrupted[2], uninterrupted[3]}, 1e-3);
  }
  world.barrier();
  c.stop_after = 0;
  const TrainResult back = run_training(c, world, nullptr);
  REQUIRE(back.first_step == 5);
  check_same_losses(losses(back), {uninterrupted[4]}, 1e-3);
  world.barrier();
  if (world.rank() == 0) std::remove(c.checkpoint.c_str());
}

// A checkpoint's payload as floats (parameters, then AdamW's moments; each tensor whole).
static std::vector<float> payload_floats(const std::string& path) {
  const Checkpoint checkpoint = read_checkpoint(path);
  std::vector<float> floats(checkpoint.payload.size() / sizeof(float));
  std::memcpy(floats.data(), checkpoint.payload.data(), floats.size() * sizeof(float));
  return floats;
}

// Tensor parallelism against one rank: the heads and MLP features split over 2 ranks (each
// sublayer's output and input gradient all-reduced, the sub-LayerNorm's statistics summed) train
// the model one rank trains - the same losses and clipped gradient norms, and after the run the
// same parameters and AdamW moments, put back together whole in the checkpoint. Dense and
// block-sparse attention; with and without sequence parallelism (each tensor rank holding half
// of each sequence's tokens between the sublayers: then less memory at its peak).
TEST_CASE("tensor parallel: tp 2 trains the model of one rank", "[train][tp]") {
  if (!two_ranks()) return;
  const auto world = test::throwing_world();
  const auto spec = GENERATE(as<std::string>{}, "dense", "block_sparse:pattern=local_window;radius=64");
  const bool sequence_parallel = GENERATE(false, true);
  INFO("attention " << spec << ", sequence parallel " << sequence_parallel);
  TrainConfig c = tiny_config();
  c.model.attention = longattn::parse_attention_spec(spec);
  c.model.context = 128;
  // Rotary positions with the sequence split: each rank's attention turns the gathered tokens.
  c.model.positions = sequence_parallel ? PositionEncoding::rotary : PositionEncoding::learned;
  c.steps = 3;
  c.optimizer.clip = 0.05;  // below these gradients' norms: the split tensors' squares must add over tp
  TrainConfig one_config = c;
  one_config.checkpoint = shared_path(("tp1.rank" + std::to_string(world.rank()) + ".ckpt").c_str());
  const TrainResult one = run_training(one_config, self(), nullptr);
  c.tp = 2;
  c.checkpoint = shared_path("tp2.ckpt");
  c.sequence_parallel = sequence_parallel;
  const TrainResult two = run_training(c, world, nullptr);
  if (sequence_parallel) {
    TrainConfig whole_tokens = c;
    whole_tokens.sequence_parallel = false;
    whole_tokens.checkpoint.clear();
    const TrainResult without = run_training(whole_tokens, world, nullptr);
    INFO("pool high-water: " << two.steps.back().memory_bytes << " bytes with sequence parallelism, "
                             << without.steps.back().memory_bytes << " without");
    CHECK(two.steps.back().memory_bytes < without.steps.back().memory_bytes);
  }
  CHECK(two.tp == 2);
  CHECK(two.dp == 1);
  CHECK(two.parameters == one.parameters);
  CHECK(two.model_state_bytes < one.model_state_bytes);
  check_same_losses(losses(two), losses(one), 1e-5);
  for (std::size_t i = 0; i < two.steps.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(two.steps[i].gradient_norm > c.optimizer.clip);
    CHECK(two.steps[i].gradient_norm == Approx(one.steps[i].gradient_norm).epsilon(1e-5));
  }
  // Parameters, first and second moments: each within 1e-4 of its largest value. (Not element by
  // element: the key bias's gradient is zero but for rounding - softmax ignores a shift of every
  // score - and AdamW turns that noise into steps of either sign, from 1e-6 apart.)
  const std::vector<float> split = payload_floats(c.checkpoint), whole = payload_floats(one_config.checkpoint);
  REQUIRE(split.size() == whole.size());
  REQUIRE(split.size() == 3 * one.parameters);
  for (int part = 0; part < 3; ++part) {
    double largest = 0, worst = 0;
    for (std::size_t i = part * one.parameters; i < (part + 1) * one.parameters; ++i) {
      largest = std::max(largest, std::abs(double(whole[i])));
      worst = std::max(worst, std::abs(double(split[i]) - double(whole[i])));
    }
    INFO("payload part " << part << ": largest " << largest);
    CHECK(largest > 0);
    CHECK(worst < 1e-4 * largest);
  }
  world.barrier();
  std::remove(one_config.checkpoint.c_str());
  if (world.rank() == 0) std::remove(c.checkpoint.c_str());
}

// tp 2 with 16-bit training (the partial sums all-reduced in 16 bits), recomputation (the tp
// all-reduces run again in backward) and micro-batches against the same on one rank; with and
// without sequence parallelism.
TEST_CASE("tensor parallel composes with 16-bit precision, recomputation and micro-batches", "[train][tp]") {
  if (!two_ranks()) return;
  for (const bool sequence_parallel : {false, true})
  for (const Precision precision : {Precision::bf16, Precision::fp16})
    for (const Recompute recompute : {Recompute::selective, Recompute::full}) {
      INFO(to_string(precision) << ", recompute " << to_string(recompute) << ", sequence parallel " << sequence_parallel);
      TrainConfig c = tiny_config();
      c.steps = 3;
      c.precision = precision;
      c.model.recompute = recompute;
      c.micro_batch = 2;
      const std::vector<double> one = losses(run_training(c, self(), nullptr));
      c.tp = 2;
      c.sequence_parallel = sequence_parallel;
      check_same_losses(losses(run_training(c, test::throwing_world(), nullptr)), one, 1e-4);
    }
}

// At 4 ranks: tp 2 x cp 2 (ring attention over the heads of each tensor rank) against one rank,
// and ZeRO 1 and 2 under tp 2 x dp 2 (AdamW's state, and the gradients, sharded over the 2 ranks
// of each tensor rank) against none; both also with sequence parallelism (the tensor ranks
// splitting each context rank's tokens; under ZeRO 2 the pieces of the norms', head's and
// embeddings' gradients summed over the tensor ranks).
TEST_CASE("tensor parallel with context parallelism and ZeRO 1 and 2: the losses of one rank and of no ZeRO",
          "[train][tp]") {
  const auto world = test::throwing_world();
  if (world.size() != 4) {
    WARN("SKIP: needs 4 MPI ranks, the world has " << world.size() << " (ctest's train_np4_zero runs it)");
    return;
  }
  TrainConfig c = tiny_config();
  c.model.context = 256;  // zigzag: 4 chunks of one 64-token block
  c.batch = 2;
  c.steps = 3;
  c.optimizer.clip = 0.05;
  const TrainResult one = run_training(c, self(), nullptr);
  c.tp = 2;
  c.cp = 2;
  const TrainResult ring = run_training(c, world, nullptr);
  CHECK(ring.tp == 2);
  CHECK(ring.cp == 2);
  check_same_losses(losses(ring), losses(one), 1e-5);
  c.sequence_parallel = true;
  check_same_losses(losses(run_training(c, world, nullptr)), losses(one), 1e-5);
  c.sequence_parallel = false;
  c.cp = 1;  // dp 2
  const TrainResult none = run_training(c, world, nullptr);
  check_same_losses(losses(none), losses(one), 1e-5);
  for (const auto& [stage, sequence_parallel] : {std::pair{1, false}, std::pair{2, false}, std::pair{2, true}}) {
    INFO("ZeRO " << stage << ", sequence parallel " << sequence_parallel);
    c.zero = stage;
    c.sequence_parallel = sequence_parallel;
    const TrainResult zero = run_training(c, world, nullptr);
    check_same_losses(losses(zero), losses(none), 1e-5);
    for (std::size_t i = 0; i < zero.steps.size(); ++i) {
      INFO("step " << i + 1);
      CHECK(zero.steps[i].gradient_norm > c.optimizer.clip);
      CHECK(zero.steps[i].gradient_norm == Approx(one.steps[i].gradient_norm).epsilon(1e-5));
    }
    CHECK(zero.model_state_bytes < none.model_state_bytes);
  }
}

// A checkpoint holds each tensor whole: written at tp 2, resumed on one rank (tp 1) and by the
// world at tp 1 (dp 2), whose checkpoint resumes at tp 2 again: the losses are the uninterrupted
// run's.
TEST_CASE("a checkpoint written at tp 2 resumes at tp 1, on one rank and on two, and back", "[train][tp][checkpoint]") {
  if (!two_ranks()) return;
  const auto world = test::throwing_world();
  TrainConfig c = tiny_config();
  c.tp = 2;
  const std::vector<double> uninterrupted = losses(run_training(c, world, nullptr));
  c.checkpoint = shared_path("tp.ckpt");
  c.stop_after = 2;
  run_training(c, world, nullptr);
  c.resume = true;
  c.stop_after = 0;
  const parallel::Communicator alone_rank = self();  // collective: every rank splits
  if (world.rank() == 0) {
    TrainConfig one = c;
    one.tp = 1;
    one.checkpoint = shared_path("tp.ckpt.copy");
    std::filesystem::copy_file(c.checkpoint, one.checkpoint, std::filesystem::copy_options::overwrite_existing);
    const TrainResult alone = run_training(one, alone_rank, nullptr);
    REQUIRE(alone.first_step == 3);
    check_same_losses(losses(alone), {uninterrupted[2], uninterrupted[3], uninterrupted[4]}, 1e-5);
    std::remove(one.checkpoint.c_str());
  }
  world.barrier();
  c.tp = 1;
  c.stop_after = 4;
  const TrainResult data_parallel = run_training(c, world, nullptr);
  REQUIRE(data_parallel.first_step == 3);
  check_same_losses(losses(data_parallel), {uninterrupted[2], uninterrupted[3]}, 1e-5);
  c.tp = 2;  // and back: written at tp 1, resumed at tp 2
  c.stop_after = 0;
  const TrainResult back = run_training(c, world, nullptr);
  REQUIRE(back.first_step == 5);
  check_same_losses(losses(back), {uninterrupted[4]}, 1e-5);
  world.barrier();
  if (world.rank() == 0) std::remove(c.checkpoint.c_str());
}

// The run reports longattn-plan's memory for its own layout: the planner's estimate of the same
// model, precision, recomputation, grid, ZeRO stage, micro-batch and kernel copies, built here by
// hand; and the pool's high-water by category, each near the planner's term of the same name.
TEST_CASE("a run carries longattn-plan's memory and compute-time prediction for its layout", "[train][plan]") {
  const auto world = test::throwing_world();
  TrainConfig c = tiny_config();
  c.steps = 1;
  c.precision = Precision::bf16;
  c.model.recompute = Recompute::selective;
  c.micro_batch = world.size() <= 2 ? 2 : 1;
  c.zero = world.size() > 1 ? 1 : 0;
  c.peak_gflops = 100;  // all ranks' cores: each rank a "device" of 100 / ranks
  c.efficiency = test_efficiency(0.5, 0.25, 0.3, 0.35);
  c.memory_limit_mib = 4096;  // a pool of the run's own
  const TrainResult r = run_training(c, world, nullptr);
  plan::Plan p;
  p.model.layers = 2;
  p.model.hidden = 32;
  p.model.heads = 2;
  p.model.vocabulary = 256;
  p.model.sequence = 64;
  p.model.positions = plan::Positions::learned;
  p.model.tied_embeddings = false;
  p.model.sub_layer_norm = true;
  p.training.fp32_gradients = p.training.fp32_gradient_reduce = true;
  p.copies.head_major_attention = Kokkos::SpaceAccessibility<Kokkos::DefaultExecutionSpace, Kokkos::HostSpace>::accessible;
  // The host's attention backward sums dQ in a workspace in its one-pass form (bf16: always then).
  p.copies.attention_dq_sum = !p.copies.head_major_attention ||
                              longattn::attention_backward_one_pass<longattn::bfloat16>(
                                  Kokkos::DefaultExecutionSpace(), int(c.micro_batch), c.model.heads,
                                  c.model.embed / c.model.heads);
  // On the GPU cuBLAS reads the operands in place, in its workspace; on a CPU they are copied.
  p.copies.gemm_workspace_bytes = double(longattn::gemm_workspace_bytes<Kokkos::DefaultExecutionSpace>());
  p.copies.gemm = p.copies.gemm_workspace_bytes > 0     ? plan::KernelCopies::Gemm::none
                  : longattn::bf16_dot_products_in_use() ? plan::KernelCopies::Gemm::bf16_panels
                                                         : plan::KernelCopies::Gemm::float_operands;
  p.training.global_batch_tokens = 4 * 64;
  p.training.precision = plan::Precision::bf16;
  p.training.recompute = plan::Recompute::selective;
  p.cluster.gpus = p.cluster.gpu.gpus_per_node = world.size();
  p.layout.data = world.size();
  p.layout.zero_stage = c.zero;
  p.layout.micro_batch = c.micro_batch;
  p.cluster.gpu.peak_flops_tf32 = p.cluster.gpu.peak_flops_16bit = 100e9 / world.size();
  p.efficiency = test_efficiency(0.5, 0.25, 0.3, 0.35);
  const plan::Estimate expected = plan::estimate(p);
  // compute = the matrix products at 0.5 of the ranks' peak, dense attention at 0.25: less than
  // every hardware FLOP (6 Psi counts the embeddings, which are no product) at the lower one, and
  // twice as long at half the efficiencies
  CHECK(r.predicted_compute_seconds == Approx(time_term(expected, "compute")).epsilon(1e-12));
  CHECK(r.predicted_compute_seconds < expected.hardware_flops_per_step / 100e9 / 0.25);
  plan::Plan slower = p;
  slower.efficiency = test_efficiency(0.25, 0.125, 0.15, 0.175);
  CHECK(time_term(plan::estimate(slower), "compute") == Approx(2 * r.predicted_compute_seconds).epsilon(1e-12));
  CHECK(r.predicted_memory_bytes == Approx(expected.memory_total).epsilon(1e-12));
  REQUIRE(r.predicted_memory.size() == expected.memory.size());
  for (std::size_t i = 0; i < expected.memory.size(); ++i) {
    CHECK(r.predicted_memory[i].first == expected.memory[i].name);
    CHECK(r.predicted_memory[i].second == Approx(expected.memory[i].value).epsilon(1e-12));
  }
  // Measured by category: every category the planner names, within 10% (or 32 KiB: the pool's
  // rounding of a few small blocks);
  // nothing outside the categories.
  REQUIRE(r.memory_by_category.size() == std::size_t(longattn::memory::category_count));
  CHECK(r.memory_by_category[0] == std::make_pair(std::string("other"), std::size_t(0)));
  for (const auto& [name, predicted] : r.predicted_memory) {
    const auto measured = std::find_if(r.memory_by_category.begin(), r.memory_by_category.end(),
                                       [&, n = name](const auto& m) { return m.first == n; });
    REQUIRE(measured != r.memory_by_category.end());
    INFO(name << ": measured " << measured->second << " bytes, predicted " << predicted);
    CHECK(std::abs(double(measured->second) - predicted) <= std::max(0.10 * predicted, 32768.0));
  }
  CHECK(double(r.steps.back().memory_bytes) == Approx(r.predicted_memory_bytes).epsilon(0.10));
  // The peak's parts: every block is in a category, so they add up to the whole high-water.
  REQUIRE(r.memory_at_peak.size() == std::size_t(longattn::memory::category_count));
  std::size_t at_peak = 0;
  for (const auto& [name, bytes] : r.memory_at_peak) at_peak += bytes;
  CHECK(at_peak == r.steps.back().memory_bytes);
  if (world.size() == 2) {  // tp 2: the planner's tensor parallelism without its sequence and vocabulary splits
    c.tp = 2;
    const TrainResult split = run_training(c, world, nullptr);
    p.layout.tensor = 2;
    p.layout.data = 1;
    p.layout.sequence_parallel = p.layout.vocab_parallel = false;
    const plan::Estimate tp = plan::estimate(p);
    CHECK(split.predicted_memory_bytes == Approx(tp.memory_total).epsilon(1e-12));
    CHECK(split.predicted_compute_seconds == Approx(time_term(tp, "compute")).epsilon(1e-12));
    p.layout.sequence_parallel = p.layout.vocab_parallel = true;  // Megatron's: less memory
    CHECK(plan::estimate(p).memory_total < tp.memory_total);
    c.tp = 1;
  }
  // Element costs timed where longattn-train's element probe read 1e9 elements/s: a run whose
  // probe reads half that takes twice as long in them; without either rate, as calibrated.
  CHECK(r.element_rate > 0);
  plan::ElementCosts costs;
  costs.fill(100);
  c.efficiency.element_costs[int(plan::Precision::bf16)] = costs;
  const auto element_seconds = [&](double rate) {
    return time_term(planner_estimate(c, world.size(), 100e9, rate), "element-wise kernels");
  };
  const double as_calibrated = element_seconds(0.5e9);
  CHECK(as_calibrated > 0);
  c.efficiency.element_rates[int(plan::Precision::bf16)] = 1e9;
  CHECK(element_seconds(0.5e9) == Approx(2 * as_calibrated).epsilon(1e-12));
  CHECK(element_seconds(0) == Approx(as_calibrated).epsilon(1e-12));
}

// --export-reference (reference_export.hpp): the groups in the model's order with their initial
// values (those of a model built from the same configuration), and each step's global batch.
TEST_CASE("a one-rank run exports its initial weights and batches for a reference implementation", "[train][reference]") {
  const auto world = test::throwing_world();
  TrainConfig c = tiny_config();
  c.steps = 3;
  c.model.positions = GENERATE(PositionEncoding::learned, PositionEncoding::rotary);
  c.export_reference = shared_path("reference") + "_rank" + std::to_string(world.rank());
  INFO(to_string(c.model.positions) << " positions");
  if (world.size() > 1) {
    CHECK_THROWS_WITH(run_training(c, world, nullptr),
                      Catch::Contains("argument 'export-reference' is \"" + c.export_reference +
                                      "\", expected a one-rank run from its start"));
  }
  const TrainResult r = run_training(c, self(), nullptr);
  std::ifstream index_file(c.export_reference + "/reference.json");
  const nlohmann::json index = nlohmann::json::parse(index_file);
  CHECK(index["sequences"] == c.batch);
  CHECK(index["tokens"] == c.model.context);
  auto read = [&](const std::string& name) {
    std::ifstream in(c.export_reference + "/" + name, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  };
  const std::vector<char> weights = read("weights.bin"), batches = read("batches.bin");
  CHECK(batches.size() == std::size_t(c.steps) * 3 * c.batch * c.model.context * 4);
  REQUIRE(weights.size() == r.parameters * sizeof(float));
  const std::vector<int> first_inputs(reinterpret_cast<const int*>(batches.data()),
                                      reinterpret_cast<const int*>(batches.data()) + c.batch * c.model.context);
  CHECK(*std::min_element(first_inputs.begin(), first_inputs.end()) >= 0);
  CHECK(*std::max_element(first_inputs.begin(), first_inputs.end()) < 256);
  // The same model, built again: its groups, in order, hold the exported values.
  Transformer<Host, float> model(c.model);
  const auto& groups = model.parameter_groups();
  REQUIRE(index["groups"].size() == groups.size());
  const float* exported = reinterpret_cast<const float*>(weights.data());
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const nlohmann::json& g = index["groups"][i];
    INFO("group " << groups[i].name);
    CHECK(g["name"] == groups[i].name);
    CHECK(g["count"] == groups[i].count);
    CHECK(g["decay"] == groups[i].decay);
    const std::size_t offset = g["offset"];
    CHECK(std::equal(groups[i].values, groups[i].values + groups[i].count, exported + offset));
  }
  std::filesystem::remove_all(c.export_reference);
}

TEST_CASE("a step's phases are timed, inside its time; evaluation and checkpoints apart", "[train][phases]") {
  const auto world = test::throwing_world();
  TrainConfig c = tiny_config();
  c.steps = 3;
  c.micro_batch = 2 / world.size();  // two micro-batches a step (batch 4 over 1 or 2 ranks)
  const TrainResult r = run_training(c, world, nullptr);
  REQUIRE(r.steps.size() == 3);
  for (const StepRecord& s : r.steps) {
    INFO("step " << s.step);
    const auto at = [&](Phase p) { return s.phase_seconds[std::size_t(p)]; };
    CHECK(at(Phase::forward) > 0);
    CHECK(at(Phase::backward) > 0);
    CHECK(at(Phase::optimizer) > 0);
    CHECK(at(Phase::gradient_reduction) >= 0);
    // Each phase is the slowest rank's, as the step's time is: each within the step's; on one
    // rank their sum too (over ranks, the slowest in each phase may be different ranks).
    const double sum = at(Phase::forward) + at(Phase::backward) + at(Phase::gradient_reduction) + at(Phase::optimizer);
    for (const Phase p : {Phase::forward, Phase::backward, Phase::gradient_reduction, Phase::optimizer})
      CHECK(at(p) <= s.seconds);
    if (world.size() == 1) CHECK(sum <= s.seconds);
    CHECK(at(Phase::checkpoint) == 0);  // no --checkpoint
    CHECK((at(Phase::evaluation) > 0) == (s.step == 3));  // validation after the last step only
  }
  const nlohmann::json j = r.to_json(c);
  for (int p = 0; p < phase_count; ++p) {
    const char* name = to_string(Phase(p));
    INFO(name);
    double sum = 0;
    for (const StepRecord& s : r.steps) sum += s.phase_seconds[std::size_t(p)];
    CHECK(j["summary"]["phase_seconds"][name].get<double>() == Approx(sum));
    CHECK(j["steps"][0]["phase_seconds"].contains(name));
  }
}

// longattn-plan's memory against random (model, layout) pairs the trainer runs on this world's
// ranks (perf_tests/plan_check.py draws 40 over 1-4 ranks): a fresh seed each run, printed;
// LONGATTN_PLAN_SEED repeats one. Each case's whole high-water within 10% of the prediction.
TEST_CASE("longattn-plan's memory holds on random models and layouts", "[train][plan]") {
  const auto world = test::throwing_world();
  double seed = 0;
  if (world.rank() == 0)
    seed = std::getenv("LONGATTN_PLAN_SEED") ? std::atof(std::getenv("LONGATTN_PLAN_SEED"))
                                               : double(std::random_device()() % (1u << 30));
  world.all_reduce(&seed, &seed, 1, parallel::DataType::float64, parallel::ReduceOp::max);  // every rank draws alike
  WARN("LONGATTN_PLAN_SEED=" << std::uint64_t(seed) << " repeats these cases");
  std::mt19937_64 rng{std::uint64_t(seed)};
  auto pick = [&](std::vector<int> options) { return options[std::size_t(rng() % options.size())]; };
  const int ranks = world.size();
  for (int n = 0; n < 3; ++n) {
    TrainConfig c = tiny_config();
    c.steps = 2;
    c.memory_limit_mib = 4096;  // a pool of the run's own
    c.model.layers = pick({1, 2, 3});
    c.model.embed = pick({32, 64, 96});
    c.model.heads = pick({1, 2, 4});
    c.model.context = pick({128, 256});
    c.tp = pick({1, ranks % 2 == 0 && c.model.heads % 2 == 0 ? 2 : 1});
    // A context-parallel rank holds whole 64-token blocks, 2 of them under the ring's zigzag.
    c.cp = pick({1, (ranks / c.tp) % 2 == 0 && c.model.context % (2 * 2 * 64) == 0 ? 2 : 1});
    const int dp = ranks / (c.tp * c.cp);
    const std::string attention = c.tp > 1 ? pick({0, 1}) ? "dense" : "block_sparse:pattern=local_window;radius=64"
                                           : pick({0, 1, 2}) == 0 ? "dense"
                                           : pick({0, 1}) ? "dilated:w=64,128;r=1,2"
                                                          : "block_sparse:pattern=random;density=0.5";
    c.model.attention = parse_attention_spec(attention);
    c.batch = dp * pick({1, 2});
    c.micro_batch = pick({0, 1});
    c.zero = pick({0, 1, 2});
    c.precision = std::vector<Precision>{Precision::fp32, Precision::bf16, Precision::fp16}[rng() % 3];
    c.model.recompute = std::vector<Recompute>{Recompute::none, Recompute::selective, Recompute::full}[rng() % 3];
    c.grad_reduce = pick({0, 1}) ? GradientReduce::fp32 : GradientReduce::model;
    c.sequence_parallel = c.tp > 1 && pick({0, 1});
    c.model.positions = pick({0, 1}) ? PositionEncoding::rotary : PositionEncoding::learned;
    const TrainResult r = run_training(c, world, nullptr);
    std::ostringstream measured;
    for (const auto& [name, bytes] : r.memory_by_category) measured << name << " " << bytes << ", ";
    std::ostringstream predicted;
    for (const auto& [name, bytes] : r.predicted_memory) predicted << name << " " << bytes << ", ";
    INFO("case " << n << ": " << ranks << " ranks tp " << c.tp << " cp " << c.cp << (c.sequence_parallel ? " sp" : "")
                 << " ZeRO " << c.zero << ", L " << c.model.layers << " E " << c.model.embed << " H " << c.model.heads
                 << " N " << c.model.context << " " << to_string(c.model.positions) << " positions, batch " << c.batch << " mb " << c.micro_batch << ", "
                 << to_string(c.precision) << " " << to_string(c.model.recompute) << " reduce "
                 << to_string(c.grad_reduce) << ", " << attention << "\nmeasured: " << measured.str()
                 << "\npredicted: " << predicted.str());
    CHECK(double(r.steps.back().memory_bytes) == Approx(r.predicted_memory_bytes).epsilon(0.10));
  }
}

// A category's bytes in a run's (name, bytes) list.
template <class Named>
static double category_bytes(const Named& named, const std::string& name) {
  for (const auto& [n, b] : named)
    if (n == name) return double(b);
  return 0.0;
}

// Says SKIP (and the case checks nothing) unless the attention makes head-major copies: on host
// spaces (a function, not a constant: nvcc would call the rest of the case unreachable).
static bool head_major_copies() {
  if (Kokkos::SpaceAccessibility<Kokkos::DefaultExecutionSpace, Kokkos::HostSpace>::accessible) return true;
  WARN("SKIP: the attention makes head-major copies on host spaces only");
  return false;
}

// Dilated attention's passes copy one sequence's selected tokens of their heads where the rows
// of a head are not together: the planner counts the largest pass's copies.
TEST_CASE("longattn-plan counts dilated attention's head-major copies pass by pass", "[train][plan]") {
  if (!head_major_copies()) return;
  for (const int heads : {1, 4}) {
    TrainConfig c = tiny_config();
    c.steps = 1;
    c.memory_limit_mib = 4096;  // a pool of the run's own
    c.model.layers = 1;
    c.model.heads = heads;
    c.model.context = 256;
    c.batch = 2;
    c.model.attention = parse_attention_spec("dilated:w=128,256;r=1,2");
    const TrainResult r = run_training(c, self(), nullptr);
    // fp32: no matrix product's copies. One head: only the rate-2 pass copies (s / 2 tokens);
    // four: the rate-1 pass's four heads of s tokens.
    const double D = double(c.model.embed / heads);
    const double expected = heads == 1 ? 2 * 4 * (256 / 2) * D : 2 * 4 * 256 * 4 * D;
    INFO(heads << " heads");
    CHECK(category_bytes(r.predicted_memory, "transient copies") == expected);
    CHECK(category_bytes(r.memory_by_category, "transient copies") == Approx(expected).epsilon(0.02));
  }
}

// The attention backward's one-pass form sums dQ in an fp32 workspace; the two-pass form (head
// dims not a multiple of the one-pass form's) has none. The planner asks core which form runs.
TEST_CASE("longattn-plan counts the attention backward's dQ sums where its one-pass form runs", "[train][plan]") {
  if (!head_major_copies()) return;
  constexpr int multiple = longattn::attention_one_pass_head_dim_multiple<Kokkos::DefaultExecutionSpace, longattn::bfloat16>();
  for (const char* attention : {"dense", "dilated:w=128,256;r=1,2"})
    for (const int head_dim : {multiple, multiple / 2}) {
      TrainConfig c = tiny_config();
      c.steps = 1;
      c.memory_limit_mib = 4096;  // a pool of the run's own
      c.precision = Precision::bf16;
      c.model.layers = 1;
      c.model.heads = 2;
      c.model.embed = 2 * head_dim;
      c.model.context = 256;
      c.batch = 2;
      c.model.attention = parse_attention_spec(attention);
      const TrainResult r = run_training(c, self(), nullptr);
      INFO(attention << ", head dim " << head_dim);
      // The dQ sums are a tenth of the workspaces here; the pool rounds each block to 4 KiB.
      const double predicted = category_bytes(r.predicted_memory, "workspaces");
      CHECK(category_bytes(r.memory_by_category, "workspaces") == Approx(predicted).epsilon(0.01));
    }
}

// Distributed dilated attention (cp 2) gathers a spanning segment's dilated K and V and returns
// their gradients: it holds two buffers of them at a time, which the planner counts.
TEST_CASE("longattn-plan counts distributed dilated attention's buffers: two of a spanning segment's K and V",
          "[train][plan]") {
  if (!two_ranks()) return;
  for (const Precision precision : {Precision::fp32, Precision::bf16}) {
    TrainConfig c = tiny_config();
    c.steps = 1;
    c.memory_limit_mib = 4096;  // a pool of the run's own
    c.precision = precision;
    c.model.layers = 1;
    c.model.heads = 2;
    c.model.context = 512;
    c.batch = 2;
    c.cp = 2;
    // w 512 spans both ranks' 256 tokens: 512 / 4 = 128 selected tokens of K and V a sequence,
    // in passes of one head (each of the 2 heads its own offset of the 4).
    c.model.attention = parse_attention_spec("dilated:w=128,512;r=1,4");
    const TrainResult r = run_training(c, test::throwing_world(), nullptr);
    const double element = precision == Precision::fp32 ? 4 : 2;
    const double segment_kv = 2 * c.batch * (512 / 4) * 1 * (c.model.embed / c.model.heads) * element;
    INFO(to_string(precision));
    CHECK(category_bytes(r.predicted_memory, "communication buffers") == 2 * segment_kv);
    CHECK(category_bytes(r.memory_by_category, "communication buffers") == Approx(2 * segment_kv).epsilon(0.02));
  }
}

// cp 2 (ring attention, distributed dilated attention) against one rank: the same losses.
static void check_context_parallel(const std::string& spec, Precision precision,
                                   PositionEncoding positions = PositionEncoding::learned) {
  TrainConfig c = tiny_config();
  c.precision = precision;
  c.model.positions = positions;
  c.model.context = 256;  // zigzag: 4 chunks of one 64-token block
  c.model.attention = longattn::parse_attention_spec(spec);
  c.batch = 2;
  c.steps = 3;
  const std::vector<double> one = losses(run_training(c, self(), nullptr));
  c.cp = 2;
  const TrainResult two = run_training(c, test::throwing_world(), nullptr);
  CHECK(two.cp == 2);
  check_same_losses(losses(two), one, 1e-4);
}

TEST_CASE("context parallel: 2 ranks give the losses of 1, for each attention kind", "[train][grid]") {
  if (!two_ranks()) return;
  const auto spec = GENERATE(as<std::string>{}, "dense", "dilated:w=64,256;r=1,4",
                             "block_sparse:pattern=local_window;radius=64");
  INFO("attention " << spec);
  check_context_parallel(spec, Precision::fp32);
}

// Rotary positions under the ring's zigzag: each rank turns its two chunks by their global
// positions, so the shards' scores are the whole sequence's.
TEST_CASE("context parallel with rotary positions: 2 ranks give the losses of 1", "[train][grid]") {
  if (!two_ranks()) return;
  const auto spec = GENERATE(as<std::string>{}, "dense", "dilated:w=64,256;r=1,4");
  INFO("attention " << spec);
  check_context_parallel(spec, Precision::fp32, PositionEncoding::rotary);
}

// Accumulating k micro-batches sums the same per-token terms in another order: equal to the
// one-batch step up to rounding. Recomputation changes nothing (the same kernels on the same
// inputs). At 2 ranks: data parallel with micro-batches, and context parallel (ring attention,
// distributed dilated attention) recomputing, against one rank keeping everything.
TEST_CASE("micro-batches and recomputation give the losses of one batch keeping every activation",
          "[train][recompute]") {
  TrainConfig c = tiny_config();
  c.batch = 4;
  c.steps = 4;
  c.eval_every = 2;
  const TrainResult reference = run_training(c, self(), nullptr);
  auto check_same = [&](const TrainResult& r, double tolerance) {
    check_same_losses(losses(r), losses(reference), tolerance);
    REQUIRE(r.evals.size() == reference.evals.size());
    for (std::size_t i = 0; i < r.evals.size(); ++i) CHECK(r.evals[i].loss == Approx(reference.evals[i].loss).epsilon(tolerance));
  };
  SECTION("micro-batches of 1 and 2 sequences") {
    for (const std::int64_t micro : {1, 2}) {
      INFO("micro-batch " << micro);
      TrainConfig m = c;
      m.micro_batch = micro;
      const TrainResult r = run_training(m, self(), nullptr);
      CHECK(r.micro_batches == 4 / micro);
      check_same(r, 1e-5);
      CHECK(r.steps.back().memory_bytes < reference.steps.back().memory_bytes);
    }
  }
  SECTION("recomputation, alone and with micro-batches") {
    for (const Recompute recompute : {Recompute::selective, Recompute::full}) {
      INFO("recompute " << to_string(recompute));
      TrainConfig m = c;
      m.model.recompute = recompute;
      check_same(run_training(m, self(), nullptr), 1e-6);
      m.micro_batch = 2;
      check_same(run_training(m, self(), nullptr), 1e-5);
    }
  }
  SECTION("2 ranks: dp 2 with micro-batches, cp 2 recomputing") {
    if (!two_ranks()) return;
    TrainConfig m = c;
    m.micro_batch = 1;
    m.model.recompute = Recompute::full;
    check_same(run_training(m, test::throwing_world(), nullptr), 1e-4);
    for (const char* spec : {"dense", "dilated:w=64,256;r=1,4"}) {
      INFO("cp 2, attention " << spec);
      TrainConfig one = c, two = c;
      one.model.context = two.model.context = 256;  // zigzag: 4 chunks of one 64-token block
      one.model.attention = two.model.attention = longattn::parse_attention_spec(spec);
      const TrainResult local = run_training(one, self(), nullptr);
      two.cp = 2;
      for (const Recompute recompute : {Recompute::selective, Recompute::full}) {
        two.model.recompute = recompute;
        two.micro_batch = 2;
        check_same_losses(losses(run_training(two, test::throwing_world(), nullptr)), losses(local), 1e-4);
      }
    }
  }
}

// Mixed precision: 16-bit parameters, activations and attention with fp32 gradients, master
// weights and moments follow the fp32 run within the storage's precision (bf16 keeps 8
// significant bits, fp16 11), and hold less memory. A checkpoint holds the fp32 master weights:
// resuming gives the uninterrupted run's losses in every precision.
TEST_CASE("bf16 and fp16 training follows fp32 within their precision", "[train][precision]") {
  TrainConfig c = tiny_config();
  c.steps = 6;
  const TrainResult fp32 = run_training(c, test::throwing_world(), nullptr);
  for (const auto& [precision, tolerance] : {std::pair{Precision::bf16, 0.02}, std::pair{Precision::fp16, 0.005}}) {
    INFO("precision " << to_string(precision));
    TrainConfig m = c;
    m.precision = precision;
    const TrainResult half = run_training(m, test::throwing_world(), nullptr);
    check_same_losses(losses(half), losses(fp32), tolerance);
    CHECK(losses(half) != losses(fp32));  // the 16-bit path ran
    // Less memory, but for the workspace of the GPU's 16-bit products (cuBLAS's: larger than
    // this whole model).
    CHECK(half.steps.back().memory_bytes - longattn::gemm_workspace_bytes<Kokkos::DefaultExecutionSpace>() <
          fp32.steps.back().memory_bytes);
    for (const StepRecord& r : half.steps) CHECK_FALSE(r.skipped);

    // Written after 3 steps, resumed for the rest: the same losses (fp16: with its loss scale).
    m.checkpoint = shared_path("precision.ckpt");
    m.stop_after = 3;
    std::vector<double> joined = losses(run_training(m, test::throwing_world(), nullptr));
    m.stop_after = 0;
    m.resume = true;
    for (double loss : losses(run_training(m, test::throwing_world(), nullptr))) joined.push_back(loss);
    check_same_losses(joined, losses(half), 1e-6);
  }
  test::throwing_world().barrier();
  if (test::throwing_world().rank() == 0) std::filesystem::remove(shared_path("precision.ckpt"));
}

// 16 bits over 2 ranks: context parallel (ring attention with 16-bit pieces and float accumulation
// over its steps; distributed dilated attention gathering in 16 bits) follows one rank in the same
// precision; data parallel with gradients all-reduced in the model's 16-bit type follows the fp32
// all-reduce within that type's rounding.
TEST_CASE("16-bit training over 2 ranks: context parallel, and gradients all-reduced in 16 bits", "[train][precision]") {
  if (!two_ranks()) return;
  // Measured: the losses differ by about 1e-5 (bf16) and 1e-6 (fp16) relative; the bound is
  // fp32's for the same comparisons.
  for (const Precision precision : {Precision::bf16, Precision::fp16}) {
    for (const char* spec : {"dense", "dilated:w=64,256;r=1,4"}) {
      INFO(to_string(precision) << ", cp 2, attention " << spec);
      check_context_parallel(spec, precision);
    }
    INFO(to_string(precision) << ", dp 2, gradients all-reduced in fp32 and in " << to_string(precision));
    TrainConfig c = tiny_config();
    c.precision = precision;
    c.steps = 4;
    const TrainResult fp32_reduce = run_training(c, test::throwing_world(), nullptr);
    c.grad_reduce = GradientReduce::model;
    const TrainResult half_reduce = run_training(c, test::throwing_world(), nullptr);
    check_same_losses(losses(half_reduce), losses(fp32_reduce), 1e-4);
    CHECK(losses(half_reduce) != losses(fp32_reduce));  // the 16-bit all-reduce ran
  }
}

// A loss scale of 2^32 makes the tiny model's fp16 gradients overflow (65504 is fp16's largest):
// those steps are skipped and the scale halves until the gradients fit; after `window` good
// steps it doubles. The run recovers and learns, and the log says what happened.
TEST_CASE("fp16 loss scaling skips overflowing steps and recovers", "[train][precision]") {
  TrainConfig c = tiny_config();
  c.precision = Precision::fp16;
  c.loss_scale.initial = std::ldexp(1.0, 32);
  c.loss_scale.window = 4;
  c.steps = 40;
  c.optimizer.lr = 3e-3;
  std::ostringstream log;
  const TrainResult r = run_training(c, test::throwing_world(), &log);
  REQUIRE(r.steps.size() == 40);
  CHECK(r.steps[0].skipped);
  CHECK(r.steps[0].loss_scale == std::ldexp(1.0, 32));
  int skipped = 0, good_run = 0, doublings = 0;
  for (std::size_t i = 0; i + 1 < r.steps.size(); ++i) {
    INFO("step " << r.steps[i].step << ", loss scale " << r.steps[i].loss_scale);
    if (r.steps[i].skipped) {
      ++skipped;
      good_run = 0;
      CHECK(r.steps[i + 1].loss_scale == r.steps[i].loss_scale / 2);
    } else if (++good_run == 4) {
      good_run = 0;
      ++doublings;
      CHECK(r.steps[i + 1].loss_scale == r.steps[i].loss_scale * 2);
    } else {
      CHECK(r.steps[i + 1].loss_scale == r.steps[i].loss_scale);
    }
  }
  INFO(skipped << " steps skipped, " << doublings << " doublings");
  CHECK(skipped >= 6);  // from 2^32 down to where the gradients fit
  CHECK(doublings >= 1);
  CHECK(r.steps.back().loss < 0.8 * r.steps.front().loss);
  if (test::throwing_world().rank() == 0) {
    CHECK_THAT(log.str(), Catch::Contains("overflow  step 1: gradients not finite at loss scale") &&
                              Catch::Contains("step skipped; loss scale now"));
  }
}

TEST_CASE("a resumed run gives the losses of an uninterrupted one", "[train][checkpoint]") {
  TrainConfig c = tiny_config();
  c.steps = 6;
  const std::vector<double> whole = losses(run_training(c, test::throwing_world(), nullptr));
  c.checkpoint = shared_path("resume.ckpt");
  c.stop_after = 3;
  const TrainResult first = run_training(c, test::throwing_world(), nullptr);
  CHECK(first.steps.size() == 3);
  c.stop_after = 0;
  c.resume = true;
  const TrainResult rest = run_training(c, test::throwing_world(), nullptr);
  CHECK(rest.first_step == 4);
  std::vector<double> joined = losses(first);
  for (double loss : losses(rest)) joined.push_back(loss);
  check_same_losses(joined, whole, 1e-6);
  if (test::throwing_world().rank() == 0) CHECK_FALSE(std::filesystem::exists(c.checkpoint + ".tmp"));
  {
    INFO("written recomputing everything in micro-batches of 1, resumed recomputing attention in 2");
    TrainConfig other = c;
    other.resume = false;
    other.stop_after = 3;
    other.model.recompute = Recompute::full;
    other.micro_batch = 1;
    std::vector<double> mixed = losses(run_training(other, test::throwing_world(), nullptr));
    other.resume = true;
    other.stop_after = 0;
    other.model.recompute = Recompute::selective;
    other.micro_batch = 2 / test::throwing_world().size();
    for (double loss : losses(run_training(other, test::throwing_world(), nullptr))) mixed.push_back(loss);
    check_same_losses(mixed, whole, 1e-5);
  }

  SECTION("a mismatched checkpoint is refused") {
    c.model.embed = 64;
    CHECK_THROWS_WITH(run_training(c, test::throwing_world(), nullptr),
                      Catch::Contains("checkpoint's embed") && Catch::Contains("32") && Catch::Contains("64 (this run's"));
  }
  SECTION("a corrupted checkpoint is refused") {
    test::throwing_world().barrier();
    if (test::throwing_world().rank() == 0) {
      std::fstream file(c.checkpoint, std::ios::in | std::ios::out | std::ios::binary);
      file.seekp(-100, std::ios::end);
      file.put('\x5a');
    }
    test::throwing_world().barrier();
    CHECK_THROWS_WITH(run_training(c, test::throwing_world(), nullptr), Catch::Contains("checksum"));
  }
  SECTION("a truncated checkpoint is refused") {
    test::throwing_world().barrier();
    if (test::throwing_world().rank() == 0) std::filesystem::resize_file(c.checkpoint, std::filesystem::file_size(c.checkpoint) - 10);
    test::throwing_world().barrier();
    CHECK_THROWS_WITH(run_training(c, test::throwing_world(), nullptr), Catch::Contains("truncated"));
  }
  SECTION("a file that is not a checkpoint is refused") {
    c.checkpoint = shared_path("not-a-checkpoint");
    if (test::throwing_world().rank() == 0) std::ofstream(c.checkpoint) << "hello\n";
    test::throwing_world().barrier();
    CHECK_THROWS_WITH(run_training(c, test::throwing_world(), nullptr), Catch::Contains("not a longattn checkpoint"));
  }
  // Each section runs the case again; remove what any of them wrote.
  test::throwing_world().barrier();
  if (test::throwing_world().rank() == 0) {
    std::filesystem::remove(shared_path("resume.ckpt"));
    std::filesystem::remove(shared_path("not-a-checkpoint"));
  }
}

TEST_CASE("checkpoints with bad metadata are refused naming the field", "[train][checkpoint][errors]") {
  const auto world = test::throwing_world();
  TrainConfig c = tiny_config();
  c.checkpoint = shared_path("metadata.ckpt");
  c.stop_after = 2;
  run_training(c, world, nullptr);
  c.stop_after = 0;
  c.resume = true;
  const Checkpoint good = read_checkpoint(c.checkpoint);
  // The metadata is not covered by the checksum: write_checkpoint re-checksums the payload, so
  // only the field read from the metadata can refuse the file.
  auto resume_with = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& text) {
    world.barrier();
    if (world.rank() == 0) {
      Checkpoint changed = good;
      edit(changed.metadata);
      write_checkpoint(c.checkpoint, changed);
    }
    world.barrier();
    CHECK_THROWS_WITH(run_training(c, world, nullptr), Catch::Contains(text));
  };
  resume_with([](nlohmann::json& m) { m.erase("step"); }, "checkpoint's step' is missing");
  resume_with([](nlohmann::json& m) { m["step"] = "2"; }, "checkpoint's step' is \"2\", expected an integer in [0, 5]");
  resume_with([](nlohmann::json& m) { m["step"] = 6; }, "checkpoint's step' is 6");
  resume_with([](nlohmann::json& m) { m["optimizer_steps"] = -1; }, "checkpoint's optimizer_steps' is -1");
  resume_with([](nlohmann::json& m) { m["rng"] = "not an engine"; }, "checkpoint's rng");
  resume_with([](nlohmann::json& m) { m["rng"] = 7; }, "checkpoint's rng' is 7");
  resume_with([](nlohmann::json& m) { m["loss_scale"] = -1.0; }, "checkpoint's loss_scale' is -1.0");
  resume_with([](nlohmann::json& m) { m["loss_scale"] = 2.0; m["good_steps"] = "x"; }, "checkpoint's good_steps");

  // Files that read_checkpoint itself refuses: the fields that size the payload.
  const std::string header = "longattn-checkpoint 1\n";
  auto read_refuses = [&](const std::string& metadata, const std::string& text) {
    world.barrier();
    if (world.rank() == 0) std::ofstream(c.checkpoint, std::ios::binary) << header << metadata << "\nabcd";
    world.barrier();
    CHECK_THROWS_WITH(read_checkpoint(c.checkpoint), Catch::Contains(text));
  };
  read_refuses(R"({"payload_bytes": "4", "checksum": "0000000000000000"})", "payload_bytes' is \"4\"");
  read_refuses(R"({"payload_bytes": -4, "checksum": "0000000000000000"})", "payload_bytes' is -4");
  read_refuses(R"({"payload_bytes": 1000000000000000000, "checksum": "0000000000000000"})",
               "no larger than the rest of the file, 4");
  read_refuses(R"({"payload_bytes": 4, "checksum": 12})", "checksum' is 12");
  read_refuses(R"({"payload_bytes": 4, "checksum": "00"})", "16 hex digits");
  read_refuses(R"([1, 2])", "metadata with payload_bytes and checksum");
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove(c.checkpoint);
}

TEST_CASE("a checkpoint write that fails leaves the previous checkpoint", "[train][checkpoint][errors]") {
  const auto world = test::throwing_world();
  TrainConfig c = tiny_config();
  c.checkpoint = shared_path("full.ckpt");
  c.stop_after = 2;
  run_training(c, world, nullptr);
  const std::uintmax_t bytes = std::filesystem::file_size(c.checkpoint);
  // A file size limit below the checkpoint's (as a full disk or quota): writes past it fail with
  // EFBIG once SIGXFSZ, which would kill the process, is ignored. Rank 0 writes.
  rlimit before{};
  REQUIRE(getrlimit(RLIMIT_FSIZE, &before) == 0);
  rlimit limit = before;
  limit.rlim_cur = rlim_t(bytes / 2);
  const auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);
  REQUIRE(setrlimit(RLIMIT_FSIZE, &limit) == 0);
  c.stop_after = 4;
  c.resume = true;
  std::string error;
  try {
    run_training(c, world, nullptr);
  } catch (const longattn::Error& e) {
    error = e.what();
  }
  REQUIRE(setrlimit(RLIMIT_FSIZE, &before) == 0);
  std::signal(SIGXFSZ, previous_handler);
  CHECK_THAT(error, Catch::Contains(c.checkpoint + ".tmp") && Catch::Contains("File too large"));
  world.barrier();
  // The step-2 checkpoint is whole and loadable, and no partial file is left beside it.
  CHECK(read_checkpoint(c.checkpoint).metadata["step"] == 2);
  CHECK_FALSE(std::filesystem::exists(c.checkpoint + ".tmp"));
  c.stop_after = 0;
  CHECK(run_training(c, world, nullptr).first_step == 3);
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove(c.checkpoint);
}

TEST_CASE("a checkpoint writer killed during the save leaves the previous checkpoint", "[train][checkpoint][errors]") {
  const auto world = test::throwing_world();
  const std::string path = shared_path("killed.ckpt");
  Checkpoint previous;
  previous.metadata = {{"step", 2}};
  previous.payload.assign(4096, 7);
  if (world.rank() == 0) {
    write_checkpoint(path, previous);
    // A child process writes a 256 MiB checkpoint over it (write, then fsync: long enough to be
    // caught in) and is SIGKILLed as soon as it has written anything.
    std::filesystem::remove(path + ".tmp");
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      Checkpoint next;
      next.metadata = {{"step", 4}};
      next.payload.assign(std::size_t(256) << 20, 9);
      try {
        write_checkpoint(path, next);
      } catch (...) {
      }
      _exit(0);  // not exit(): the child must not run the parent's MPI and Kokkos finalizers
    }
    // Written anything yet, wherever it writes?
    const std::uintmax_t previous_bytes = std::filesystem::file_size(path);
    auto started = [&] {
      std::error_code temporary_error, error;
      const std::uintmax_t temporary_bytes = std::filesystem::file_size(path + ".tmp", temporary_error);
      const std::uintmax_t bytes = std::filesystem::file_size(path, error);
      return (!temporary_error && temporary_bytes > 0) || error || bytes != previous_bytes;
    };
    int status = 0;
    bool writing = true;
    while (writing && !started()) writing = waitpid(child, &status, WNOHANG) == 0;
    REQUIRE(writing);  // caught before the child finished
    kill(child, SIGKILL);
    REQUIRE(waitpid(child, &status, 0) == child);
    CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
    // The half-written file is only ever PATH.tmp; PATH is the previous checkpoint, whole.
    CHECK(std::filesystem::exists(path + ".tmp"));
    const Checkpoint read = read_checkpoint(path);
    CHECK(read.metadata["step"] == 2);
    CHECK(read.payload == previous.payload);
    // The next save replaces the leftover, whatever it is (here a FIFO, which would block an open).
    std::filesystem::remove(path + ".tmp");
    REQUIRE(mkfifo((path + ".tmp").c_str(), 0600) == 0);
    previous.metadata["step"] = 6;
    write_checkpoint(path, previous);
    CHECK(read_checkpoint(path).metadata["step"] == 6);
    CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
    std::filesystem::remove(path);
  }
  world.barrier();
}

TEST_CASE("the memory limit reached in a step stops the run after saving the last good state",
          "[train][checkpoint][errors]") {
  // On one rank (the several-rank form ends the job with MPI_Abort: train_memory_limit_np2 runs
  // the app under mpiexec for it).
  const auto world = test::throwing_world();
  const parallel::Communicator one = self();
  if (world.rank() == 0) {
    TrainConfig c = tiny_config();
    c.model.context = 256;
    c.batch = 8;
    c.checkpoint = shared_path("memory.ckpt");
    // Two steps in micro-batches of 1 (little memory), checkpointed; and how much a step of all
    // 8 sequences at once holds.
    c.micro_batch = 1;
    c.stop_after = 2;
    const std::size_t small = run_training(c, one, nullptr).steps.back().memory_bytes;
    TrainConfig whole = c;
    whole.micro_batch = 0;
    whole.checkpoint.clear();
    whole.stop_after = 1;
    const std::size_t large = run_training(whole, one, nullptr).steps.back().memory_bytes;
    INFO("pool high-water: " << small << " bytes in micro-batches of 1, " << large << " all at once");
    REQUIRE(large > small + (std::size_t(4) << 20));
    std::ifstream saved_file(c.checkpoint, std::ios::binary);
    const std::string saved((std::istreambuf_iterator<char>(saved_file)), std::istreambuf_iterator<char>());
    // Resumed all at once under a limit between the two: step 3 runs out.
    c.micro_batch = 0;
    c.stop_after = 0;
    c.resume = true;
    c.memory_limit_mib = std::int64_t((small + large) / 2 >> 20);
    std::string error;
    try {
      run_training(c, one, nullptr);
    } catch (const longattn::Error& e) {
      error = e.what();
    }
    CHECK_THAT(error, Catch::Contains("rank 0 stopped in step 3: longattn::memory::Pool::allocate: cannot allocate") &&
                          Catch::Contains("pool's limit of " + std::to_string(c.memory_limit_mib) + ".0 MiB") &&
                          Catch::Contains("in use") &&
                          Catch::Contains("Saved the last good state (step 2) to " + c.checkpoint));
    // What it saved is the step's start: the step-2 checkpoint, byte for byte (parameters,
    // moments, the random engine before step 3's batch); no temporary left.
    std::ifstream resaved_file(c.checkpoint, std::ios::binary);
    const std::string resaved((std::istreambuf_iterator<char>(resaved_file)), std::istreambuf_iterator<char>());
    CHECK(resaved == saved);
    CHECK_FALSE(std::filesystem::exists(c.checkpoint + ".rank0.tmp"));
    c.memory_limit_mib = 0;
    CHECK(run_training(c, one, nullptr).first_step == 3);
    std::filesystem::remove(c.checkpoint);
  }
  world.barrier();
}

TEST_CASE("a non-finite loss stops the run naming the step and the first non-finite tensor", "[train][errors]") {
  const auto world = test::throwing_world();
  TrainConfig c = tiny_config();
  c.optimizer.lr = 1e38f;  // the first update overflows the weights
  c.optimizer.warmup = 0;
  c.optimizer.clip = 0;
  CHECK_THROWS_WITH(run_training(c, world, nullptr),
                    Catch::Contains("loss at step 2") && Catch::Contains("finite") &&
                        Catch::Contains("the first non-finite tensor of the step: "));

  // One NaN planted in a weight of a checkpoint: the resumed run's step names it.
  c = tiny_config();
  c.checkpoint = shared_path("nan.ckpt");
  c.stop_after = 2;
  run_training(c, world, nullptr);
  if (world.rank() == 0) {
    Checkpoint checkpoint = read_checkpoint(c.checkpoint);
    const Transformer<Kokkos::DefaultExecutionSpace, float> model(c.model);  // its groups: the payload's order
    std::size_t offset = 0;
    for (const auto& g : model.parameter_groups()) {
      if (g.name == "layer1.mlp.w1") break;
      offset += g.count;
    }
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(checkpoint.payload.data() + (offset + 5) * sizeof(float), &nan, sizeof nan);
    write_checkpoint(c.checkpoint, checkpoint);
  }
  world.barrier();
  c.resume = true;
  c.stop_after = 0;
  CHECK_THROWS_WITH(run_training(c, world, nullptr),
                    Catch::Contains("argument 'loss at step 3' is nan") &&
                        Catch::Contains("the first non-finite tensor of the step: layer1.mlp.w1 nan at [5])"));
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove(c.checkpoint);
}

TEST_CASE("bad options are refused naming them", "[train][errors]") {
  const auto world = test::throwing_world();
  TrainConfig c = tiny_config();
  auto fails = [&](const TrainConfig& config, const std::string& text) {
    CHECK_THROWS_WITH(run_training(config, world, nullptr), Catch::Contains(text));
  };
  TrainConfig bad = c;
  bad.cp = 3;
  fails(bad, "argument 'cp' is 3, expected a divisor of ranks / tp = " + std::to_string(world.size()));
  bad = c;
  bad.tp = 3;
  fails(bad, "argument 'tp' is 3, expected a divisor of the " + std::to_string(world.size()) + " ranks");
  bad = c;
  bad.model.heads = 5;
  fails(bad, "argument 'embed' is 32, expected a positive multiple of heads = 5");
  bad = c;
  bad.data.text = "/nonexistent/text";
  fails(bad, "argument 'text' is \"/nonexistent/text\", expected a readable file");
  bad = c;
  bad.model.context = 40000;
  fails(bad, "expected a file whose train and validation parts each hold one sequence");
  bad = c;
  bad.resume = true;
  fails(bad, "argument 'resume' is true, expected a --checkpoint file");
  bad = c;
  bad.micro_batch = 3;
  fails(bad, "argument 'micro-batch' is 3, expected a divisor of batch / dp = " + std::to_string(4 / world.size()));
  CHECK_THROWS_WITH(named_model_shape("7b"), Catch::Contains("argument 'model' is \"7b\", expected one of 350m, 1.3b"));
  CHECK_THROWS_WITH(parse_recompute("some"), Catch::Contains("argument 'recompute' is \"some\", expected one of none, selective, full"));
  CHECK_THROWS_WITH(parse_positions("absolute"), Catch::Contains("argument 'positions' is \"absolute\", expected one of learned, rotary"));
  bad = c;
  bad.model.heads = 32;  // head dim 1
  bad.model.positions = PositionEncoding::rotary;
  fails(bad, "argument 'embed / heads' is 1, expected an even head dim with rotary positions");
  CHECK_THROWS_WITH(parse_precision("fp8"), Catch::Contains("argument 'precision' is \"fp8\", expected one of fp32, bf16, fp16"));
  CHECK_THROWS_WITH(parse_gradient_reduce("bf16"), Catch::Contains("argument 'grad-reduce' is \"bf16\", expected fp32 or model"));
  bad = c;
  bad.loss_scale.initial = 0;
  fails(bad, "argument 'loss-scale' is 0, expected a positive finite factor");
  bad = c;
  bad.zero = 3;
  fails(bad, "argument 'zero' is 3, expected 0, 1 or 2 (ZeRO 1: AdamW's state sharded over the ranks; 2: the "
             "gradients too; stage 3 is not built)");
  bad = c;
  bad.sequence_parallel = true;
  fails(bad, "argument 'sequence-parallel' is true, expected --tp > 1");
  if (world.size() == 2) {
    bad = c;
    bad.batch = 3;
    fails(bad, "argument 'batch' is 3, expected a positive multiple of dp");
    bad = c;
    bad.cp = 2;
    bad.model.context = 256;
    bad.model.attention = longattn::parse_attention_spec("block_sparse:pattern=top_k;k=2");
    fails(bad, "a fixed block-sparse pattern");
    bad = c;
    bad.tp = 2;
    bad.model.heads = 1;
    fails(bad, "argument 'tp' is 2, expected a divisor of the 1 heads");
    bad = c;
    bad.tp = 2;
    bad.model.attention = longattn::parse_attention_spec("dilated:w=16;r=2");
    fails(bad, "argument 'tp' is 2, expected 1 with dilated");
    bad = c;
    bad.tp = 2;
    bad.sequence_parallel = true;
    bad.model.context = 65;
    fails(bad, "argument 'sequence-parallel' is true, expected tokens per rank context / cp = 65 divisible by tp = 2");
  }
}
