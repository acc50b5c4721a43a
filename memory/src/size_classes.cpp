// Size classes: slabs of equal blocks, a central list per class (locked), and the thread caches
// in front of it (lock-free for their own thread). A block's state is one byte in its slab
// ("lent" or not), so a double free is caught wherever the block sits.
#include <cstring>

#include "longattn/error.hpp"
#include "pool_state.hpp"

namespace longattn::memory::detail {

void Arena::link(SizeClassList& list, Slab* slab) {
  slab->prev = nullptr;
  slab->next = list.partial;
  if (list.partial) list.partial->prev = slab;
  list.partial = slab;
  slab->listed = true;
  ++list.partial_slabs;
}

void Arena::unlink(SizeClassList& list, Slab* slab) {
  if (slab->prev) slab->prev->next = slab->next;
  else list.partial = slab->next;
  if (slab->next) slab->next->prev = slab->prev;
  slab->prev = slab->next = nullptr;
  slab->listed = false;
  --list.partial_slabs;
}

// A new slab for `size_class`: a span from the slab heap, every block free. Called with the
// class's mutex held (then the arena's is taken: the lock order).
Slab* Arena::make_slab(int size_class, std::string& why) {
  const Lock lock(mutex_);
  const std::size_t span_bytes = slab_bytes(size_class);
  const std::uintptr_t begin = take_span(slab_heap, span_bytes, page_bytes, why);
  if (!begin) return nullptr;
  auto slab = std::make_unique<Slab>();
  slab->begin = begin;
  slab->chunk = reinterpret_cast<Chunk*>(pool_.page_map.get(begin));
  slab->span_bytes = span_bytes;
  slab->block_bytes = std::uint32_t(class_size(size_class));
  slab->blocks = std::uint32_t(span_bytes / class_size(size_class));
  slab->size_class = size_class;
  slab->arena = this;
  slab->index_multiplier = ((std::uint64_t(1) << Slab::index_shift) + slab->block_bytes - 1) / slab->block_bytes;
  const std::uint32_t batch = refill_blocks(size_class);
  while ((1u << slab->refill_shift) < batch) ++slab->refill_shift;
  slab->lent_lines = std::make_unique<Slab::FlagLine[]>((slab->blocks + batch - 1) / batch);
  for (std::uint32_t i = 0; i < slab->blocks; ++i) slab->lent(i).store(0, std::memory_order_relaxed);
  slab->free_blocks.reserve(slab->blocks);
  for (std::uint32_t i = slab->blocks; i-- > 0;) slab->free_blocks.push_back(i);  // lends lowest addresses first
  Slab* made = slab.get();
  pool_.page_map.set(begin, begin + span_bytes, slab_entry(made));
  slabs_.emplace(begin, std::move(slab));
  return made;
}

// A wholly free slab, already out of its class's list, goes back to the slab heap.
void Arena::release_slab(Slab* slab) {
  const Lock lock(mutex_);
  Chunk& chunk = *slab->chunk;
  const std::uintptr_t begin = slab->begin;
  pool_.page_map.set(begin, begin + slab->span_bytes, chunk_entry(&chunk));
  slabs_.erase(begin);
  return_span(chunk, begin);
}

// Up to `want` free blocks of the class from its central list, making a slab when it is empty.
std::uint32_t Arena::take_blocks(int size_class, CachedBlock* out, std::uint32_t want, std::string& why) {
  SizeClassList& list = classes_[size_class];
  const Lock lock(list.mutex);
  std::uint32_t taken = 0;
  while (taken < want) {
    Slab* slab = list.partial;
    if (!slab) {
      slab = make_slab(size_class, why);
      if (!slab) break;
      link(list, slab);
      list.free_blocks += slab->blocks;
    }
    while (taken < want && !slab->free_blocks.empty()) {
      const std::uint32_t i = slab->free_blocks.back();
      slab->free_blocks.pop_back();
      out[taken++] = CachedBlock{slab->block(i), slab, i};
      --list.free_blocks;
    }
    if (slab->free_blocks.empty()) unlink(list, slab);
  }
  return taken;
}

// Blocks back to the central list. A slab that becomes wholly free goes back to the slab heap,
// unless it is the class's only slab with free blocks (kept, so that a class used in bursts does
// not make and release a slab each time).
void Arena::return_blocks(int size_class, const CachedBlock* blocks, std::uint32_t count) {
  SizeClassList& list = classes_[size_class];
  Slab* empty[64];
  std::uint32_t empties = 0;
  {
    const Lock lock(list.mutex);
    for (std::uint32_t b = 0; b < count; ++b) {
      Slab* slab = blocks[b].slab;
      slab->free_blocks.push_back(blocks[b].index);
      ++list.free_blocks;
      if (!slab->listed) link(list, slab);
      if (slab->free_blocks.size() == slab->blocks && list.partial_slabs > 1 && empties < 64) {
        unlink(list, slab);
        list.free_blocks -= slab->blocks;
        empty[empties++] = slab;
      }
    }
  }
  for (std::uint32_t i = 0; i < empties; ++i) release_slab(empty[i]);
}

// The slow path of allocate: the thread's cache for the class is empty (refilled from the
// central list), or caches are off (one block from the central list).
void* Arena::allocate_small(int size_class, std::string& why) {
  ThreadCache* cache = thread_cache();
  CachedBlock block;
  if (cache) {
    ThreadCache::Bin& bin = cache->bins[size_class];
    if (bin.count > 0) return allocate_cached(size_class);
    cache->misses.add(1);
    bin.count = take_blocks(size_class, bin.blocks, refill_blocks(size_class), why);
    if (bin.count == 0) return nullptr;
    block = bin.blocks[--bin.count];
    cache->cached_bytes.add(std::int64_t(bin.count * class_size(size_class)));
  } else {
    if (take_blocks(size_class, &block, 1, why) == 0) return nullptr;
    small_allocations_.fetch_add(1, std::memory_order_relaxed);
  }
  block.slab->lent(block.index).store(1, std::memory_order_relaxed);
  pool_.lent(block.slab->block_bytes, cache);
  return block.ptr;
}

// The slow half of deallocate_small: the thread's bin is full (its older half goes back to the
// central list first), or caches are off.
void Arena::return_small(const CachedBlock& block, ThreadCache* cache) {
  const int size_class = block.slab->size_class;
  if (!cache) {
    return_blocks(size_class, &block, 1);
    small_deallocations_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  ThreadCache::Bin& bin = cache->bins[size_class];
  const std::uint32_t half = bin.capacity / 2;
  return_blocks(size_class, bin.blocks, half);
  std::memmove(bin.blocks, bin.blocks + half, (bin.count - half) * sizeof(CachedBlock));
  bin.count -= half;
  bin.blocks[bin.count++] = block;
  cache->cached_bytes.add(std::int64_t((1 - std::int64_t(half)) * block.slab->block_bytes));
  cache->deallocations.add(1);
}

}  // namespace longattn::memory::detail
