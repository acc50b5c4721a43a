#include "longattn/train/trainer.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <tuple>
#include <utility>
#include <vector>

#include "longattn/core/ceilings.hpp"
#include "longattn/core/layer_norm.hpp"
#include "longattn/parallel/context_parallel_attention.hpp"
#include "longattn/parallel/gradient_buckets.hpp"
#include "longattn/parallel/gradient_reduce_scatter.hpp"
#include "longattn/parallel/tensor_parallel.hpp"
#include "longattn/train/checkpoint.hpp"
#include "longattn/train/prediction.hpp"
#include "longattn/train/reference_export.hpp"
#include "longattn/train/zero.hpp"

namespace longattn::train {

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* program = "longattn-train";

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One phase of a step (trainer.hpp, Phase): a Kokkos Tools region while it runs; its time, up to
// a fence of the instance (kernels count in the phase that launched them), added to `seconds`.
template <class Exec>
class PhaseScope {
 public:
  PhaseScope(Phase phase, const Exec& exec, std::array<double, phase_count>& seconds)
      : phase_(phase), exec_(exec), seconds_(seconds), start_(Clock::now()) {
    Kokkos::Profiling::pushRegion(std::string(program) + ": " + to_string(phase));
  }
  ~PhaseScope() {
    exec_.fence();
    seconds_[std::size_t(phase_)] += seconds_since(start_);
    Kokkos::Profiling::popRegion();
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Phase phase_;
  Exec exec_;
  std::array<double, phase_count>& seconds_;
  Clock::time_point start_;
};

// The fastest of three windows of a rate `measure` takes, the ranks starting each together: a
// window in which the OS had two ranks on one core, or a neighbour took the core, reads half (one
// of about ten starts on a 2-core guest read 0.53 of the rest, and every prediction doubled).
template <class Measure>
double fastest_of_three_windows(const parallel::Communicator& world, const Measure& measure) {
  double best = 0;
  for (int window = 0; window < 3; ++window) {
    world.barrier();
    best = std::max(best, measure());
  }
  return best;
}

// This rank's rate for element-wise kernels (elements per second), the ranks together: LayerNorm
// forward over 2048 x 128 floats (the calibration model's rows; in cache), the fastest of three
// 0.1 s windows. On a shared virtual machine a neighbour's cache and memory traffic slows these
// kernels by 1.2-1.5x for minutes while the FMA probe reads the same; the prediction scales the
// calibration's element costs by its rate over this one (plan::Efficiency::element_rates).
template <class Exec>
double measure_element_rate(const Exec& exec, const parallel::Communicator& world) {
  using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, typename Exec::memory_space>;
  using Vector = Kokkos::View<float*, typename Exec::memory_space>;
  constexpr int rows = 2048, columns = 128;
  const Matrix x("longattn-train: probe x", rows, columns), y("longattn-train: probe y", rows, columns);
  const Vector gamma("longattn-train: probe gamma", columns), beta("longattn-train: probe beta", columns);
  const Vector mean("longattn-train: probe mean", rows), rstd("longattn-train: probe rstd", rows);
  Kokkos::parallel_for(
      "longattn-train: probe fill", Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {rows, columns}),
      KOKKOS_LAMBDA(int i, int j) { x(i, j) = float((i * 7 + j * 13) % 17) * 0.0625f; });
  Kokkos::deep_copy(exec, gamma, 1.0f);
  exec.fence();
  return fastest_of_three_windows(world, [&] {
    std::int64_t calls = 0;
    const Clock::time_point start = Clock::now();
    do {
      layer_norm_forward(exec, x, gamma, beta, 1e-5, y, mean, rstd);
      exec.fence();
      ++calls;
    } while (seconds_since(start) < 0.1);
    return double(calls) * rows * columns / seconds_since(start);
  });
}

// What a checkpoint must agree on with the run that resumes it.
nlohmann::json run_identity(const TrainConfig& c) {
  return {{"layers", c.model.layers}, {"embed", c.model.embed}, {"heads", c.model.heads},
          {"context", c.model.context}, {"positions", to_string(c.model.positions)},
          {"attention", to_string(c.model.attention)}, {"seed", c.model.seed},
          {"task", to_string(c.data.task)}, {"text", c.data.task == Task::text ? c.data.text : ""},
          {"pairs", c.data.pairs}, {"queries", c.data.queries}, {"batch", c.batch}, {"data_seed", c.data_seed}};
}

// The tokens of one micro-batch of this rank: `sequences` of its sequences of the global batch,
// its segments of each. Filled on the host, then copied to the model's memory.
template <class Exec, class T>
class LocalBatch {
 public:
  using Model = Transformer<Exec, T>;
  LocalBatch(std::int64_t first, std::int64_t sequences, const std::vector<parallel::Segment>& segments)
      : segments_(segments), first_(first), sequences_(sequences) {
    std::int64_t n = 0;
    for (const auto& s : segments) n += s.tokens;
    batch_.inputs = typename Model::TokenIds("inputs", sequences, n);
    batch_.targets = typename Model::TokenIds("targets", sequences, n);
    batch_.weights = typename Model::Weights("weights", sequences, n);
    batch_.positions = typename Model::Positions("positions", n);
    inputs_ = Kokkos::create_mirror_view(batch_.inputs);
    targets_ = Kokkos::create_mirror_view(batch_.targets);
    weights_ = Kokkos::create_mirror_view(batch_.weights);
    const auto positions = Kokkos::create_mirror_view(batch_.positions);
    for (const auto& s : segments)
      for (std::int64_t t = 0; t < s.tokens; ++t) positions(s.local_begin + t) = int(s.global_begin + t);
    Kokkos::deep_copy(batch_.positions, positions);
  }
  // Micro-batch `micro` of this rank's part of `global`.
  const typename Model::Batch& fill(const HostBatch& global, std::int64_t micro) {
    const std::int64_t first = first_ + micro * sequences_;
    for (std::int64_t b = 0; b < sequences_; ++b)
      for (const auto& s : segments_)
        for (std::int64_t t = 0; t < s.tokens; ++t) {
          const std::size_t from = std::size_t((first + b) * global.tokens + s.global_begin + t);
          inputs_(b, s.local_begin + t) = global.inputs[from];
          targets_(b, s.local_begin + t) = global.targets[from];
          weights_(b, s.local_begin + t) = T(global.weights[from]);
        }
    Kokkos::deep_copy(batch_.inputs, inputs_);
    Kokkos::deep_copy(batch_.targets, targets_);
    Kokkos::deep_copy(batch_.weights, weights_);
    return batch_;
  }

