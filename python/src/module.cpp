// longattn._core: longattn::core's attention kernels on DLPack tensors (numpy arrays, torch
// tensors), read and written where they are: every tensor becomes an unmanaged Kokkos view of
// the caller's memory, strides as given. The Python package (python/longattn) allocates the
// outputs and calls these; nothing here allocates a tensor the caller sees.
//
//   forward(q, k, v, o, lse, spec, causal, softmax_scale, query_offset, key_offset, block_mask)
//   backward(q, k, v, o, d_o, lse, dq, dk, dv, spec, causal, ...)
//
// q, k, v, o, dq, dk, dv: [B, N, H, D] of one storage type (float32, float64, bfloat16, float16);
// lse [B, H, Nq] of its accumulation type (float64 for float64, float32 otherwise). Kokkos starts
// on the first call (or initialize()) and stops in finalize(), which the package registers
// with atexit. The GIL is released while kernels run.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <Kokkos_Core.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <optional>
#include <string>
#include <vector>

#include "longattn/longattn.hpp"

namespace nb = nanobind;

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Memory = Exec::memory_space;
using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
// Inputs in any strides; outputs (which the package allocates) C-contiguous.
template <class T>
using Tensor = Kokkos::View<const T****, Kokkos::LayoutStride, Memory, Unmanaged>;  // [B, N, H, D]
template <class T>
using OutputTensor = Kokkos::View<T****, Kokkos::LayoutRight, Memory, Unmanaged>;
template <class T>
using Lse = Kokkos::View<const T***, Kokkos::LayoutStride, Memory, Unmanaged>;  // [B, H, Nq]
template <class T>
using OutputLse = Kokkos::View<T***, Kokkos::LayoutRight, Memory, Unmanaged>;
using Array = nb::ndarray<>;            // written
using Input = nb::ndarray<nb::ro>;      // only read
using Mask = nb::ndarray<nb::ro, std::uint8_t>;  // block mask, as uint8 (bool arrays are cast by the package)

constexpr const char* module_name = "longattn";

// Kokkos and the context the kernels run in (its default pool), for the life of the process
// or until finalize(); the context goes before Kokkos does.
struct Runtime {
  longattn::ScopeGuard guard;
  longattn::ExecutionContext<Exec> context;
  explicit Runtime(int argc_value, std::vector<char*> argv)
      : guard(argc_value, argv.data()), context(Exec()) {}
};

// Every Kokkos call runs on one thread of this module's: Kokkos' OpenMP space takes work only
// from the thread that initialized it, and Python may call from any thread. A caller hands its
// work over with the GIL released and waits; exceptions come back to it.
class KernelThread {
 public:
  KernelThread() : thread_([this] { serve(); }) {}
  ~KernelThread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  void run(const std::function<void()>& work) {
    std::lock_guard<std::mutex> one_caller(calls_);
    std::exception_ptr failure;
    std::unique_lock<std::mutex> lock(mutex_);
    work_ = [&] {
      try {
        work();
      } catch (...) {
        failure = std::current_exception();
      }
    };
    wake_.notify_all();
    finished_.wait(lock, [&] { return !work_; });
    lock.unlock();
    if (failure) std::rethrow_exception(failure);
  }

 private:
  void serve() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || work_; });
      if (work_) {
        work_();
        work_ = nullptr;
        finished_.notify_all();
      } else if (stopping_) {
        return;
      }
    }
  }

  std::mutex calls_, mutex_;
  std::condition_variable wake_, finished_;
  std::function<void()> work_;
  bool stopping_ = false;
  std::thread thread_;
};

std::unique_ptr<KernelThread>& kernel_thread_slot() {
  static std::unique_ptr<KernelThread> thread;
  return thread;
}
std::unique_ptr<Runtime>& runtime_slot() {  // touched on the kernel thread only
  static std::unique_ptr<Runtime> runtime;
  return runtime;
}
std::atomic<bool> kokkos_started{false};  // what callers on other threads read

