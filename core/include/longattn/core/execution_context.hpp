// ExecutionContext<ExecSpace>: where longattn's work runs and where its buffers come from.
//
//   Kokkos::OpenMP exec = ...;                       // the caller's instance (a stream on CUDA)
//   memory::PoolOptions limit;
//   limit.limit_bytes = std::size_t(8) << 30;        // optional: never more than 8 GiB
//   longattn::ExecutionContext<Kokkos::OpenMP> ctx(exec, memory::Pool<Kokkos::HostSpace>(limit));
//   longattn::MultiheadAttention<Kokkos::OpenMP> layer(ctx, 1024, 16);
//
// Every kernel, gemm and copy a module or function launches runs on ctx.exec(); every buffer it
// allocates (backward's Delta, dilated attention's partial results, top-k's pooled blocks, a
// module's parameters and activations) is a PooledView from ctx.pool(), so a training step
// reuses the previous step's memory and a pool's limit bounds what longattn holds (a request
// past it is a longattn::Error naming the pool, the request and what it holds). Without a pool
// the context takes the memory space's memory::default_pool; a default-constructed context is the
// space's default instance with that pool.
//
// Functions that allocate (attention_backward, dilated attention, top-k layouts, ring attention)
// take a context or a bare instance (then the default pool) as their first argument.
//
// A buffer goes back to the pool when its last PooledView goes, which may be before kernels
// that use it have finished on an asynchronous instance. The next user of that memory is then
// ordered after them only if it runs on the same instance: work on another instance that shares
// the pool must fence first (as with any stream-ordered allocator), or use its own pool.
#pragma once

#include <Kokkos_Core.hpp>

#include <type_traits>

#include "longattn/memory/pool.hpp"
#include "longattn/memory/pooled_view.hpp"

namespace longattn {

template <class ExecSpace>
class ExecutionContext {
  static_assert(Kokkos::is_execution_space<ExecSpace>::value, "ExecutionContext<ExecSpace>: a Kokkos execution space");

 public:
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;
  using pool_type = memory::Pool<memory_space>;

  ExecutionContext() : ExecutionContext(ExecSpace()) {}
  explicit ExecutionContext(const ExecSpace& exec) : exec_(exec), pool_(memory::default_pool<memory_space>()) {}
  ExecutionContext(const ExecSpace& exec, const pool_type& pool) : exec_(exec), pool_(pool) {}

  const ExecSpace& exec() const { return exec_; }
  const pool_type& pool() const { return pool_; }

  // A ViewType of the given extents from the pool, uninitialized (callers write every element
  // they read).
  template <class ViewType, class... Extents>
  memory::PooledView<ViewType> allocate(Extents... extents) const {
    static_assert(std::is_same_v<typename ViewType::memory_space, memory_space>,
                  "ExecutionContext::allocate: a view in the context's memory space");
    return memory::PooledView<ViewType>(pool_, extents...);
  }

 private:
  ExecSpace exec_;
  pool_type pool_;
};

namespace detail {
template <class On>
struct ContextOf {
  static_assert(Kokkos::is_execution_space<On>::value, "an execution space instance or an ExecutionContext");
  using execution_space = On;
};
template <class ExecSpace>
struct ContextOf<ExecutionContext<ExecSpace>> {
  using execution_space = ExecSpace;
};
}  // namespace detail

// The execution space of what a function was given to run on: an instance or a context.
template <class On>
using execution_space_of = typename detail::ContextOf<On>::execution_space;

// The context a function runs in, from an instance (with the default pool) or a context.
template <class ExecSpace>
ExecutionContext<ExecSpace> context_of(const ExecSpace& exec) {
  return ExecutionContext<ExecSpace>(exec);
}
template <class ExecSpace>
const ExecutionContext<ExecSpace>& context_of(const ExecutionContext<ExecSpace>& context) {
  return context;
}

// The instance to run on, from an instance or a context (no pool needed).
template <class ExecSpace>
const ExecSpace& instance_of(const ExecSpace& exec) {
  return exec;
}
template <class ExecSpace>
const ExecSpace& instance_of(const ExecutionContext<ExecSpace>& context) {
  return context.exec();
}

}  // namespace longattn
