// The fused attention kernels on this machine: forward and forward + backward GFLOP/s for B = 1,
// H = 8, D = 64 and 128, N = 1K..16K (and 32K at D = 64), causal and not, fp32, on all cores of
// the default host execution space, and with and without head-major copies; the peak extra
// memory of forward + backward for N = 4K, 16K, 64K; and dilated attention (LongNet, w = 2048,4096,8192, r = 1,2,4, both modes) for
// N = 8K..256K: tokens/s, time per token, GFLOP/s of the scores it computes; block-sparse
// attention at N = 16K and 64K for densities 5..100% and each named pattern, beside dense.
//
// FLOPs counted (the convention of FlashAttention and of the issue): forward 4 B H Nq Nk D
// (two products of 2 B H Nq Nk D), backward 2.5x that, both halved when causal. The kernels'
// own work is larger: the backward pass recomputes S and dP once more for dQ (7 products where
// 5 are counted). Bytes: the minimum a pass must move, every tensor once (forward: read q, k,
// v, write o and lse; backward: read q, k, v, o, dO, lse, write dq, dk, dv).
// fraction_of_peak divides by the FMA peak of all cores, measured at start-up the way
// longattn-info measures it. A CUDA build also runs the dense and dilated benchmarks on the GPU
// (named <..., Kokkos::Cuda>), against the GPU's FP32 FMA peak measured the same way.
#include <benchmark/benchmark.h>

#include <Kokkos_Random.hpp>

#include <algorithm>
#include <cstdint>
#include <string>

#include "longattn/core/attention.hpp"
#include "longattn/core/block_sparse_patterns.hpp"
#include "longattn/core/dilated_attention.hpp"
#include "longattn/core/ceilings.hpp"
#include "longattn/core/runtime.hpp"

namespace {

using Exec = Kokkos::DefaultHostExecutionSpace;

// The FP32 FMA peak of each execution space the benchmarks run on, measured in main.
template <class Space>
double fma_peak_gflops = 0;

// The tensors of one attention call on Space, stored as T (float, or a 16-bit type: bfloat16
// benchmarks are named <longattn::bfloat16>); lse in accumulate_t<T>.
template <class T = float, class Space = Exec>
struct Problem {
  using Tensor = Kokkos::View<T****, Kokkos::LayoutRight, typename Space::memory_space>;
  using Rows = Kokkos::View<longattn::accumulate_t<T>***, Kokkos::LayoutRight, typename Space::memory_space>;
  Tensor q, k, v, o, d_o, dq, dk, dv;
  Rows lse;
  struct Convert {  // a functor: CUDA allows no device lambda in a constructor
    T* to;
    const float* from;
    KOKKOS_FUNCTION void operator()(std::size_t i) const { to[i] = T(from[i]); }
  };
  Problem(int batch, int tokens, int heads, int head_dim)
      : q("q", batch, tokens, heads, head_dim), k("k", batch, tokens, heads, head_dim),
        v("v", batch, tokens, heads, head_dim), o("o", batch, tokens, heads, head_dim),
        d_o("do", batch, tokens, heads, head_dim), dq("dq", batch, tokens, heads, head_dim),
        dk("dk", batch, tokens, heads, head_dim), dv("dv", batch, tokens, heads, head_dim),
        lse("lse", batch, heads, tokens) {
    Kokkos::Random_XorShift64_Pool<Space> pool(2026);
    Kokkos::View<float****, Kokkos::LayoutRight, typename Space::memory_space> values("values", batch, tokens, heads,
                                                                                     head_dim);
    for (const Tensor& x : {q, k, v, d_o}) {
      Kokkos::fill_random(values, pool, -1.0f, 1.0f);
      Kokkos::parallel_for(Kokkos::RangePolicy<Space>(0, x.span()), Convert{x.data(), values.data()});
    }
  }
};

double forward_flops(int batch, int tokens, int heads, int head_dim, bool causal) {
  return 4.0 * batch * heads * double(tokens) * tokens * head_dim / (causal ? 2 : 1);
}

template <class Space = Exec>
void set_counters(benchmark::State& state, double flops, double bytes, double seconds) {
  state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsRate);
  if (bytes > 0) state.counters["bytes/s"] = benchmark::Counter(bytes, benchmark::Counter::kIsRate);
  state.counters["fraction_of_peak"] = flops / seconds * 1e-9 / fma_peak_gflops<Space>;
  state.counters["threads"] = Space().concurrency();
}

