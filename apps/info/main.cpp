// longattn-info: checks an installation. Prints how longattn was built, the machine as hwloc
// sees it, where the MPI ranks run, and two measured ceilings of the machine (FP32 FMA peak
// and sgemm through Kokkos Kernels, one core and all cores), optionally as JSON for
// benchmarks and the planner.
//
//   longattn-info [--seconds S] [--gemm-size N] [--no-ceilings] [--json FILE]
//   mpiexec -n 4 longattn-info        (rank 0 measures while the others wait without spinning)
#include <CLI/CLI.hpp>
#include <Kokkos_Core.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "longattn/core/blas.hpp"
#include "longattn/core/build_info.hpp"
#include "longattn/core/ceilings.hpp"
#include "longattn/core/gemm.hpp"
#include "longattn/core/linear.hpp"
#include "longattn/core/runtime.hpp"
#include "longattn/error.hpp"
#include "longattn/memory/topology.hpp"
#include "longattn/parallel/placement.hpp"
#if LONGATTN_HAVE_MPI
#include "longattn/parallel/communicator.hpp"
#endif

namespace {

struct Options {
  double seconds = 0.5;
  int gemm_size = 2048;
  bool ceilings = true;
  std::string json_path;
};

struct Ceilings {
  int cores = 0;  // threads of the host execution space
  longattn::Rate fma_core, fma_all, sgemm_core, sgemm_all;
};

// Everything the report shows, gathered once for the text and the JSON forms.
struct Report {
  longattn::BuildInfo build;
  longattn::BlasRuntime blas;
  std::vector<std::string> communication;
  std::vector<std::string> transports;  // "host memory mpi", "device memory staged"
  longattn::memory::TopologySummary machine;
  longattn::parallel::Placement placement;
  const Ceilings* ceilings = nullptr;  // null with --no-ceilings
};

std::string bytes_text(std::size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) value /= 1024, ++unit;
  char text[32];
  std::snprintf(text, sizeof(text), value < 10 && unit > 0 ? "%.1f %s" : "%.0f %s", value, units[unit]);
  return text;
}

std::string join(const std::vector<std::string>& items, const char* separator) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : separator) + item;
  return out;
}

Ceilings measure(const Options& options) {
  using Host = Kokkos::DefaultHostExecutionSpace;
  Ceilings c;
  c.cores = Host().concurrency();
  const int blas_threads = longattn::blas_runtime().threads;
  c.fma_core = longattn::measure_fma_peak(Kokkos::Serial(), options.seconds);
  c.fma_all = longattn::measure_fma_peak(Host(), options.seconds);
  longattn::set_blas_threads(1);
  c.sgemm_core = longattn::measure_sgemm(Host(), options.gemm_size, options.seconds);
  longattn::set_blas_threads(blas_threads > 0 ? blas_threads : c.cores);
  c.sgemm_all = longattn::measure_sgemm(Host(), options.gemm_size, options.seconds);
  return c;
}

// What products of bfloat16 matrices run on in this process: gemm's, and the attention kernels'
// block products, which take the tile products first.
std::string bf16_products_text() {
  if (!longattn::bf16_dot_products_available()) return "float copies and sgemm (no bf16 dot products on this CPU or build)";
  char speed[128];
  std::snprintf(speed, sizeof speed, "AVX512-BF16 dot products: %.2fx the FMA's products per second",
                longattn::bf16_dot_product_speedup());
  if (longattn::bf16_dot_products_in_use()) return std::string("the CPU's bf16 dot products (") + speed + ")";
  return std::string("float copies and sgemm (") + speed + "; LONGATTN_BF16_DOT_PRODUCTS=1 uses them)";
}

std::string bf16_attention_products_text() {
  if (longattn::bf16_tile_products_in_use()) return "the CPU's bf16 tile products (AMX-BF16)";
  const std::string tiles = longattn::bf16_tile_products_available()
                                ? "; AMX-BF16 tile products off: LONGATTN_BF16_TILE_PRODUCTS=0"
                                : "; no AMX-BF16 tile products on this CPU, OS or build";
  if (longattn::bf16_dot_products_in_use()) return "the CPU's bf16 dot products, as gemm" + tiles;
  return "float values" + tiles;
}

// How float matrix products run on the GPU's space (gemm.hpp's TF32 switch).
std::string float_products_text() {
#if defined(KOKKOS_ENABLE_CUDA)
  return longattn::tf32_matmul_allowed() ? "TF32 tensor cores on Kokkos::Cuda (LONGATTN_ALLOW_TF32=1)"
                                         : "float (TF32 tensor cores on Kokkos::Cuda with LONGATTN_ALLOW_TF32=1)";
#else
  return "float (no CUDA space in this build)";
#endif
}

// How linear layers (linear.hpp) run on the GPU's space.
std::string linear_layers_text() {
#if defined(KOKKOS_ENABLE_CUDA)
  return longattn::cublaslt_gelu_in_use()
             ? "cuBLASLt on Kokkos::Cuda: bias, residual and GELU in the epilogue (LONGATTN_CUBLASLT_GELU=1)"
             : "cuBLASLt on Kokkos::Cuda: bias and residual in the epilogue, GELU after it (LONGATTN_CUBLASLT_GELU=0)";
#else
  return "gemm and element-wise kernels (no CUDA space in this build)";
#endif
}