// Runs work on the kernel thread, Kokkos started there first (threads: the host space's thread
// count, Kokkos' own default where not given: OMP_NUM_THREADS or every core). Called with the
// GIL released.
void on_kernel_thread(const std::function<void()>& work, std::optional<int> threads = std::nullopt) {
  if (!kernel_thread_slot()) kernel_thread_slot() = std::make_unique<KernelThread>();
  kernel_thread_slot()->run([&] {
    if (!runtime_slot()) {
      std::vector<std::string> args{module_name};
      if (threads) {
#if KOKKOS_VERSION >= 30700
        args.push_back("--kokkos-num-threads=" + std::to_string(*threads));
#else
        args.push_back("--kokkos-threads=" + std::to_string(*threads));
#endif
      }
      std::vector<char*> argv;
      for (std::string& arg : args) argv.push_back(arg.data());
      argv.push_back(nullptr);
      runtime_slot() = std::make_unique<Runtime>(int(args.size()), argv);
      kokkos_started = true;
    }
    work();
  });
}

const longattn::ExecutionContext<Exec>& context() { return runtime_slot()->context; }  // on the kernel thread

bool initialized() { return kokkos_started; }

void initialize(std::optional<int> threads) {
  if (threads) longattn::require(*threads > 0, "longattn.initialize", "threads", *threads, "a positive thread count");
  nb::gil_scoped_release unlocked;
  on_kernel_thread([] {}, threads);
}

void finalize() {
  if (!kernel_thread_slot()) return;
  nb::gil_scoped_release unlocked;
  kernel_thread_slot()->run([] {
    runtime_slot().reset();
    kokkos_started = false;
  });
  kernel_thread_slot().reset();
}

// ---- DLPack arrays -> views --------------------------------------------------------------

// The DLPack device whose memory the default execution space reads.
constexpr int memory_device() {
  return Kokkos::SpaceAccessibility<Exec, Kokkos::HostSpace>::accessible ? nb::device::cpu::value
                                                                         : nb::device::cuda::value;
}
std::string device_name(int device) {
  return device == nb::device::cpu::value ? "cpu" : device == nb::device::cuda::value ? "cuda" : std::to_string(device);
}
// The device id within memory_device() that the execution space runs on (the GPU Kokkos chose).
int memory_device_id() {
#ifdef KOKKOS_ENABLE_CUDA
  if constexpr (std::is_same_v<Exec, Kokkos::Cuda>) return context().exec().cuda_device();
#endif
  return 0;
}

std::string dtype_name(const nb::dlpack::dtype& type) {
  const auto code = nb::dlpack::dtype_code(type.code);
  const std::string kind = code == nb::dlpack::dtype_code::Float    ? "float"
                           : code == nb::dlpack::dtype_code::Bfloat ? "bfloat"
                           : code == nb::dlpack::dtype_code::Int    ? "int"
                           : code == nb::dlpack::dtype_code::UInt   ? "uint"
                                                                    : "code " + std::to_string(type.code) + " ";
  return kind + std::to_string(type.bits) + (type.lanes != 1 ? "x" + std::to_string(type.lanes) : "");
}

template <class T>
nb::dlpack::dtype dtype_of() {
  if constexpr (std::is_same_v<T, longattn::bfloat16>)
    return {std::uint8_t(nb::dlpack::dtype_code::Bfloat), 16, 1};
  else if constexpr (std::is_same_v<T, longattn::float16>)
    return {std::uint8_t(nb::dlpack::dtype_code::Float), 16, 1};
  else
    return nb::dtype<T>();
}

