#pragma once
// PooledView<ViewType>: a Kokkos View whose memory comes from a Pool and goes back to it when
// the last copy of the PooledView is gone. The view itself is an ordinary (unmanaged) ViewType:
// pass view() - or the PooledView, which converts - to any kernel.
//
//   memory::Pool<Kokkos::HostSpace> pool;
//   memory::PooledView<Kokkos::View<float**, Kokkos::LayoutRight>> a(pool, rows, cols);
//   Kokkos::deep_copy(a.view(), 1.0f);
//
// Ownership is the PooledView's, not the view's: copies of the PooledView share the block (like
// View) and the block returns to the pool when the last of them goes, but a ViewType taken from
// it (view(), the conversion) borrows, like std::string_view from a std::string: keep the
// PooledView (a member, a local) while kernels use the view. Kokkos gives no public way to attach
// a pool block to a View's own reference count, so the misuse that would dangle at once is
// refused at compile time instead: view(), the conversion and data() exist only on a PooledView
// that lives on (an lvalue), never on a temporary such as `PooledView<V>(pool, n).view()`.
// The block keeps its pool alive, so a PooledView may outlive every Pool handle. Contents are
// uninitialized, as with Kokkos::WithoutInitializing. The block counts under the calling thread's
// memory::Category (category.hpp) while the PooledView lives.
#include <Kokkos_Core.hpp>

#include <cstddef>
#include <memory>
#include <type_traits>

#include "longattn/memory/pool.hpp"

namespace longattn::memory {

template <class ViewType>
class PooledView {
  static_assert(Kokkos::is_view<ViewType>::value, "PooledView<ViewType>: ViewType is a Kokkos::View");
  static_assert(!std::is_same_v<typename ViewType::array_layout, Kokkos::LayoutStride>,
                "PooledView: a layout whose size follows from the extents (LayoutRight or LayoutLeft)");

 public:
  using view_type = ViewType;
  using memory_space = typename ViewType::memory_space;

  PooledView() = default;

  // A view of the given extents in a block from `pool` (none for zero elements).
  template <class... Extents>
  explicit PooledView(const Pool<memory_space>& pool, Extents... extents) {
    const std::size_t bytes = ViewType::required_allocation_size(std::size_t(extents)...);
    using Value = typename ViewType::value_type;
    const std::size_t alignment = alignof(Value) > default_alignment ? alignof(Value) : default_alignment;
    void* block = bytes > 0 ? pool.allocate(bytes, alignment) : nullptr;
    if (block) {
      std::shared_ptr<detail::PoolState> owner = pool.state_;
      const Category category = current_category();
      const std::size_t counted = block_bytes(bytes, alignment);
      detail::count_block(*owner, category, counted);
      memory_ = std::shared_ptr<void>(
          block, [owner, category, counted](void* p) { detail::release_block(*owner, p, category, counted); });
    }
    view_ = ViewType(static_cast<Value*>(block), std::size_t(extents)...);
  }

  const ViewType& view() const& noexcept { return view_; }
  operator const ViewType&() const& noexcept { return view_; }  // NOLINT: a PooledView is used as its view
  typename ViewType::pointer_type data() const& noexcept { return view_.data(); }
  // A temporary's view would dangle when the statement ends: keep the PooledView instead.
  const ViewType& view() const&& = delete;
  operator const ViewType&() const&& = delete;
  typename ViewType::pointer_type data() const&& = delete;

  std::size_t size() const noexcept { return view_.size(); }
  template <class Rank>
  std::size_t extent(Rank r) const noexcept { return view_.extent(r); }
  // Bytes the view spans (its block may be larger).
  std::size_t bytes() const noexcept { return view_.span() * sizeof(typename ViewType::value_type); }

 private:
  ViewType view_;
  std::shared_ptr<void> memory_;
};

}  // namespace longattn::memory
