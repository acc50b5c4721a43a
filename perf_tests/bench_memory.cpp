// Memory pool benchmarks, longattn's Pool beside the allocators a user has instead, in one run:
// malloc/free, Kokkos::kokkos_malloc/kokkos_free and Kokkos::MemoryPool.
//
//   BM_AllocFree/<allocator>/<bytes>        allocate + free, p50 and p99 latency per pair
//   BM_AllocTouchFree/<allocator>/<bytes>   allocate, write one byte per 4 KiB page, free, one
//                                           buffer in a loop (glibc keeps blocks up to 32 MiB in
//                                           its heap then: its best case)
//   BM_StepReuse/<allocator>/<bytes>        a step's worth of such buffers (256 MiB) allocated
//                                           and touched, then freed in reverse, step after step:
//                                           first touch included, as users pay it
//   BM_TrainingTrace/<allocator>/<order>    replay of a training run's allocations (below)
// All with 1 and 2 threads (one pool shared by both). Latencies are timed per pair with the
// TSC (lfence-fenced, the timer's own ~20 ns subtracted); ops_per_s counts all threads.
#include <benchmark/benchmark.h>
#include <malloc.h>
#include <x86intrin.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "longattn/core/runtime.hpp"
#include "longattn/memory/pool.hpp"

namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;

// ------------------------------------------------------------------ timing
std::uint64_t tsc() {
  _mm_lfence();
  const std::uint64_t t = __rdtsc();
  _mm_lfence();
  return t;
}

struct TscClock {
  double ns_per_cycle = 0;
  double overhead_cycles = 0;  // median of an empty timed region
  TscClock() {
    const auto t0 = std::chrono::steady_clock::now();
    const std::uint64_t c0 = tsc();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(100)) {
    }
    const std::uint64_t c1 = tsc();
    ns_per_cycle = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / double(c1 - c0);
    std::vector<std::uint64_t> empty(100000);
    for (auto& e : empty) {
      const std::uint64_t a = tsc();
      e = tsc() - a;
    }
    std::nth_element(empty.begin(), empty.begin() + empty.size() / 2, empty.end());
    overhead_cycles = double(empty[empty.size() / 2]);
  }
};
const TscClock& tsc_clock() {
  static const TscClock c;
  return c;
}

// p50 and p99 of per-operation cycle counts, in ns, the timer's overhead removed.
void report_percentiles(benchmark::State& state, std::vector<std::uint64_t>& cycles) {
  if (cycles.empty()) return;
  auto at = [&](double q) {
    const auto k = cycles.begin() + std::ptrdiff_t(q * double(cycles.size() - 1));
    std::nth_element(cycles.begin(), k, cycles.end());
    return std::max(0.0, (double(*k) - tsc_clock().overhead_cycles) * tsc_clock().ns_per_cycle);
  };
  state.counters["p50_ns"] = benchmark::Counter(at(0.50), benchmark::Counter::kAvgThreads);
  state.counters["p99_ns"] = benchmark::Counter(at(0.99), benchmark::Counter::kAvgThreads);
  state.counters["ops_per_s"] = benchmark::Counter(double(state.iterations()), benchmark::Counter::kIsRate);
}

// One byte per 4 KiB page, and the last byte: what a user's first write costs.
void touch(void* ptr, std::size_t bytes) {
  auto* p = static_cast<volatile char*>(ptr);
  for (std::size_t offset = 0; offset < bytes; offset += 4096) p[offset] = 1;
  p[bytes - 1] = 1;
}

// ------------------------------------------------------------------ the allocators
struct LongattnPool {
  static constexpr const char* name = "longattn_Pool";
  static longattn::memory::Pool<Kokkos::HostSpace>& pool() {
    static longattn::memory::Pool<Kokkos::HostSpace> p;
    return p;
  }
  void* allocate(std::size_t bytes) const { return pool().allocate(bytes); }
  void deallocate(void* p, std::size_t) const { pool().deallocate(p); }
};

struct Malloc {
  static constexpr const char* name = "malloc";
  void* allocate(std::size_t bytes) const { return std::malloc(bytes); }
  void deallocate(void* p, std::size_t) const { std::free(p); }
};

