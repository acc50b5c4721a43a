// EmulatedWarp: the warp-level operations of warp_ops.hpp on the host, lane-exact, so that the
// tensor-core kernels' fragment and index code runs and is checked without a GPU.
//
// Emulator::run(program, ctas) runs program(cta, shared) for every CTA of a grid, one CTA at a
// time on the calling thread, each of its Program::threads threads a fiber with its own stack.
// A thread runs until it reaches a collective (a warp operation or a CTA barrier) and waits
// there until its warp's 32 lanes (or the CTA's threads) have arrived; the last to arrive
// computes the collective for all. The collectives are computed from the PTX ISA's tables
// (emulator.cpp), independently of fragments.hpp, which the kernels use: a wrong index in the
// kernels gives wrong results here.
//
// What the emulation checks, each failure a longattn::Error naming the CTA and thread:
//   - a warp's lanes reach the same collective (no divergence inside one);
//   - every CTA thread reaches each barrier (no thread finishes while others wait);
//   - named barriers (bar.sync / bar.arrive id, n): ids 1-15, n a multiple of 32 that every
//     arrival of a phase agrees on, whole warps, no thread twice in a phase, none left holding
//     arrivals when the CTA ends (they order no memory here: the race check counts only CTA
//     barriers);
//   - shared-memory accesses stay inside the CTA's dynamic shared memory and are aligned
//     (ldmatrix rows and cp.async to 16 bytes);
//   - no race on shared memory: between two CTA barriers a 4-byte word written by one thread is
//     not read or written by a thread of another warp (nor of the same warp without a
//     sync_warp between), and a cp.async in flight (issued, not yet waited for by its thread)
//     is not read, nor issued over data another thread read since the last barrier;
//   - cp.async data lands only when its own thread waits: a read before the wait sees old data
//     and is reported.
//   - the operands of mma...tf32 are TF32 values (their 13 low bits clear: cvt.rna.tf32.f32);
//   - a value given to Warp::uniform is the same in every lane;
//   - mbarriers: initialized (8-byte aligned) before use and, by another thread, a CTA barrier
//     after; no more arrivals in a phase than it expects;
//   - TMA copies (cp.async.bulk.tensor): the box inside shared memory, 128-byte aligned; its bytes
//     land on the copy's mbarrier phase; nothing reads or writes them while the copy is in flight
//     (nor does a wgmma waiting to run read them as it lands); a thread reads them only after
//     waiting for that phase. Copies land at once in even CTAs and as late as possible (when no
//     thread can run) in odd ones: both are what a GPU may do, and a program that misses a wait
//     (full or empty) reads the wrong data in one of them;
//   - setmaxnreg (a warpgroup collective): 24-256 registers, a multiple of 8, the warpgroup's
//     threads agreeing, inc never below nor dec above what they have; an increase waits until
//     the warpgroups' registers fit an SM sub-partition's (from what a lone CTA of that many
//     threads has at launch), so one that nothing frees deadlocks;
//   - wgmma (warpgroup collectives of 128 threads): a wgmma.fence since the last wait, operands
//     the same in every thread, shared memory it reads written with a fence.proxy.async of the
//     writer since, nothing left to wait for when a thread finishes; a wgmma computes when its
//     group is waited for, so a read of its accumulators before the wait sees old values.
// Counters (EmulationCounters) say how many instructions of each kind ran and how many extra
// shared-memory wavefronts ldmatrix took for bank conflicts.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "longattn/core/detail/tensor_core/fragments.hpp"
#include "longattn/core/detail/tensor_core/warpgroup.hpp"
#include "longattn/core/half.hpp"

namespace longattn::detail::tensor_core {

struct EmulationCounters {
  std::int64_t ctas = 0;
  std::int64_t mma = 0;
  std::int64_t ldmatrix = 0;
  std::int64_t wgmma = 0;  // wgmma.mma_async (warpgroup) instructions
  std::int64_t tma = 0;    // cp.async.bulk.tensor copies
  std::int64_t ldmatrix_conflict_wavefronts = 0;  // wavefronts beyond one per 8 x 8 matrix
  std::int64_t cp_async = 0;
  std::int64_t shuffles = 0;
  std::int64_t barriers = 0;
  std::int64_t named_barriers = 0;  // phases of bar.sync / bar.arrive completed
  std::int64_t setmaxnreg = 0;      // warpgroups' setmaxnreg
  std::int64_t atomics = 0;
};

class Emulator {
 public:
  using Body = void (*)(const void* program, int cta, char* shared);
  // Runs `body(program, cta, shared)` for cta in [0, ctas), `threads` emulated threads per CTA
  // (a multiple of 32, at most 1024) with `shared_bytes` of dynamic shared memory (at most
  // 227 KiB, the H100's limit per block).
  static void run(const void* program, Body body, int ctas, int threads, std::size_t shared_bytes);

  template <class Program>
  static void run(const Program& program, int ctas) {
    run(&program, [](const void* p, int cta, char* shared) { (*static_cast<const Program*>(p))(cta, shared); }, ctas,
        Program::threads, Program::shared_bytes);
  }