 private:
  std::vector<parallel::Segment> segments_;
  std::int64_t first_, sequences_;
  typename Model::Batch batch_;
  typename Model::TokenIds::HostMirror inputs_, targets_;
  typename Model::Weights::HostMirror weights_;
};

// A stretch of a checkpoint's payload, as floats.
using PayloadFloats = Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;

// A float vector over parameter groups (parameters, AdamW's moments) as tensor-parallel ranks hold
// it - each group's part, one after the other - and as a checkpoint holds it: each group whole.
struct SplitFloats {
  std::vector<FeatureSplit> splits;  // the groups', in order
  int parts = 1;

  std::size_t part_count() const {
    std::size_t n = 0;
    for (const auto& s : splits) n += s.part_count(parts);
    return n;
  }
  std::size_t whole_count() const {
    std::size_t n = 0;
    for (const auto& s : splits) n += s.whole_count();
    return n;
  }
  // whole (whole_count()) from every part's vector, `gathered` (parts x part_count(), rank order).
  void assemble(const float* gathered, float* whole) const {
    for (int p = 0; p < parts; ++p) {
      const float* part = gathered + std::size_t(p) * part_count();
      std::size_t whole_at = 0;
      for (const auto& s : splits) {
        s.insert(parts, p, part, whole + whole_at);
        part += s.part_count(parts);
        whole_at += s.whole_count();
      }
    }
  }
  // part p's vector (part_count()) from the whole one.
  void extract(int p, const float* whole, float* part) const {
    for (const auto& s : splits) {
      s.extract(parts, p, whole, part);
      whole += s.whole_count();
      part += s.part_count(parts);
    }
  }
};

std::string duration(double seconds) {
  const long s = long(std::lround(std::max(0.0, seconds)));
  std::ostringstream out;
  out << s / 60 << ":" << std::setw(2) << std::setfill('0') << s % 60;
  return out.str();
}

}  // namespace

void validate(const TrainConfig& c, int world_size) {
  validate(c.model);
  validate(c.optimizer);
  require(c.steps >= 1, program, "steps", c.steps, "at least 1");
  require(c.tp >= 1 && world_size % c.tp == 0, program, "tp", c.tp,
          "a divisor of the " + std::to_string(world_size) + " ranks");
  require(c.model.heads % c.tp == 0, program, "tp", c.tp,
          "a divisor of the " + std::to_string(c.model.heads) + " heads (each tensor-parallel rank holds heads / tp)");
  require(c.tp == 1 || c.model.attention.kind == AttentionSpec::Kind::dense ||
              c.model.attention.kind == AttentionSpec::Kind::block_sparse,
          program, "tp", c.tp,
          "1 with " + to_string(c.model.attention) +
              " attention (tensor parallelism splits the heads of dense and block-sparse attention; dilated "
              "attention's offsets, and auto's choice of it, follow the head index over all heads)");
  require(c.cp >= 1 && (world_size / c.tp) % c.cp == 0, program, "cp", c.cp,
          "a divisor of ranks / tp = " + std::to_string(world_size / c.tp));
  require(!c.sequence_parallel || c.tp > 1, program, "sequence-parallel", "true",
          "--tp > 1 (it splits each tensor-parallel group's tokens)");
  require(!c.sequence_parallel || (c.model.context / c.cp) % c.tp == 0, program, "sequence-parallel", "true",
          "tokens per rank context / cp = " + std::to_string(c.model.context / c.cp) + " divisible by tp = " +
              std::to_string(c.tp));
  require(c.precision == Precision::fp32 || c.model.attention.kind != AttentionSpec::Kind::block_sparse ||
              c.model.attention.block_sparse.pattern != BlockSparsePattern::top_k,
          program, "attention", to_string(c.model.attention),
          "a fixed block-sparse pattern with --precision " + std::string(to_string(c.precision)) +
              " (top_k scores the key blocks in float: use --precision fp32)");
  const int dp = world_size / (c.tp * c.cp);
  require(c.batch >= 1 && c.batch % dp == 0, program, "batch", c.batch,
          "a positive multiple of dp = ranks / (tp x cp) = " + std::to_string(dp) + " (sequences per step)");
  const std::int64_t per_rank = c.batch / dp;
  require(c.micro_batch >= 0 && (c.micro_batch == 0 || per_rank % c.micro_batch == 0), program, "micro-batch",
          c.micro_batch,
          "a divisor of batch / dp = " + std::to_string(per_rank) + " (sequences per rank), or 0 for all of them");
  require(c.zero >= 0 && c.zero <= 2, program, "zero", c.zero,
          "0, 1 or 2 (ZeRO 1: AdamW's state sharded over the ranks; 2: the gradients too; stage 3 is not built)");
  require(c.eval_every >= 0, program, "eval-every", c.eval_every, "a step count >= 0");
  require(c.eval_batches >= 1, program, "eval-batches", c.eval_batches, "at least 1");
  require(c.checkpoint_every >= 0, program, "checkpoint-every", c.checkpoint_every, "a step count >= 0");
  require(!c.resume || !c.checkpoint.empty(), program, "resume", "true", "a --checkpoint file to resume from");
  require(c.stop_after >= 0, program, "stop-after", c.stop_after, "a step >= 0");
  require(c.export_reference.empty() || (world_size == 1 && !c.resume), program, "export-reference",
          "\"" + c.export_reference + "\"",
          "a one-rank run from its start (the reference trains the whole model from its initial weights; this run: " +
              std::to_string(world_size) + " ranks" + (c.resume ? ", resumed)" : ")"));
  require(c.memory_limit_mib >= 0 && c.memory_limit_mib < (std::int64_t(1) << 40), program, "memory-limit",
          c.memory_limit_mib, "MiB >= 0 (0: the machine's memory)");
  require(c.peak_gflops >= 0, program, "peak-gflops", c.peak_gflops, "GFLOP/s >= 0 (0: measure)");
  require(c.loss_scale.initial > 0 && std::isfinite(c.loss_scale.initial), program, "loss-scale",
          c.loss_scale.initial, "a positive finite factor");
  require(c.loss_scale.window >= 1, program, "loss-scale-window", c.loss_scale.window, "at least 1 step");
}

const char* to_string(Precision precision) {
  return precision == Precision::fp32 ? "fp32" : precision == Precision::bf16 ? "bf16" : "fp16";
}

Precision parse_precision(const std::string& text, const char* option) {
  for (const Precision p : {Precision::fp32, Precision::bf16, Precision::fp16})
    if (text == to_string(p)) return p;
  throw_invalid_argument(program, option, "\"" + text + "\"", "one of fp32, bf16, fp16");
}

