// longattn-train: trains a byte-level decoder-only transformer with the attention of your choice,
// on one core or many nodes (data x context x tensor parallel), and prints what a practitioner
// watches.
//
//   mpiexec -n 2 longattn-train                       GPL-3 text, 4 layers, dense attention
//   mpiexec -n 4 longattn-train --cp 2 --context 1024 --attention "dilated:w=256,1024;r=1,4"
//   mpiexec -n 4 longattn-train --tp 2 --cp 2 --zero 1
//   longattn-train --task long_range --context 2048 --attention "block_sparse:pattern=local_window;radius=256"
//   longattn-train --config train.json --checkpoint run.ckpt --resume --json summary.json
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>

#include "longattn/apps/cli_config.hpp"
#include "longattn/core/runtime.hpp"
#include "longattn/error.hpp"
#include "longattn/parallel/placement.hpp"
#include "longattn/train/trainer.hpp"

int main(int argc, char** argv) {
  using namespace longattn::train;
  longattn::parallel::MpiSession mpi(argc, argv);
  longattn::ScopeGuard kokkos(argc, argv, {/*select_blas_kernels=*/true});
  longattn::parallel::CommunicatorOptions comm_options;
  comm_options.on_error = longattn::parallel::ErrorPolicy::throw_error;  // every rank fails alike; rank 0 reports
  // A dead or hung rank ends the job instead of holding it to its time limit (the batch script
  // restarts from the last checkpoint); LONGATTN_COLLECTIVE_TIMEOUT sets another limit.
  if (!std::getenv("LONGATTN_COLLECTIVE_TIMEOUT")) comm_options.timeout_seconds = 1800;
  const auto world = longattn::parallel::Communicator::world(comm_options);
  const bool root = world.rank() == 0;

  CLI::App app{"longattn-train: train a byte-level decoder-only transformer on text or a long-range task, "
               "data x context x tensor parallel over MPI ranks (README: \"Training\")"};
  app.name("longattn-train");
  app.option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  TrainConfig c;
  std::string task = to_string(c.data.task), attention = to_string(c.model.attention), json_path, config_path;
  std::string recompute = to_string(c.model.recompute), precision = to_string(c.precision);
  std::string positions = to_string(c.model.positions);
  std::string grad_reduce = to_string(c.grad_reduce), calibration;
  const std::map<std::string, Task> tasks{{"text", Task::text}, {"long_range", Task::long_range}};

  app.add_option("--config", config_path, "JSON file of options (keys: the long option names)");
  std::string model_name;
  app.add_option("--model", model_name,
                 "a named shape: 350m (24 layers, E 1024, 16 heads) or 1.3b (24 layers, E 2048, 16 heads); "
                 "--layers, --embed and --heads beside it override its values")->group("Model");
  app.add_option("--layers", c.model.layers, "transformer blocks")->group("Model");
  app.add_option("--embed", c.model.embed, "embedding size E (MLP 4E)")->group("Model");
  app.add_option("--heads", c.model.heads, "attention heads (dividing E)")->group("Model");
  app.add_option("--context", c.model.context, "tokens per sequence N")->group("Model");
  app.add_option("--positions", positions,
                 "learned (an embedding per position: context x E parameters) or rotary (Q and K turned by their "
                 "positions in every attention layer: no parameters; an even head dim)")->group("Model");
  app.add_option("--attention", attention,
                 "dense | dilated:w=<lengths>;r=<rates> | block_sparse:pattern=<name>;<fields> | auto "
                 "(the core's attention specs, docs/user-guide.md)")->group("Model");
  app.add_option("--seed", c.model.seed, "weight initialization seed")->group("Model");
  app.add_option("--task", task, "text (a file's bytes) or long_range (synthetic key-value recall)")
      ->check(CLI::IsMember({"text", "long_range"}))->group("Data");
  app.add_option("--text", c.data.text, "text file for --task text")->group("Data");
  app.add_option("--validation", c.data.validation, "fraction of the text kept for validation")->group("Data");
  app.add_option("--pairs", c.data.pairs, "long_range: key-value pairs at the start (more: associative recall)")->group("Data");
  app.add_option("--queries", c.data.queries, "long_range: distinct keys asked at the end")->group("Data");
  app.add_option("--data-seed", c.data_seed, "seed of the batches drawn")->group("Data");
  app.add_option("--steps", c.steps, "optimizer steps (the schedule's length)")->group("Training");
  app.add_option("--batch", c.batch, "sequences per step over all data-parallel ranks")->group("Training");
  app.add_option("--micro-batch", c.micro_batch,
                 "sequences per forward/backward on each rank, gradients accumulated over batch / dp / "
                 "micro-batch of them (0: all at once)")->group("Training");
  app.add_option("--recompute", recompute,
                 "activation recomputation: none (keep all), selective (recompute the attention's outputs), "
                 "full (recompute each block from its input)")->group("Training");
  app.add_option("--precision", precision,
                 "fp32, or bf16 / fp16: 16-bit parameters, activations and attention with fp32 gradients, master "
                 "weights and AdamW moments (fp16 with dynamic loss scaling)")->group("Training");
  app.add_option("--grad-reduce", grad_reduce,
                 "what the data-parallel all-reduce sums gradients in: fp32, or model (the --precision's 16-bit "
                 "type: half the bytes, each sum rounded to it)")->group("Training");
  app.add_option("--loss-scale", c.loss_scale.initial, "fp16: the initial loss scale")->group("Training");
  app.add_option("--loss-scale-window", c.loss_scale.window,
                 "fp16: good steps in a row before the loss scale doubles (an overflow halves it and skips the step)")
      ->group("Training");
  app.add_option("--lr", c.optimizer.lr, "peak learning rate")->group("Training");
  app.add_option("--min-lr", c.optimizer.min_lr, "learning rate at the end of the cosine decay")->group("Training");
  app.add_option("--warmup", c.optimizer.warmup, "linear warmup steps")->group("Training");
  app.add_option("--weight-decay", c.optimizer.weight_decay, "AdamW decay of the weight matrices")->group("Training");
  app.add_option("--beta1", c.optimizer.beta1, "AdamW beta1")->group("Training");
  app.add_option("--beta2", c.optimizer.beta2, "AdamW beta2")->group("Training");
  app.add_option("--clip", c.optimizer.clip, "gradient global-norm clip (0: none)")->group("Training");
  app.add_option("--tp", c.tp,
                 "tensor-parallel ranks per layer (Megatron: heads and MLP features split, neighbouring ranks; "
                 "dense or block-sparse attention); dp = ranks / (tp x cp)")
      ->group("Parallel");
  app.add_flag("--sequence-parallel", c.sequence_parallel,
               "with --tp > 1: embeddings, norms, residuals and the head on 1/tp of each sequence's tokens "
               "(Megatron-LM's sequence parallelism: all-gather into and reduce-scatter out of each sublayer)")
      ->group("Parallel");
  app.add_option("--cp", c.cp, "context-parallel ranks per sequence (ring attention); dp = ranks / (tp x cp)")
      ->group("Parallel");
  app.add_option("--zero", c.zero,
                 "ZeRO stage over the dp x cp ranks: 0 (none), 1 (AdamW's moments and master weights sharded: "
                 "each rank updates its shard, then all-gathers the parameters) or 2 (the gradients too: "
                 "reduce-scattered in buckets during backward, each rank keeping its shard)")->group("Parallel");
  app.add_option("--eval-every", c.eval_every, "steps between validation losses (0: at the end only)")->group("Output");
  app.add_option("--eval-batches", c.eval_batches, "global batches per validation")->group("Output");
  app.add_option("--checkpoint", c.checkpoint, "checkpoint file (written atomically)")->group("Checkpoint");
  app.add_option("--checkpoint-every", c.checkpoint_every, "steps between checkpoints (0: when the run stops)")
      ->group("Checkpoint");
  app.add_flag("--resume", c.resume, "continue from --checkpoint")->group("Checkpoint");
  app.add_option("--stop-after", c.stop_after, "stop (and checkpoint) after this step, e.g. before a time limit")
      ->group("Checkpoint");
  app.add_option("--memory-limit", c.memory_limit_mib,
                 "MiB the memory pool of each rank may hold (model state, activations, workspaces; 0: the "
                 "machine's). A step that needs more stops the run with an error, after saving the last good "
                 "state to --checkpoint")->group("Training");
  app.add_option("--peak-gflops", c.peak_gflops, "FMA peak of all ranks' cores (0: measure at start)")->group("Output");
  app.add_option("--calibration", calibration,
                 "longattn-plan's measured efficiencies (perf_tests/write_calibration.py) for the compute time per step "
                 "it predicts beside the measured one (default: the planner's assumed efficiencies)")
      ->group("Output");
  app.add_flag("--quiet", c.quiet, "no per-step lines")->group("Output");
  app.add_option("--export-reference", c.export_reference,
                 "directory to write the initial weights and each step's batch into, for a reference "
                 "implementation to train the same run (perf_tests/reference_train.py; one rank)")->group("Output");
  app.add_option("--json", json_path, "write a JSON summary (every step, validation, totals) to this file")
      ->group("Output");

  try {
    longattn::apps::parse_with_config(app, argc, argv, "longattn-train");
    c.model.attention = longattn::parse_attention_spec(attention);  // once, here at the edge
    c.model.recompute = parse_recompute(recompute);
    c.model.positions = parse_positions(positions);
    if (!model_name.empty()) {
      const ModelShape shape = named_model_shape(model_name);
      if (app.count("--layers") == 0) c.model.layers = shape.layers;
      if (app.count("--embed") == 0) c.model.embed = shape.embed;
      if (app.count("--heads") == 0) c.model.heads = shape.heads;
    }
    c.precision = parse_precision(precision);
    c.grad_reduce = parse_gradient_reduce(grad_reduce);
    if (!calibration.empty()) c.efficiency = longattn::plan::read_calibration(calibration);
    longattn::check_environment_switches();
  } catch (const CLI::ParseError& error) {
    return root ? app.exit(error) : (error.get_exit_code() == 0 ? 0 : 2);
  } catch (const longattn::Error& error) {
    if (root) std::cerr << "error: " << error.what() << "\n";
    return 2;
  }
  c.data.task = tasks.at(task);
  try {
    const TrainResult result = run_training(c, world, &std::cout);
    const nlohmann::json report = root ? result.to_json(c) : nlohmann::json();
    if (root && !json_path.empty()) {
      std::ofstream out(json_path);
      longattn::require(bool(out), "longattn-train", "json", "\"" + json_path + "\"", "a writable file");
      out << report.dump(2) << "\n";
    }
    if (root && !result.steps.empty()) {
      const auto& summary = report["summary"];
      std::cout << std::fixed << std::setprecision(4) << "summary   loss " << summary["first_loss"].get<double>()
                << " -> " << summary["last_loss"].get<double>() << "; after the first step " << std::setprecision(1)
                << summary["steady_gflops"].get<double>() << " GFLOP/s = " << std::setprecision(2)
                << summary["steady_peak_fraction"].get<double>() << " of the FMA peak, communication "
                << std::setprecision(1) << 100 * summary["steady_communication_share"].get<double>()
                << "% of the time\n";
      const double measured = summary["memory_bytes"].get<double>(), predicted = result.predicted_memory_bytes;
      std::cout << "memory    pool high-water " << measured / double(1 << 20) << " MiB per rank (the largest)";
      if (predicted > 0)
        std::cout << "; longattn-plan predicted " << predicted / double(1 << 20) << " MiB (measured / predicted "
                  << std::setprecision(2) << measured / predicted << ")";
      std::cout << "\n          by category, measured / predicted MiB:";
      for (const auto& [name, bytes] : result.memory_by_category) {
        double expected = 0;
        for (const auto& [term, value] : result.predicted_memory)
          if (term == name) expected = value;
        if (bytes == 0 && expected == 0) continue;
        std::cout << " " << name << " " << std::setprecision(1) << double(bytes) / double(1 << 20) << " / "
                  << expected / double(1 << 20) << ";";
      }
      std::cout << "\n          at the high-water, MiB:";
      for (const auto& [name, bytes] : result.memory_at_peak)
        if (bytes > 0) std::cout << " " << name << " " << std::setprecision(1) << double(bytes) / double(1 << 20) << ";";
      std::cout << "\n";
      const double compute = summary["steady_compute_seconds"].get<double>();
      std::cout << "time      " << std::setprecision(3) << compute
                << " s per step after the first, less communication";
      if (result.predicted_compute_seconds > 0)
        std::cout << "; longattn-plan predicted " << result.predicted_compute_seconds << " s of compute ("
                  << c.efficiency.source << "; measured / predicted " << std::setprecision(2)
                  << compute / result.predicted_compute_seconds << ")";
      std::cout << "\nphases    seconds over all steps (Kokkos Tools regions \"longattn-train: <phase>\"):";
      for (int p = 0; p < longattn::train::phase_count; ++p) {
        const char* name = to_string(longattn::train::Phase(p));
        std::cout << " " << name << " " << std::setprecision(3) << summary["phase_seconds"][name].get<double>() << ";";
      }
      std::cout << std::endl;  // before Kokkos::finalize, where Kokkos Tools print their reports
    }
  } catch (const longattn::Error& error) {
    if (root) std::cerr << "error: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
