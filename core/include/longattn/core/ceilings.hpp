#pragma once
// Measured ceilings of an execution space: the FP32 fused multiply-add peak and the sgemm
// rate through Kokkos Kernels. longattn-info prints them; benchmarks divide by them to report
// a fraction of what the machine can do.
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>

#include "longattn/core/detail/pack.hpp"  // host_simd_bytes
#include "longattn/core/gemm.hpp"
#include "longattn/error.hpp"

namespace longattn {

struct Rate {
  double flops = 0;    // floating-point operations done (an FMA counts 2)
  double seconds = 0;  // wall time they took
  double gflops() const { return seconds > 0 ? flops / seconds * 1e-9 : 0; }
};

namespace detail {

// Kept out of line on the host: inlined into a caller, GCC 12 has spilled the accumulators to
// the stack or reordered the loop nest depending on the caller's constants, and the same loop
// then ran at 55-60% of the FMA peak.
// noipa (GCC) also rules out constant-propagated clones; clang knows only noinline.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDA_ARCH__)
#define LONGATTN_FMA_CHAINS_NOINLINE __attribute__((noipa))
#elif defined(__clang__)
#define LONGATTN_FMA_CHAINS_NOINLINE __attribute__((noinline))
#else
#define LONGATTN_FMA_CHAINS_NOINLINE
#endif

// Each work item runs 12 independent vector registers of chains: 12 cover the 4-cycle FMA
// latency on two FMA ports, and fit the register file (AVX-512: 12 of 32 zmm; AVX2: 12 of 16
// ymm, where 12 chains of 16 floats would need 24 and spill, measuring half the peak). The
// compiler vectorizes the lane loop and keeps all accumulators in registers. A GPU build (CUDA,
// HIP) keeps 16 floats in both compiler passes, so that host and device agree on the work counted.
struct FmaChains {
#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP)
  static constexpr int kVectorFloats = 16;
#else
  static constexpr int kVectorFloats = host_simd_bytes / int(sizeof(float));
#endif
  static constexpr int kLanes = kVectorFloats * 12;
  std::int64_t iterations;
  float mul, add;  // acc -> acc * 0.9999 + 0.0001 stays at 1: no overflow, no denormals

  LONGATTN_FMA_CHAINS_NOINLINE KOKKOS_FUNCTION static float run(std::int64_t iterations, float mul, float add) {
    float acc[kLanes];
    for (int l = 0; l < kLanes; ++l) acc[l] = 1.0f + 1e-4f * static_cast<float>(l);
    for (std::int64_t it = 0; it < iterations; ++it)
      for (int l = 0; l < kLanes; ++l) acc[l] = acc[l] * mul + add;
    float sum = 0;
    for (int l = 0; l < kLanes; ++l) sum += acc[l];
    return sum;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const int, float& sum) const { sum += run(iterations, mul, add); }
};

// Repeats run(work) with doubling work until one run lasts min_seconds; returns the last.
template <class Run>
Rate time_until(double min_seconds, double flops_per_unit, std::int64_t work, Run run) {
  for (;;) {
    Kokkos::Timer timer;
    run(work);
    const double seconds = timer.seconds();
    if (seconds >= min_seconds || work > (std::int64_t(1) << 40))
      return Rate{flops_per_unit * static_cast<double>(work), seconds};
    work *= seconds > 0 ? std::max<std::int64_t>(2, static_cast<std::int64_t>(min_seconds / seconds)) : 16;
  }
}

}  // namespace detail

// Runs `iterations` rounds of the FMA chains once per thread of exec and returns the FLOPs done.
template <class ExecSpace>
double run_fma_chains(const ExecSpace& exec, std::int64_t iterations) {
  require(iterations >= 1, "longattn::run_fma_chains", "iterations", iterations, "at least 1");
  const int items = exec.concurrency();
  float sum = 0;
  Kokkos::parallel_reduce("longattn::fma_chains",
                          Kokkos::RangePolicy<ExecSpace, Kokkos::Schedule<Kokkos::Static>>(exec, 0, items),
                          detail::FmaChains{iterations, 0.9999f, 0.0001f}, sum);
  exec.fence();
  if (!(sum > 0)) throw Error("longattn::run_fma_chains: the FMA chains produced no result");
  return 2.0 * detail::FmaChains::kLanes * items * static_cast<double>(iterations);
}

// FP32 FMA throughput with one work item per thread of exec (exec.concurrency() of them).
template <class ExecSpace>
Rate measure_fma_peak(const ExecSpace& exec, double min_seconds = 0.5) {
  require(min_seconds > 0 && min_seconds <= 60, "longattn::measure_fma_peak", "min_seconds",
          min_seconds, "a duration in (0, 60] seconds");
  const double flops_per_iteration = 2.0 * detail::FmaChains::kLanes * exec.concurrency();
  return detail::time_until(min_seconds, flops_per_iteration, 1 << 12,
                            [&](std::int64_t iterations) { run_fma_chains(exec, iterations); });
}

// sgemm rate C = A B (n x n, LayoutLeft, in exec's memory) through longattn::gemm, with the
// BLAS's current thread count. 2 n^3 FLOPs per call; one untimed call first.
template <class ExecSpace>
Rate measure_sgemm(const ExecSpace& exec, int n = 2048, double min_seconds = 0.5) {
  require(n >= 1 && n <= 32768, "longattn::measure_sgemm", "n", n, "a matrix size in [1, 32768]");
  require(min_seconds > 0 && min_seconds <= 60, "longattn::measure_sgemm", "min_seconds",
          min_seconds, "a duration in (0, 60] seconds");
  using Matrix = Kokkos::View<float**, Kokkos::LayoutLeft, typename ExecSpace::memory_space>;
  Matrix a("longattn::sgemm::A", n, n), b("longattn::sgemm::B", n, n), c("longattn::sgemm::C", n, n);
  Kokkos::parallel_for("longattn::sgemm_fill",
                       Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>(exec, {0, 0}, {n, n}),
                       KOKKOS_LAMBDA(const int i, const int j) {
                         a(i, j) = static_cast<float>((i * 7 + j * 13) % 17) * 0.0625f - 0.5f;
                         b(i, j) = static_cast<float>((i * 11 + j * 5) % 19) * 0.0625f - 0.5f;
                       });
  exec.fence();
  gemm(exec, "N", "N", 1.0f, a, b, 0.0f, c);
  exec.fence();
  const double flops_per_call = 2.0 * double(n) * double(n) * double(n);
  return detail::time_until(min_seconds, flops_per_call, 1, [&](std::int64_t calls) {
    for (std::int64_t i = 0; i < calls; ++i) gemm(exec, "N", "N", 1.0f, a, b, 0.0f, c);
    exec.fence();
  });
}

}  // namespace longattn
