#pragma once
// The pool's internals: PoolState (what a Pool handle points to) owns the page map and one Arena
// per placement (one for device spaces; one per NUMA node, plus an interleaved one, for host
// pools). An arena owns its chunks, its free spans, its size classes and its threads' caches.
//
// Locks, always taken in this order: a size class's mutex, then the arena's mutex. Thread
// caches are touched only by their own thread (and by the arena when the thread has exited).
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "longattn/memory/pool.hpp"
#include "page_map.hpp"
#include "size_classes.hpp"

namespace longattn::memory::detail {

class Arena;

// A mutex that spins briefly before it sleeps. The pool's critical sections last ~100-300 ns,
// while a thread put to sleep waits for the kernel to wake it (tens of microseconds on a VM):
// spinning first keeps the tail latency of two threads sharing an arena near the section's.
class SpinThenBlockMutex {
 public:
  void lock() {
    for (int i = 0; i < 256; ++i) {
      if (mutex_.try_lock()) return;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#elif defined(__aarch64__)
      asm volatile("yield");
#endif
    }
    mutex_.lock();
  }
  bool try_lock() { return mutex_.try_lock(); }
  void unlock() { mutex_.unlock(); }

 private:
  std::mutex mutex_;
};
using Lock = std::lock_guard<SpinThenBlockMutex>;

// One allocation from the memory space; [begin, end) is its page-aligned usable part.
struct Chunk {
  void* raw = nullptr;
  std::size_t raw_bytes = 0;
  std::uintptr_t begin = 0, end = 0;
  std::size_t free_bytes = 0;  // in free spans
  int heap = 0;                // which of the arena's heaps it belongs to (large blocks or slabs)
  Arena* arena = nullptr;
  std::size_t bytes() const { return end - begin; }
  bool wholly_free() const { return free_bytes == bytes(); }
};

// A span of pages cut into blocks of one size class.
struct Slab {
  std::uintptr_t begin = 0;
  Chunk* chunk = nullptr;
  std::size_t span_bytes = 0;
  std::uint32_t block_bytes = 0, blocks = 0;
  int size_class = 0;
  Arena* arena = nullptr;
  // Per block: 1 while a caller holds it. Written on every allocate and free, so the flags of
  // the blocks a thread cache takes in one refill (refill_blocks of them, consecutive in a
  // fresh slab) share a cache line of their own: two threads cycling blocks of one slab do not
  // write the same line.
  struct alignas(64) FlagLine {
    std::atomic<std::uint8_t> flags[64];
  };
  std::unique_ptr<FlagLine[]> lent_lines;
  std::uint32_t refill_shift = 0;  // log2 of the class's refill batch
  std::atomic<std::uint8_t>& lent(std::uint32_t i) const {
    return lent_lines[i >> refill_shift].flags[i & ((1u << refill_shift) - 1)];
  }
  // Guarded by the size class's mutex:
  std::vector<std::uint32_t> free_blocks;  // blocks in the class's central list
  Slab* prev = nullptr;
  Slab* next = nullptr;
  bool listed = false;  // in the class's list of slabs with free blocks

