// The warp-level operations of the tensor-core kernels, and their two implementations:
//
//   CudaWarp       the instructions themselves (mma.sync, ldmatrix, cp.async, shfl.sync, ...),
//                  for Kokkos::Cuda (sm_80 and later; the kernels are tuned for sm_90)
//   EmulatedWarp   a lane-exact emulation on the host (emulated_warp.hpp): every thread of a CTA
//                  a fiber, each collective gathered from the warp's 32 lanes and computed from
//                  the PTX ISA's layout tables, shared memory checked for bounds, alignment and
//                  races, cp.async copies landing only at the issuing thread's wait
//
// The kernels (forward.hpp, backward.hpp) are written once against this interface, a class of
// static functions (Warp below):
//   int thread()                                   the thread's index in its CTA (threadIdx.x)
//   void sync_cta(), sync_warp()                   __syncthreads(), __syncwarp()
//   void barrier_sync(int id, int threads)         bar.sync id, threads: a named barrier (ids 1-15;
//                                                  0 is sync_cta's) that completes when `threads`
//                                                  threads (whole warps) arrived or waited, this
//                                                  one waiting
//   void barrier_arrive(int id, int threads)       bar.arrive id, threads: the same, not waiting
//   float shfl_xor(float v, int lane_mask)         v of lane ^ lane_mask
//   int uniform(int v)                             lane 0's v (shfl.sync.idx): a value the same in
//                                                  every lane, which the compiler then knows
//   void ldmatrix_x4(uint32_t (&r)[4], const void* row)        ldmatrix...x4.shared.b16
//   void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row)  ldmatrix...x4.trans.shared.b16
//   template <Operand> void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
//                                                  d += a b, mma.sync...row.col.f32: m16n8k16
//                                                  .bf16/.f16, m16n8k8 .tf32
//   void cp_async_16(void* shared, const void* global, bool fill)
//                                                  cp.async.cg 16 bytes (zeros unless fill)
//   void cp_async_commit(), cp_async_wait_all()    cp.async.commit_group, cp.async.wait_all
//   void atomic_add_pair(float* global, float x, float y)
//                                                  red.global.add.v2.f32 (x to global[0], y to
//                                                  global[1]; 8-byte aligned)
//   float exp2(float x)                            ex2.approx.ftz.f32
//   template <Operand> uint32_t pack(float lo, float hi)    two values rounded to nearest, lo low
//   uint32_t tf32(float x)                         cvt.rna.tf32.f32 (to nearest, ties away from 0)
//   template <class T> void store_shared(void*, T), T load_shared(const void*)
// and, for the warpgroup programs (sm_90a; warpgroup.hpp says where a warpgroup's values sit):
//   uint32_t shared_address(const void*)           the shared-memory address of a pointer into it
//   template <Operand, int N> void wgmma(float (&d)[N / 8][4], uint64_t a, uint64_t b)
//                                                  d += a b, wgmma.mma_async...m64nNk16.f32, A and
//                                                  B K-major from shared memory (descriptors)
//   template <Operand, int N> void wgmma(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b)
//                                                  the same, A from registers, B MN-major
//                                                  (imm-trans-b 1)
//   void wgmma_fence(), wgmma_commit()             wgmma.fence, wgmma.commit_group
//   template <int N> void wgmma_wait()             wgmma.wait_group N: all but the N latest
//                                                  committed groups done (every thread of the group)
//   template <int N> void fence_accumulators(float (&d)[N][4])
//                                                  keeps the compiler from moving accesses of
//                                                  in-flight accumulators across the wgmma
//                                                  instructions (CUTLASS's warpgroup_fence_operand)
//   void fence_proxy_async()                       fence.proxy.async.shared::cta
//   template <int R> void setmaxnreg_inc(), setmaxnreg_dec()
//                                                  setmaxnreg.{inc,dec}.sync.aligned.u32 R: the
//                                                  warpgroup's threads take (waiting until free) or
//                                                  give back registers, to R each
//   TensorMap                                      the copy engine's tensor map (CUtensorMap; the
//                                                  emulation's: TileMap, warpgroup.hpp)
//   void tma_load(void* tile, const TensorMap& map, int x, int token, int head, int batch,
//                 uint32_t barrier)                cp.async.bulk.tensor.4d...mbarrier::complete_tx:
//                                                  the box at (x, token, head, batch) into tile,
//                                                  its bytes counted on the mbarrier
//   void mbarrier_init(uint32_t barrier, int arrivals)   mbarrier.init.shared::cta.b64
//   void fence_barrier_init()                      fence.mbarrier_init.release.cluster (before the
//                                                  CTA barrier after which other threads use it)
//   void mbarrier_arrive(uint32_t barrier)         mbarrier.arrive.shared::cta.b64
//   void mbarrier_arrive_expect_tx(uint32_t barrier, uint32_t bytes)
//                                                  mbarrier.arrive.expect_tx.shared::cta.b64
//   void mbarrier_wait(uint32_t barrier, int parity)
//                                                  mbarrier.try_wait.parity until the phase of
//                                                  that parity completed
// (barrier: the shared-memory address of an 8-byte-aligned mbarrier, shared_address).
// fragments.hpp says where each lane's values sit.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>