// Runs step() once per iteration; the seconds measured. A warm-up step first (scratch, first
// touch of pages) unless the benchmark is a single step of seconds, where neither shows.
template <class Step>
double time_steps(benchmark::State& state, Step&& step) {
  if (state.max_iterations > 1) step();
  Kokkos::Timer timer;
  for (auto _ : state) step();
  return timer.seconds();
}

// Args: {N, D, causal}; B = 1, H heads (8 unless named: <T, Space, H>). T: the tensors' storage
// type; Space: where they run; Program: the tensor-core programs (AttentionOptions'
// tensor_core_forward and tensor_core_backward).
template <class T, class Space = Exec, int H = 8,
          longattn::TensorCoreProgram Program = longattn::TensorCoreProgram::automatic>
void BM_AttentionForward(benchmark::State& state) {
  const int N = int(state.range(0)), D = int(state.range(1));
  longattn::AttentionOptions opts;
  opts.causal = state.range(2) != 0;
  opts.tensor_core_forward = Program;
  Problem<T, Space> p(1, N, H, D);
  const double seconds = time_steps(state, [&] {
    longattn::attention_forward(Space(), p.q, p.k, p.v, p.o, p.lse, opts);
    Kokkos::fence();
  });
  const double n = state.iterations();
  set_counters<Space>(state, n * forward_flops(1, N, H, D, opts.causal),
                      n * (4.0 * N * H * D * sizeof(T) + H * N * sizeof(float)), seconds);
}

template <class T, class Space = Exec, int H = 8,
          longattn::TensorCoreProgram Program = longattn::TensorCoreProgram::automatic>
void BM_AttentionForwardBackward(benchmark::State& state) {
  const int N = int(state.range(0)), D = int(state.range(1));
  longattn::AttentionOptions opts;
  opts.causal = state.range(2) != 0;
  opts.tensor_core_forward = opts.tensor_core_backward = Program;
  Problem<T, Space> p(1, N, H, D);
  const double seconds = time_steps(state, [&] {
    longattn::attention_forward(Space(), p.q, p.k, p.v, p.o, p.lse, opts);
    longattn::attention_backward(Space(), p.q, p.k, p.v, p.o, p.d_o, p.lse, p.dq, p.dk, p.dv, opts);
    Kokkos::fence();
  });
  const double n = state.iterations();
  set_counters<Space>(state, n * 3.5 * forward_flops(1, N, H, D, opts.causal),
                      n * (4.0 + 8.0) * N * H * D * sizeof(T) + n * 2.0 * H * N * sizeof(float), seconds);
}

// The backward pass alone in each form (AttentionOptions::backward_passes). Args: {N, D, causal,
// passes (1 or 2)}; B = 1, H = 8, fp32.
void BM_AttentionBackwardPasses(benchmark::State& state) {
  const int N = int(state.range(0)), D = int(state.range(1)), H = 8;
  longattn::AttentionOptions opts;
  opts.causal = state.range(2) != 0;
  opts.backward_passes = state.range(3) == 1 ? longattn::BackwardPasses::one : longattn::BackwardPasses::two;
  Problem<float> p(1, N, H, D);
  longattn::attention_forward(Exec(), p.q, p.k, p.v, p.o, p.lse, opts);
  const double seconds = time_steps(state, [&] {
    longattn::attention_backward(Exec(), p.q, p.k, p.v, p.o, p.d_o, p.lse, p.dq, p.dk, p.dv, opts);
    Kokkos::fence();
  });
  const double n = state.iterations();
  set_counters(state, n * 2.5 * forward_flops(1, N, H, D, opts.causal), n * 8.0 * N * H * D * sizeof(float), seconds);
}

// Forward + backward with and without head-major copies (AttentionOptions::head_major_copies).
// Args: {N, D, causal, copies (0 or 1)}; B = 1, H = 8, fp32; GFLOP/s counted as the pair's.
void BM_AttentionHeadMajorCopies(benchmark::State& state) {
  const int N = int(state.range(0)), D = int(state.range(1)), H = 8;
  longattn::AttentionOptions opts;
  opts.causal = state.range(2) != 0;
  opts.head_major_copies = state.range(3) != 0;
  Problem<float> p(1, N, H, D);
  const double seconds = time_steps(state, [&] {
    longattn::attention_forward(Exec(), p.q, p.k, p.v, p.o, p.lse, opts);
    longattn::attention_backward(Exec(), p.q, p.k, p.v, p.o, p.d_o, p.lse, p.dq, p.dk, p.dv, opts);
    Kokkos::fence();
  });
  const double n = state.iterations();
  set_counters(state, n * 3.5 * forward_flops(1, N, H, D, opts.causal), n * 12.0 * N * H * D * sizeof(float), seconds);
}

