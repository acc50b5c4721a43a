// Arena: chunks from the memory space and the spans in them (large blocks and slabs), best fit
// from an address-ordered free list that coalesces neighbours; growth, consolidation and release
// of chunks. The size classes on top are in size_classes.cpp, thread caches in thread_cache.cpp.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <sstream>

#include "longattn/error.hpp"
#include "pool_state.hpp"

namespace longattn::memory::detail {
namespace {

std::atomic<std::uint64_t> next_arena_id{1};

std::string mib(std::size_t bytes) {
  std::ostringstream out;
  out.precision(1);
  out << std::fixed << double(bytes) / double(1 << 20) << " MiB";
  return out.str();
}

}  // namespace

Arena::Arena(PoolState& pool, std::unique_ptr<ChunkSource> source)
    : pool_(pool), source_(std::move(source)), id_(next_arena_id.fetch_add(1)), binding_(source_->binding()) {
  register_arena(this);
}

Arena::~Arena() {
  unregister_arena(this);  // exiting threads no longer hand their caches back here
  caches_.clear();
  slabs_.clear();
  for (auto& chunk : chunks_) source_->release(chunk->raw, chunk->raw_bytes);
  pool_.unreserve(reserved_);
}

// ------------------------------------------------------------------------------ spans
void Arena::add_free(Heap& heap, std::uintptr_t begin, std::size_t bytes, Chunk* chunk) {
  heap.by_address.emplace(begin, std::make_pair(bytes, chunk));
  heap.by_size.emplace(bytes, begin);
  heap.free_bytes += bytes;
}

void Arena::remove_free(Heap& heap, std::uintptr_t begin) {
  const auto it = heap.by_address.find(begin);
  heap.by_size.erase({it->second.first, begin});
  heap.free_bytes -= it->second.first;
  heap.by_address.erase(it);
}

// Best fit: the smallest free span that holds `bytes` at `alignment`, the lowest address among
// equals; the block is cut from its front (after what the alignment skips), the rest stays free.
// Spans begin on large_granule boundaries (slabs on pages), so an alignment up to the granule
// costs nothing and a larger one at most alignment - large_granule.
std::uintptr_t Arena::take_span(int heap_index, std::size_t bytes, std::size_t alignment, std::string& why) {
  Heap& heap = heaps_[heap_index];
  const std::size_t needed = bytes + (alignment > large_granule ? alignment - large_granule : 0);
  auto fit = heap.by_size.lower_bound({needed, 0});
  if (fit == heap.by_size.end()) {
    if (!grow(heap_index, needed, why)) return 0;
    fit = heap.by_size.lower_bound({needed, 0});
  }
  const std::uintptr_t span = fit->second;
  const auto [span_bytes, chunk] = heap.by_address.at(span);
  const std::uintptr_t begin = round_up(span, alignment);
  remove_free(heap, span);
  if (begin > span) add_free(heap, span, begin - span, chunk);
  if (span + span_bytes > begin + bytes) add_free(heap, begin + bytes, span + span_bytes - begin - bytes, chunk);
  chunk->free_bytes -= bytes;
  live_spans_.emplace(begin, bytes);
  return begin;
}

// The span starting at `begin` becomes free and merges with free neighbours in its chunk.
void Arena::return_span(Chunk& chunk, std::uintptr_t begin) {
  Heap& heap = heaps_[chunk.heap];
  const auto live = live_spans_.find(begin);
  std::size_t bytes = live->second;
  live_spans_.erase(live);
  chunk.free_bytes += bytes;
  const auto next = heap.by_address.find(begin + bytes);
  if (next != heap.by_address.end() && next->second.second == &chunk) {
    bytes += next->second.first;
    remove_free(heap, next->first);
  }
  auto previous = heap.by_address.lower_bound(begin);
  if (previous != heap.by_address.begin()) {
    --previous;
    if (previous->second.second == &chunk && previous->first + previous->second.first == begin) {
      begin = previous->first;
      bytes += previous->second.first;
      remove_free(heap, begin);
    }
  }
  add_free(heap, begin, bytes, &chunk);
  if (chunk.wholly_free()) settle_free_chunks(chunk.heap);
}

// No free span holds `bytes`. First the heap's chunk with the largest free tail grows in place
// by what is missing (at least min_chunk_bytes), where the space allows it. Otherwise a new
// chunk: wholly free chunks of the heap are too small for the request, so they go back first
// and their size joins the new chunk, which is at least `growth` of what the heap holds: a run
// whose memory grows in steps ends up in a few large chunks, not many small ones.
bool Arena::grow(int heap, std::size_t bytes, std::string& why) {
  if (extend_in_place(heap, bytes, why)) return true;
  if (!why.empty()) return false;  // the limit refused
  const std::size_t idle = release_wholly_free(heap);
  std::size_t held = 0;
  for (const auto& chunk : chunks_) held += chunk->heap == heap ? chunk->bytes() : 0;
  const std::size_t wanted =
      std::max({pool_.options.min_chunk_bytes, bytes + idle, std::size_t(pool_.options.growth * double(held))});
  if (obtain_chunk(heap, round_up(wanted, page_bytes), why)) return true;
  return wanted > bytes && obtain_chunk(heap, round_up(bytes, page_bytes), why);  // at the limit: just what is needed
}

// The free span that ends where `chunk` ends, 0 if its last page is in use.
std::size_t Arena::free_tail(const Chunk& chunk) const {
  const Heap& heap = heaps_[chunk.heap];
  auto last = heap.by_address.lower_bound(chunk.end);
  if (last == heap.by_address.begin()) return 0;
  --last;
  const auto& [bytes, owner] = last->second;
  return owner == &chunk && last->first + bytes == chunk.end ? bytes : 0;
}

bool Arena::extend_in_place(int heap, std::size_t bytes, std::string& why) {
  Chunk* chunk = nullptr;
  std::size_t tail = 0;
  for (const auto& c : chunks_)
    if (c->heap == heap && c->raw == reinterpret_cast<void*>(c->begin) && (!chunk || free_tail(*c) > tail)) {
      chunk = c.get();
      tail = free_tail(*c);
    }
  if (!chunk) return false;
  const std::size_t needed = round_up(bytes - std::min(bytes, tail), page_bytes);
  std::size_t more = round_up(std::max(needed, pool_.options.min_chunk_bytes), page_bytes);
  if (!pool_.reserve(more)) {
    more = needed;  // at the limit: just what is missing
    if (!pool_.reserve(more)) {
      why = "growing by " + mib(more) + " would pass the pool's limit of " + mib(pool_.limit);
      return false;
    }
  }
  if (!source_->extend(chunk->raw, chunk->raw_bytes, more)) {
    pool_.unreserve(more);
    return false;
  }
  const std::uintptr_t added = chunk->end;
  const std::string refused = source_->prepare(reinterpret_cast<void*>(added), more);
  if (!refused.empty()) {
    binding_ = "refused by the OS (memory left unbound): " + refused;
    pool_.binding_refused(source_->describe(), refused);
  }
  pool_.page_map.set(added, added + more, chunk_entry(chunk));
  chunk->end += more;
  chunk->raw_bytes += more;
  chunk->free_bytes += more;
  reserved_ += more;
  if (tail > 0) remove_free(heaps_[heap], added - tail);
  add_free(heaps_[heap], added - tail, tail + more, chunk);
  return true;
}

Chunk* Arena::obtain_chunk(int heap, std::size_t bytes, std::string& why) {
  const std::size_t slack = source_->alignment() >= page_bytes ? 0 : page_bytes - source_->alignment();
  const std::size_t raw_bytes = bytes + slack;
  if (!pool_.reserve(raw_bytes)) {
    why = "a chunk of " + mib(raw_bytes) + " would pass the pool's limit of " + mib(pool_.limit);
    return nullptr;
  }
  void* raw = nullptr;
  try {
    raw = source_->obtain(raw_bytes);
  } catch (const std::exception& e) {
    why = source_->describe() + " could not provide " + mib(raw_bytes) + ": " + e.what();
  }
  if (!raw) {
    if (why.empty()) why = source_->describe() + " could not provide " + mib(raw_bytes);
    pool_.unreserve(raw_bytes);
    return nullptr;
  }
  auto chunk = std::make_unique<Chunk>();
  chunk->raw = raw;
  chunk->raw_bytes = raw_bytes;
  chunk->begin = round_up(reinterpret_cast<std::uintptr_t>(raw), page_bytes);
  chunk->end = chunk->begin + bytes;
  chunk->heap = heap;
  chunk->arena = this;
  if (chunk->end > PageMap::address_limit) {
    source_->release(raw, raw_bytes);
    pool_.unreserve(raw_bytes);
    why = source_->describe() + " returned memory above the 48-bit addresses the pool maps";
    return nullptr;
  }
  const std::string refused = source_->prepare(reinterpret_cast<void*>(chunk->begin), bytes);
  if (!refused.empty()) {
    binding_ = "refused by the OS (memory left unbound): " + refused;
    pool_.binding_refused(source_->describe(), refused);
  }
  pool_.page_map.set(chunk->begin, chunk->end, chunk_entry(chunk.get()));
  add_free(heaps_[heap], chunk->begin, bytes, chunk.get());
  chunk->free_bytes = bytes;
  reserved_ += raw_bytes;
  overhead_ += raw_bytes - bytes;
  ++chunks_obtained_;
  chunks_.push_back(std::move(chunk));
  return chunks_.back().get();
}

void Arena::release_chunk(Chunk* chunk) {
  remove_free(heaps_[chunk->heap], chunk->begin);
  pool_.page_map.set(chunk->begin, chunk->end, 0);
  source_->release(chunk->raw, chunk->raw_bytes);
  pool_.unreserve(chunk->raw_bytes);
  reserved_ -= chunk->raw_bytes;
  overhead_ -= chunk->raw_bytes - chunk->bytes();
  ++chunks_released_;
  chunks_.erase(std::find_if(chunks_.begin(), chunks_.end(), [&](const auto& c) { return c.get() == chunk; }));
}

std::size_t Arena::release_wholly_free(int heap) {
  std::vector<Chunk*> idle;
  for (const auto& chunk : chunks_)
    if (chunk->heap == heap && chunk->wholly_free()) idle.push_back(chunk.get());
  std::size_t released = 0;
  for (Chunk* chunk : idle) {
    released += chunk->bytes();
    release_chunk(chunk);
  }
  return released;
}

// A chunk just became wholly free. Two or more wholly free chunks of a heap are merged into one
// (their memory was needed together once and will be again); wholly free bytes beyond the
// release threshold go back to the space, largest chunk first.
void Arena::settle_free_chunks(int heap) {
  if (trimming_) return;  // trim() releases them all anyway
  std::size_t idle_chunks = 0;
  for (const auto& chunk : chunks_) idle_chunks += chunk->heap == heap && chunk->wholly_free();
  if (idle_chunks >= 2) {
    const std::size_t merged = release_wholly_free(heap);
    std::string ignored;  // if the space refuses the merged chunk, the memory is simply given back
    obtain_chunk(heap, merged, ignored);
  }
  std::size_t idle_bytes = 0;
  for (const auto& chunk : chunks_) idle_bytes += chunk->wholly_free() ? chunk->bytes() : 0;
  while (idle_bytes > pool_.options.release_threshold_bytes) {
    Chunk* largest = nullptr;
    for (const auto& chunk : chunks_)
      if (chunk->wholly_free() && (!largest || chunk->bytes() > largest->bytes())) largest = chunk.get();
    idle_bytes -= largest->bytes();
    release_chunk(largest);
  }
}

// ------------------------------------------------------------------------------ large blocks
void* Arena::allocate_large(std::size_t bytes, std::size_t alignment, std::string& why) {
  std::uintptr_t begin = 0;
  {
    const Lock lock(mutex_);
    begin = take_span(large_heap, bytes, alignment, why);
    if (!begin) return nullptr;
    ++large_allocations_;
  }
  pool_.lent(bytes, existing_thread_cache_of(id_));
  return reinterpret_cast<void*>(begin);
}

void Arena::deallocate_large(Chunk& chunk, void* ptr) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  std::size_t bytes = 0;
  {
    const Lock lock(mutex_);
    const auto live = live_spans_.find(address);
    if (live == live_spans_.end()) {
      const Heap& heap = heaps_[chunk.heap];
      auto span = heap.by_address.upper_bound(address);
      const bool in_free_span = span != heap.by_address.begin() && (--span, address < span->first + span->second.first);
      throw_bad_block(ptr, in_free_span ? "a live block (this memory is free already: a double free?)"
                                        : "the start of a block (it points inside one)");
    }
    bytes = live->second;
    return_span(chunk, address);
    ++large_deallocations_;
  }
  pool_.returned(bytes, existing_thread_cache_of(id_));
}