#include "longattn/core/detail/tensor_core/fragments.hpp"

#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

// Unrolls a loop over registers in the device compilation (so that fragment arrays stay in
// registers); nothing elsewhere (GCC would take `#pragma unroll` from nvcc's host pass as unknown).
// LONGATTN_WARP_ROLLED keeps a loop rolled there (a loop whose body holds enough work, where
// unrolling would only keep more operands in flight than the registers hold).
#if defined(__CUDA_ARCH__)
#define LONGATTN_WARP_UNROLL _Pragma("unroll")
#define LONGATTN_WARP_ROLLED _Pragma("unroll 1")
#else
#define LONGATTN_WARP_UNROLL
#define LONGATTN_WARP_ROLLED
#endif

namespace longattn::detail::tensor_core {

#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
// wgmma's accumulator operands: the registers {%0, ..., %31} (or %63), d[n][i] as %(4 n + i).
#define LONGATTN_WGMMA_D32                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define LONGATTN_WGMMA_D64                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "  \
  "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "  \
  "%59, %60, %61, %62, %63}"
#define LONGATTN_WGMMA_OUT4(d, n) "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3])
#define LONGATTN_WGMMA_OUT32(d, n)                                                                   \
  LONGATTN_WGMMA_OUT4(d, n), LONGATTN_WGMMA_OUT4(d, n + 1), LONGATTN_WGMMA_OUT4(d, n + 2),            \
      LONGATTN_WGMMA_OUT4(d, n + 3), LONGATTN_WGMMA_OUT4(d, n + 4), LONGATTN_WGMMA_OUT4(d, n + 5),    \
      LONGATTN_WGMMA_OUT4(d, n + 6), LONGATTN_WGMMA_OUT4(d, n + 7)

// wgmma.m64nNk16 with A and B from shared memory (SS) or A from registers and B transposed (RS), of
// 16-bit type `type` ("bf16", "f16"), scale-d 1 (accumulate), from the caller's d, a and b.
#define LONGATTN_WGMMA_SS_N64(type)                                                                          \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32." type \
               "." type " " LONGATTN_WGMMA_D32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"                                \
               : LONGATTN_WGMMA_OUT32(d, 0)                                                                 \
               : "l"(a), "l"(b), "r"(1))
#define LONGATTN_WGMMA_SS_N128(type)                                                                          \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\nwgmma.mma_async.sync.aligned.m64n128k16.f32." type \
               "." type " " LONGATTN_WGMMA_D64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"                                 \
               : LONGATTN_WGMMA_OUT32(d, 0), LONGATTN_WGMMA_OUT32(d, 8)                                      \
               : "l"(a), "l"(b), "r"(1))
#define LONGATTN_WGMMA_RS_N64(type)                                                                          \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32." type \
               "." type " " LONGATTN_WGMMA_D32 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                  \
               : LONGATTN_WGMMA_OUT32(d, 0)                                                                 \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))
#define LONGATTN_WGMMA_RS_N128(type)                                                                          \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\nwgmma.mma_async.sync.aligned.m64n128k16.f32." type \
               "." type " " LONGATTN_WGMMA_D64 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                   \
               : LONGATTN_WGMMA_OUT32(d, 0), LONGATTN_WGMMA_OUT32(d, 8)                                      \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))