// Bytes allocated through Kokkos (Views, and the OpenMP backend's per-thread scratch pool) while
// a measurement runs: Kokkos' tool hooks see every allocation and deallocation. The default
// pool's chunks are reported to the hooks too; they are left out, as what the call takes from
// the pool is counted by the pool itself.
struct AllocationCounter {
  static inline std::int64_t current = 0, peak = 0;
  static bool counted(const char* label) { return std::string(label).rfind("longattn::default_pool", 0) != 0; }
  static void on_allocate(Kokkos::Tools::SpaceHandle, const char* label, const void*, std::uint64_t bytes) {
    if (!counted(label)) return;
    current += std::int64_t(bytes);
    peak = std::max(peak, current);
  }
  static void on_deallocate(Kokkos::Tools::SpaceHandle, const char* label, const void*, std::uint64_t bytes) {
    if (counted(label)) current -= std::int64_t(bytes);
  }
  AllocationCounter() {
    current = peak = 0;
    Kokkos::Tools::Experimental::set_allocate_data_callback(&on_allocate);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(&on_deallocate);
  }
  ~AllocationCounter() {
    Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(nullptr);
  }
};

// Peak memory that forward + backward take beyond their inputs and outputs: workspaces from the
// default pool (the Delta buffer; the pool's in-use high-water mark) plus anything allocated
// through Kokkos directly (its hooks; none once the per-thread scratch has grown), and the team
// scratch they use (allocated once per process, per thread, and independent of N).
// Args: {N, copies (AttentionOptions::head_major_copies, 0 or 1)}; B = 1, H = 8, D = 64, causal.
void BM_AttentionMemory(benchmark::State& state) {
  const int N = int(state.range(0)), H = 8, D = 64;
  longattn::AttentionOptions opts;
  opts.causal = true;
  opts.head_major_copies = state.range(1) != 0;
  Problem<float> p(1, N, H, D);
  {  // the per-thread scratch pool grows on first use: reported separately, below
    Problem<float> small(1, 64, H, D);
    longattn::attention_backward(Exec(), small.q, small.k, small.v, small.o, small.d_o, small.lse, small.dq,
                                 small.dk, small.dv, opts);
  }
  const auto& pool = longattn::memory::default_pool<Exec::memory_space>();
  double peak_allocated = 0;
  for (auto _ : state) {
    const AllocationCounter counter;
    const std::size_t before = pool.stats().in_use_bytes;
    pool.reset_high_water();
    longattn::attention_forward(Exec(), p.q, p.k, p.v, p.o, p.lse, opts);
    longattn::attention_backward(Exec(), p.q, p.k, p.v, p.o, p.d_o, p.lse, p.dq, p.dk, p.dv, opts);
    Kokkos::fence();
    peak_allocated = double(pool.stats().in_use_high_water_bytes - before) + double(AllocationCounter::peak);
  }
  const double scratch = double(longattn::attention_scratch_bytes<Exec, float>(D, true) * Exec().concurrency());
  state.counters["peak_allocated_bytes"] = peak_allocated;
  state.counters["scratch_bytes_all_threads"] = scratch;
  state.counters["peak_extra_bytes_per_token"] = peak_allocated / N;
  state.counters["tensor_bytes"] = (8.0 * N * H * D + H * N) * sizeof(float);
}

// Dilated attention. Args: {N, mode (0 longnet, 1 head_groups), causal}; B = 1, H = 8, D = 64.
// FLOPs: 4 D per computed score forward (dilated_attention_scores), 3.5x that with backward.
longattn::DilatedConfig dilated_config(const benchmark::State& state) {
  return {{2048, 4096, 8192}, {1, 2, 4}, state.range(1) ? longattn::DilatedMode::head_groups : longattn::DilatedMode::longnet};
}

