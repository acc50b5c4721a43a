// The machine's ceilings as benchmarks: FP32 FMA peak per execution space, and sgemm through
// longattn::gemm (Kokkos Kernels -> OpenBLAS) at several sizes on one BLAS thread and on all;
// gemm of bfloat16 A and B against sgemm at the same shapes (the trainer's among them), on the
// CPU's bf16 dot products and on float copies; and the attention kernels' block products, on
// floats against the FMA peak and on bf16 pairs against the peak of the instruction they run on
// (dot products, or AMX tile products).
//
// sgemm n x n x n does 2 n^3 FLOPs and must move at least 3 n^2 floats (12 n^2 bytes); from
// n = 256 on it is compute-bound on this CPU (arithmetic intensity n/6 FLOP/byte).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <vector>

#include "longattn/core/detail/amx_tile_config.hpp"
#ifdef LONGATTN_AMX_TILE_CONFIG
#include <immintrin.h>
#define LONGATTN_BENCH_AMX __attribute__((target("amx-tile,amx-bf16")))
#endif

#include "longattn/core/bf16_dot_products.hpp"
#include "longattn/core/blas.hpp"
#include "longattn/core/ceilings.hpp"
#include "longattn/core/runtime.hpp"
#include "longattn/core/gemm.hpp"
#include "longattn/core/attention_tiles.hpp"
#include "longattn/core/detail/bf16_pair_product.hpp"
#include "longattn/core/detail/tile_mma.hpp"

namespace {

using Host = Kokkos::DefaultHostExecutionSpace;

// Measured once per process, before the benchmarks: the denominators of "fraction_of_peak".
double fma_peak_gflops_one_core = 0;
double tile_peak_gflops_one_core = 0;  // 0 where the CPU has no AMX-BF16 for this process

#ifdef LONGATTN_BENCH_AMX
// tdpbf16ps's peak on one core: 4 independent 16 x 16 float accumulators (tiles 0-3) on operand
// tiles that stay loaded (4-7), 16384 FLOPs an instruction, `rounds` rounds of 4.
LONGATTN_BENCH_AMX double measure_tile_peak_gflops(int rounds) {
  alignas(64) std::uint32_t operand[16 * 16];
  std::fill(std::begin(operand), std::end(operand), 0x3f803f80u);  // pairs of 1.0: finite sums
  alignas(64) float result[16 * 16];
  longattn::detail::load_amx_tile_config(longattn::detail::amx_tile_config(8, 16, 64));
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  Kokkos::Timer timer;
  for (int i = 0; i < rounds; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, result, 64);  // waits for the last round
  const double seconds = timer.seconds();
  _tile_release();
  benchmark::DoNotOptimize(result);
  return 4.0 * 16384.0 * rounds / seconds * 1e-9;
}
#endif

template <class ExecSpace>
void BM_FmaPeak(benchmark::State& state) {
  ExecSpace exec;
  double flops = 0;
  for (auto _ : state) flops += longattn::run_fma_chains(exec, state.range(0));
  state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsRate);
  state.counters["threads"] = exec.concurrency();
}

void BM_Sgemm(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int threads = static_cast<int>(state.range(1));
  const int blas_threads = longattn::blas_runtime().threads;
  const int all = blas_threads > 0 ? blas_threads : Host().concurrency();
  longattn::set_blas_threads(threads > 0 ? threads : all);
  using Matrix = Kokkos::View<float**, Kokkos::LayoutLeft, Host::memory_space>;
  Matrix a("A", n, n), b("B", n, n), c("C", n, n);
  Kokkos::deep_copy(a, 0.5f);
  Kokkos::deep_copy(b, 0.25f);
  longattn::gemm(Kokkos::DefaultHostExecutionSpace(), "N", "N", 1.0f, a, b, 0.0f, c);  // warm-up: BLAS buffers, page faults
  Kokkos::Timer timer;
  for (auto _ : state) {
    longattn::gemm(Kokkos::DefaultHostExecutionSpace(), "N", "N", 1.0f, a, b, 0.0f, c);
    Kokkos::fence();
  }
  const double seconds = timer.seconds();
  const double flops = 2.0 * n * double(n) * n * state.iterations();
  const double cores = threads > 0 ? threads : all;
  state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsRate);
  state.counters["bytes/s"] = benchmark::Counter(12.0 * n * double(n) * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["fraction_of_peak"] = flops / seconds * 1e-9 / (fma_peak_gflops_one_core * cores);
  longattn::set_blas_threads(all);
}