// A view of `array` (rank R, element type T) in place: same data, extents and strides.
template <class View, class A>
View view_of(const char* where, const char* name, const A& array) {
  using T = std::remove_const_t<typename View::value_type>;
  constexpr int rank = View::rank;
  longattn::require(array.ndim() == std::size_t(rank), where, std::string(name) + ".ndim", array.ndim(),
                    std::to_string(rank) + (rank == 4 ? " ([batch, tokens, heads, head dim])" : " ([batch, heads, queries])"));
  longattn::require(array.device_type() == memory_device(), where, std::string(name) + ".device",
                    device_name(array.device_type()),
                    device_name(memory_device()) + " (the memory of this build's execution space, " +
                        std::string(Exec::name()) + ")");
  longattn::require(int(array.device_id()) == memory_device_id(), where, std::string(name) + ".device_id",
                    array.device_id(),
                    std::to_string(memory_device_id()) + " (the " + device_name(memory_device()) +
                        " device Kokkos runs on)");
  longattn::require(array.dtype() == dtype_of<T>(), where, std::string(name) + ".dtype", dtype_name(array.dtype()),
                    dtype_name(dtype_of<T>()) + (rank == 3 ? " (the accumulation type of q's)" : " (as q)"));
  std::size_t dims[8] = {};
  std::int64_t contiguous = 1;  // the C-order stride of dimension r
  for (int r = rank - 1; r >= 0; --r) {
    const std::string stride_name = std::string(name) + ".strides[" + std::to_string(r) + "] (elements)";
    if constexpr (std::is_same_v<typename View::array_layout, Kokkos::LayoutRight>)
      longattn::require(array.stride(r) == contiguous || array.shape(r) == 1, where, stride_name, array.stride(r),
                        std::to_string(contiguous) + " (an output is C-contiguous)");
    else
      longattn::require(array.stride(r) >= 0, where, stride_name, array.stride(r), "a non-negative stride");
    dims[2 * r] = array.shape(r);
    dims[2 * r + 1] = std::size_t(array.stride(r));
    contiguous *= std::int64_t(array.shape(r));
  }
  auto* data = static_cast<typename View::pointer_type>(const_cast<void*>(static_cast<const void*>(array.data())));
  if constexpr (std::is_same_v<typename View::array_layout, Kokkos::LayoutRight> && rank == 4)
    return View(data, dims[0], dims[2], dims[4], dims[6]);
  else if constexpr (std::is_same_v<typename View::array_layout, Kokkos::LayoutRight>)
    return View(data, dims[0], dims[2], dims[4]);
  else if constexpr (rank == 4)
    return View(data, Kokkos::LayoutStride(dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], dims[7]));
  else
    return View(data, Kokkos::LayoutStride(dims[0], dims[1], dims[2], dims[3], dims[4], dims[5]));
}

// Calls f(T{}) for the storage type of q.
template <class F>
void with_storage_type(const char* where, const Input& q, F&& f) {
  const nb::dlpack::dtype type = q.dtype();
  if (type == dtype_of<float>())
    f(float{});
  else if (type == dtype_of<double>())
    f(double{});
  else if (type == dtype_of<longattn::bfloat16>())
    f(longattn::bfloat16{});
  else if (type == dtype_of<longattn::float16>())
    f(longattn::float16{});
  else
    longattn::throw_invalid_argument(where, "q.dtype", dtype_name(type), "float32, float64, bfloat16 or float16");
}

// ---- the attention a call runs ------------------------------------------------------------

struct Call {
  longattn::AttentionSpec spec;
  longattn::AttentionOptions options;
  std::optional<Mask> block_mask;  // [patterns over batch, patterns over heads, query blocks, key blocks]
};

Call make_call(const char* where, const longattn::AttentionSpec& spec, bool causal, std::optional<double> softmax_scale,
               std::int64_t query_offset, std::int64_t key_offset, std::optional<Mask> block_mask) {
  Call call{spec, {}, std::move(block_mask)};
  longattn::require(!call.block_mask || spec.kind == longattn::AttentionSpec::Kind::dense, where, "block_mask",
                    "given with spec " + longattn::to_string(spec), "None, or spec \"dense\" (the mask is the layout)");
  call.options.causal = causal;
  call.options.softmax_scale = softmax_scale;
  call.options.query_offset = query_offset;
  call.options.key_offset = key_offset;
  return call;
}

