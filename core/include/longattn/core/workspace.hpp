// detail::allocate_workspace: the one function through which the core and its modules allocate their
// own buffers (backward's Delta, dilated attention's partial results, a module's parameters and
// activations). The memory layer's pool takes over here, in one place, when it lands.
#pragma once

#include <Kokkos_Core.hpp>

#include <string>

namespace longattn::detail {

// A View of type ViewType with the given extents, allocated on exec's memory space without
// initialization (callers write every element they read).
template <class ViewType, class ExecSpace, class... Extents>
ViewType allocate_workspace(const ExecSpace& exec, const std::string& label, Extents... extents) {
  return ViewType(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, label), extents...);
}

}  // namespace longattn::detail
