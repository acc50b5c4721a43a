// longattn-train's pieces and its loop: the whole model's gradients by finite differences, the
// optimizer against its formulas, the data, checkpoints (atomic, refused when corrupted or
// mismatched), the loss falling on real text, and the grid: DP = 2 and CP = 2 (ring attention,
// distributed dilated attention, block-sparse ring) give the losses of one rank. Runs at 1 and 2
// ranks; the grid comparisons need 2.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "longattn/train/checkpoint.hpp"
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

// A checkpoint path every rank agrees on.
std::string shared_path(const char* name) {
  return (std::filesystem::temp_directory_path() /
          ("longattn_test_" + std::to_string(test::shared_seed()) + "_" + name))
      .string();
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
  INFO("attention " << spec << ", seed " << config.seed);
  using Model = Transformer<Host, double>;
  Model model(config);
  const int B = 2, n = 70;
  Model::Batch batch{Model::TokenIds("inputs", B, n), Model::TokenIds("targets", B, n), Model::Weights("weights", B, n),
                     Model::Positions("positions", n)};
  std::mt19937_64 rng(config.seed + 1);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < n; ++t) {
      batch.inputs(b, t) = int(rng() % 256);
      batch.targets(b, t) = int(rng() % 256);
      batch.weights(b, t) = rng() % 4 == 0 ? 0.0 : 1.0;  // some tokens not counted
    }
  for (int t = 0; t < n; ++t) batch.positions(t) = t;
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

TEST_CASE("data parallel: 2 ranks give the losses of 1 with the same global batch", "[train][grid]") {
  if (test::throwing_world().size() != 2) return;
  TrainConfig c = tiny_config();
  const std::vector<double> one = losses(run_training(c, self(), nullptr));
  const TrainResult two = run_training(c, test::throwing_world(), nullptr);
  CHECK(two.dp == 2);
  check_same_losses(losses(two), one, 1e-4);
}

TEST_CASE("context parallel: 2 ranks give the losses of 1, for each attention kind", "[train][grid]") {
  if (test::throwing_world().size() != 2) return;
  const auto spec = GENERATE(as<std::string>{}, "dense", "dilated:w=64,256;r=1,4",
                             "block_sparse:pattern=local_window;radius=64");
  INFO("attention " << spec);
  TrainConfig c = tiny_config();
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

TEST_CASE("a non-finite loss stops the run naming the step", "[train][errors]") {
  TrainConfig c = tiny_config();
  c.optimizer.lr = 1e38f;  // the first update overflows the weights
  c.optimizer.warmup = 0;
  c.optimizer.clip = 0;
  CHECK_THROWS_WITH(run_training(c, test::throwing_world(), nullptr), Catch::Contains("loss at step 2") && Catch::Contains("finite"));
}

TEST_CASE("bad options are refused naming them", "[train][errors]") {
  const auto world = test::throwing_world();
  TrainConfig c = tiny_config();
  auto fails = [&](const TrainConfig& config, const std::string& text) {
    CHECK_THROWS_WITH(run_training(config, world, nullptr), Catch::Contains(text));
  };
  TrainConfig bad = c;
  bad.cp = 3;
  fails(bad, "argument 'cp' is 3, expected a divisor of the " + std::to_string(world.size()) + " ranks");
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
  if (world.size() == 2) {
    bad = c;
    bad.batch = 3;
    fails(bad, "argument 'batch' is 3, expected a positive multiple of dp");
    bad = c;
    bad.cp = 2;
    bad.model.context = 256;
    bad.model.attention = longattn::parse_attention_spec("block_sparse:pattern=top_k;k=2");
    fails(bad, "a fixed block-sparse pattern");
  }
}