struct KokkosMalloc {
  static constexpr const char* name = "kokkos_malloc";
  void* allocate(std::size_t bytes) const { return Kokkos::kokkos_malloc<Kokkos::HostSpace>("bench", bytes); }
  void deallocate(void* p, std::size_t) const { Kokkos::kokkos_free<Kokkos::HostSpace>(p); }
};

// Kokkos::MemoryPool has a fixed capacity and power-of-two blocks up to its superblock size:
// one is built per block size, with room for `blocks` blocks per thread (two threads).
struct KokkosMemoryPool {
  static constexpr const char* name = "Kokkos_MemoryPool";
  using Device = Kokkos::Device<Kokkos::DefaultHostExecutionSpace, Kokkos::HostSpace>;
  static Kokkos::MemoryPool<Device>& for_size(std::size_t bytes, std::size_t blocks) {
    static std::mutex mutex;
    static std::map<std::pair<std::size_t, std::size_t>, Kokkos::MemoryPool<Device>> pools;
    const std::lock_guard<std::mutex> lock(mutex);
    auto it = pools.find({bytes, blocks});
    if (it == pools.end()) {
      std::size_t block = 64;
      while (block < bytes) block *= 2;
      const std::size_t superblock = std::max(block, MiB);
      if (pools.empty())  // its memory must go before Kokkos does
        Kokkos::push_finalize_hook([] {
          const std::lock_guard<std::mutex> finalize_lock(mutex);
          pools.clear();
        });
      it = pools.emplace(std::make_pair(bytes, blocks), Kokkos::MemoryPool<Device>(Kokkos::HostSpace(), 2 * (blocks + 1) * superblock, block,
                                                            block, superblock))
               .first;
    }
    return it->second;
  }
  KokkosMemoryPool(std::size_t bytes, std::size_t blocks) : pool(&for_size(bytes, blocks)) {}
  void* allocate(std::size_t bytes) const { return pool->allocate(bytes); }
  void deallocate(void* p, std::size_t bytes) const { pool->deallocate(p, bytes); }
  Kokkos::MemoryPool<Device>* pool;
};

template <class Allocator>
Allocator make_allocator(std::size_t bytes, std::size_t blocks) {
  if constexpr (std::is_same_v<Allocator, KokkosMemoryPool>) return Allocator(bytes, blocks);
  else return Allocator();
}

// ------------------------------------------------------------------ alloc + free
template <class Allocator, bool Touch>
void alloc_free(benchmark::State& state) {
  const auto bytes = std::size_t(state.range(0));
  const Allocator allocator = make_allocator<Allocator>(bytes, 1);
  std::vector<std::uint64_t> cycles;
  cycles.reserve(1 << 20);
  const TscClock& clock = tsc_clock();  // calibrated before the first timing
  benchmark::DoNotOptimize(clock);
  for (auto _ : state) {
    const std::uint64_t start = tsc();
    void* p = allocator.allocate(bytes);
    if (!p) {
      state.SkipWithError("allocation failed");
      break;
    }
    if constexpr (Touch) touch(p, bytes);
    benchmark::DoNotOptimize(p);
    allocator.deallocate(p, bytes);
    const std::uint64_t stop = tsc();
    if (cycles.size() < cycles.capacity()) cycles.push_back(stop - start);
  }
  report_percentiles(state, cycles);
}

template <class Allocator>
void BM_AllocFree(benchmark::State& state) { alloc_free<Allocator, false>(state); }
template <class Allocator>
void BM_AllocTouchFree(benchmark::State& state) { alloc_free<Allocator, true>(state); }