void print_report(std::ostream& out, const Report& report, const Options& options) {
  const auto& build = report.build;
  const auto& blas = report.blas;
  const auto& machine = report.machine;
  const auto& placement = report.placement;
  char line[256];

  out << "longattn " << build.version << " (" << build.build_type << ", " << build.compiler << ")\n\n";
  out << "Build\n";
  out << "  Kokkos            " << build.kokkos_version << ", Kokkos Kernels " << build.kokkos_kernels_version << "\n";
  out << "  execution spaces  " << join(build.execution_spaces, ", ")
      << " (default " << build.default_execution_space << ")\n";
  out << "  architecture      " << build.architecture << "\n";
  out << "  BLAS              " << blas.library << "\n";
  out << "  BLAS kernels      " << (blas.kernels.empty() ? "unknown" : blas.kernels) << ": "
      << blas.selection << "\n";
  out << "  bf16 products     " << bf16_products_text() << "\n";
  out << "  bf16 attention    " << bf16_attention_products_text() << "\n";
  out << "  float products    " << float_products_text() << "\n";
  out << "  linear layers     " << linear_layers_text() << "\n";
  out << "  communication     " << join(report.communication, "; ") << "\n";
  out << "  transport         " << join(report.transports, "; ") << "\n";
  out << "  hwloc             " << (build.hwloc ? "yes" : "no") << "\n\n";

  out << "Machine (" << machine.source << ")\n";
  if (!machine.cpu_model.empty()) out << "  CPU               " << machine.cpu_model << "\n";
  out << "  packages          " << machine.packages << "\n";
  out << "  NUMA nodes        " << machine.numa_nodes;
  std::vector<std::string> memory;
  for (auto bytes : machine.numa_memory_bytes) memory.push_back(bytes_text(bytes));
  out << " (" << join(memory, ", ") << ")\n";
  out << "  cores             " << machine.cores << "\n";
  out << "  hardware threads  " << machine.hardware_threads << "\n";
  std::vector<std::string> caches;
  for (const auto& c : machine.caches)
    caches.push_back("L" + std::to_string(c.level) + (c.kind == "data" ? "d" : c.kind == "instruction" ? "i" : "") +
                     " " + bytes_text(c.size_bytes) + " x" + std::to_string(c.count));
  out << "  caches            " << join(caches, ", ") << "\n\n";

  out << "MPI ranks: " << placement.size << " on " << placement.nodes
      << (placement.nodes == 1 ? " node\n" : " nodes\n");
  out << "  rank  node  local   cpus      host\n";
  for (const auto& r : placement.ranks) {
    std::snprintf(line, sizeof(line), "  %4d  %4d  %2d/%-2d   %-8s  %s\n", r.rank, r.node, r.local_rank,
                  r.local_size, r.cpus.c_str(), r.host.c_str());
    out << line;
  }
  out << "\n";

  if (!report.ceilings) return;
  const Ceilings& c = *report.ceilings;
  out << "Ceilings of this machine (FP32, measured by rank 0, " << options.seconds << " s each)\n";
  std::snprintf(line, sizeof(line), "  %-28s %12s %14s (%d)\n", "GFLOP/s", "one core", "all cores", c.cores);
  out << line;
  std::snprintf(line, sizeof(line), "  %-28s %12.1f %18.1f\n", "FMA peak", c.fma_core.gflops(), c.fma_all.gflops());
  out << line;
  const std::string gemm = "sgemm n=" + std::to_string(options.gemm_size) + " (Kokkos Kernels)";
  std::snprintf(line, sizeof(line), "  %-28s %12.1f %18.1f\n", gemm.c_str(), c.sgemm_core.gflops(), c.sgemm_all.gflops());
  out << line;
  std::snprintf(line, sizeof(line), "  %-28s %11.0f%% %17.0f%%\n", "sgemm / FMA peak",
                100 * c.sgemm_core.gflops() / c.fma_core.gflops(), 100 * c.sgemm_all.gflops() / c.fma_all.gflops());
  out << line;
}