const char* to_string(GradientReduce reduce) { return reduce == GradientReduce::fp32 ? "fp32" : "model"; }

const char* to_string(Phase phase) {
  static constexpr const char* names[phase_count] = {"forward",   "backward",   "gradient reduction",
                                                     "optimizer", "checkpoint", "evaluation"};
  return names[int(phase)];
}

GradientReduce parse_gradient_reduce(const std::string& text, const char* option) {
  for (const GradientReduce r : {GradientReduce::fp32, GradientReduce::model})
    if (text == to_string(r)) return r;
  throw_invalid_argument(program, option, "\"" + text + "\"", "fp32 or model");
}

nlohmann::json TrainResult::to_json(const TrainConfig& c) const {
  nlohmann::json j;
  j["config"] = run_identity(c);
  j["config"]["steps"] = c.steps;
  j["config"]["lr"] = c.optimizer.lr;
  j["config"]["micro_batch"] = c.batch / dp / micro_batches;
  j["config"]["recompute"] = to_string(c.model.recompute);
  j["config"]["precision"] = to_string(c.precision);
  j["config"]["grad_reduce"] = to_string(c.grad_reduce);
  j["config"]["zero"] = c.zero;
  j["config"]["tp"] = c.tp;
  j["config"]["sequence_parallel"] = c.sequence_parallel;
  j["grid"] = {{"dp", dp}, {"cp", cp}, {"tp", tp}};
  j["transport"] = transport;
  j["micro_batches"] = micro_batches;
  j["parameters"] = parameters;
  j["model_state_bytes"] = model_state_bytes;
  j["bucket_bytes"] = bucket_bytes;
  j["flops_per_step"] = flops_per_step;
  j["predicted_memory_bytes"] = predicted_memory_bytes;
  j["predicted_memory"] = nlohmann::json::object();
  for (const auto& [name, bytes] : predicted_memory) j["predicted_memory"][name] = bytes;
  j["predicted_compute_seconds"] = predicted_compute_seconds;
  j["predicted_compute_parts"] = nlohmann::json::object();
  for (const auto& [name, seconds] : predicted_compute_parts) j["predicted_compute_parts"][name] = seconds;
  j["predicted_elements"] = nlohmann::json::object();
  for (const auto& [name, count] : predicted_elements) j["predicted_elements"][name] = count;
  j["predicted_attention_flops"] = predicted_attention_flops;
  j["predicted_efficiency"] = c.efficiency.source;
  j["peak_gflops"] = peak_gflops;
  j["element_rate"] = element_rate;
  j["first_step"] = first_step;
  j["steps"] = nlohmann::json::array();
  const auto phase_json = [](const std::array<double, phase_count>& values) {
    nlohmann::json phases = nlohmann::json::object();
    for (int p = 0; p < phase_count; ++p) phases[to_string(Phase(p))] = values[std::size_t(p)];
    return phases;
  };
  std::array<double, phase_count> phase_total{};
  double seconds = 0;
  for (const StepRecord& s : steps) {
    j["steps"].push_back({{"step", s.step}, {"loss", s.loss}, {"lr", s.lr}, {"gradient_norm", s.gradient_norm},
                          {"seconds", s.seconds}, {"tokens_per_second", s.tokens_per_second}, {"gflops", s.gflops},
                          {"peak_fraction", s.peak_fraction}, {"communication_share", s.communication_share},
                          {"memory_bytes", s.memory_bytes}, {"loss_scale", s.loss_scale}, {"skipped", s.skipped},
                          {"phase_seconds", phase_json(s.phase_seconds)}});
    seconds += s.seconds;
    for (int p = 0; p < phase_count; ++p) phase_total[std::size_t(p)] += s.phase_seconds[std::size_t(p)];
  }
  j["evals"] = nlohmann::json::array();
  for (const EvalRecord& e : evals) j["evals"].push_back({{"step", e.step}, {"loss", e.loss}});
  // Steady-state figures: the steps after the first (which pays for first-touch allocations).
  double steady_seconds = 0, steady_comm = 0;
  for (std::size_t i = steps.size() > 1 ? 1 : 0; i < steps.size(); ++i) {
    steady_seconds += steps[i].seconds;
    steady_comm += steps[i].seconds * steps[i].communication_share;
  }
  const double steady_steps = double(steps.size() > 1 ? steps.size() - 1 : steps.size());
  const std::size_t memory = steps.empty() ? 0 : steps.back().memory_bytes, fixed = model_state_bytes + bucket_bytes;
  const auto categories_json = [](const std::vector<std::pair<std::string, std::size_t>>& table) {
    nlohmann::json categories = nlohmann::json::object();
    for (const auto& [name, bytes] : table) categories[name] = bytes;
    return categories;
  };
  const double gflops = steady_seconds > 0 ? steady_steps * flops_per_step / steady_seconds * 1e-9 : 0;
  j["summary"] = {{"seconds", seconds},
                  {"first_loss", steps.empty() ? 0.0 : steps.front().loss},
                  {"last_loss", steps.empty() ? 0.0 : steps.back().loss},
                  {"validation_loss", evals.empty() ? nlohmann::json(nullptr) : nlohmann::json(evals.back().loss)},
                  {"steady_gflops", gflops},
                  {"steady_peak_fraction", peak_gflops > 0 ? gflops / peak_gflops : 0.0},
                  {"steady_communication_share", steady_seconds > 0 ? steady_comm / steady_seconds : 0.0},
                  // a step's time after the first, less its communication: what the planner's compute term predicts
                  {"steady_compute_seconds", steady_steps > 0 ? (steady_seconds - steady_comm) / steady_steps : 0.0},
                  {"memory_bytes", memory},
                  {"memory_by_category", categories_json(memory_by_category)},
                  {"memory_at_peak", categories_json(memory_at_peak)},
                  {"phase_seconds", phase_json(phase_total)},  // every step's, summed
                  // the high-water mark beyond the model's state and the buckets: activations, workspaces
                  {"activation_bytes", memory > fixed ? memory - fixed : 0}};
  return j;
}