// The layout of a caller's block mask: one pattern per batch entry or shared (extent 1), the
// same for heads, in blocks of block_size(dtype) tokens.
template <class T>
longattn::BlockSparseLayout<Exec> mask_layout(const char* where, const Mask& mask, std::int64_t batch,
                                              std::int64_t queries, std::int64_t keys, std::int64_t heads) {
  longattn::BlockSparseShape shape;
  shape.block = longattn::attention_block_size<Exec, T>();
  shape.queries = queries;
  shape.keys = keys;
  longattn::require(mask.ndim() == 4, where, "block_mask.ndim", mask.ndim(),
                    "4 ([1 or batch, 1 or heads, query blocks, key blocks])");
  longattn::require(mask.device_type() == nb::device::cpu::value, where, "block_mask.device",
                    device_name(mask.device_type()), "cpu (a layout is built from host memory)");
  const std::int64_t want[4] = {mask.shape(0) == 1 ? 1 : batch, mask.shape(1) == 1 ? 1 : heads, shape.query_blocks(),
                                shape.key_blocks()};
  for (int r = 0; r < 4; ++r)
    longattn::require(std::int64_t(mask.shape(r)) == want[r], where, "block_mask.shape[" + std::to_string(r) + "]",
                      mask.shape(r),
                      std::to_string(want[r]) + (r < 2 ? " (1 or the " + std::string(r == 0 ? "batch" : "head") + " count)"
                                                       : " (blocks of " + std::to_string(shape.block) + " tokens)"));
  shape.batch = int(mask.shape(0));
  shape.heads = int(mask.shape(1));
  std::vector<std::uint8_t> keep(std::size_t(shape.rows() * shape.key_blocks()));
  std::size_t n = 0;
  for (std::size_t b = 0; b < mask.shape(0); ++b)
    for (std::size_t h = 0; h < mask.shape(1); ++h)
      for (std::size_t qb = 0; qb < mask.shape(2); ++qb)
        for (std::size_t kb = 0; kb < mask.shape(3); ++kb)
          keep[n++] = mask.data()[b * mask.stride(0) + h * mask.stride(1) + qb * mask.stride(2) + kb * mask.stride(3)];
  return longattn::mask_layout(context().exec(), shape, keep);
}

// Runs the attention a call names, then waits for its kernels: `blocks(layout...)` with the
// layout of the caller's block mask or of a block-sparse pattern, or with none (dense), or
// `dilated(config)`.
template <class T, class Q, class K, class Blocks, class Dilated>
void run_attention(const char* where, const Call& call, const Q& q, const K& k, const Blocks& blocks,
                   const Dilated& dilated) {
  using Kind = longattn::AttentionSpec::Kind;
  const auto& ctx = context();
  const longattn::AttentionSpec spec = longattn::resolve_attention_spec(call.spec, q.extent(1));
  if (call.block_mask)
    blocks(mask_layout<T>(where, *call.block_mask, q.extent(0), q.extent(1), k.extent(1), q.extent(2)));
  else if (spec.kind == Kind::dilated)
    dilated(spec.dilated);
  else if (spec.kind == Kind::block_sparse)
    blocks(longattn::block_sparse_layout(ctx, spec.block_sparse, q, k, call.options.causal));
  else
    blocks();
  ctx.exec().fence();
}

template <class T>
void run_forward(const Call& call, const Input& q_array, const Input& k_array, const Input& v_array,
                 const Array& o_array, const Array& lse_array) {
  constexpr const char* where = "longattn.attention_forward";
  using S = longattn::accumulate_t<T>;
  const auto q = view_of<Tensor<T>>(where, "q", q_array);
  const auto k = view_of<Tensor<T>>(where, "k", k_array);
  const auto v = view_of<Tensor<T>>(where, "v", v_array);
  const auto o = view_of<OutputTensor<T>>(where, "o", o_array);
  const auto lse = view_of<OutputLse<S>>(where, "lse", lse_array);
  for (const auto& [name, input] : {std::pair{"q", q}, {"k", k}, {"v", v}}) {
    longattn::check_no_alias(where, "o", o, name, input);
    longattn::check_no_alias(where, "lse", lse, name, input);
  }
  longattn::check_no_alias(where, "lse", lse, "o", o);
  const auto& ctx = context();
  run_attention<T>(
      where, call, q, k,
      [&](const auto&... layout) { longattn::attention_forward(ctx, q, k, v, o, lse, call.options, layout...); },
      [&](const longattn::DilatedConfig& config) {
        longattn::dilated_attention_forward(ctx, q, k, v, o, lse, config, call.options);
      });
}