std::size_t Arena::large_block_size(const void* ptr) const {
  const Lock lock(mutex_);
  const auto live = live_spans_.find(reinterpret_cast<std::uintptr_t>(ptr));
  return live == live_spans_.end() ? 0 : live->second;
}

// ------------------------------------------------------------------------------ release, stats
void Arena::release_unused() {
  if (ThreadCache* cache = existing_thread_cache_of(id_)) flush(*cache);
  {
    const Lock lock(mutex_);
    trimming_ = true;
  }
  for (int c = 0; c < class_count; ++c) {
    std::vector<Slab*> empty;
    {
      SizeClassList& list = classes_[c];
      const Lock lock(list.mutex);
      for (Slab* slab = list.partial; slab;) {
        Slab* next = slab->next;
        if (slab->free_blocks.size() == slab->blocks) {
          unlink(list, slab);
          list.free_blocks -= slab->blocks;
          empty.push_back(slab);
        }
        slab = next;
      }
    }
    for (Slab* slab : empty) release_slab(slab);
  }
  const Lock lock(mutex_);
  trimming_ = false;
  release_wholly_free(large_heap);
  release_wholly_free(slab_heap);
}

PoolStats Arena::stats() const {
  PoolStats s;
  s.name = source_->describe();
  std::uint64_t allocations = 0, deallocations = 0;
  {
    const Lock lock(mutex_);
    s.reserved_bytes = reserved_;
    s.overhead_bytes = overhead_;
    s.chunks = chunks_.size();
    s.chunks_obtained = chunks_obtained_;
    s.chunks_released = chunks_released_;
    for (const Heap& heap : heaps_) {
      s.free_bytes += heap.free_bytes;
      if (!heap.by_size.empty()) s.largest_free_block_bytes = std::max(s.largest_free_block_bytes, heap.by_size.rbegin()->first);
    }
    for (const auto& [begin, slab] : slabs_) s.overhead_bytes += slab->span_bytes - std::size_t(slab->blocks) * slab->block_bytes;
    allocations = large_allocations_;
    deallocations = large_deallocations_;
    s.binding = binding_;
  }
  for (int c = 0; c < class_count; ++c) {
    SizeClassList& list = classes_[c];
    const Lock lock(list.mutex);
    s.cached_bytes += list.free_blocks * class_size(c);
  }
  {
    const std::lock_guard<std::mutex> lock(caches_mutex_);
    for (const auto& cache : caches_) {
      s.cached_bytes += std::size_t(cache->cached_bytes.get());
      allocations += cache->hits.get() + cache->misses.get();
      deallocations += cache->deallocations.get();
      s.cache_hits += cache->hits.get();
      s.cache_misses += cache->misses.get();
    }
  }
  s.allocations = allocations + small_allocations_.load();
  s.deallocations = deallocations + small_deallocations_.load();
  s.cache_hits += retired_hits_.load();
  s.cache_misses += retired_misses_.load();
  // Derived, so exact when no thread is allocating; clamped for a picture taken mid-flight.
  const auto lent = std::int64_t(s.reserved_bytes) - std::int64_t(s.overhead_bytes + s.free_bytes + s.cached_bytes);
  s.in_use_bytes = std::size_t(std::max<std::int64_t>(lent, 0));
  s.limit_bytes = pool_.limit;
  return s;
}

}  // namespace longattn::memory::detail