namespace {

// The run in the model type T (float; bfloat16 or float16 for mixed precision).
template <class Exec, class T>
TrainResult train(const TrainConfig& config, const parallel::Communicator& world, std::ostream* log) {
  using Model = Transformer<Exec, T>;
  using Memory = typename Exec::memory_space;
  // Where every kernel of the run goes and where its memory comes from (the step's high-water
  // mark below is this pool's): the default pool, or one of its own with --memory-limit.
  const ExecutionContext<Exec> context = [&] {
    if (config.memory_limit_mib == 0) return ExecutionContext<Exec>();
    memory::PoolOptions options;
    options.label = "longattn-train";
    options.limit_bytes = std::size_t(config.memory_limit_mib) << 20;
    return ExecutionContext<Exec>(Exec(), memory::Pool<Memory>(options));
  }();
  // The grid, tp innermost: rank = (dp_rank cp + cp_rank) tp + tp_rank.
  const int tp = config.tp, cp = config.cp, dp = world.size() / (tp * cp);
  const int tp_rank = world.rank() % tp, cp_rank = world.rank() / tp % cp, dp_rank = world.rank() / (tp * cp);
  const parallel::Communicator cp_group = world.split(dp_rank * tp + tp_rank, cp_rank);
  // The dp x cp ranks holding the same parameters (this tensor rank's part): they sum gradients
  // and losses, and share ZeRO's shards.
  const parallel::Communicator same_part = world.split(tp_rank, world.rank() / tp);
  std::shared_ptr<parallel::TensorParallelGroup<Exec>> features;
  if (tp > 1)
    features = std::make_shared<parallel::TensorParallelGroup<Exec>>(world.split(world.rank() / tp, tp_rank));
  const std::int64_t N = config.model.context, sequences = config.batch / dp;
  const std::int64_t micro_batch = config.micro_batch > 0 ? config.micro_batch : sequences;
  const std::int64_t micro_batches = sequences / micro_batch;
  std::ostream* out = world.rank() == 0 ? log : nullptr;

  std::optional<Dataset> data;
  world.checked(program, [&] { data.emplace(config.data, N); });
  // ZeRO 1 and 2 shard over the ranks holding the same parameters (with one: nothing to shard).
  const int zero = same_part.size() > 1 ? config.zero : 0;
  Model model(context, config.model, features, zero == 2 ? GradientMemory::per_block : GradientMemory::kept,
              config.sequence_parallel);
  std::shared_ptr<parallel::ContextParallelAttention<Exec, T>> ring;
  std::vector<parallel::Segment> segments{{0, 0, N}};
  if (cp > 1) {
    ring = std::make_shared<parallel::ContextParallelAttention<Exec, T>>(context.exec(), cp_group, N,
                                                                         config.model.attention, true);
    model.set_attention_runner(ring);
    segments = ring->segments();
  }
  LocalBatch<Exec, T> local(std::int64_t(dp_rank) * sequences, micro_batch, segments);

  const auto& groups = model.parameter_groups();
  // ZeRO 1 and 2: this rank's AdamW updates its pieces of every group (zero.hpp).
  std::optional<ParameterShards<Exec, T>> shards;
  if (zero > 0) shards.emplace(context, same_part, groups, zero);
  // The gradients' sum over the same_part ranks: all-reduced in buckets (every rank gets them
  // whole), or under ZeRO 2 reduce-scattered (each rank gets its pieces).
  const parallel::DataType reduce_type = config.grad_reduce == GradientReduce::model && !std::is_same_v<T, float>
                                             ? parallel::data_type_of<T>()
                                             : parallel::DataType::float32;
  std::unique_ptr<parallel::GradientBuckets<Exec>> buckets;
  std::vector<int> stretch_ended_by(groups.size(), -1);  // the buckets' gradient each group completes
  std::unique_ptr<parallel::GradientReduceScatter<Exec>> scatter;
  if (zero == 2) {
    parallel::GradientReduceScatterOptions options;
    options.op = parallel::ReduceOp::sum;  // every rank's loss is already divided by the global token count
    options.reduce_type = reduce_type;
    scatter = std::make_unique<parallel::GradientReduceScatter<Exec>>(context, same_part, options);
    for (std::size_t i = 0; i < groups.size(); ++i) scatter->add(groups[i].count, shards->pieces()[i].gradients);
  } else if (same_part.size() > 1) {
    parallel::GradientBucketOptions options;
    options.op = parallel::ReduceOp::sum;
    options.reduce_type = reduce_type;
    buckets = std::make_unique<parallel::GradientBuckets<Exec>>(context, same_part, options);
    // The model's kept gradients, stretch by stretch (the head's, each block's, the embeddings'),
    // back to back in backward's order: reduced where they lie, nothing copied.
    const auto stretches = model.gradient_stretches();
    std::vector<std::size_t> counts;
    for (std::size_t s = 0; s < stretches.size(); ++s) {
      counts.push_back(stretches[s].count);
      stretch_ended_by[std::size_t(stretches[s].first_group + stretches[s].groups - 1)] = int(s);
    }
    buckets->add_back_to_back(stretches.front().gradients, counts);
  }
  // The global gradient norm: pieces (ZeRO) summed over the ranks of a part, parts of split
  // tensors (tp) over the tensor-parallel group; whole tensors are alike on its ranks.
  using Squares = typename AdamW<Exec, T>::Squares;
  auto squares_over_ranks = [&](const Squares& mine) {
    Squares total = mine;
    if (shards) std::tie(total.split, total.whole) = shards->sum_squares_over_ranks(mine.split, mine.whole);
    if (features) {
      const double split = total.split;
      features->communicator().all_reduce(&split, &total.split, 1, parallel::DataType::float64,
                                          parallel::ReduceOp::sum);
    }
    return total.split + total.whole;
  };
  using SquaresOverRanks = typename AdamW<Exec, T>::SquaresOverRanks;
  AdamW<Exec, T> optimizer(context, config.optimizer, shards ? shards->pieces() : groups,
                           shards || features ? SquaresOverRanks(squares_over_ranks) : nullptr);
  // A checkpoint's payload, in order: every group's parameters (fp32: the model's; 16-bit: the
  // optimizer's fp32 master weights, in the same order), then AdamW's two moments, each whole
  // (gathered from the ranks under ZeRO 1, each tensor whole from its tensor-parallel parts).
  // The same bytes in every precision and at every grid, so a run may resume in another
  // precision, on another number of ranks, with another tp, with or without ZeRO.
  using Floats = Kokkos::View<float*, Memory, Kokkos::MemoryUnmanaged>;
  struct StatePart {
    Floats local;        // what this rank holds
    bool sharded;        // its pieces of its part (ZeRO 1)
    SplitFloats layout;  // its part of the whole
  };
  auto layout_of = [&](auto first, auto last) {
    SplitFloats layout{{}, tp};
    for (auto g = first; g != last; ++g) layout.splits.push_back(g->split);
    return layout;
  };
  std::vector<StatePart> state;
  const SplitFloats all_groups = layout_of(groups.begin(), groups.end());
  auto optimizer_part = [&](const auto& flat) {
    return StatePart{Floats(flat.data(), flat.size()), bool(shards), all_groups};
  };
  if constexpr (AdamW<Exec, T>::keeps_master_weights)
    state.push_back(optimizer_part(optimizer.master_weights()));
  else
    for (auto g = groups.begin(); g != groups.end(); ++g)
      state.push_back({Floats(g->values, g->count), false, layout_of(g, g + 1)});
  state.push_back(optimizer_part(optimizer.first_moment()));
  state.push_back(optimizer_part(optimizer.second_moment()));
  std::size_t state_bytes = 0;
  for (const auto& part : state) state_bytes += part.layout.whole_count() * sizeof(float);
  // Whether no rank holds all of the state (ZeRO's pieces, tp's parts): then only the ranks
  // together can write a checkpoint.
  const bool state_spread = shards || features;
  std::mt19937_64 train_rng(config.data_seed);
  int first = 0;  // 0-based step to start from
  // fp16's dynamic loss scale and the good steps since it last changed (1: no scaling).
  const bool scaling = config.precision == Precision::fp16;
  double loss_scale = scaling ? config.loss_scale.initial : 1.0;
  int good_steps = 0;

  // ---- resume
  if (config.resume) {
    Checkpoint checkpoint;
    ResumePoint resume;
    world.checked(program, [&] {
      checkpoint = read_checkpoint(config.checkpoint);
      resume = resume_point(checkpoint.metadata, config.steps, config.checkpoint);
      const nlohmann::json& m = checkpoint.metadata;
      const nlohmann::json expected = run_identity(config);
      require(m.contains("run") && m["run"].is_object(), program, "checkpoint", "\"" + config.checkpoint + "\"",
              "a longattn-train checkpoint (metadata has no run)");
      nlohmann::json written = m["run"];
      if (!written.contains("positions")) written["positions"] = "learned";  // the only kind before --positions
      for (const auto& [key, value] : expected.items())
        require(written.contains(key) && written[key] == value, program,
                "checkpoint's " + key, written.contains(key) ? written[key].dump() : "missing",
                value.dump() + " (this run's; resume with the options the checkpoint was written with)");
      require(checkpoint.payload.size() == state_bytes, program, "checkpoint's payload bytes",
              checkpoint.payload.size(), std::to_string(state_bytes) + " (this model's parameters and optimizer state)");
    });
    unsigned char* p = checkpoint.payload.data();
    for (const auto& part : state) {
      // This tensor rank's part of each whole tensor, then (ZeRO 1) this rank's pieces of that.
      std::vector<float> mine(part.layout.part_count());
      part.layout.extract(tp_rank, reinterpret_cast<const float*>(p), mine.data());
      const PayloadFloats floats(mine.data(), mine.size());
      if (part.sharded) {
        const memory::CategoryScope scope(memory::Category::transient_copies);
        const auto whole = context.template allocate<Kokkos::View<float*, Memory>>(floats.size());
        Kokkos::deep_copy(whole.view(), floats);
        shards->take_pieces(whole.data(), part.local.data());
      } else {
        Kokkos::deep_copy(part.local, floats);
      }
      p += part.layout.whole_count() * sizeof(float);
    }
    if constexpr (AdamW<Exec, T>::keeps_master_weights) {
      optimizer.master_weights_changed();
      if (shards) shards->all_gather_parameters();
    }
    first = resume.step;
    optimizer.set_steps(resume.optimizer_steps);
    if (scaling && resume.loss_scale > 0) {  // written by an fp16 run
      loss_scale = resume.loss_scale;
      good_steps = resume.good_steps;
    }
    train_rng = resume.rng;
    if (out) *out << "resumed   from " << config.checkpoint << " at step " << first << "\n";
  }
  // The run's state as a checkpoint: the parameters and moments now, `next_step` and the random
  // engine that will draw its batch. Every rank holds the whole state, or (state_spread) its
  // pieces and parts: then this is collective, and only the rank that `keeps` the payload fills it.
  auto make_checkpoint = [&](int next_step, const std::mt19937_64& rng_at_step, bool keeps = true) {
    Checkpoint checkpoint;
    std::ostringstream rng;
    rng << rng_at_step;
    checkpoint.metadata = {{"run", run_identity(config)}, {"step", next_step},
                           {"optimizer_steps", optimizer.steps()}, {"rng", rng.str()}};
    if (scaling) {
      checkpoint.metadata["loss_scale"] = loss_scale;
      checkpoint.metadata["good_steps"] = good_steps;
    }
    if (keeps) checkpoint.payload.resize(state_bytes);
    unsigned char* p = checkpoint.payload.data();
    for (const auto& part : state) {
      // This tensor rank's part (ZeRO 1: gathered from the ranks' pieces), on the host where it
      // goes into a payload: this rank's, or under tp the tensor-parallel group's.
      const bool copied = keeps || features;
      std::vector<float> mine(copied ? part.layout.part_count() : 0);
      const PayloadFloats floats(mine.data(), mine.size());
      if (part.sharded) {
        const memory::CategoryScope scope(memory::Category::transient_copies);
        const auto whole = context.template allocate<Kokkos::View<float*, Memory>>(part.layout.part_count());
        shards->gather(part.local.data(), whole.data());
        if (copied) Kokkos::deep_copy(floats, whole.view());
      } else if (copied) {
        Kokkos::deep_copy(floats, part.local);
      }
      float* payload = reinterpret_cast<float*>(p);
      if (features) {  // every tensor whole from the tensor-parallel group's parts
        std::vector<float> gathered(std::size_t(tp) * mine.size());
        features->communicator().all_gather(mine.data(), gathered.data(), mine.size(), parallel::DataType::float32);
        if (keeps) part.layout.assemble(gathered.data(), payload);
      } else if (keeps) {
        std::copy(mine.begin(), mine.end(), payload);
      }
      if (keeps) p += part.layout.whole_count() * sizeof(float);
    }
    return checkpoint;
  };
  auto save = [&](int next_step) {
    // Rank 0 writes (every rank holds the same parameters; under ZeRO 1 the others send it their
    // pieces of AdamW's state); `checked` makes a failed write fail every rank, and no rank goes
    // on before the file is complete.
    world.checked(program, [&] {
      const Checkpoint checkpoint = make_checkpoint(next_step, train_rng, world.rank() == 0);
      if (world.rank() == 0) write_checkpoint(config.checkpoint, checkpoint);
    });
    if (out) *out << "checkpoint step " << next_step << " -> " << config.checkpoint << "\n";
  };
  // A step that failed on this rank before the update: the state is still the step's start, so
  // this rank saves it (through a temporary of its own: several ranks may fail at once) and ends
  // the run. The other ranks may be waiting for it inside a collective, so with several ranks
  // the job ends by MPI_Abort.
  auto stop_in_step = [&](int step, const std::mt19937_64& rng_at_step, const std::string& error) {
    std::string message = "rank " + std::to_string(world.rank()) + " stopped in step " + std::to_string(step + 1) +
                          ": " + error + ". ";
    if (config.checkpoint.empty()) {
      message += "Nothing saved (no --checkpoint).";
    } else if (state_spread) {
      message += std::string("Nothing saved: under ") +
                 (shards ? "--zero " + std::to_string(zero) + " AdamW's state" : std::string("--tp > 1 the model")) +
                 " is spread over the ranks, and this rank cannot collect it alone; resume from the last checkpoint "
                 "in " + config.checkpoint + ", if any.";
    } else {
      try {
        write_checkpoint(config.checkpoint, make_checkpoint(step, rng_at_step),
                         ".rank" + std::to_string(world.rank()) + ".tmp");
        message += "Saved the last good state (step " + std::to_string(step) + ") to " + config.checkpoint +
                   "; continue with --resume (after raising --memory-limit, or with a smaller --micro-batch or "
                   "more --recompute, when the memory ran out).";
      } catch (const std::exception& e) {
        message += std::string("Saving the last good state failed too: ") + e.what();
      }
    }
    if (world.size() > 1) world.abort(std::string(program) + ": " + message);
    throw Error(std::string(program) + ": " + message);
  };

  // ---- the measured peak of the cores the ranks use (all at once, as they will run)
  TrainResult result;
  result.dp = dp;
  result.cp = cp;
  result.tp = tp;
  result.first_step = first + 1;
  result.micro_batches = micro_batches;
  result.parameters = model.whole_parameter_count();
  // Values (T), and in float the gradients (ZeRO 2: this rank's pieces), two moments and for
  // 16-bit T the master weights.
  const std::size_t optimizer_elements = shards ? shards->piece_elements() : model.parameter_count();
  const std::size_t gradient_elements = zero == 2 ? shards->piece_elements() : model.parameter_count();
  result.model_state_bytes = model.parameter_count() * sizeof(T) + gradient_elements * sizeof(float) +
                             optimizer_elements * sizeof(float) * (AdamW<Exec, T>::keeps_master_weights ? 3 : 2);
  result.flops_per_step = model.flops_per_step(config.batch);
  result.peak_gflops = config.peak_gflops;
  if (result.peak_gflops == 0) {
    const double mine =
        fastest_of_three_windows(world, [&] { return measure_fma_peak(context.exec(), 0.1).gflops(); });
    world.all_reduce(&mine, &result.peak_gflops, 1, parallel::DataType::float64, parallel::ReduceOp::sum);
  }
  {
    const double mine = measure_element_rate(context.exec(), world);
    world.all_reduce(&mine, &result.element_rate, 1, parallel::DataType::float64, parallel::ReduceOp::sum);
    result.element_rate /= world.size();
  }
  std::string prediction_error;
  try {
    const plan::Estimate predicted = planner_estimate(config, world.size(), result.peak_gflops * 1e9, result.element_rate);
    result.predicted_memory_bytes = predicted.memory_total;
    const double element_wise = time_term(predicted, "element-wise kernels");
    result.predicted_compute_seconds = time_term(predicted, "compute") + element_wise;
    result.predicted_compute_parts = {{"matrix products", predicted.products_seconds},
                                      {"attention", predicted.attention_seconds},
                                      {"element-wise kernels", element_wise}};
    for (const plan::Term& term : predicted.elements) result.predicted_elements.emplace_back(term.name, term.value);
    result.predicted_attention_flops = predicted.attention_flops_per_step / double(world.size());
    for (const plan::Term& term : predicted.memory) result.predicted_memory.emplace_back(term.name, term.value);
  } catch (const Error& error) {
    prediction_error = error.what();
  }
  // The most nodes one tensor-parallel group spans (1: every group within a node, as it should).
  double tp_nodes = features ? features->communicator().nodes() : 1;
  world.all_reduce(&tp_nodes, &tp_nodes, 1, parallel::DataType::float64, parallel::ReduceOp::max);
  result.transport = parallel::to_string(world.transport(Exec()));  // collective the first time on device memory
  if (out) {
    *out << "model     " << config.model.layers << " layers, embed " << config.model.embed << ", " << config.model.heads
         << " heads, context " << N << ", " << to_string(config.model.positions) << " positions, attention "
         << to_string(config.model.attention) << ": " << result.parameters
         << " parameters\n"
         << "data      " << to_string(config.data.task)
         << (config.data.task == Task::text ? " " + config.data.text + " (" + std::to_string(data->bytes(Split::train)) +
                                                  " train / " + std::to_string(data->bytes(Split::validation)) +
                                                  " validation bytes)"
                                            : ", " + std::to_string(config.data.pairs) + " pairs, " +
                                                  std::to_string(config.data.queries) + " queries")
         << "\n"
         << "grid      " << world.size() << " ranks = dp " << dp << " x cp " << cp << " x tp " << tp
         << (config.sequence_parallel ? " (sequence parallel)" : "") << ", transport " << result.transport << "; "
         << config.batch
         << " sequences per step (" << config.batch * N << " tokens), " << micro_batches << " micro-batch"
         << (micro_batches > 1 ? "es" : "") << " of " << micro_batch << " per rank\n"
         << (tp_nodes > 1 ? "warning   a tensor-parallel group spans " + std::to_string(int(tp_nodes)) +
                                " nodes: its all-reduces, 4 per layer and step, cross the network (make the "
                                "ranks per node a multiple of --tp)\n"
                          : "")
         << "memory    recompute " << to_string(config.model.recompute) << "; precision " << to_string(config.precision)
         << "; gradients " << (zero == 2 ? "reduce-scattered" : "all-reduced") << " in "
         << (config.grad_reduce == GradientReduce::model ? to_string(config.precision) : "fp32")
         << "; ZeRO " << config.zero
         << (shards ? std::string(" (AdamW's state") + (zero == 2 ? " and the gradients" : "") + " sharded over " +
                          std::to_string(same_part.size()) + " ranks)"
                    : "");
    if (scaling) *out << ", loss scale " << loss_scale;
    *out << "\n"
         << "compute   " << std::fixed << std::setprecision(2) << result.flops_per_step * 1e-9 << " GFLOP per step; "
         << "FMA peak of the ranks' cores " << std::setprecision(1) << result.peak_gflops << " GFLOP/s"
         << (config.peak_gflops > 0 ? " (given)" : " (measured)") << "\n";
    const auto mib = [](double bytes) { return bytes / double(1 << 20); };
    if (prediction_error.empty()) {
      *out << "planner   longattn-plan predicts " << std::setprecision(1) << mib(result.predicted_memory_bytes)
           << " MiB per rank (";
      const char* separator = "";
      for (const auto& [name, bytes] : result.predicted_memory) {
        *out << separator << name << " " << mib(bytes);
        separator = ", ";
      }
      *out << " MiB); compute " << std::setprecision(3) << result.predicted_compute_seconds << " s per step ("
           << config.efficiency.source << ")\n";
    } else {
      *out << "planner   longattn-plan cannot describe this run: " << prediction_error << "\n";
    }
  }

  // A sum over the batch's tokens: over the ranks of one tensor rank (its tensor-parallel peers
  // computed the same values), or under sequence parallelism over all (each has its tokens).
  const parallel::Communicator& token_ranks = config.sequence_parallel ? world : same_part;
  auto global_sum = [&](double mine) {
    double total = 0;
    token_ranks.all_reduce(&mine, &total, 1, parallel::DataType::float64, parallel::ReduceOp::sum);
    return total;
  };
  // Sequence parallelism: the gradients of the tensors outside the sublayers (norms, head,
  // embeddings) come from each tensor rank's tokens; their sum over the tensor-parallel group,
  // once per step after the reduction over the data ranks (both are sums): the groups', or under
  // ZeRO 2 the pieces' (the same piece of a whole tensor on every tensor rank).
  auto sum_sequence_partials = [&] {
    for (std::size_t i = 0; i < groups.size(); ++i) {
      if (!groups[i].sequence_partial) continue;
      const ParameterGroup<T>& g = scatter ? shards->pieces()[i] : groups[i];
      if (g.count > 0)
        features->communicator().all_reduce(context.exec(), Floats(g.gradients, g.count), parallel::ReduceOp::sum);
    }
  };
  auto evaluate = [&] {
    std::mt19937_64 rng(config.data_seed ^ 0x9e3779b97f4a7c15ull);  // the same batches every time
    double total = 0;
    for (int i = 0; i < config.eval_batches; ++i) {
      const HostBatch global = data->sample(Split::validation, rng, config.batch);
      double mine = 0;
      for (std::int64_t m = 0; m < micro_batches; ++m) mine += model.forward(local.fill(global, m), global.weighted_tokens);
      total += global_sum(mine);
    }
    return total / config.eval_batches;
  };

  // --export-reference: the initial weights now, each step's batch as it is drawn.
  std::optional<ReferenceExport> reference;
  if (!config.export_reference.empty()) {
    std::vector<NamedValues> initial;
    for (const auto& g : groups) {
      const auto values = Kokkos::create_mirror_view_and_copy(
          Kokkos::HostSpace(), Kokkos::View<const T*, Memory, Kokkos::MemoryUnmanaged>(g.values, g.count));
      initial.push_back({g.name, std::vector<float>(g.count), g.decay});
      for (std::size_t i = 0; i < g.count; ++i) initial.back().values[i] = float(values(i));
    }
    reference.emplace(config.export_reference, initial, config.batch, N);
  }

  const int last = config.stop_after > 0 ? std::min(config.steps, config.stop_after) : config.steps;
  const Clock::time_point run_start = Clock::now();
  context.pool().reset_high_water();
  for (int step = first; step < last; ++step) {
    const Clock::time_point start = Clock::now();
    double communication = 0;
    std::array<double, phase_count> phases{};
    const auto phase = [&](Phase p) { return PhaseScope<Exec>(p, context.exec(), phases); };
    const std::mt19937_64 rng_at_step = train_rng;
    const HostBatch global = data->sample(Split::train, train_rng, config.batch);
    if (reference) reference->append(global);
    double local_loss = 0;
    try {
      model.zero_gradients();
      if (scatter) Kokkos::deep_copy(context.exec(), shards->piece_gradients(), 0.0f);
      if (ring) ring->reset_timings();
      if (features) features->reset_seconds();
      for (std::int64_t m = 0; m < micro_batches; ++m) {
        // Every micro-batch's loss is over the global batch's token count, so the gradients add
        // up to the step's; the all-reduce starts as the last micro-batch's gradients become
        // final. Under ZeRO 2 every micro-batch's gradients are reduce-scattered and added into
        // the pieces (the model keeps none of them).
        {
          const auto timed = phase(Phase::forward);
          local_loss += model.forward(local.fill(global, m), global.weighted_tokens, loss_scale);
        }
        const bool last_micro = m + 1 == micro_batches;
        if (scatter) {
          {
            const auto timed = phase(Phase::backward);
            model.backward([&](int group) { scatter->ready(group, groups[std::size_t(group)].gradients); });
          }
          const auto timed = phase(Phase::gradient_reduction);
          const Clock::time_point wait = Clock::now();
          scatter->wait();
          communication += seconds_since(wait);
        } else {
          const auto timed = phase(Phase::backward);
          auto stretch_ready = [&](int group) {
            if (const int s = stretch_ended_by[std::size_t(group)]; s >= 0) buckets->ready(s);
          };
          model.backward(buckets && last_micro ? std::function<void(int)>(stretch_ready) : std::function<void(int)>());
        }
      }
      const auto timed = phase(Phase::gradient_reduction);
      if (buckets) {
        const Clock::time_point wait = Clock::now();
        buckets->wait();
        communication += seconds_since(wait);
      }
      if (model.sequence_parallel()) {
        const Clock::time_point sum = Clock::now();
        sum_sequence_partials();
        communication += seconds_since(sum);
      }
    } catch (const Error& error) {
      stop_in_step(step, rng_at_step, error.what());
    }
    double loss = 0;
    {
      const auto timed = phase(Phase::gradient_reduction);
      const Clock::time_point reduce = Clock::now();
      loss = global_sum(local_loss);
      communication += seconds_since(reduce) + (ring ? ring->wait_seconds() : 0.0);
    }
    if (features) communication += features->seconds();  // the tp all-reduces inside forward and backward
    // Where a NaN or infinity came from: this rank's first non-finite tensor (collective: every
    // rank has the same loss, so all search and all stop).
    auto diagnosis = [&] {
      const std::string first = model.first_non_finite();
      return " (on rank " + std::to_string(world.rank()) + ", the first non-finite tensor of the step: " +
             (first.empty() ? "none; another rank's batch gave it" : first) + ")";
    };
    if (!std::isfinite(loss)) {
      const std::string where = diagnosis();
      world.guarded(program, [&] {
        throw_invalid_argument(program, "loss at step " + std::to_string(step + 1), loss,
                               "a finite number: training stopped" + where + "; try a lower --lr or --clip");
      });
    }
    StepRecord r;
    r.step = step + 1;
    r.lr = learning_rate(config.optimizer, step, config.steps);
    r.loss_scale = loss_scale;
    {
      const auto timed = phase(Phase::optimizer);
      r.gradient_norm = optimizer.step(r.lr, loss_scale);  // every rank: the same all-reduced gradients
      if (shards && std::isfinite(r.gradient_norm)) {
        const Clock::time_point gather = Clock::now();
        shards->all_gather_parameters();
        communication += seconds_since(gather);
      }
    }
    if (!std::isfinite(r.gradient_norm)) {
      if (!scaling) {
        const std::string where = diagnosis();
        world.guarded(program, [&] {
          throw_invalid_argument(program, "gradient norm at step " + std::to_string(step + 1), r.gradient_norm,
                                 "a finite number: training stopped" + where + "; try a lower --lr or --clip");
        });
      }
      r.skipped = true;  // fp16 overflow: nothing was updated; a smaller scale next time
      loss_scale /= 2;
      good_steps = 0;
      if (out) *out << "overflow  step " << step + 1 << ": gradients not finite at loss scale " << r.loss_scale
                    << ", step skipped; loss scale now " << loss_scale << "\n";
    } else if (scaling && ++good_steps == config.loss_scale.window) {
      loss_scale *= 2;
      good_steps = 0;
    }
    r.loss = loss;
    r.seconds = seconds_since(start);
    // The slowest rank's time, communication and memory make the step's figures.
    if (buckets) result.bucket_bytes = buckets->buffer_bytes();
    if (scatter) result.bucket_bytes = scatter->buffer_bytes();
    // The step's time, communication, memory high-water and each category's high-water.
    const memory::CategoryTable categories = context.pool().category_stats();
    std::vector<double> mine = {r.seconds, communication, double(context.pool().stats().in_use_high_water_bytes)};
    for (const memory::CategoryStats& c : categories) mine.push_back(double(c.in_use_high_water_bytes));
    const std::size_t first_phase = mine.size();
    mine.insert(mine.end(), phases.begin(), phases.end());
    std::vector<double> most(mine.size());
    world.all_reduce(mine.data(), most.data(), mine.size(), parallel::DataType::float64, parallel::ReduceOp::max);
    result.memory_by_category.clear();
    for (int c = 0; c < memory::category_count; ++c)
      result.memory_by_category.emplace_back(memory::to_string(memory::Category(c)), std::size_t(most[std::size_t(3 + c)]));
    // The peak's parts from the rank that holds the largest high-water (the others send zeros).
    std::vector<double> at_peak(memory::category_count, 0.0), peak_parts(memory::category_count);
    if (mine[2] == most[2])
      for (int c = 0; c < memory::category_count; ++c) at_peak[std::size_t(c)] = double(categories[std::size_t(c)].at_peak_bytes);
    world.all_reduce(at_peak.data(), peak_parts.data(), at_peak.size(), parallel::DataType::float64, parallel::ReduceOp::max);
    world.check_issue_order();  // with LONGATTN_RECORD_ISSUE_ORDER=1: the step's schedule alike on every rank
    result.memory_at_peak.clear();
    for (int c = 0; c < memory::category_count; ++c)
      result.memory_at_peak.emplace_back(memory::to_string(memory::Category(c)), std::size_t(peak_parts[std::size_t(c)]));
    r.seconds = most[0];
    r.tokens_per_second = double(config.batch * N) / r.seconds;
    r.gflops = result.flops_per_step / r.seconds * 1e-9;
    r.peak_fraction = result.peak_gflops > 0 ? r.gflops / result.peak_gflops : 0;
    r.communication_share = most[1] / r.seconds;
    r.memory_bytes = std::size_t(most[2]);
    for (int p = 0; p < phase_count; ++p) r.phase_seconds[std::size_t(p)] = most[first_phase + std::size_t(p)];
    result.steps.push_back(r);
    if (out && !config.quiet) {
      const double elapsed = seconds_since(run_start), done = double(step + 1 - first);
      *out << "step " << std::setw(5) << r.step << "/" << config.steps << "  loss " << std::fixed << std::setprecision(4)
           << r.loss << "  lr " << std::scientific << std::setprecision(2) << r.lr << std::fixed << "  tok/s "
           << std::setprecision(0) << r.tokens_per_second << "  GFLOP/s " << std::setprecision(1) << r.gflops << " ("
           << std::setprecision(2) << r.peak_fraction << " of peak)  mem " << std::setprecision(0)
           << double(r.memory_bytes) / double(1 << 20) << " MiB  comm " << std::setprecision(0)
           << 100 * r.communication_share << "%  eta " << duration(elapsed / done * (last - step - 1)) << "\n"
           << std::flush;
    }
    const bool final_step = step + 1 == last;
    // After the step's time: this rank's own times (the next step's all-reduce waits for the rest).
    std::array<double, phase_count>& after_step = result.steps.back().phase_seconds;
    if ((config.eval_every > 0 && (step + 1) % config.eval_every == 0) || (final_step && last == config.steps)) {
      {
        const PhaseScope<Exec> timed(Phase::evaluation, context.exec(), after_step);
        result.evals.push_back({step + 1, evaluate()});
      }
      if (out) *out << "eval  " << std::setw(5) << step + 1 << "  validation loss " << std::fixed << std::setprecision(4)
                    << result.evals.back().loss << "\n" << std::flush;
    }
    if (!config.checkpoint.empty() && ((config.checkpoint_every > 0 && (step + 1) % config.checkpoint_every == 0) || final_step)) {
      const PhaseScope<Exec> timed(Phase::checkpoint, context.exec(), after_step);
      save(step + 1);
    }
  }
  return result;
}

}  // namespace

template <class Exec>
TrainResult run_training(const TrainConfig& config, const parallel::Communicator& world, std::ostream* log) {
  world.guarded(program, [&] { validate(config, world.size()); });
  switch (config.precision) {
    case Precision::bf16: return train<Exec, bfloat16>(config, world, log);
    case Precision::fp16: return train<Exec, float16>(config, world, log);
    case Precision::fp32: break;
  }
  return train<Exec, float>(config, world, log);
}

template TrainResult run_training<Kokkos::DefaultExecutionSpace>(const TrainConfig&, const parallel::Communicator&,
                                                                 std::ostream*);

}  // namespace longattn::train