// One iteration is one step: 256 MiB of buffers of `bytes` each (at least four) allocated and
// touched as a forward pass would, then freed in reverse; one untimed step first.
// ns_per_buffer is the step's time per buffer (allocate + touch + free); p50/p99 are of whole
// steps.
template <class Allocator>
void BM_StepReuse(benchmark::State& state) {
  const auto bytes = std::size_t(state.range(0));
  const std::size_t count = std::max<std::size_t>(4, (256 * MiB) / bytes);
  const Allocator allocator = make_allocator<Allocator>(bytes, count);
  std::vector<void*> buffers(count);
  auto step = [&] {
    for (void*& p : buffers) {
      p = allocator.allocate(bytes);
      if (!p) return false;
      touch(p, bytes);
    }
    for (auto p = buffers.rbegin(); p != buffers.rend(); ++p) allocator.deallocate(*p, bytes);
    return true;
  };
  if (!step()) state.SkipWithError("allocation failed");  // the first step, untimed: steady state is measured
  std::vector<std::uint64_t> cycles;
  for (auto _ : state) {
    const std::uint64_t start = tsc();
    if (!step()) {
      state.SkipWithError("allocation failed");
      break;
    }
    cycles.push_back(tsc() - start);
  }
  if (cycles.empty()) return;
  double total = 0;
  for (const std::uint64_t c : cycles) total += double(c);
  state.counters["ns_per_buffer"] =
      benchmark::Counter(total * tsc_clock().ns_per_cycle / double(cycles.size() * count), benchmark::Counter::kAvgThreads);
  state.counters["buffers_per_step"] = double(count);
  report_percentiles(state, cycles);
  state.counters.erase("ops_per_s");
}

// ------------------------------------------------------------------ a training run's allocations
// A byte-level decoder-only transformer as longattn-train runs it: L = 8 pre-norm blocks, E = 512,
// H = 8, FFN 4E, vocabulary 256, one sequence per step, AdamW. Eight steps whose sequence length
// varies (1024, 2048, 4096, 1536, 3072, 2048, 4096, 1024 tokens). Each step: forward allocates
// every layer's activations (LayerNorm outputs and statistics, QKV, attention output and LSE,
// projections, residuals, MLP hidden and GELU), the head's logits; backward allocates and frees
// gradient temporaries (dLogits, dMLP, dQKV, the attention's Delta) and frees each layer's
// activations in reverse. Parameters, gradients and AdamW's two moments persist. Order "eager":
// all persistent state at initialization (longattn-train's modules do this); "lazy": gradients
// at the first backward and the moments at the first optimizer step (PyTorch's order), so they
// land between the first step's activations.
struct Event {
  bool allocate;
  int id;
  std::size_t bytes;
  int step;  // -1: initialization
};

class TraceBuilder {
 public:
  int allocate(std::size_t bytes) {
    events_.push_back({true, next_, bytes, step});
    return next_++;
  }
  void free(int id) { events_.push_back({false, id, 0, step}); }
  std::vector<Event> take() { return std::move(events_); }
  int step = -1;

 private:
  std::vector<Event> events_;
  int next_ = 0;
};

std::vector<Event> training_trace(bool lazy_state) {
  const std::size_t L = 8, E = 512, H = 8, V = 256, f = sizeof(float);
  const std::size_t seq[] = {1024, 2048, 4096, 1536, 3072, 2048, 4096, 1024};
  // Parameter tensors, as a framework keeps them (one allocation each).
  std::vector<std::size_t> parameters = {V * E * f};  // embedding
  for (std::size_t l = 0; l < L; ++l)
    for (const std::size_t n : {E, E, 3 * E * E, 3 * E, E * E, E, E, E, 4 * E * E, 4 * E, 4 * E * E, E}) parameters.push_back(n * f);
  parameters.push_back(E * f);
  parameters.push_back(E * f);  // final LayerNorm
  TraceBuilder t;
  auto allocate_state = [&] {
    for (const std::size_t bytes : parameters) t.allocate(bytes);
  };
  allocate_state();  // parameters
  if (!lazy_state) {
    allocate_state();  // gradients
    allocate_state();  // AdamW m
    allocate_state();  // AdamW v
  }
  for (int step = 0; step < 8; ++step) {
    t.step = step;
    const std::size_t N = seq[step], BNE = N * E * f, BN = N * f;
    std::vector<std::vector<int>> layer(L);
    int x = t.allocate(BNE);  // embedded tokens
    for (std::size_t l = 0; l < L; ++l) {
      auto& a = layer[l];
      for (const std::size_t bytes : {BNE, BN, BN, 3 * BNE, BNE, H * BN, BNE, BNE, BNE, BN, BN, 4 * BNE, 4 * BNE, BNE, BNE})
        a.push_back(t.allocate(bytes));
    }
    const int head_norm = t.allocate(BNE), logits = t.allocate(N * V * f), probabilities = t.allocate(N * V * f);
    // backward
    const int d_logits = t.allocate(N * V * f);
    if (step == 0 && lazy_state) allocate_state();  // gradients, allocated as backward reaches them
    t.free(probabilities);
    int d_x = t.allocate(BNE);
    t.free(d_logits);
    t.free(logits);
    t.free(head_norm);
    for (std::size_t l = L; l-- > 0;) {
      const int d_hidden = t.allocate(4 * BNE), d_gelu = t.allocate(4 * BNE);
      t.free(d_hidden);
      const int d_norm2 = t.allocate(BNE);
      t.free(d_gelu);
      const int delta = t.allocate(H * BN), d_qkv = t.allocate(3 * BNE), d_attention = t.allocate(BNE);
      t.free(delta);
      const int d_in = t.allocate(BNE);
      t.free(d_attention);
      t.free(d_qkv);
      t.free(d_norm2);
      t.free(d_x);
      d_x = d_in;
      for (auto it = layer[l].rbegin(); it != layer[l].rend(); ++it) t.free(*it);
    }
    t.free(d_x);
    t.free(x);
    if (step == 0 && lazy_state) {
      allocate_state();  // AdamW m
      allocate_state();  // AdamW v
    }
    t.free(t.allocate(4 * KiB));  // gradient-norm scratch
  }
  return t.take();
}

