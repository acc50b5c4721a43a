// The tensor-core kernels behind attention_forward and attention_backward: which calls they take,
// their arguments from the views, and how their CTAs are launched.
//
// A launcher runs a program (forward.hpp, backward.hpp) over its grid:
//   CudaLaunch       a __global__ function per program on the caller's Kokkos::Cuda instance's
//                    stream, its dynamic shared memory limit raised to what the program needs
//                    (cudaFuncSetAttribute; the programs take 36-216 KiB, over the 48 KiB a
//                    kernel gets without asking, which is also all Kokkos gives a team)
//   EmulatedLaunch   the host emulation (emulated_warp.hpp), after the instance's earlier work
// The program is the kernel's parameter (__grid_constant__: the tensor maps that the copy engine
// reads are the parameter's own bytes), and a launcher turns a TileMap (warpgroup.hpp) into its
// warp's tensor map: CudaLaunch by the driver's cuTensorMapEncodeTiled (found through the runtime's
// driver entry points: no link to the driver library), the emulation as it is.
// 16-bit calls at head dims 64 and 128 run the warp-level programs or the warpgroup ones
// (forward_warpgroup.hpp, backward_warpgroup.hpp; AttentionOptions::tensor_core_forward and
// tensor_core_backward), which run where the device is an sm_90 one (compute capability 9.0) and
// the translation unit that launches them compiled sm_90a code: the library's CUDA kernel files
// (core/CMakeLists.txt defines LONGATTN_SM90A there); the emulation runs them anywhere.
// The kernels take 16-bit tensors (bfloat16, float16), and float tensors where the caller allows
// TF32, whose head dim is contiguous, whose other strides are whole 16-byte chunks and whose data
// start on 16 bytes (cp.async copies 16-byte chunks), head dims 64 and 128 (16-bit forward also
// 256); other calls run the portable kernels.
#pragma once

#include <Kokkos_Core.hpp>

#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>

#include "longattn/core/attention_tiles.hpp"
#include "longattn/core/execution_context.hpp"
#include "longattn/core/half.hpp"
#include "longattn/core/detail/attention_kernels.hpp"
#include "longattn/core/detail/tensor_core/backward.hpp"
#include "longattn/core/detail/tensor_core/backward_warpgroup.hpp"
#include "longattn/core/detail/tensor_core/emulated_warp.hpp"
#include "longattn/core/detail/tensor_core/forward.hpp"
#include "longattn/core/detail/tensor_core/forward_warpgroup.hpp"
#include "longattn/core/detail/tensor_core/warp_ops.hpp"
#include "longattn/core/detail/tensor_core/warpgroup.hpp"
#include "longattn/error.hpp"

#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
#include <cudaTypedefs.h>
#endif

namespace longattn::detail::tensor_core {

// Grids the launchers below have started in this process (the tests check which kernels ran).
inline std::atomic<std::int64_t>& launched_grids() {
  static std::atomic<std::int64_t> count{0};
  return count;
}

struct EmulatedLaunch {
  using Warp = EmulatedWarp;
  template <class ExecSpace>
  static constexpr bool runs_on = Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;
  template <class ExecSpace>
  static bool warpgroup_device(const ExecSpace&) {
    return true;
  }
  static TileMap tensor_map(const TileMap& map) { return map; }
  template <class ExecSpace, class Program>
  static void run(const ExecSpace& exec, const Program& program) {
    const int ctas = program.ctas();
    if (ctas == 0) return;
    exec.fence();  // the program reads what earlier kernels on the instance wrote
    ++launched_grids();
    Emulator::run(program, ctas);
  }
};

#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
template <class Program>
__global__ void __launch_bounds__(Program::threads, Program::min_ctas_per_sm)
    run_program(const __grid_constant__ Program program) {
  extern __shared__ __align__(128) char shared[];
  program(int(blockIdx.x), shared);
}

struct CudaLaunch {
  using Warp = CudaWarp;
  template <class ExecSpace>
  static constexpr bool runs_on = std::is_same_v<ExecSpace, Kokkos::Cuda>;
  // Whether the instance's device runs sm_90a code: compute capability 9.0 exactly.
  static bool warpgroup_device(const Kokkos::Cuda& exec) {
    int major = 0, minor = 0;
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, exec.cuda_device()),
          "cudaDeviceGetAttribute(cudaDevAttrComputeCapabilityMajor)");
    check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, exec.cuda_device()),
          "cudaDeviceGetAttribute(cudaDevAttrComputeCapabilityMinor)");
    return major == 9 && minor == 0;
  }
  static CUtensorMap tensor_map(const TileMap& map) {
    static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
      void* function = nullptr;
      cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
      check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found),
            "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)");