template <class Space>
void set_dilated_counters(benchmark::State& state, double flops_per_step, double seconds) {
  const double n = state.iterations(), tokens = double(state.range(0));
  set_counters<Space>(state, n * flops_per_step, 0, seconds);  // bytes: not reported
  state.counters["tokens/s"] = benchmark::Counter(n * tokens, benchmark::Counter::kIsRate);
  state.counters["ns_per_token"] = seconds / n / tokens * 1e9;
}

// One dilated step per iteration: forward, and backward too when `with_backward`.
template <class Space>
void run_dilated(benchmark::State& state, bool with_backward) {
  const int N = int(state.range(0)), H = 8, D = 64;
  const longattn::DilatedConfig config = dilated_config(state);
  longattn::AttentionOptions opts;
  opts.causal = state.range(2) != 0;
  Problem<float, Space> p(1, N, H, D);
  auto step = [&] {
    longattn::dilated_attention_forward(Space(), p.q, p.k, p.v, p.o, p.lse, config, opts);
    if (with_backward)
      longattn::dilated_attention_backward(Space(), p.q, p.k, p.v, p.o, p.d_o, p.lse, p.dq, p.dk, p.dv, config, opts);
    Kokkos::fence();
  };
  const double seconds = time_steps(state, step);
  const double forward_flops = 4.0 * D * longattn::dilated_attention_scores(N, H, config, opts.causal);
  set_dilated_counters<Space>(state, (with_backward ? 3.5 : 1.0) * forward_flops, seconds);
}

template <class Space>
void BM_DilatedForward(benchmark::State& state) { run_dilated<Space>(state, false); }
template <class Space>
void BM_DilatedForwardBackward(benchmark::State& state) { run_dilated<Space>(state, true); }

// Block-sparse attention. Args: {N, pattern, density in percent (random only)}; B = 1, H = 8,
// D = 64, not causal. Patterns, with parameters that scale with N:
//   0 random at the given density       1 local window, radius N / 20 (about 10%)
//   2 dilated blocks, rates 1, 2, 4, ... up to the block count
//   3 global + local, N / 64 global tokens, radius N / 32 (about 10%)
//   4 content-adaptive top-k, k = 10% of the key blocks (the selection is timed with each step)
// FLOPs: those of the kept blocks, 4 D per score of a kept 64 x 64 block (forward), 3.5x that
// with backward. Counters: density and the kept blocks; compare times with BM_Attention* at the
// same N in the same run.
longattn::BlockSparseConfig block_sparse_config(const benchmark::State& state) {
  const std::int64_t N = state.range(0), blocks = N / 64;
  longattn::BlockSparseConfig config;
  switch (state.range(1)) {
    case 0:
      config.pattern = longattn::BlockSparsePattern::random;
      config.density = double(state.range(2)) / 100;
      config.seed = 2026;
      break;
    case 1:
      config.pattern = longattn::BlockSparsePattern::local_window;
      config.radius = N / 20;
      break;
    case 2:
      config.pattern = longattn::BlockSparsePattern::dilated;
      for (std::int64_t r = 1; r < blocks; r *= 2) config.rates.push_back(r);
      break;
    case 3:
      config.pattern = longattn::BlockSparsePattern::global_local;
      config.global_tokens = N / 64;
      config.radius = N / 32;
      break;
    default:
      config.pattern = longattn::BlockSparsePattern::top_k;
      config.top_k = std::max<std::int64_t>(1, blocks / 10);
  }
  return config;
}

// One step per iteration: (top-k: the selection,) forward, and backward when `with_backward`.
void run_block_sparse(benchmark::State& state, bool with_backward) {
  const int N = int(state.range(0)), H = 8, D = 64;
  const longattn::BlockSparseConfig config = block_sparse_config(state);
  const bool adaptive = config.pattern == longattn::BlockSparsePattern::top_k;
  longattn::AttentionOptions opts;
  Problem<float> p(1, N, H, D);
  auto layout = longattn::block_sparse_layout(Exec(), config, p.q, p.k, opts.causal);
  auto step = [&] {
    if (adaptive) layout = longattn::block_sparse_layout(Exec(), config, p.q, p.k, opts.causal);
    longattn::attention_forward(Exec(), p.q, p.k, p.v, p.o, p.lse, opts, layout);
    if (with_backward)
      longattn::attention_backward(Exec(), p.q, p.k, p.v, p.o, p.d_o, p.lse, p.dq, p.dk, p.dv, opts, layout);
    Kokkos::fence();
  };
  const double seconds = time_steps(state, step), n = state.iterations();
  // Every block is 64 x 64 but the last, which is whole here (N is a multiple of 64).
  const double pairs_per_pattern = double(layout.kept_blocks()) / layout.shape().patterns() * 64 * 64;
  const double forward_flops = 4.0 * D * H * pairs_per_pattern;
  set_counters(state, n * (with_backward ? 3.5 : 1.0) * forward_flops, 0, seconds);
  state.counters["density"] = layout.density();
  state.counters["kept_blocks_per_head"] = double(layout.kept_blocks()) / layout.shape().patterns();
  state.counters["seconds_per_step"] = seconds / n;
}

