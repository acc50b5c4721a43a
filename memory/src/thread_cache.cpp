// Thread caches: each thread keeps, per arena it uses, a ThreadCache of recently freed blocks.
// The arena owns the cache; the thread finds it through a small thread-local table of
// (arena id, cache) pairs. Arena ids are never reused, so an entry of a destroyed arena is never
// matched again. When the thread exits, its caches go back to their arenas, if still alive.
#include <unordered_map>

#include "pool_state.hpp"

namespace longattn::memory::detail {
namespace {

// Arenas alive, by id. Never destroyed: threads may exit after static destructors have run.
struct LiveArenas {
  std::mutex mutex;
  std::unordered_map<std::uint64_t, Arena*> arenas;
};
LiveArenas& live_arenas() {
  static LiveArenas* const live = new LiveArenas;
  return *live;
}

// The table lives in a thread_local with a destructor, made on the first cache.
ThreadCaches& this_thread() {
  static thread_local ThreadCaches caches;
  this_thread_caches = &caches;
  return caches;
}

// Called with live_arenas().mutex held.
void retire(const ThreadCaches::Slot& slot) {
  const auto arena = live_arenas().arenas.find(slot.arena_id);
  if (arena != live_arenas().arenas.end()) arena->second->retire_thread_cache(slot.cache);
}

}  // namespace

__thread ThreadCaches* this_thread_caches __attribute__((tls_model("initial-exec"))) = nullptr;

ThreadCaches::~ThreadCaches() {
  const std::lock_guard<std::mutex> lock(live_arenas().mutex);
  for (int i = 0; i < count; ++i) retire(slots[i]);
  this_thread_caches = nullptr;
}

void register_arena(Arena* arena) {
  const std::lock_guard<std::mutex> lock(live_arenas().mutex);
  live_arenas().arenas.emplace(arena->id(), arena);
}

void unregister_arena(Arena* arena) {
  const std::lock_guard<std::mutex> lock(live_arenas().mutex);
  live_arenas().arenas.erase(arena->id());
}

ThreadCache::ThreadCache() {
  std::size_t total = 0;
  for (int c = 0; c < class_count; ++c) total += cache_capacity(c);
  storage = std::make_unique<CachedBlock[]>(total);
  CachedBlock* next = storage.get();
  for (int c = 0; c < class_count; ++c) {
    bins[c].capacity = cache_capacity(c);
    bins[c].blocks = next;
    next += bins[c].capacity;
  }
}

ThreadCache* make_thread_cache_of(Arena& arena) {
  ThreadCaches& caches = this_thread_caches ? *this_thread_caches : this_thread();
  if (caches.count == ThreadCaches::capacity) {
    const std::lock_guard<std::mutex> lock(live_arenas().mutex);
    retire(caches.slots[0]);
    for (int i = 1; i < caches.count; ++i) caches.slots[i - 1] = caches.slots[i];
    --caches.count;
  }
  caches.slots[caches.count++] = ThreadCaches::Slot{arena.id(), arena.make_thread_cache()};
  return caches.slots[caches.count - 1].cache;
}

ThreadCache* Arena::make_thread_cache() {
  auto cache = std::make_unique<ThreadCache>();
  ThreadCache* made = cache.get();
  const std::lock_guard<std::mutex> lock(caches_mutex_);
  caches_.push_back(std::move(cache));
  return made;
}

std::int64_t Arena::unpublished_in_use() const {
  const std::lock_guard<std::mutex> lock(caches_mutex_);
  std::int64_t sum = 0;
  for (const auto& cache : caches_) sum += cache->unpublished.get();
  return sum;
}

void Arena::flush(ThreadCache& cache) {
  for (int c = 0; c < class_count; ++c) {
    ThreadCache::Bin& bin = cache.bins[c];
    if (bin.count == 0) continue;
    return_blocks(c, bin.blocks, bin.count);
    cache.cached_bytes.add(-std::int64_t(bin.count * class_size(c)));
    bin.count = 0;
  }
}

void Arena::retire_thread_cache(ThreadCache* cache) {
  flush(*cache);
  const std::lock_guard<std::mutex> lock(caches_mutex_);
  cache->unpublished.set(pool_.publish(*cache, cache->unpublished.get()));
  small_allocations_ += cache->hits.get() + cache->misses.get();
  small_deallocations_ += cache->deallocations.get();
  retired_hits_ += cache->hits.get();
  retired_misses_ += cache->misses.get();
  for (auto it = caches_.begin(); it != caches_.end(); ++it)
    if (it->get() == cache) {
      caches_.erase(it);
      break;
    }
}

}  // namespace longattn::memory::detail
