// The tile configuration of the attention kernels: how a team cuts its block of work. It is a
// template parameter of the kernels, not a consequence of the backend, so that the host can run
// the GPU's shape of the code (several threads per team sharing micro-tiles, team barriers
// between stages) and the tests can check it there.
//
// A configuration is a type with
//   static constexpr int team_size;      threads per team
//   static constexpr bool reads_rows_in_place;  optional (false when absent): whether a streamed
//                                        block whose rows lie together in the tensor
//                                        ([count][D], T) is read where it is, not copied to scratch
//   template <class T> struct shape {    for the accumulation type T:
//     static constexpr int block;        tokens per block (block patterns are in these units)
//     static constexpr int rows, packs;  a micro-tile: rows x packs accumulators, in registers
//     static constexpr int lanes;        values of T per pack (a SIMD register, or one scalar)
//   };
// A kernel keeps one block resident in team scratch with its tokens along the lanes and streams
// blocks of the other side past it; the team's threads share out the micro-tiles of every
// product (detail/tile_mma.hpp). `block` must be a multiple of packs x lanes.
//
//   SimdTiles         the host's: one thread per team, a pack is one SIMD register.
//   ThreadTiles<N>    the portable GPU shape: N threads per team, one lane per thread, 4 x 1
//                     micro-tiles.
//   TensorCoreTiles   Kokkos::Cuda's: the tensor-core kernels (detail/tensor_core/) for the calls
//                     they take (bfloat16 and float16 tensors, head dims 64 and 128, forward
//                     also 256; float as TF32 with AttentionOptions::allow_tf32, head dims 64
//                     and 128; rows of 16-byte chunks), ThreadTiles<128> for the rest.
//   EmulatedTensorCoreTiles  the tensor-core kernels on a host space through the lane-exact
//                     emulation of the warps (detail/tensor_core/emulated_warp.hpp: slow, for
//                     tests and debugging), SimdTiles for the rest.
//   WavefrontTiles    AMD GPUs' (HIP): ThreadTiles of 256 threads, four 64-lane wavefronts,
//                     one for each SIMD unit of a compute unit.
//   DefaultTiles      the execution space's own (default_tiles_t): TensorCoreTiles on
//                     Kokkos::Cuda, WavefrontTiles on HIP, SimdTiles on the host spaces.
// attention_forward<Tiles>(...) and the functions above it take one as their first template
// argument; the library's compiled kernels (ETI) are those of DefaultTiles.
#pragma once

#include <Kokkos_Core.hpp>

#include <type_traits>

#include "longattn/core/detail/pack.hpp"

namespace longattn {

// 4 x 4 registers of 16 floats keep two FMA ports busy with 4 vector loads and 4 broadcasts per
// 16 FMAs (measured 110-125 GFLOP/s of ~133 on one Sapphire Rapids core with the operands in L1).
struct SimdTiles {
  static constexpr int team_size = 1;
  // A CPU thread reads a contiguous block from L2 as fast as from scratch (the head-major
  // copies of attention.hpp make the streamed blocks contiguous): no copy.
  static constexpr bool reads_rows_in_place = true;
  template <class T>
  struct shape {
    static constexpr int lanes = detail::host_simd_bytes / static_cast<int>(sizeof(T));
    static constexpr int packs = 4;
    static constexpr int rows = detail::host_simd_bytes == 64 ? 4 : 2;  // 16 accumulators of 32 zmm
    static constexpr int block = 64;
  };
};

// One lane per thread: a 64 x 64 product is 1024 micro-tiles of 4 x 1, 8 per thread of a
// 128-thread team. Correct and portable; the tensor-core kernels (TensorCores, below) replace it
// on Kokkos::Cuda for the calls they take.
template <int TeamSize>
struct ThreadTiles {
  static_assert(TeamSize >= 1, "a team has at least one thread");
  static constexpr int team_size = TeamSize;  // no reads_rows_in_place: a GPU stages every block
  template <class T>
  struct shape {
    static constexpr int lanes = 1;
    static constexpr int packs = 1;
    static constexpr int rows = 4;
    static constexpr int block = 64;
  };
};

// An AMD GPU runs a team as 64-lane wavefronts, and a compute unit issues from four SIMD units:
// 256 threads give each its own wavefront (a 64 x 64 product is 4 micro-tiles per thread).
using WavefrontTiles = ThreadTiles<256>;

// The tensor-core program of a 16-bit call at head dim 64 or 128 (TensorCoreTiles), forward
// (AttentionOptions::tensor_core_forward) and backward (tensor_core_backward):
//   warp       warp-level mma.sync (FlashAttention-2's structure; every GPU from sm_80)
//   warpgroup  Hopper's warpgroup wgmma from shared-memory descriptors, tiles by the tensor copy
//              engine (sm_90a: an H100 or H200, with a build that compiled sm_90a code, as the
//              CUDA builds do); backward: dK and dV by it, dQ by the warp-level dQ pass (the
//              two-pass form). Asking for it on a call the tensor-core kernels take and it cannot
//              run (TF32, head dim 256, another GPU, backward_passes = one) is a longattn::Error
//   automatic  warp: the warpgroup programs have not yet run on a GPU (docs/design.md)
// Calls the tensor-core kernels do not take ignore it.
enum class TensorCoreProgram { automatic, warp, warpgroup };
inline const char* to_string(TensorCoreProgram program) {
  return program == TensorCoreProgram::automatic ? "automatic" : program == TensorCoreProgram::warp ? "warp" : "warpgroup";
}

namespace detail::tensor_core {
struct EmulatedLaunch;  // detail/tensor_core/kernels.hpp
struct CudaLaunch;
}  // namespace detail::tensor_core

// The tensor-core kernels where they take the call (Launch: how their CTAs run), the kernels of
// the configuration Fallback (whose shape this one has) elsewhere.
template <class Launch, class Fallback>
struct TensorCores : Fallback {
  using tensor_core_launch = Launch;
};
using EmulatedTensorCoreTiles = TensorCores<detail::tensor_core::EmulatedLaunch, SimdTiles>;
#ifdef KOKKOS_ENABLE_CUDA
using TensorCoreTiles = TensorCores<detail::tensor_core::CudaLaunch, ThreadTiles<128>>;
#endif

// Whether a configuration runs the tensor-core kernels where they take the call.
template <class Tiles, class = void>
struct uses_tensor_cores : std::false_type {};
template <class Tiles>
struct uses_tensor_cores<Tiles, std::void_t<typename Tiles::tensor_core_launch>> : std::true_type {};

// Tiles::reads_rows_in_place, false for a configuration that does not say.
template <class Tiles, class = void>
struct reads_rows_in_place : std::false_type {};
template <class Tiles>
struct reads_rows_in_place<Tiles, std::void_t<decltype(Tiles::reads_rows_in_place)>>
    : std::bool_constant<Tiles::reads_rows_in_place> {};

// Stands for the execution space's own configuration.
struct DefaultTiles {};

template <class ExecSpace>
struct default_tiles {
  using type = SimdTiles;
};
#ifdef KOKKOS_ENABLE_CUDA
template <>
struct default_tiles<Kokkos::Cuda> {
  using type = TensorCoreTiles;
};
#endif
#ifdef KOKKOS_ENABLE_HIP
template <>
struct default_tiles<HIP> {
  using type = WavefrontTiles;
};
#endif

// Tiles, with DefaultTiles replaced by the space's own.
template <class ExecSpace, class Tiles = DefaultTiles>
using tiles_for_t = std::conditional_t<std::is_same_v<Tiles, DefaultTiles>, typename default_tiles<ExecSpace>::type, Tiles>;

}  // namespace longattn