void BM_BlockSparseForward(benchmark::State& state) { run_block_sparse(state, false); }
void BM_BlockSparseForwardBackward(benchmark::State& state) { run_block_sparse(state, true); }

// Building a fixed pattern's layout (same Args as above, not causal): what LocalAttention did in
// every forward and every backward of every layer before BlockSparseLayoutCache, and now does
// once per shape. Compare seconds_per_build with BM_BlockSparseForwardBackward's
// seconds_per_step at the same N and pattern: a layer step saved 2 builds.
void BM_BlockSparseLayoutBuild(benchmark::State& state) {
  const longattn::BlockSparseConfig config = block_sparse_config(state);
  longattn::BlockSparseShape shape;
  shape.queries = shape.keys = state.range(0);
  double kept = 0;
  const double seconds = time_steps(state, [&] {
    kept = double(longattn::block_sparse_layout(Exec(), config, shape, false).kept_blocks());
    Kokkos::fence();
  });
  state.counters["seconds_per_build"] = seconds / state.iterations();
  state.counters["kept_blocks"] = kept;
}

}  // namespace

BENCHMARK_TEMPLATE(BM_AttentionForward, float)
    ->ArgsProduct({{1024, 2048, 4096, 8192, 16384}, {64, 128}, {0, 1}})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_AttentionForwardBackward, float)
    ->ArgsProduct({{1024, 2048, 4096, 8192, 16384}, {64, 128}, {0, 1}})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
// The two forms of each shape one after the other (compare like with like on a drifting machine).
BENCHMARK(BM_AttentionBackwardPasses)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (int causal : {0, 1})
        for (int D : {64, 128})
          for (int N : {4096, 16384})
            for (int passes : {2, 1}) b->Args({N, D, causal, passes});
    })
    ->UseRealTime()->Unit(benchmark::kMillisecond);
// bfloat16 storage (float accumulation) on the same shapes.
BENCHMARK_TEMPLATE(BM_AttentionForward, longattn::bfloat16)
    ->ArgsProduct({{1024, 2048, 4096, 8192, 16384}, {64, 128}, {0, 1}})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_AttentionForwardBackward, longattn::bfloat16)
    ->ArgsProduct({{1024, 2048, 4096, 8192, 16384}, {64, 128}, {0, 1}})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
// Dense at 32K: the baseline dilated attention is compared with in the same run.
BENCHMARK_TEMPLATE(BM_AttentionForward, float)->Args({32768, 64, 0})->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);
BENCHMARK_TEMPLATE(BM_AttentionForwardBackward, float)->Args({32768, 64, 0})->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);
BENCHMARK(BM_DilatedForward<Exec>)
    ->Name("BM_DilatedForward")
    ->ArgsProduct({{8192, 16384, 32768, 65536, 131072, 262144}, {0, 1}, {0}})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DilatedForwardBackward<Exec>)
    ->Name("BM_DilatedForwardBackward")
    ->ArgsProduct({{8192, 16384, 32768, 65536, 131072, 262144}, {0, 1}, {0}})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
// Block-sparse at 16K and 64K, and dense at 64K (16K is above): densities, then the named patterns.
BENCHMARK_TEMPLATE(BM_AttentionForward, float)->Args({65536, 64, 0})->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);
BENCHMARK_TEMPLATE(BM_AttentionForwardBackward, float)->Args({65536, 64, 0})->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);
BENCHMARK(BM_BlockSparseForward)
    ->ArgsProduct({{16384, 65536}, {0}, {5, 10, 25, 50, 100}})
    ->ArgsProduct({{16384, 65536}, {1, 2, 3, 4}, {0}})
    ->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BlockSparseForwardBackward)
    ->ArgsProduct({{16384, 65536}, {0}, {5, 10, 25, 50, 100}})
    ->ArgsProduct({{16384, 65536}, {1, 2, 3, 4}, {0}})
    ->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BlockSparseLayoutBuild)
    ->ArgsProduct({{16384, 65536}, {0}, {10}})
    ->ArgsProduct({{16384, 65536}, {1, 2, 3}, {0}})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