nlohmann::json to_json(const Report& report, const Options& options) {
  const auto& build = report.build;
  const auto& blas = report.blas;
  const auto& machine = report.machine;
  const Ceilings* ceilings = report.ceilings;
  nlohmann::json j;
  j["build"] = {{"longattn", build.version}, {"build_type", build.build_type},
                {"compiler", build.compiler}, {"kokkos", build.kokkos_version},
                {"kokkos_kernels", build.kokkos_kernels_version},
                {"execution_spaces", build.execution_spaces}, {"architecture", build.architecture},
                {"blas", blas.library}, {"blas_kernels", blas.kernels}, {"blas_selection", blas.selection},
                {"communication", report.communication}, {"transports", report.transports},
                {"bf16_products", bf16_products_text()}, {"float_products", float_products_text()},
                {"linear_layers", linear_layers_text()}};
  j["machine"] = {{"source", machine.source}, {"cpu", machine.cpu_model}, {"packages", machine.packages},
                  {"numa_nodes", machine.numa_nodes}, {"numa_memory_bytes", machine.numa_memory_bytes},
                  {"cores", machine.cores}, {"hardware_threads", machine.hardware_threads}};
  for (const auto& c : machine.caches)
    j["machine"]["caches"].push_back({{"level", c.level}, {"kind", c.kind}, {"bytes", c.size_bytes}, {"count", c.count}});
  j["ranks"] = nlohmann::json::array();
  for (const auto& r : report.placement.ranks)
    j["ranks"].push_back({{"rank", r.rank}, {"node", r.node}, {"local_rank", r.local_rank},
                          {"local_size", r.local_size}, {"cpus", r.cpus}, {"host", r.host}});
  if (ceilings) {
    auto rate = [](const longattn::Rate& r) { return nlohmann::json{{"gflops", r.gflops()}, {"seconds", r.seconds}}; };
    j["ceilings"] = {{"cores", ceilings->cores},
                     {"gemm_size", options.gemm_size},
                     {"fp32_fma_peak_one_core", rate(ceilings->fma_core)},
                     {"fp32_fma_peak_all_cores", rate(ceilings->fma_all)},
                     {"sgemm_one_core", rate(ceilings->sgemm_core)},
                     {"sgemm_all_cores", rate(ceilings->sgemm_all)}};
  }
  return j;
}

#if LONGATTN_HAVE_MPI
// Waits for rank 0 without spinning, so that waiting ranks leave the cores to its measurement.
void quiet_barrier(MPI_Comm comm) {
  MPI_Request request;
  MPI_Ibarrier(comm, &request);
  for (int done = 0; !done;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}
#endif

int run(int argc, char* argv[], const longattn::parallel::Placement& placement) {
  Options options;
  CLI::App app{"longattn-info: how longattn was built, the machine, MPI placement and measured ceilings"};
  app.add_option("--seconds", options.seconds, "Minimum duration of each ceiling measurement")
      ->check(CLI::Range(0.01, 60.0));
  app.add_option("--gemm-size", options.gemm_size, "Matrix size n of the sgemm ceiling (n x n x n)")
      ->check(CLI::Range(64, 16384));
  app.add_flag("--no-ceilings", [&](std::int64_t) { options.ceilings = false; }, "Skip the measurements");
  app.add_option("--json", options.json_path, "Also write the report as JSON to this file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << "longattn-info: " << e.what() << "\n\n" << app.help();
    return 2;
  }
  longattn::check_environment_switches();

  int rank = 0;
#if LONGATTN_HAVE_MPI
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
#endif

  Ceilings ceilings;
  if (rank == 0 && options.ceilings) ceilings = measure(options);
#if LONGATTN_HAVE_MPI
  quiet_barrier(MPI_COMM_WORLD);
#endif
  // What the world's collectives take on each memory (every rank: the choice for device memory is
  // collective).
  std::vector<std::string> transports;
#if LONGATTN_HAVE_MPI
  {
    const auto world = longattn::parallel::Communicator::world();
    transports.push_back("host memory " + to_string(world.transport(Kokkos::DefaultHostExecutionSpace())));
    if constexpr (!std::is_same_v<Kokkos::DefaultExecutionSpace, Kokkos::DefaultHostExecutionSpace>)
      transports.push_back("device memory " + to_string(world.transport(Kokkos::DefaultExecutionSpace())));
  }
#else
  transports.push_back("none (built without MPI)");
#endif
  if (rank != 0) return 0;

  const Report report{longattn::build_info(),
                      longattn::blas_runtime(),
                      longattn::parallel::communication_libraries(),
                      transports,
                      longattn::memory::Topology::system().summary(),
                      placement,
                      options.ceilings ? &ceilings : nullptr};
  print_report(std::cout, report, options);
  if (!options.json_path.empty()) {
    std::ofstream file(options.json_path);
    if (!file) throw longattn::Error("longattn-info: cannot write --json file '" + options.json_path + "'");
    file << to_json(report, options).dump(2) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char* argv[]) {
#if LONGATTN_HAVE_MPI
  longattn::parallel::MpiSession mpi(argc, argv);
  // Before Kokkos starts: OMP_PROC_BIND would pin this thread and hide the process's CPU set.
  const auto placement = longattn::parallel::gather_placement(MPI_COMM_WORLD);
#else
  const auto placement = longattn::parallel::local_placement();
#endif
  longattn::ScopeGuard guard(argc, argv, {/*select_blas_kernels=*/true});
  try {
    return run(argc, argv, placement);
  } catch (const std::exception& e) {
    std::cerr << "longattn-info: " << e.what() << "\n";
#if LONGATTN_HAVE_MPI
    MPI_Abort(MPI_COMM_WORLD, 1);  // the other ranks may wait for this one: never hang
#endif
    return 1;
  }
}