// The instructions. Each body is device code only; the host pass of nvcc sees empty functions
// that nothing calls (the kernels run only inside a __global__ function).
struct CudaWarp {
  KOKKOS_INLINE_FUNCTION static int thread() {
#ifdef __CUDA_ARCH__
    return int(threadIdx.x);
#else
    return 0;
#endif
  }
  KOKKOS_INLINE_FUNCTION static void sync_cta() {
#ifdef __CUDA_ARCH__
    __syncthreads();
#endif
  }
  KOKKOS_INLINE_FUNCTION static void sync_warp() {
#ifdef __CUDA_ARCH__
    __syncwarp();
#endif
  }
  KOKKOS_INLINE_FUNCTION static void barrier_sync(int id, int threads) {
#ifdef __CUDA_ARCH__
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
#else
    (void)id, (void)threads;
#endif
  }
  KOKKOS_INLINE_FUNCTION static void barrier_arrive(int id, int threads) {
#ifdef __CUDA_ARCH__
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
#else
    (void)id, (void)threads;
#endif
  }
  KOKKOS_INLINE_FUNCTION static float shfl_xor(float value, int lane_mask) {
#ifdef __CUDA_ARCH__
    return __shfl_xor_sync(0xffffffffu, value, lane_mask);
#else
    (void)lane_mask;
    return value;
#endif
  }
  KOKKOS_INLINE_FUNCTION static int uniform(int value) {
#ifdef __CUDA_ARCH__
    return __shfl_sync(0xffffffffu, value, 0);
#else
    return value;
#endif
  }
  KOKKOS_INLINE_FUNCTION static void ldmatrix_x4(std::uint32_t (&r)[4], const void* row) {
#ifdef __CUDA_ARCH__
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
#else
    (void)r, (void)row;
#endif
  }
  KOKKOS_INLINE_FUNCTION static void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* row) {
#ifdef __CUDA_ARCH__
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
#else
    (void)r, (void)row;
#endif
  }
  template <Operand Type>
  KOKKOS_INLINE_FUNCTION static void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                         std::uint32_t b1) {
#ifdef __CUDA_ARCH__
    if constexpr (Type == Operand::bf16)
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
          "{%0, %1, %2, %3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else if constexpr (Type == Operand::f16)
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
          "{%0, %1, %2, %3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
      asm volatile(
          "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
          "{%0, %1, %2, %3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    (void)d, (void)a, (void)b0, (void)b1;
#endif
  }
  KOKKOS_INLINE_FUNCTION static void cp_async_16(void* shared, const void* global, bool fill) {
#ifdef __CUDA_ARCH__
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(global),
                 "r"(fill ? 16 : 0));
#else
    (void)shared, (void)global, (void)fill;
#endif
  }
  KOKKOS_INLINE_FUNCTION static void cp_async_commit() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.commit_group;\n" ::);
#endif
  }
  KOKKOS_INLINE_FUNCTION static void cp_async_wait_all() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
  }
  KOKKOS_INLINE_FUNCTION static void atomic_add_pair(float* global, float x, float y) {
#ifdef __CUDA_ARCH__
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(global), "f"(x), "f"(y) : "memory");
#else
    (void)global, (void)x, (void)y;
#endif
  }
  KOKKOS_INLINE_FUNCTION static float exp2(float x) {
#ifdef __CUDA_ARCH__
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
#else
    return x;
#endif
  }
  template <Operand Type>
  KOKKOS_INLINE_FUNCTION static std::uint32_t pack(float lo, float hi) {
    std::uint32_t word = 0;
#ifdef __CUDA_ARCH__
    if constexpr (Type == Operand::bf16) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);  // .x (the low half) = lo
      memcpy(&word, &pair, sizeof word);
    } else {
      const __half2 pair = __floats2half2_rn(lo, hi);
      memcpy(&word, &pair, sizeof word);
    }
#else
    (void)lo, (void)hi;
#endif
    return word;
  }
  KOKKOS_INLINE_FUNCTION static std::uint32_t tf32(float x) {
    std::uint32_t word = 0;
#ifdef __CUDA_ARCH__
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(word) : "f"(x));
#else
    (void)x;
