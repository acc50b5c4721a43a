// detail::allocate_workspace: the one function through which the core and its modules allocate
// their own buffers (backward's Delta, dilated attention's partial results, top-k's pooled
// blocks, a module's parameters and activations). They come from the memory space's default pool
// (memory::default_pool), so a training step reuses the previous step's memory instead of asking
// the space again (cudaMalloc synchronizes the device; fresh host pages fault in on first touch),
// and the pool's statistics show what the core holds.
//
// A workspace goes back to the pool when its last PooledView goes, which may be before kernels
// that use it have finished on an asynchronous instance. The next user of that memory is then
// ordered after them only if it runs on the same instance: work on another instance must fence
// first (as with any stream-ordered allocator).
#pragma once

#include <Kokkos_Core.hpp>

#include "longattn/memory/pooled_view.hpp"

namespace longattn::detail {

// A ViewType of the given extents, uninitialized (callers write every element they read).
template <class ViewType, class... Extents>
memory::PooledView<ViewType> allocate_workspace(Extents... extents) {
  return memory::PooledView<ViewType>(memory::default_pool<typename ViewType::memory_space>(), extents...);
}

}  // namespace longattn::detail
