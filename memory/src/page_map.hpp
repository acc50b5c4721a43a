#pragma once
// PageMap (internal): which chunk or slab each 64 KiB page of the address space belongs to, so
// that deallocate(ptr) finds a block's owner without a lock and without touching the block
// (device memory is never read). A two-level radix table over 48-bit addresses: a top array of
// 2^16 leaves, each leaf 2^16 entries covering 4 GiB. Both levels come from calloc, so only the
// entries written cost memory. Entries are written when chunks and slabs come and go, by
// several arenas at once, each on its own pages.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace longattn::memory::detail {

class PageMap {
 public:
  static constexpr unsigned page_shift = 16, leaf_bits = 16, top_bits = 16;
  static constexpr std::uintptr_t address_limit = std::uintptr_t(1) << (page_shift + leaf_bits + top_bits);

  PageMap() : top_(static_cast<std::atomic<Leaf*>*>(std::calloc(top_size, sizeof(std::atomic<Leaf*>)))) {
    if (!top_) throw std::bad_alloc();
  }
  ~PageMap() {
    for (std::size_t i = 0; i < top_size; ++i) std::free(top_[i].load(std::memory_order_relaxed));
    std::free(top_);
  }
  PageMap(const PageMap&) = delete;
  PageMap& operator=(const PageMap&) = delete;

  // The entry of the page holding `address`; 0 if none.
  std::uintptr_t get(std::uintptr_t address) const noexcept {
    if (address >= address_limit) return 0;
    const Leaf* leaf = top_[address >> (page_shift + leaf_bits)].load(std::memory_order_acquire);
    if (!leaf) return 0;
    return leaf->entries[(address >> page_shift) & leaf_mask].load(std::memory_order_acquire);
  }

  // Sets the entries of the pages [begin, end) (page-aligned, below address_limit).
  void set(std::uintptr_t begin, std::uintptr_t end, std::uintptr_t value) {
    for (std::uintptr_t page = begin; page < end; page += std::uintptr_t(1) << page_shift) {
      std::atomic<Leaf*>& slot = top_[page >> (page_shift + leaf_bits)];
      Leaf* leaf = slot.load(std::memory_order_acquire);
      if (!leaf) {
        Leaf* fresh = static_cast<Leaf*>(std::calloc(1, sizeof(Leaf)));
        if (!fresh) throw std::bad_alloc();
        if (slot.compare_exchange_strong(leaf, fresh, std::memory_order_acq_rel)) leaf = fresh;
        else std::free(fresh);  // another arena installed it first; `leaf` now holds theirs
      }
      leaf->entries[(page >> page_shift) & leaf_mask].store(value, std::memory_order_release);
    }
  }

 private:
  static constexpr std::size_t top_size = std::size_t(1) << top_bits;
  static constexpr std::uintptr_t leaf_mask = (std::uintptr_t(1) << leaf_bits) - 1;
  struct Leaf {
    std::atomic<std::uintptr_t> entries[std::size_t(1) << leaf_bits];
  };
  std::atomic<Leaf*>* top_;
};

}  // namespace longattn::memory::detail