#else  // CUDA 12.0-12.4
      check(cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &function, cudaEnableDefault, &found),
            "cudaGetDriverEntryPoint(cuTensorMapEncodeTiled)");
#endif
      if (found != cudaDriverEntryPointSuccess)
        throw Error("longattn attention (tensor cores): the CUDA driver has no cuTensorMapEncodeTiled (12.0 or later)");
      return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
    }();
    CUtensorMap encoded;
    const cuuint64_t extents[4] = {cuuint64_t(map.extents[0]), cuuint64_t(map.extents[1]), cuuint64_t(map.extents[2]),
                                   cuuint64_t(map.extents[3])};
    const cuuint64_t strides[3] = {cuuint64_t(map.strides[1]), cuuint64_t(map.strides[2]), cuuint64_t(map.strides[3])};
    const cuuint32_t box[4] = {cuuint32_t(panel_values), cuuint32_t(map.box_rows), 1, 1};
    const cuuint32_t element_strides[4] = {1, 1, 1, 1};
    const CUresult status = encode(&encoded, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, const_cast<void*>(map.data), extents,
                                   strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                   CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (status != CUDA_SUCCESS)
      throw Error("longattn attention (tensor cores): cuTensorMapEncodeTiled failed with CUresult " +
                  std::to_string(int(status)));
    return encoded;
  }
  template <class Program>
  static void run(const Kokkos::Cuda& exec, const Program& program) {
    const int ctas = program.ctas();
    if (ctas == 0) return;
    check(cudaFuncSetAttribute(run_program<Program>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(Program::shared_bytes)),
          "cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize)");
    run_program<Program><<<ctas, Program::threads, Program::shared_bytes, exec.cuda_stream()>>>(program);
    check(cudaGetLastError(), "the kernel launch");
    ++launched_grids();
  }
  static void check(cudaError_t status, const char* what) {
    if (status != cudaSuccess)
      throw Error(std::string("longattn attention (tensor cores): ") + what + " failed: " + cudaGetErrorString(status));
  }
};
#endif

// The head dims with programs: 64 and 128; the 16-bit forward also 256 (a float one would take
// 260 KiB of shared memory).
template <class S>
bool head_dim_supported(int head_dim, bool backward) {
  return head_dim == 64 || head_dim == 128 || (!backward && sizeof(S) == 2 && head_dim == 256);
}

// A view the programs copy in 16-byte chunks: head dim contiguous, the other strides whole
// chunks (where the extent is above 1), data on 16 bytes.
template <class View>
bool chunked(const View& x) {
  constexpr int values = chunk_values<typename View::value_type>;
  for (int r = 0; r < 3; ++r)
    if (x.extent(r) > 1 && x.stride(r) % values != 0) return false;
  return x.stride(3) == 1 && reinterpret_cast<std::uintptr_t>(x.data()) % 16 == 0;
}

// A [B][N][H][D] 16-bit view as the copy engine's TileMap, boxes of box_rows tokens (the strides of
// dimensions of extent 1, which no copy steps along, set to 16 bytes: the engine takes multiples
// of 16 only).
template <class View>
TileMap tile_map_of(const View& x, int box_rows) {
  static_assert(sizeof(typename View::value_type) == 2, "16-bit tensors");
  TileMap map;
  map.data = x.data();
  const int dimension_of[4] = {3, 1, 2, 0};  // D, tokens, heads, batch
  for (int i = 0; i < 4; ++i) {
    const int r = dimension_of[i];
    map.extents[i] = std::int64_t(x.extent(r));
    map.strides[i] = i == 0 ? 2 : x.extent(r) > 1 ? 2 * std::int64_t(x.stride(r)) : 16;
  }
  map.box_rows = box_rows;
  return map;
}

template <class S, class View>
Tensor<S> tensor_of(const View& x) {
  return {x.data(), std::int64_t(x.stride(0)), std::int64_t(x.stride(1)), std::int64_t(x.stride(2))};
}
template <class T, class View>
Rows<T> rows_of(const View& x) {
  return {x.data(), std::int64_t(x.stride(0)), std::int64_t(x.stride(1)), std::int64_t(x.stride(2))};
}

// dq = [dq +] the float sums of the one-pass backward ([B][H][Nq][D]), rounded once.
template <class ExecSpace, class S>
struct AddQueryGradientSums {
  Tensor4<S, ExecSpace> dq;
  const float* sums;
  int heads, queries, head_dim;
  bool accumulate;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t row) const {
    const int i = int(row % queries), h = int(row / queries % heads), b = int(row / queries / heads);
    const float* sum = sums + row * head_dim;
    for (int d = 0; d < head_dim; ++d) dq(b, i, h, d) = S((accumulate ? float(dq(b, i, h, d)) : 0.0f) + sum[d]);
  }
};