  void* block(std::uint32_t i) const { return reinterpret_cast<void*>(begin + std::uintptr_t(i) * block_bytes); }
  // The block holding a byte offset, by a multiply and a shift instead of a division (which costs
  // several times more on the free path): with m = ceil(2^42 / block_bytes), (offset m) >> 42 is
  // exact for every offset below 2^42 / (m block_bytes - 2^42) > 2^42 / block_bytes >= 2^26,
  // i.e. anywhere in a slab (at most 256 KiB).
  static constexpr unsigned index_shift = 42;
  std::uint64_t index_multiplier = 0;
  std::uint32_t offset_of(const void* ptr) const { return std::uint32_t(reinterpret_cast<std::uintptr_t>(ptr) - begin); }
  std::uint32_t index_of(std::uint32_t offset) const { return std::uint32_t((offset * index_multiplier) >> index_shift); }
};

// Page map entries: a Chunk* for pages of large blocks and free spans, a Slab* | 1 for slab pages.
inline std::uintptr_t chunk_entry(Chunk* chunk) { return reinterpret_cast<std::uintptr_t>(chunk); }
inline std::uintptr_t slab_entry(Slab* slab) { return reinterpret_cast<std::uintptr_t>(slab) | 1; }

struct CachedBlock {
  void* ptr;
  Slab* slab;
  std::uint32_t index;  // in the slab
};

// A counter only its owner thread writes (a plain load and store, no locked instruction), that
// any thread may read.
template <class Int>
class OwnedCounter {
 public:
  void add(Int delta) noexcept { set(get() + delta); }
  void set(Int value) noexcept { value_.store(value, std::memory_order_relaxed); }
  Int get() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<Int> value_{0};
};

// One thread's recently freed blocks for one arena, per size class (a stack each: the most
// recently freed block is lent first, while it is still in cache). Cache-line aligned: another
// thread's cache never shares a line with it.
struct alignas(64) ThreadCache {
  struct Bin {
    std::uint32_t count = 0, capacity = 0;
    CachedBlock* blocks = nullptr;
  };
  Bin bins[class_count];
  std::unique_ptr<CachedBlock[]> storage;
  OwnedCounter<std::uint64_t> hits, misses, deallocations;  // allocations = hits + misses
  OwnedCounter<std::int64_t> cached_bytes;
  // Bytes lent minus bytes returned by this thread not yet added to the pool's count (published
  // past PoolState::publish_bytes, so that threads do not all write one counter).
  OwnedCounter<std::int64_t> unpublished;
  ThreadCache();
};

// Arenas alive, by id: a thread that exits hands its caches back only to those (thread_cache.cpp).
void register_arena(Arena* arena);
void unregister_arena(Arena* arena);

// This thread's caches, one per arena it used: (arena id, cache) pairs, found by a short scan.
// Eight arenas cover a process's pools on any machine (one arena per NUMA node a thread uses,
// per pool); a ninth evicts the oldest, whose blocks go back to its arena (thread_cache.cpp).
struct ThreadCaches {
  static constexpr int capacity = 8;
  struct Slot {
    std::uint64_t arena_id;
    ThreadCache* cache;
  };
  Slot slots[capacity];
  int count = 0;
  ~ThreadCaches();  // thread exit: every cache back to its arena, if still alive
};
// A plain pointer to this thread's table (__thread: no initialization guard on each access;
// initial-exec: no call to find it, as the library is loaded with the program).
extern __thread ThreadCaches* this_thread_caches __attribute__((tls_model("initial-exec")));

// The calling thread's cache for an arena if it has one.
inline ThreadCache* existing_thread_cache_of(std::uint64_t arena_id) {
  if (const ThreadCaches* caches = this_thread_caches)
    for (int i = 0; i < caches->count; ++i)
      if (caches->slots[i].arena_id == arena_id) return caches->slots[i].cache;
  return nullptr;
}
// ... made on first use.
ThreadCache* make_thread_cache_of(Arena& arena);

// The pool's bad-pointer errors, out of line so that the paths that check stay short.
[[noreturn, gnu::cold]] void throw_bad_block(const void* ptr, const std::string& expected);

class PoolState;

class Arena {
 public:
  Arena(PoolState& pool, std::unique_ptr<ChunkSource> source);
  ~Arena();  // every chunk goes back to the space
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  std::uint64_t id() const { return id_; }

  // Size classes. allocate_cached is the fast path (a block from the thread's cache, nullptr if
  // it has none); allocate_small the rest (nullptr: no memory, `why` says why).
  inline void* allocate_cached(int size_class);
  void* allocate_small(int size_class, std::string& why);
  inline void deallocate_small(Slab& slab, void* ptr);
  inline ThreadCache* thread_cache();  // the calling thread's, made on first use; nullptr if caches are off
  // Large blocks of `bytes` (a multiple of large_granule), aligned. nullptr as above.
  void* allocate_large(std::size_t bytes, std::size_t alignment, std::string& why);
  [[gnu::noinline]] void deallocate_large(Chunk& chunk, void* ptr);
  std::size_t large_block_size(const void* ptr) const;  // 0: no live block starts there

  // Thread caches (thread_cache.cpp): made for a thread on its first allocation here.
  ThreadCache* make_thread_cache();
  void retire_thread_cache(ThreadCache* cache);  // its blocks and counters into the arena; deletes it
  void flush(ThreadCache& cache);                // all its blocks back to the central lists
  std::int64_t unpublished_in_use() const;       // sum over this arena's thread caches

  // Empty slabs, and then wholly free chunks, back to the space (what trim() does).
  void release_unused();
  PoolStats stats() const;

 private:
  // The free spans of one heap: large blocks and slabs live in chunks of their own, so that the
  // chunks of a training step's activations become wholly free when the step ends.
  struct Heap {
    std::map<std::uintptr_t, std::pair<std::size_t, Chunk*>> by_address;  // begin -> (bytes, chunk)
    std::set<std::pair<std::size_t, std::uintptr_t>> by_size;             // (bytes, begin): best fit
    std::size_t free_bytes = 0;
  };
  static constexpr int large_heap = 0, slab_heap = 1;

  // A size class's central list of slabs with free blocks.
  struct SizeClassList {
    SpinThenBlockMutex mutex;
    Slab* partial = nullptr;
    std::size_t partial_slabs = 0, free_blocks = 0;
  };