template <class T>
void run_backward(const Call& call, const Input& q_array, const Input& k_array, const Input& v_array,
                  const Input& o_array, const Input& d_o_array, const Input& lse_array, const Array& dq_array,
                  const Array& dk_array, const Array& dv_array) {
  constexpr const char* where = "longattn.attention_backward";
  using S = longattn::accumulate_t<T>;
  const auto q = view_of<Tensor<T>>(where, "q", q_array);
  const auto k = view_of<Tensor<T>>(where, "k", k_array);
  const auto v = view_of<Tensor<T>>(where, "v", v_array);
  const auto o = view_of<Tensor<T>>(where, "o", o_array);
  const auto d_o = view_of<Tensor<T>>(where, "d_o", d_o_array);
  const auto lse = view_of<Lse<S>>(where, "lse", lse_array);
  const auto dq = view_of<OutputTensor<T>>(where, "dq", dq_array);
  const auto dk = view_of<OutputTensor<T>>(where, "dk", dk_array);
  const auto dv = view_of<OutputTensor<T>>(where, "dv", dv_array);
  for (const auto& [out_name, out] : {std::pair{"dq", dq}, {"dk", dk}, {"dv", dv}}) {
    for (const auto& [name, input] : {std::pair{"q", q}, {"k", k}, {"v", v}, {"o", o}, {"d_o", d_o}})
      longattn::check_no_alias(where, out_name, out, name, input);
    longattn::check_no_alias(where, out_name, out, "lse", lse);
  }
  longattn::check_no_alias(where, "dq", dq, "dk", dk);
  longattn::check_no_alias(where, "dq", dq, "dv", dv);
  longattn::check_no_alias(where, "dk", dk, "dv", dv);
  const auto& ctx = context();
  run_attention<T>(
      where, call, q, k,
      [&](const auto&... layout) {
        longattn::attention_backward(ctx, q, k, v, o, d_o, lse, dq, dk, dv, call.options, layout...);
      },
      [&](const longattn::DilatedConfig& config) {
        longattn::dilated_attention_backward(ctx, q, k, v, o, d_o, lse, dq, dk, dv, config, call.options);
      });
}