// What a backward call asks of the tensor-core kernels beyond the forward's arguments.
struct BackwardChoice {
  bool deterministic = false;  // dQ by a pass of its own (no atomics), as BackwardPasses::two
  TensorCoreProgram program = TensorCoreProgram::automatic;  // warpgroup: dK and dV by wgmma, dQ by its pass
};

template <class Launch, class ExecSpace, class S, class Pattern>
struct TensorCoreKernels {
  using Warp = typename Launch::Warp;
  using Input = Tensor4<const S, ExecSpace>;
  using Output = Tensor4<S, ExecSpace>;
  using Context = ExecutionContext<ExecSpace>;
  static_assert(is_half_v<S> || std::is_same_v<S, float>, "the tensor-core kernels take bfloat16, float16, float");

  // Whether the programs take these tensors (else the caller runs the portable kernels): float
  // only where the caller allows TF32.
  template <class... Views>
  static bool take(int head_dim, bool backward, bool allow_tf32, const Views&... views) {
    return (is_half_v<S> || allow_tf32) && head_dim_supported<S>(head_dim, backward) && (chunked(views) && ...);
  }

  // Whether the warpgroup forward program runs for this launcher and instance. The macro is read
  // in this class template, instantiated only by the files that launch its programs (an inline
  // function of another class would differ between files compiled with and without it).
  static bool warpgroup_runs(const ExecSpace& exec) {
#ifdef LONGATTN_SM90A
    constexpr bool sm90a_compiled = true;
#else
    constexpr bool sm90a_compiled = std::is_same_v<Launch, EmulatedLaunch>;
#endif
    return sm90a_compiled && Launch::warpgroup_device(exec);
  }

  static void forward(const Context& context, const Input& q, const Input& k, const Input& v, const Output& o,
                      const Tensor3<float, ExecSpace>& lse, const AttentionGeometry& geo, const Pattern& pattern,
                      float scale_log2, float output_scale, bool accumulate, TensorCoreProgram program) {
    ForwardArguments<S> args;
    args.q = tensor_of<const S>(q);
    args.k = tensor_of<const S>(k);
    args.v = tensor_of<const S>(v);
    args.o = tensor_of<S>(o);
    args.lse = rows_of<float>(lse);
    set_geometry(args, geo);
    args.scale_log2 = scale_log2;
    args.output_scale = output_scale;
    args.accumulate = accumulate;
    if (program == TensorCoreProgram::warpgroup) {
      require_warpgroup(context.exec(), geo, "longattn::attention_forward", "opts.tensor_core_forward");
      if constexpr (is_half_v<S>) {
        if (geo.head_dim == 64)
          run_warpgroup_forward<64>(context.exec(), args, pattern, q, k, v);
        else
          run_warpgroup_forward<128>(context.exec(), args, pattern, q, k, v);
      }
      return;
    }
    switch (geo.head_dim) {
      case 64: Launch::run(context.exec(), ForwardProgram<Warp, S, 64, Pattern>{args, pattern}); break;
      case 128: Launch::run(context.exec(), ForwardProgram<Warp, S, 128, Pattern>{args, pattern}); break;
      default:
        if constexpr (is_half_v<S>) Launch::run(context.exec(), ForwardProgram<Warp, S, 256, Pattern>{args, pattern});
        break;
    }
  }

  static void backward(const Context& context, const Input& q, const Input& k, const Input& v, const Input& o,
                       const Input& d_o, const Tensor3<const float, ExecSpace>& lse, const Output& dq,
                       const Output& dk, const Output& dv, const AttentionGeometry& geo, const Pattern& pattern,
                       float scale, float scale_log2, float output_scale, bool accumulate, BackwardChoice choice) {
    const memory::CategoryScope scope(memory::Category::workspaces);
    // The queries' statistics, rows padded to whole blocks.
    const int padded = (geo.queries + block_tokens - 1) / block_tokens * block_tokens;
    const std::int64_t rows = std::int64_t(geo.batch) * geo.heads * padded;
    using Statistics = Kokkos::View<FloatPair*, typename ExecSpace::memory_space>;
    const auto statistics = context.template allocate<Statistics>(std::size_t(rows));
    Kokkos::parallel_for("longattn::attention_backward::statistics",
                         Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(context.exec(), 0, rows),
                         QueryStatistics<ExecSpace, S, Tensor3<const float, ExecSpace>>{
                             o, d_o, lse, statistics.data(), geo.heads, geo.queries, padded, geo.head_dim});
    BackwardArguments<S> args;
    args.q = tensor_of<const S>(q);
    args.k = tensor_of<const S>(k);
    args.v = tensor_of<const S>(v);
    args.d_o = tensor_of<const S>(d_o);
    args.dq = tensor_of<S>(dq);
    args.dk = tensor_of<S>(dk);
    args.dv = tensor_of<S>(dv);
    args.statistics = statistics.data();
    args.padded_queries = padded;
    set_geometry(args, geo);
    args.scale = scale;
    args.scale_log2 = scale_log2;
    args.output_scale = output_scale;
    args.accumulate = accumulate;
    if (choice.program == TensorCoreProgram::warpgroup) {
      require_warpgroup(context.exec(), geo, "longattn::attention_backward", "opts.tensor_core_backward");
      if constexpr (is_half_v<S>) {
        if (geo.head_dim == 64)
          run_warpgroup_backward<64>(context.exec(), args, pattern, q, k, v, d_o);
        else
          run_warpgroup_backward<128>(context.exec(), args, pattern, q, k, v, d_o);
      }
      return;
    }
    if (geo.head_dim == 64)
      backward_programs<64>(context, args, dq, geo, pattern, choice);
    else
      backward_programs<128>(context, args, dq, geo, pattern, choice);
  }