template <class Allocator>
void BM_TrainingTrace(benchmark::State& state) {
  const bool lazy = state.range(0) != 0;
  const std::vector<Event> trace = training_trace(lazy);
  std::size_t slots = 0;
  for (const Event& e : trace) slots = std::max(slots, std::size_t(e.id) + 1);
  double seconds = 0, peak_live = 0, peak_reserved = 0, fragmentation = 0;
  std::vector<double> step_seconds(8);
  for (auto _ : state) {
    std::unique_ptr<longattn::memory::Pool<Kokkos::HostSpace>> pool;
    if constexpr (std::is_same_v<Allocator, LongattnPool>) pool = std::make_unique<longattn::memory::Pool<Kokkos::HostSpace>>();
    std::vector<void*> ptrs(slots);
    std::vector<std::size_t> sizes(slots);
    // What malloc holds from the OS (heap arenas and mmapped blocks), counted from here: memory
    // it kept from earlier benchmarks in this process is not the replay's.
    const auto malloc_held = [] {
      const struct mallinfo2 info = mallinfo2();
      return info.arena + info.hblkhd;
    };
    const std::size_t malloc_before = malloc_held();
    std::size_t live = 0, live_high = 0, malloc_high = 0;
    double elapsed = 0;
    std::fill(step_seconds.begin(), step_seconds.end(), 0.0);
    for (const Event& e : trace) {
      const auto t0 = std::chrono::steady_clock::now();
      if (e.allocate) {
        void* p = pool ? pool->allocate(e.bytes) : Allocator().allocate(e.bytes);
        touch(p, e.bytes);
        ptrs[std::size_t(e.id)] = p;
        sizes[std::size_t(e.id)] = e.bytes;
      } else if (pool) {
        pool->deallocate(ptrs[std::size_t(e.id)]);
      } else {
        Allocator().deallocate(ptrs[std::size_t(e.id)], sizes[std::size_t(e.id)]);
      }
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      elapsed += dt;
      if (e.step >= 0) step_seconds[std::size_t(e.step)] += dt;
      live = e.allocate ? live + e.bytes : live - sizes[std::size_t(e.id)];
      live_high = std::max(live_high, live);
      if (!pool && e.allocate) malloc_high = std::max(malloc_high, malloc_held() - std::min(malloc_before, malloc_held()));
    }
    seconds = elapsed;
    peak_live = double(live_high);
    if (pool) {
      const auto s = pool->stats();
      peak_reserved = double(s.reserved_high_water_bytes);
      fragmentation = s.fragmentation();
      state.counters["chunks_end"] = double(s.chunks);
      state.counters["chunks_obtained"] = double(s.chunks_obtained);
    } else {
      peak_reserved = double(malloc_high);
    }
    for (const Event& e : trace)  // the persistent state
      if (e.allocate && ptrs[std::size_t(e.id)]) {
        bool freed = false;
        for (const Event& f : trace) freed = freed || (!f.allocate && f.id == e.id);
        if (!freed) pool ? pool->deallocate(ptrs[std::size_t(e.id)]) : Allocator().deallocate(ptrs[std::size_t(e.id)], e.bytes);
      }
    state.SetIterationTime(seconds);
  }
  // Steps 0-2 reach the longest sequence (the pool grows); steps 3-7 are no longer than it.
  state.counters["ms_per_step"] = seconds / 8 * 1e3;
  state.counters["ms_steps_0_2"] = (step_seconds[0] + step_seconds[1] + step_seconds[2]) * 1e3;
  state.counters["ms_per_step_3_7"] =
      (step_seconds[3] + step_seconds[4] + step_seconds[5] + step_seconds[6] + step_seconds[7]) / 5 * 1e3;
  state.counters["peak_live_MiB"] = peak_live / double(MiB);
  state.counters["peak_reserved_MiB"] = peak_reserved / double(MiB);
  state.counters["reserved_over_live"] = peak_reserved / peak_live;
  if constexpr (std::is_same_v<Allocator, LongattnPool>) state.counters["fragmentation_end"] = fragmentation;
  state.counters["events"] = double(trace.size());
}