// The same sgemm on OpenBLAS's SSE3 ("Prescott") kernels: what Debian's OpenBLAS runs on CPUs
// it misdetects, i.e. what longattn's kernel selection saves.
void BM_SgemmPrescottKernels(benchmark::State& state) {
  const std::string selected = longattn::blas_runtime().kernels;
  if (longattn::detail::switch_openblas_kernels("Prescott").empty()) {
    state.SkipWithError("not OpenBLAS");
    return;
  }
  BM_Sgemm(state);
  longattn::detail::switch_openblas_kernels(selected);
}

// C (float) = op(A) op(B) for an m x n x k product; Args: {m, n, k, transposes (0 NN, 1 NT, 2 TN),
// operands (0: float through the BLAS; 1: bfloat16 on float copies; 2: bfloat16 on the CPU's bf16
// dot products; 3: float16 on float copies)}, on ExecSpace's threads (the BLAS set to as many).
template <class ExecSpace>
void run_gemm(benchmark::State& state, int m, int n, int k, int transposes, int operands) {
  const char* trans_a = transposes == 2 ? "T" : "N";
  const char* trans_b = transposes == 1 ? "T" : "N";
  if (operands == 2 && !longattn::bf16_dot_products_available()) {
    state.SkipWithError("this CPU has no bf16 dot products (AVX512-BF16)");
    return;
  }
  const ExecSpace exec;
  const int blas_threads = longattn::blas_runtime().threads;
  longattn::set_blas_threads(exec.concurrency());
  const bool dot_products_before = longattn::bf16_dot_products_in_use();
  longattn::use_bf16_dot_products(operands == 2);
  const longattn::ExecutionContext<ExecSpace> ctx(exec);
  const int a_rows = trans_a[0] == 'T' ? k : m, a_cols = trans_a[0] == 'T' ? m : k;
  const int b_rows = trans_b[0] == 'T' ? n : k, b_cols = trans_b[0] == 'T' ? k : n;
  Kokkos::View<float**, Kokkos::LayoutRight, typename ExecSpace::memory_space> c("C", m, n);
  auto run = [&](const auto& a, const auto& b) {
    Kokkos::deep_copy(a, std::decay_t<decltype(a(0, 0))>(0.5f));
    Kokkos::deep_copy(b, std::decay_t<decltype(b(0, 0))>(0.25f));
    longattn::gemm(ctx, trans_a, trans_b, 1.0f, a, b, 0.0f, c);  // warm-up: buffers, page faults
    Kokkos::Timer timer;
    for (auto _ : state) {
      longattn::gemm(ctx, trans_a, trans_b, 1.0f, a, b, 0.0f, c);
      exec.fence();
    }
    return timer.seconds();
  };
  double seconds = 0;
  if (operands == 0)
    seconds = run(Kokkos::View<float**, Kokkos::LayoutRight, typename ExecSpace::memory_space>("A", a_rows, a_cols),
        Kokkos::View<float**, Kokkos::LayoutRight, typename ExecSpace::memory_space>("B", b_rows, b_cols));
  else if (operands == 3)
    seconds = run(Kokkos::View<longattn::float16**, Kokkos::LayoutRight, typename ExecSpace::memory_space>("A", a_rows, a_cols),
        Kokkos::View<longattn::float16**, Kokkos::LayoutRight, typename ExecSpace::memory_space>("B", b_rows, b_cols));
  else
    seconds = run(Kokkos::View<longattn::bfloat16**, Kokkos::LayoutRight, typename ExecSpace::memory_space>("A", a_rows, a_cols),
        Kokkos::View<longattn::bfloat16**, Kokkos::LayoutRight, typename ExecSpace::memory_space>("B", b_rows, b_cols));
  const double flops = 2.0 * m * double(n) * k * double(state.iterations());
  state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsRate);
  state.counters["fraction_of_peak"] = flops / seconds * 1e-9 / (fma_peak_gflops_one_core * exec.concurrency());
  longattn::use_bf16_dot_products(dot_products_before);
  longattn::set_blas_threads(blas_threads > 0 ? blas_threads : Host().concurrency());
}

template <class ExecSpace>
void BM_Gemm(benchmark::State& state) {
  run_gemm<ExecSpace>(state, int(state.range(0)), int(state.range(1)), int(state.range(2)), int(state.range(3)),
                      int(state.range(4)));
}

// The calibration's table (perf_tests/write_calibration.py): NN products on all host threads over
// a grid of shapes; Args: {m, n, k, precision (0: float; 1: bfloat16 as this process runs it, on
// the bf16 dot products or on float copies; 2: float16, on float copies)}.
void BM_GemmGrid(benchmark::State& state) {
  const int operands = state.range(3) == 0   ? 0
                       : state.range(3) == 2 ? 3
                       : longattn::bf16_dot_products_in_use() ? 2
                                                              : 1;
  run_gemm<Host>(state, int(state.range(0)), int(state.range(1)), int(state.range(2)), 0, operands);
}