int block_size(const Input& like) {  // a compile-time figure: no Kokkos call
  int size = 0;
  with_storage_type("longattn.block_size", like,
                    [&](auto tag) { size = longattn::attention_block_size<Exec, decltype(tag)>(); });
  return size;
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "longattn's attention kernels on DLPack tensors (the longattn package wraps these)";
  nb::exception<longattn::Error>(m, "Error", PyExc_ValueError);

  nb::class_<longattn::AttentionSpec>(m, "AttentionSpec",
                                      "Which attention runs, parsed once from a spec string: dense, "
                                      "dilated:w=...;r=...[;mode=head_groups], block_sparse:pattern=..., auto")
      .def("__init__",
           [](longattn::AttentionSpec* spec, const std::string& text) {
             new (spec) longattn::AttentionSpec(longattn::parse_attention_spec(text));
           })
      .def("__str__", [](const longattn::AttentionSpec& spec) { return longattn::to_string(spec); })
      .def("__repr__",
           [](const longattn::AttentionSpec& spec) { return "AttentionSpec(\"" + longattn::to_string(spec) + "\")"; })
      .def("__eq__", [](const longattn::AttentionSpec& a, const longattn::AttentionSpec& b) { return a == b; })
      .def_prop_ro("kind", [](const longattn::AttentionSpec& spec) {
        using Kind = longattn::AttentionSpec::Kind;
        return spec.kind == Kind::dense ? "dense" : spec.kind == Kind::dilated ? "dilated"
                                                  : spec.kind == Kind::block_sparse ? "block_sparse" : "auto";
      });

  m.def("initialize", &initialize, nb::arg("threads").none() = nb::none(),
        "Starts Kokkos (threads: the host space's, default OMP_NUM_THREADS or every core) unless it runs");
  m.def(
      "concurrency",
      [] {
        int threads = 0;
        nb::gil_scoped_release unlocked;
        on_kernel_thread([&] { threads = context().exec().concurrency(); });
        return threads;
      },
      "Threads (host) the kernels run on");
  m.def("finalize", &finalize, "Releases the memory pool and stops Kokkos (registered with atexit)");
  m.def("is_initialized", &initialized);
  m.def("execution_space", [] { return std::string(Exec::name()); });
  m.def("memory_device", [] { return device_name(memory_device()); });
  m.def("block_size", &block_size, nb::arg("like"),
        "Tokens per block of the kernels for an array's dtype (the unit of a block mask)");
  m.def("data_pointer", [](const Input& array) { return reinterpret_cast<std::uintptr_t>(array.data()); },
        "The address this module sees for an array (tests check that nothing was copied)");

  m.def(
      "forward",
      [](const Input& q, const Input& k, const Input& v, const Array& o, const Array& lse,
         const longattn::AttentionSpec& spec, bool causal, std::optional<double> softmax_scale,
         std::int64_t query_offset, std::int64_t key_offset, std::optional<Mask> block_mask) {
        const Call call = make_call("longattn.attention_forward", spec, causal, softmax_scale, query_offset,
                                    key_offset, std::move(block_mask));
        nb::gil_scoped_release unlocked;
        on_kernel_thread([&] {
          with_storage_type("longattn.attention_forward", q,
                            [&](auto tag) { run_forward<decltype(tag)>(call, q, k, v, o, lse); });
        });
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("lse"), nb::arg("spec"), nb::arg("causal"),
      nb::arg("softmax_scale").none(), nb::arg("query_offset"), nb::arg("key_offset"), nb::arg("block_mask").none());

  m.def(
      "forward_seconds",
      [](const Input& q, const Input& k, const Input& v, const Array& o, const Array& lse,
         const longattn::AttentionSpec& spec, bool causal, int calls) {
        longattn::require(calls > 0, "longattn._core.forward_seconds", "calls", calls, "a positive count");
        const Call call = make_call("longattn._core.forward_seconds", spec, causal, std::nullopt, 0, 0, std::nullopt);
        double seconds = 0;
        nb::gil_scoped_release unlocked;
        on_kernel_thread([&] {
          with_storage_type("longattn._core.forward_seconds", q, [&](auto tag) {
            const auto start = std::chrono::steady_clock::now();
            for (int i = 0; i < calls; ++i) run_forward<decltype(tag)>(call, q, k, v, o, lse);
            seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls;
          });
        });
        return seconds;
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("lse"), nb::arg("spec"), nb::arg("causal"),
      nb::arg("calls"),
      "Seconds per forward call timed in C++, on the kernel thread (the binding's overhead is a Python "
      "call's time over this, measured in the same process: perf_tests/compare_python.py)");

  m.def(
      "backward",
      [](const Input& q, const Input& k, const Input& v, const Input& o, const Input& d_o, const Input& lse,
         const Array& dq, const Array& dk, const Array& dv, const longattn::AttentionSpec& spec, bool causal,
         std::optional<double> softmax_scale, std::int64_t query_offset, std::int64_t key_offset,
         std::optional<Mask> block_mask) {
        const Call call = make_call("longattn.attention_backward", spec, causal, softmax_scale, query_offset,
                                    key_offset, std::move(block_mask));
        nb::gil_scoped_release unlocked;
        on_kernel_thread([&] {
          with_storage_type("longattn.attention_backward", q, [&](auto tag) {
            run_backward<decltype(tag)>(call, q, k, v, o, d_o, lse, dq, dk, dv);
          });
        });
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("d_o"), nb::arg("lse"), nb::arg("dq"),
      nb::arg("dk"), nb::arg("dv"), nb::arg("spec"), nb::arg("causal"), nb::arg("softmax_scale").none(),
      nb::arg("query_offset"), nb::arg("key_offset"), nb::arg("block_mask").none());
}