void latency_sizes(benchmark::internal::Benchmark* b) {
  for (const std::size_t bytes :
       {64 * std::size_t(1), KiB, 16 * KiB, 64 * KiB, 256 * KiB, MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB})
    b->Arg(std::int64_t(bytes));
  b->Threads(1)->Threads(2)->MinTime(0.2)->UseRealTime();
}

void reuse_sizes(benchmark::internal::Benchmark* b) {
  for (const std::size_t bytes : {MiB, 4 * MiB, 16 * MiB, 64 * MiB}) b->Arg(std::int64_t(bytes));
  b->Threads(1)->Threads(2)->MinTime(0.2)->UseRealTime();
}

void step_sizes(benchmark::internal::Benchmark* b) {
  for (const std::size_t bytes : {MiB, 4 * MiB, 16 * MiB, 64 * MiB}) b->Arg(std::int64_t(bytes));
  b->Threads(1)->Threads(2)->MinTime(1.0)->UseRealTime()->Unit(benchmark::kMillisecond);
}

#define LONGATTN_MEMORY_BENCHMARKS(Allocator)                                                          \
  BENCHMARK_TEMPLATE(BM_AllocFree, Allocator)->Name(std::string("BM_AllocFree/") + Allocator::name)    \
      ->Apply(latency_sizes);                                                                          \
  BENCHMARK_TEMPLATE(BM_AllocTouchFree, Allocator)                                                     \
      ->Name(std::string("BM_AllocTouchFree/") + Allocator::name)                                     \
      ->Apply(reuse_sizes);                                                                            \
  BENCHMARK_TEMPLATE(BM_StepReuse, Allocator)->Name(std::string("BM_StepReuse/") + Allocator::name)   \
      ->Apply(step_sizes);

LONGATTN_MEMORY_BENCHMARKS(LongattnPool)
LONGATTN_MEMORY_BENCHMARKS(Malloc)
LONGATTN_MEMORY_BENCHMARKS(KokkosMalloc)
LONGATTN_MEMORY_BENCHMARKS(KokkosMemoryPool)

BENCHMARK_TEMPLATE(BM_TrainingTrace, LongattnPool)->Name("BM_TrainingTrace/longattn_Pool")
    ->ArgName("lazy")->Arg(0)->Arg(1)->Iterations(2)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_TrainingTrace, Malloc)->Name("BM_TrainingTrace/malloc")
    ->ArgName("lazy")->Arg(0)->Arg(1)->Iterations(2)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_TrainingTrace, KokkosMalloc)->Name("BM_TrainingTrace/kokkos_malloc")
    ->ArgName("lazy")->Arg(0)->Arg(1)->Iterations(2)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  longattn::ScopeGuard guard(argc, argv, {/*select_blas_kernels=*/true});
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