  // Spans (under mutex_).
  std::uintptr_t take_span(int heap, std::size_t bytes, std::size_t alignment, std::string& why);
  void return_span(Chunk& chunk, std::uintptr_t begin);
  void add_free(Heap& heap, std::uintptr_t begin, std::size_t bytes, Chunk* chunk);
  void remove_free(Heap& heap, std::uintptr_t begin);
  bool grow(int heap, std::size_t bytes, std::string& why);
  bool extend_in_place(int heap, std::size_t bytes, std::string& why);
  std::size_t free_tail(const Chunk& chunk) const;
  Chunk* obtain_chunk(int heap, std::size_t bytes, std::string& why);
  void release_chunk(Chunk* chunk);
  std::size_t release_wholly_free(int heap);  // returns the bytes released
  void settle_free_chunks(int heap);

  // Slabs and central lists.
  std::uint32_t take_blocks(int size_class, CachedBlock* out, std::uint32_t want, std::string& why);
  void return_blocks(int size_class, const CachedBlock* blocks, std::uint32_t count);
  Slab* make_slab(int size_class, std::string& why);  // under the class's mutex
  void release_slab(Slab* slab);
  static void link(SizeClassList& list, Slab* slab);
  static void unlink(SizeClassList& list, Slab* slab);
  [[gnu::noinline]] void return_small(const CachedBlock& block, ThreadCache* cache);  // deallocate_small's slow half

  PoolState& pool_;
  std::unique_ptr<ChunkSource> source_;
  const std::uint64_t id_;
  std::string binding_;  // how chunks are bound (host arenas), or what the OS refused

  mutable SpinThenBlockMutex mutex_;
  Heap heaps_[2];
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::unordered_map<std::uintptr_t, std::size_t> live_spans_;  // large blocks and slabs: begin -> bytes
  std::unordered_map<std::uintptr_t, std::unique_ptr<Slab>> slabs_;
  std::size_t reserved_ = 0, overhead_ = 0;
  bool trimming_ = false;
  std::uint64_t chunks_obtained_ = 0, chunks_released_ = 0, large_allocations_ = 0, large_deallocations_ = 0;

  mutable SizeClassList classes_[class_count];

  mutable std::mutex caches_mutex_;
  std::vector<std::unique_ptr<ThreadCache>> caches_;
  // Counters of uncached allocations and of caches whose threads have exited.
  std::atomic<std::uint64_t> small_allocations_{0}, small_deallocations_{0}, retired_hits_{0}, retired_misses_{0};
};

class PoolState {
 public:
  PoolState(const PoolOptions& options, std::size_t default_limit);
  ~PoolState();

  void* allocate(std::size_t bytes, std::size_t alignment, const NumaPlacement& placement);
  void deallocate(void* ptr);
  std::size_t block_size(const void* ptr) const;
  void trim();
  PoolStats stats() const;
  void reset_high_water();

  // Reserved bytes against the limit.
  bool reserve(std::size_t bytes) noexcept;
  void unreserve(std::size_t bytes) noexcept { reserved_.fetch_sub(bytes, std::memory_order_relaxed); }

  // Bytes in use. A thread with a cache keeps its own running delta and adds it to the pool's
  // count only past publish_bytes, so the hot path writes no shared cache line. The high-water
  // mark compares the pool's count plus the caller's own delta: exact for one thread, and short
  // of the truth by at most (threads - 1) x publish_bytes when several allocate at once.
  static constexpr std::int64_t publish_bytes = std::int64_t(4) << 20;
  void lent(std::size_t bytes, ThreadCache* cache) noexcept {
    std::int64_t own = 0;
    if (cache) {
      own = cache->unpublished.get() + std::int64_t(bytes);
      if (own >= publish_bytes) own = publish(*cache, own);
      cache->unpublished.set(own);
    } else {
      in_use_.fetch_add(std::int64_t(bytes), std::memory_order_relaxed);
    }
    const std::int64_t now = in_use_.load(std::memory_order_relaxed) + own;
    std::int64_t high = in_use_high_.load(std::memory_order_relaxed);
    while (now > high && !in_use_high_.compare_exchange_weak(high, now, std::memory_order_relaxed)) {
    }
  }
  void returned(std::size_t bytes, ThreadCache* cache) noexcept {
    if (cache) {
      std::int64_t own = cache->unpublished.get() - std::int64_t(bytes);
      if (own <= -publish_bytes) own = publish(*cache, own);
      cache->unpublished.set(own);
    } else {
      in_use_.fetch_sub(std::int64_t(bytes), std::memory_order_relaxed);
    }
  }
  // Adds a cache's delta to the pool's count; returns what stays unpublished (0).
  std::int64_t publish(ThreadCache&, std::int64_t own) noexcept {
    in_use_.fetch_add(own, std::memory_order_relaxed);
    return 0;
  }
  std::size_t reserved() const noexcept { return reserved_.load(std::memory_order_relaxed); }