// The float attention kernels' block products on one core, through their micro-kernel
// (detail::tile_mma in the host's tile shape, SimdTiles): C (rows x cols) = [C +] A (rows x depth)
// B (depth x cols), 2 rows cols depth FLOPs, operands and C (32-80 KiB) in cache as in the
// kernels. fraction_of_peak divides by the FMA peak. Args: {rows, cols, depth, A's depth (0:
// along its rows, as K's in S = K Q^T; 1: down its columns, as V's in O += V^T P), C added to
// (0 as S, 1 as O)}.
void BM_FloatBlockProduct(benchmark::State& state) {
  using Shape = longattn::SimdTiles::shape<float>;
  using Policy = Kokkos::TeamPolicy<Kokkos::Serial>;
  const int rows = int(state.range(0)), cols = int(state.range(1)), depth = int(state.range(2));
  const bool depth_down_columns = state.range(3) == 1, accumulate = state.range(4) == 1;
  Kokkos::View<float*, Kokkos::HostSpace> a("a", std::size_t(rows) * depth), b("b", std::size_t(depth) * cols),
      c("c", std::size_t(rows) * cols);
  // Near 1/depth: C stays finite however often it is added to.
  Kokkos::deep_copy(a, 1.0f / float(depth));
  Kokkos::deep_copy(b, 0.5f);
  const int a_row_stride = depth_down_columns ? 1 : depth, a_depth_stride = depth_down_columns ? rows : 1;
  constexpr int products_per_launch = 64;  // one launch's overhead spread over many products
  const auto run = [=](int products) {
    Kokkos::parallel_for(Policy(Kokkos::Serial(), 1, 1), [=](const Policy::member_type& team) {
      for (int p = 0; p < products; ++p)
        longattn::detail::tile_mma<Shape>(team, rows, cols, depth, a.data(), a_row_stride, a_depth_stride, b.data(),
                                          cols, c.data(), cols, accumulate);
    });
  };
  run(1);  // warm-up: caches
  Kokkos::Timer timer;
  for (auto _ : state) {
    run(products_per_launch);
    benchmark::DoNotOptimize(c.data());
  }
  const double seconds = timer.seconds();
  const double flops = 2.0 * rows * double(cols) * depth * products_per_launch * double(state.iterations());
  state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsRate);
  state.counters["fraction_of_peak"] = flops / seconds * 1e-9 / fma_peak_gflops_one_core;
}

// One block product of the attention kernels on bf16 pairs (detail/bf16_pair_product.hpp) on
// one core: C (rows x cols) = [C +] alpha A (rows x pairs) B (pairs x cols), 4 rows cols pairs
// FLOPs; operands and C (32-56 KiB) stay in cache as in the kernels.
// fraction_of_peak divides by the instruction's peak: for dot products the FMA peak times
// bf16_dot_product_speedup(), for tile products tdpbf16ps's (measure_tile_peak_gflops). Args:
// {rows, cols, pairs, A's pairs (0: along its rows, as K's and dO's; 1: down its columns, as
// V's), products (0: dot, 1: tile), C (0: alpha 1/8 and not added to, as S; 1: alpha 1, added
// to, as O)}.
void BM_Bf16PairProduct(benchmark::State& state) {
  const bool tiles = state.range(4) == 1;
  if (tiles ? tile_peak_gflops_one_core == 0 : !longattn::bf16_dot_products_available()) {
    state.SkipWithError(tiles ? "this CPU has no AMX-BF16 tile products for this process"
                              : "this CPU has no bf16 dot products (AVX512-BF16)");
    return;
  }
  const int rows = int(state.range(0)), cols = int(state.range(1)), pairs = int(state.range(2));
  const bool pairs_down_columns = state.range(3) == 1;
  // Words of two bf16 values near 1 (0x3f80: 1.0): finite products whatever the order.
  std::vector<std::uint32_t> a(std::size_t(rows) * pairs, 0x3f803f80u), b(std::size_t(pairs) * cols, 0x3f803f80u);
  std::vector<float> c(std::size_t(rows) * cols);
  longattn::detail::Bf16PairProduct product{};
  product.a = a.data();
  product.a_row_stride = pairs_down_columns ? 1 : pairs;
  product.a_pair_stride = pairs_down_columns ? rows : 1;
  product.b = b.data();
  product.ldb = cols;
  product.c = c.data();
  product.ldc = cols;
  product.rows = rows;
  product.cols = cols;
  product.pairs = pairs;
  product.alpha = state.range(5) == 1 ? 1.0f : 0.125f;
  product.accumulate = state.range(5) == 1;
  const bool tiles_before = longattn::bf16_tile_products_in_use();
  longattn::use_bf16_tile_products(tiles);
  longattn::detail::bf16_pair_product(product, 0, rows);  // warm-up: caches
  Kokkos::Timer timer;
  for (auto _ : state) {
    longattn::detail::bf16_pair_product(product, 0, rows);
    benchmark::DoNotOptimize(c.data());
  }
  const double seconds = timer.seconds();
  longattn::use_bf16_tile_products(tiles_before);
  const double flops = 4.0 * rows * double(cols) * pairs * double(state.iterations());
  const double peak = tiles ? tile_peak_gflops_one_core : fma_peak_gflops_one_core * longattn::bf16_dot_product_speedup();
  state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsRate);
  state.counters["fraction_of_peak"] = flops / seconds * 1e-9 / peak;
}

}  // namespace