 private:
  // A warpgroup program was asked for (`option`): the call must be one it takes, on a device it runs on.
  static void require_warpgroup(const ExecSpace& exec, const AttentionGeometry& geo, const char* where,
                                const char* option) {
    require(is_half_v<S> && (geo.head_dim == 64 || geo.head_dim == 128), where, option, "warpgroup",
            "warp or automatic for this call (the warpgroup programs take 16-bit tensors at head dims 64 and 128)");
    require(warpgroup_runs(exec), where, option, "warpgroup",
            "warp or automatic on this device (the warpgroup programs run on compute capability 9.0 from a build "
            "with sm_90a code)");
  }

  template <int D>
  static void run_warpgroup_forward(const ExecSpace& exec, const ForwardArguments<S>& args, const Pattern& pattern,
                                    const Input& q, const Input& k, const Input& v) {
    using Program = WarpgroupForwardProgram<Warp, S, D, Pattern>;
    Launch::run(exec, Program{{args, pattern},
                              Launch::tensor_map(tile_map_of(q, Program::query_rows)),
                              Launch::tensor_map(tile_map_of(k, block_tokens)),
                              Launch::tensor_map(tile_map_of(v, block_tokens))});
  }

  // dK and dV by the warpgroup program, then dQ by the warp-level dQ pass.
  template <int D>
  static void run_warpgroup_backward(const ExecSpace& exec, const BackwardArguments<S>& args, const Pattern& pattern,
                                     const Input& q, const Input& k, const Input& v, const Input& d_o) {
    using Program = WarpgroupKeyGradientProgram<Warp, S, D, Pattern>;
    Launch::run(exec, Program{args, pattern, Launch::tensor_map(tile_map_of(q, block_tokens)),
                              Launch::tensor_map(tile_map_of(k, Program::key_rows)),
                              Launch::tensor_map(tile_map_of(v, Program::key_rows)),
                              Launch::tensor_map(tile_map_of(d_o, block_tokens))});
    Launch::run(exec, QueryGradientProgram<Warp, S, D, Pattern>{args, pattern});
  }

  template <int D>
  static void backward_programs(const Context& context, BackwardArguments<S>& args, const Output& dq,
                                const AttentionGeometry& geo, const Pattern& pattern, BackwardChoice choice) {
    const ExecSpace& exec = context.exec();
    if (choice.deterministic) {
      Launch::run(exec, KeyGradientProgram<Warp, S, D, Pattern, false>{args, pattern});
      Launch::run(exec, QueryGradientProgram<Warp, S, D, Pattern>{args, pattern});
      return;
    }
    // One pass: dQ summed atomically in float, then rounded into dq.
    using Sums = Kokkos::View<float*, typename ExecSpace::memory_space>;
    const std::int64_t rows = std::int64_t(geo.batch) * geo.heads * geo.queries;
    const auto sums = context.template allocate<Sums>(std::size_t(rows) * D);
    Kokkos::deep_copy(exec, sums.view(), 0.0f);
    args.dq_sum = sums.data();
    Launch::run(exec, KeyGradientProgram<Warp, S, D, Pattern, true>{args, pattern});
    Kokkos::parallel_for("longattn::attention_backward::dq",
                         Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, rows),
                         AddQueryGradientSums<ExecSpace, S>{dq, sums.data(), geo.heads, geo.queries, D, args.accumulate});
  }

  template <class Arguments>
  static void set_geometry(Arguments& args, const AttentionGeometry& geo) {
    args.batch = geo.batch;
    args.heads = geo.heads;
    args.queries = geo.queries;
    args.keys = geo.keys;
    args.query_offset = geo.query_offset;
    args.key_offset = geo.key_offset;
    args.causal = geo.causal;
  }
};

}  // namespace longattn::detail::tensor_core