  // What the emulations on this host thread have counted since the last reset.
  static EmulationCounters counters();
  static void reset_counters();
};

// The emulation's functions (tensor_core_emulator.cpp), host code.
namespace emulation {
int thread();
void sync_cta();
void sync_warp();
void named_barrier(int id, int threads, bool wait);
float shfl_xor(float value, int lane_mask);
int uniform(int value);  // lane 0's; the lanes must agree (else a failure)
void ldmatrix_x4(std::uint32_t (&r)[4], const void* row, bool trans);
void mma(Operand type, float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1);
void cp_async_16(void* shared, const void* global, bool fill);
void cp_async_wait_all();
void atomic_add_pair(float* global, float x, float y);
float exp2(float x);
std::uint32_t tf32(float x);
void store_shared(void* address, const void* value, std::size_t bytes);
std::uint32_t shared_address(const void* address);
// a: the A registers of the thread, or nullptr for A from a_descriptor.
void wgmma(Operand type, int n, float* d, const std::uint32_t* a, std::uint64_t a_descriptor,
           std::uint64_t b_descriptor, bool b_transposed);
void wgmma_fence();
void wgmma_commit();
void wgmma_wait(int pending);
void fence_proxy_async();
void setmaxnreg(int registers, bool increase);
void load_shared(const void* address, void* value, std::size_t bytes);
void tma_load(void* tile, const TileMap& map, int x, int token, int head, int batch, std::uint32_t barrier);
void mbarrier_init(std::uint32_t barrier, int arrivals);
void mbarrier_arrive(std::uint32_t barrier, std::uint32_t expect_bytes);
void mbarrier_wait(std::uint32_t barrier, int parity);
}  // namespace emulation

// EMULATED(host call, device value): the programs are host and device code (nvcc checks that such
// code calls no host-only function), but with EmulatedWarp they never run on a device, where
// these functions are empty.
#ifdef __CUDA_ARCH__
#define LONGATTN_EMULATED(host_call, device_value) device_value
#else
#define LONGATTN_EMULATED(host_call, device_value) host_call
#endif

struct EmulatedWarp {
  KOKKOS_INLINE_FUNCTION static int thread() { return LONGATTN_EMULATED(emulation::thread(), 0); }
  KOKKOS_INLINE_FUNCTION static void sync_cta() { LONGATTN_EMULATED(emulation::sync_cta(), void()); }
  KOKKOS_INLINE_FUNCTION static void sync_warp() { LONGATTN_EMULATED(emulation::sync_warp(), void()); }
  KOKKOS_INLINE_FUNCTION static void barrier_sync(int id, int threads) {
    LONGATTN_EMULATED(emulation::named_barrier(id, threads, true), (void(id), void(threads)));
  }
  KOKKOS_INLINE_FUNCTION static void barrier_arrive(int id, int threads) {
    LONGATTN_EMULATED(emulation::named_barrier(id, threads, false), (void(id), void(threads)));
  }
  KOKKOS_INLINE_FUNCTION static float shfl_xor(float value, int lane_mask) {
    return LONGATTN_EMULATED(emulation::shfl_xor(value, lane_mask), (void(lane_mask), value));
  }
  KOKKOS_INLINE_FUNCTION static int uniform(int value) {
    return LONGATTN_EMULATED(emulation::uniform(value), value);
  }
  KOKKOS_INLINE_FUNCTION static void ldmatrix_x4(std::uint32_t (&r)[4], const void* row) {
    LONGATTN_EMULATED(emulation::ldmatrix_x4(r, row, false), (void(r), void(row)));
  }
  KOKKOS_INLINE_FUNCTION static void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* row) {
    LONGATTN_EMULATED(emulation::ldmatrix_x4(r, row, true), (void(r), void(row)));
  }
  template <Operand Type>
  KOKKOS_INLINE_FUNCTION static void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                         std::uint32_t b1) {
    LONGATTN_EMULATED(emulation::mma(Type, d, a, b0, b1), (void(d), void(a), void(b0), void(b1)));
  }
  KOKKOS_INLINE_FUNCTION static void cp_async_16(void* shared, const void* global, bool fill) {
    LONGATTN_EMULATED(emulation::cp_async_16(shared, global, fill), (void(shared), void(global), void(fill)));
  }
  // Groups matter only to cp.async.wait_group N, which the programs do not use.
  KOKKOS_INLINE_FUNCTION static void cp_async_commit() {}
  KOKKOS_INLINE_FUNCTION static void cp_async_wait_all() { LONGATTN_EMULATED(emulation::cp_async_wait_all(), void()); }
  KOKKOS_INLINE_FUNCTION static void atomic_add_pair(float* global, float x, float y) {
    LONGATTN_EMULATED(emulation::atomic_add_pair(global, x, y), (void(global), void(x), void(y)));
  }
  KOKKOS_INLINE_FUNCTION static float exp2(float x) { return LONGATTN_EMULATED(emulation::exp2(x), x); }
  // cvt.rn.{bf16x2,f16x2}.f32: round to nearest even, as half.hpp's conversions.
  template <Operand Type>
  KOKKOS_INLINE_FUNCTION static std::uint32_t pack(float lo, float hi) {
    if constexpr (Type == Operand::bf16)
      return std::uint32_t(bfloat16(lo).bits) | std::uint32_t(bfloat16(hi).bits) << 16;
    else
      return std::uint32_t(float16(lo).bits) | std::uint32_t(float16(hi).bits) << 16;
  }
  KOKKOS_INLINE_FUNCTION static std::uint32_t tf32(float x) {
    return LONGATTN_EMULATED(emulation::tf32(x), (void(x), 0u));
  }
  template <class T>
  KOKKOS_INLINE_FUNCTION static void store_shared(void* address, T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    LONGATTN_EMULATED(emulation::store_shared(address, &value, sizeof(T)), (void(address), void(value)));
  }
  template <class T>
  KOKKOS_INLINE_FUNCTION static T load_shared(const void* address) {
    static_assert(std::is_trivially_copyable_v<T>);
    T value{};
    LONGATTN_EMULATED(emulation::load_shared(address, &value, sizeof(T)), static_cast<void>(address));
    return value;
  }
  KOKKOS_INLINE_FUNCTION static std::uint32_t shared_address(const void* address) {
    return LONGATTN_EMULATED(emulation::shared_address(address), (void(address), 0u));
  }
  template <Operand Type, int N>
  KOKKOS_INLINE_FUNCTION static void wgmma(float (&d)[N / 8][4], std::uint64_t a, std::uint64_t b) {
    LONGATTN_EMULATED(emulation::wgmma(Type, N, &d[0][0], nullptr, a, b, false), (void(d), void(a), void(b)));
  }
  template <Operand Type, int N>
  KOKKOS_INLINE_FUNCTION static void wgmma(float (&d)[N / 8][4], const std::uint32_t (&a)[4], std::uint64_t b) {
    LONGATTN_EMULATED(emulation::wgmma(Type, N, &d[0][0], a, 0, b, true), (void(d), void(a), void(b)));
  }
  KOKKOS_INLINE_FUNCTION static void wgmma_fence() { LONGATTN_EMULATED(emulation::wgmma_fence(), void()); }
  KOKKOS_INLINE_FUNCTION static void wgmma_commit() { LONGATTN_EMULATED(emulation::wgmma_commit(), void()); }
  template <int N>
  KOKKOS_INLINE_FUNCTION static void wgmma_wait() {
    LONGATTN_EMULATED(emulation::wgmma_wait(N), void());
  }
  template <int N>
  KOKKOS_INLINE_FUNCTION static void fence_accumulators(float (&)[N][4]) {}
  KOKKOS_INLINE_FUNCTION static void fence_proxy_async() { LONGATTN_EMULATED(emulation::fence_proxy_async(), void()); }
  template <int Registers>
  KOKKOS_INLINE_FUNCTION static void setmaxnreg_inc() {
    LONGATTN_EMULATED(emulation::setmaxnreg(Registers, true), void());
  }
  template <int Registers>
  KOKKOS_INLINE_FUNCTION static void setmaxnreg_dec() {
    LONGATTN_EMULATED(emulation::setmaxnreg(Registers, false), void());
  }
  using TensorMap = TileMap;
  KOKKOS_INLINE_FUNCTION static void tma_load(void* tile, const TensorMap& map, int x, int token, int head, int batch,
                                              std::uint32_t barrier) {
    LONGATTN_EMULATED(emulation::tma_load(tile, map, x, token, head, batch, barrier),
                      (void(tile), void(map), void(x), void(token), void(head), void(batch), void(barrier)));
  }
  KOKKOS_INLINE_FUNCTION static void mbarrier_init(std::uint32_t barrier, int arrivals) {
    LONGATTN_EMULATED(emulation::mbarrier_init(barrier, arrivals), (void(barrier), void(arrivals)));
  }
  KOKKOS_INLINE_FUNCTION static void fence_barrier_init() {}
  KOKKOS_INLINE_FUNCTION static void mbarrier_arrive(std::uint32_t barrier) {
    LONGATTN_EMULATED(emulation::mbarrier_arrive(barrier, 0), static_cast<void>(barrier));
  }
  KOKKOS_INLINE_FUNCTION static void mbarrier_arrive_expect_tx(std::uint32_t barrier, std::uint32_t bytes) {
    LONGATTN_EMULATED(emulation::mbarrier_arrive(barrier, bytes), (void(barrier), void(bytes)));
  }
  KOKKOS_INLINE_FUNCTION static void mbarrier_wait(std::uint32_t barrier, int parity) {
    LONGATTN_EMULATED(emulation::mbarrier_wait(barrier, parity), (void(barrier), void(parity)));
  }
};

#undef LONGATTN_EMULATED

}  // namespace longattn::detail::tensor_core