// Arg: FMA rounds per launch.
BENCHMARK_TEMPLATE(BM_FmaPeak, Kokkos::Serial)->Arg(1 << 18)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_FmaPeak, Host)->Arg(1 << 18)->UseRealTime()->Unit(benchmark::kMillisecond);
// Args: {n, BLAS threads (0 = all)}.
BENCHMARK(BM_Sgemm)->ArgsProduct({{256, 512, 1024, 2048}, {1, 0}})->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SgemmPrescottKernels)->Args({2048, 1})->UseRealTime()->Unit(benchmark::kMillisecond);
// Square, then the default trainer's linear layers at 2048 rows per rank (embed 128: QKV forward,
// its weight gradient, its input gradient; the MLP's 512-wide forward).
BENCHMARK_TEMPLATE(BM_Gemm, Kokkos::Serial)
    ->ArgsProduct({{1024}, {1024}, {1024}, {0}, {0, 1, 2}})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_Gemm, Host)
    ->ArgsProduct({{2048}, {2048}, {2048}, {0}, {0, 1, 2}})
    ->ArgsProduct({{2048}, {384}, {128}, {1}, {0, 1, 2}})
    ->ArgsProduct({{384}, {128}, {2048}, {2}, {0, 1, 2}})
    ->ArgsProduct({{2048}, {128}, {384}, {0}, {0, 1, 2}})
    ->ArgsProduct({{2048}, {512}, {128}, {1}, {0, 1, 2}})
    ->UseRealTime()->Unit(benchmark::kMillisecond);

// The forward pass's products at L = 64: S = K Q^T at D 64 and 128 (K along its rows, not added
// to), then O += V^T P at D 64 and 128 (V down its columns).
BENCHMARK(BM_FloatBlockProduct)
    ->ArgsProduct({{64}, {64}, {64, 128}, {0}, {0}})
    ->ArgsProduct({{64, 128}, {64}, {64}, {1}, {1}})
    ->UseRealTime()->Unit(benchmark::kMicrosecond);

// The forward pass's products at L = 64 on each kind of product: S = K Q^T at D 64 and 128
// (pairs along K's rows, scaled, not added to), then O += V^T P at D 64 and 128 (V's pairs down
// its columns).
BENCHMARK(BM_Bf16PairProduct)
    ->ArgsProduct({{64}, {64}, {32, 64}, {0}, {0, 1}, {0}})
    ->ArgsProduct({{64, 128}, {64}, {32}, {1}, {0, 1}, {1}})
    ->UseRealTime()->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_GemmGrid)
    ->ArgsProduct({{128, 256, 1024, 4096, 16384}, {64, 256, 1024}, {64, 256, 1024}, {0, 1, 2}})
    ->UseRealTime()->Unit(benchmark::kMillisecond);

int main(int argc, char* argv[]) {
  longattn::ScopeGuard guard(argc, argv, {/*select_blas_kernels=*/true});
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  fma_peak_gflops_one_core = longattn::measure_fma_peak(Kokkos::Serial(), 0.3).gflops();
  benchmark::AddCustomContext("fp32_fma_peak_one_core_gflops", std::to_string(fma_peak_gflops_one_core));
#ifdef LONGATTN_BENCH_AMX
  if (longattn::bf16_tile_products_available()) {  // which asks Linux for the tile registers
    // The best of 8: single probes on a shared 2-core guest ranged from 0.95 to 2.2 TFLOP/s.
    for (int probe = 0; probe < 8; ++probe)
      tile_peak_gflops_one_core = std::max(tile_peak_gflops_one_core, measure_tile_peak_gflops(1 << 18));
    benchmark::AddCustomContext("bf16_tile_peak_one_core_gflops", std::to_string(tile_peak_gflops_one_core));
  }
#endif
  benchmark::AddCustomContext("blas_kernels", longattn::blas_runtime().kernels);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