  // PooledViews' blocks by category (category.hpp); as their sum passes its high-water, every
  // category's bytes then (what made the peak).
  void count_category(Category category, std::int64_t bytes) noexcept {
    CategoryCount& c = categories_[std::size_t(category)];
    const std::int64_t now = c.in_use.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    std::int64_t high = c.high.load(std::memory_order_relaxed);
    while (now > high && !c.high.compare_exchange_weak(high, now, std::memory_order_relaxed)) {
    }
    if (bytes > 0) note_categorized_peak();
  }
  void note_categorized_peak() noexcept;
  CategoryTable category_stats() const;
  // A NUMA binding the OS refused: warns once per pool.
  void binding_refused(const std::string& arena, const std::string& reason);

  const PoolOptions options;
  const std::size_t limit;
  PageMap page_map;
  std::vector<std::unique_ptr<Arena>> arenas;
  // Host pools: the arena of each NUMA node's CPUs (indexed by OS CPU number), the interleaved one.
  std::vector<int> arena_of_cpu;
  int interleave_arena = -1;

 private:
  Arena& arena_for(const NumaPlacement& placement, const char* where);
  void* allocate_once(Arena& arena, int size_class, std::size_t bytes, std::size_t alignment, std::string& why);
  [[gnu::noinline]] void* allocate_uncached(Arena& arena, int size_class, std::size_t bytes, std::size_t alignment);

  alignas(64) std::atomic<std::int64_t> in_use_{0};  // published: add the caches' deltas for the total
  alignas(64) std::atomic<std::int64_t> in_use_high_{0};
  alignas(64) std::atomic<std::size_t> reserved_{0};
  std::atomic<std::size_t> reserved_high_{0};
  std::atomic<bool> warned_binding_{false};
  struct CategoryCount {
    std::atomic<std::int64_t> in_use{0}, high{0};
  };
  std::array<CategoryCount, category_count> categories_;
  // The categories' sum at its high-water (read without the lock: most blocks make no new peak)
  // and each one's bytes then; the lock keeps a snapshot whole.
  class PeakLock {
   public:
    explicit PeakLock(std::atomic_flag& flag) noexcept : flag_(flag) {
      while (flag_.test_and_set(std::memory_order_acquire)) {
      }
    }
    ~PeakLock() { flag_.clear(std::memory_order_release); }
    PeakLock(const PeakLock&) = delete;
    PeakLock& operator=(const PeakLock&) = delete;

   private:
    std::atomic_flag& flag_;
  };
  mutable std::atomic_flag peak_lock_ = ATOMIC_FLAG_INIT;
  std::atomic<std::int64_t> categorized_high_{0};
  std::array<std::int64_t, category_count> at_peak_{};
};

// ------------------------------------------------------------------------------ fast paths
inline ThreadCache* Arena::thread_cache() {
  if (!pool_.options.thread_cache) return nullptr;
  ThreadCache* cache = existing_thread_cache_of(id_);
  return cache ? cache : make_thread_cache_of(*this);
}

inline void* Arena::allocate_cached(int size_class) {
  ThreadCache* cache = existing_thread_cache_of(id_);
  if (!cache || cache->bins[size_class].count == 0) return nullptr;
  ThreadCache::Bin& bin = cache->bins[size_class];
  const CachedBlock block = bin.blocks[--bin.count];
  cache->hits.add(1);
  cache->cached_bytes.add(-std::int64_t(block.slab->block_bytes));
  block.slab->lent(block.index).store(1, std::memory_order_relaxed);
  pool_.lent(block.slab->block_bytes, cache);
  return block.ptr;
}

inline void Arena::deallocate_small(Slab& slab, void* ptr) {
  const std::uint32_t offset = slab.offset_of(ptr);
  const std::uint32_t i = slab.index_of(offset);
  if (offset != i * slab.block_bytes || i >= slab.blocks)
    throw_bad_block(ptr, "the start of a block (it points inside a block of " + std::to_string(slab.block_bytes) + " bytes)");
  std::atomic<std::uint8_t>& lent = slab.lent(i);
  if (lent.load(std::memory_order_relaxed) == 0) throw_bad_block(ptr, "a live block (this block is free already: a double free?)");
  lent.store(0, std::memory_order_relaxed);
  ThreadCache* cache = thread_cache();
  pool_.returned(slab.block_bytes, cache);
  const CachedBlock block{ptr, &slab, i};
  ThreadCache::Bin* bin = cache ? &cache->bins[slab.size_class] : nullptr;
  if (bin && bin->count < bin->capacity) {
    bin->blocks[bin->count++] = block;
    cache->cached_bytes.add(slab.block_bytes);
    cache->deallocations.add(1);
    return;
  }
  return_small(block, cache);
}

}  // namespace longattn::memory::detail