#endif
    return word;
  }
  template <class T>
  KOKKOS_INLINE_FUNCTION static void store_shared(void* address, T value) {
    *static_cast<T*>(address) = value;
  }
  template <class T>
  KOKKOS_INLINE_FUNCTION static T load_shared(const void* address) {
    return *static_cast<const T*>(address);
  }

  // The warpgroup instructions exist in the sm_90a compilation only (__CUDA_ARCH_FEAT_SM90_ALL);
  // elsewhere they trap: the launcher runs the warpgroup programs only where that code was built.
  KOKKOS_INLINE_FUNCTION static std::uint32_t shared_address(const void* address) {
#ifdef __CUDA_ARCH__
    return static_cast<std::uint32_t>(__cvta_generic_to_shared(address));
#else
    (void)address;
    return 0;
#endif
  }
  template <Operand Type, int N>
  KOKKOS_INLINE_FUNCTION static void wgmma(float (&d)[N / 8][4], std::uint64_t a, std::uint64_t b) {
    static_assert(Type != Operand::tf32 && (N == 64 || N == 128), "16-bit m64n64k16 and m64n128k16");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (N == 64 && Type == Operand::bf16)
      LONGATTN_WGMMA_SS_N64("bf16");
    else if constexpr (N == 64)
      LONGATTN_WGMMA_SS_N64("f16");
    else if constexpr (Type == Operand::bf16)
      LONGATTN_WGMMA_SS_N128("bf16");
    else
      LONGATTN_WGMMA_SS_N128("f16");
#elif defined(__CUDA_ARCH__)
    (void)d, (void)a, (void)b;
    __trap();
#else
    (void)d, (void)a, (void)b;
#endif
  }
  template <Operand Type, int N>
  KOKKOS_INLINE_FUNCTION static void wgmma(float (&d)[N / 8][4], const std::uint32_t (&a)[4], std::uint64_t b) {
    static_assert(Type != Operand::tf32 && (N == 64 || N == 128), "16-bit m64n64k16 and m64n128k16");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (N == 64 && Type == Operand::bf16)
      LONGATTN_WGMMA_RS_N64("bf16");
    else if constexpr (N == 64)
      LONGATTN_WGMMA_RS_N64("f16");
    else if constexpr (Type == Operand::bf16)
      LONGATTN_WGMMA_RS_N128("bf16");
    else
      LONGATTN_WGMMA_RS_N128("f16");
#elif defined(__CUDA_ARCH__)
    (void)d, (void)a, (void)b;
    __trap();
#else
    (void)d, (void)a, (void)b;
#endif
  }
  KOKKOS_INLINE_FUNCTION static void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
  }
  KOKKOS_INLINE_FUNCTION static void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
  }
  template <int N>
  KOKKOS_INLINE_FUNCTION static void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
  }
  template <int N>
  KOKKOS_INLINE_FUNCTION static void fence_accumulators(float (&d)[N][4]) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    LONGATTN_WARP_UNROLL
    for (int n = 0; n < N; ++n)
      LONGATTN_WARP_UNROLL
      for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(d[n][i])::"memory");
#else
    (void)d;
#endif
  }
  KOKKOS_INLINE_FUNCTION static void fence_proxy_async() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
  }

  template <int Registers>
  KOKKOS_INLINE_FUNCTION static void setmaxnreg_inc() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Registers));
#endif
  }
  template <int Registers>
  KOKKOS_INLINE_FUNCTION static void setmaxnreg_dec() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Registers));
#endif
  }

  // The copy engine and mbarriers (sm_90; built where the warpgroup programs are).
  using TensorMap = CUtensorMap;
  KOKKOS_INLINE_FUNCTION static void tma_load(void* tile, const TensorMap& map, int x, int token, int head, int batch,
                                              std::uint32_t barrier) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
        "%5}], [%6];\n" ::"r"(shared_address(tile)),
        "l"(reinterpret_cast<std::uint64_t>(&map)), "r"(x), "r"(token), "r"(head), "r"(batch), "r"(barrier)
        : "memory");
#elif defined(__CUDA_ARCH__)
    (void)tile, (void)map, (void)x, (void)token, (void)head, (void)batch, (void)barrier;
    __trap();
#else
    (void)tile, (void)map, (void)x, (void)token, (void)head, (void)batch, (void)barrier;
#endif
  }
  KOKKOS_INLINE_FUNCTION static void mbarrier_init(std::uint32_t barrier, int arrivals) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(arrivals) : "memory");
#else
    (void)barrier, (void)arrivals;
#endif
  }
  KOKKOS_INLINE_FUNCTION static void fence_barrier_init() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
  }
  KOKKOS_INLINE_FUNCTION static void mbarrier_arrive(std::uint32_t barrier) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(barrier) : "memory");
#else
    (void)barrier;
#endif
  }
  KOKKOS_INLINE_FUNCTION static void mbarrier_arrive_expect_tx(std::uint32_t barrier, std::uint32_t bytes) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier), "r"(bytes) : "memory");
#else
    (void)barrier, (void)bytes;
#endif
  }
  KOKKOS_INLINE_FUNCTION static void mbarrier_wait(std::uint32_t barrier, int parity) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    std::uint32_t done = 0;
    while (!done)
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(barrier), "r"(parity)
          : "memory");
#else
    (void)barrier, (void)parity;
#endif
  }
};
#endif

}  // namespace longattn::detail::tensor_core