#ifdef KOKKOS_ENABLE_CUDA
// The GPU: dense attention at N 1K..16K in fp32 and bf16, and dilated attention up to 256K.
// Select them with --benchmark_filter=Cuda.
BENCHMARK_TEMPLATE(BM_AttentionForward, float, Kokkos::Cuda)
    ->ArgsProduct({{1024, 4096, 16384}, {64, 128}, {0, 1}})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
// Where the team scratch lives: at D 20 the forward kernel's 36.5 KiB fit Kokkos 3.4's 40 KiB of
// shared memory (level 0), at D 24 its 40.5 KiB do not (level 1, global memory).
BENCHMARK_TEMPLATE(BM_AttentionForward, float, Kokkos::Cuda)
    ->Args({16384, 20, 0})->Args({16384, 24, 0})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_AttentionForwardBackward, float, Kokkos::Cuda)
    ->ArgsProduct({{1024, 4096, 16384}, {64, 128}, {0, 1}})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
// bf16 on the tensor cores (TensorCoreTiles), also with 16 heads: 8 heads of 4K tokens are 256
// forward CTAs, under two waves on 132 SMs.
BENCHMARK_TEMPLATE(BM_AttentionForward, longattn::bfloat16, Kokkos::Cuda)
    ->ArgsProduct({{4096, 16384}, {64, 128}, {0, 1}})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_AttentionForwardBackward, longattn::bfloat16, Kokkos::Cuda)
    ->ArgsProduct({{4096, 16384}, {64, 128}, {0, 1}})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_AttentionForward, longattn::bfloat16, Kokkos::Cuda, 16)
    ->ArgsProduct({{4096, 8192, 16384}, {64, 128}, {0, 1}})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_AttentionForwardBackward, longattn::bfloat16, Kokkos::Cuda, 16)
    ->ArgsProduct({{4096, 8192, 16384}, {64, 128}, {0, 1}})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
// The warpgroup programs (wgmma, sm_90a) beside the default (compare_sdpa.py --program).
BENCHMARK_TEMPLATE(BM_AttentionForward, longattn::bfloat16, Kokkos::Cuda, 16, longattn::TensorCoreProgram::warpgroup)
    ->ArgsProduct({{4096, 8192, 16384}, {64, 128}, {0, 1}})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_AttentionForwardBackward, longattn::bfloat16, Kokkos::Cuda, 16, longattn::TensorCoreProgram::warpgroup)
    ->ArgsProduct({{4096, 8192, 16384}, {64, 128}, {0, 1}})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DilatedForward<Kokkos::Cuda>)
    ->Name("BM_DilatedForward<Kokkos::Cuda>")
    ->ArgsProduct({{65536, 262144}, {0}, {0}})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DilatedForwardBackward<Kokkos::Cuda>)
    ->Name("BM_DilatedForwardBackward<Kokkos::Cuda>")
    ->ArgsProduct({{65536, 262144}, {0}, {0}})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
#endif
BENCHMARK(BM_AttentionHeadMajorCopies)
    ->ArgsProduct({{1024, 4096, 16384}, {64, 128}, {0, 1}, {0, 1}})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AttentionMemory)
    ->ArgsProduct({{4096, 16384, 65536}, {0, 1}})
    ->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);

int main(int argc, char* argv[]) {
  longattn::ScopeGuard guard(argc, argv, {/*select_blas_kernels=*/true});
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  fma_peak_gflops<Exec> = longattn::measure_fma_peak(Exec(), 0.3).gflops();
  benchmark::AddCustomContext("fp32_fma_peak_all_cores_gflops", std::to_string(fma_peak_gflops<Exec>));
#ifdef KOKKOS_ENABLE_CUDA
  fma_peak_gflops<Kokkos::Cuda> = longattn::measure_fma_peak(Kokkos::Cuda(), 0.3).gflops();
  benchmark::AddCustomContext("fp32_fma_peak_gpu_gflops", std::to_string(fma_peak_gflops<Kokkos::Cuda>));
#endif
  benchmark::AddCustomContext("threads", std::to_string(Exec().concurrency()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
