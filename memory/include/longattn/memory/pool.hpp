#pragma once
// longattn::memory::Pool<MemorySpace>: a thread-safe memory pool over any Kokkos memory space.
//
// A training run allocates the same buffers step after step. The pool makes that cheap and
// keeps the memory a run holds close to what it uses:
//   - sizes up to 64 KiB come from size classes (16-byte steps to 128 B, then four classes per
//     doubling), carved from slabs; each thread keeps a small cache of recently freed blocks
//     per class, so a steady allocate/free cycle takes no lock;
//   - larger sizes are rounded to 4 KiB and taken best-fit (smallest fitting block, lowest
//     address among equals) from an address-ordered free list that coalesces neighbours, so
//     buffers whose size changes from step to step share memory;
//   - memory comes from the space in chunks. Host chunks are the start of a reserved address
//     range and grow in place (min_chunk_bytes at a time), so a host heap stays one contiguous
//     range: free spans coalesce across what was added, and no page is given back and faulted
//     in again. Device chunks come from Kokkos (cudaMalloc on CudaSpace); a new one is at least
//     `growth` of what the heap holds, and chunks that become wholly free together are merged
//     into one (consolidation), so a run that grows settles into a few large chunks. Wholly free
//     chunks beyond `release_threshold_bytes` return to the space, as do all of them on trim();
//   - reserved bytes never pass `limit_bytes`: an allocation that would is refused with a
//     longattn::Error saying what the pool holds (never a silent over-commit);
//   - host pools (HostSpace) keep one arena per NUMA node, bound through hwloc, and place each
//     allocation by a NumaPlacement (local, a given node, interleaved);
//   - bookkeeping lives on the host, outside the blocks, so device memory is never touched.
// Double frees, pointers from elsewhere and pointers into the middle of a block are refused
// with a longattn::Error. PooledViews' blocks are also counted by what they hold (category.hpp).
//
// Pool is a handle, like Kokkos::View: copies share one pool, which lives until the last copy
// and the last PooledView (pooled_view.hpp) from it are gone.
#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "longattn/memory/category.hpp"
#include "longattn/memory/topology.hpp"

namespace longattn::memory {

// Where a host allocation's pages go on a machine with several NUMA nodes.
struct NumaPlacement {
  enum class Kind { local, node, interleave };
  Kind kind = Kind::local;  // local: the NUMA node of the CPU the calling thread runs on
  int node = 0;             // for Kind::node: the node's index, 0 .. nodes-1

  static NumaPlacement local() { return {}; }
  static NumaPlacement on_node(int index) { return {Kind::node, index}; }
  static NumaPlacement interleave() { return {Kind::interleave, 0}; }
};
std::string to_string(const NumaPlacement& placement);

struct PoolOptions {
  std::string label = "longattn::memory::Pool";  // names the chunks (Kokkos tools) and the pool in messages
  // Reserved bytes never pass this. 0: host pools take the machine's physical memory, device
  // pools no limit but what the device gives.
  std::size_t limit_bytes = 0;
  std::size_t min_chunk_bytes = std::size_t(2) << 20;  // smallest chunk asked of the space
  double growth = 0.125;  // a new chunk is at least this fraction of the bytes already reserved
  // Wholly free chunks are kept (a training step will want them again) up to this many bytes;
  // beyond it they go back to the space. The default keeps them all; trim() releases them.
  std::size_t release_threshold_bytes = ~std::size_t(0);
  bool thread_cache = true;       // per-thread caches of size-class blocks
  // Host pools: each chunk reserves address space up to the limit and grows in place. Off (or
  // where the reservation is refused, e.g. under `ulimit -v`): fixed chunks, as device pools.
  bool grow_in_place = true;
  NumaPlacement placement;        // host pools: placement of allocate() without one
  // Host pools: the machine to place on; nullptr is this machine (Topology::shared_system()).
  std::shared_ptr<const Topology> topology;
};

// What a pool (or one of its arenas) holds. Counters are exact whenever no other thread is
// allocating; read while others work they are a recent picture. Bytes in use count whole blocks
// (block_bytes()), which is what the pool cannot lend to anyone else.
struct PoolStats {
  std::string name;                        // the pool's label, or the arena's description
  std::size_t in_use_bytes = 0;            // blocks held by callers
  std::size_t in_use_high_water_bytes = 0;
  std::size_t reserved_bytes = 0;          // obtained from the memory space (chunks)
  std::size_t reserved_high_water_bytes = 0;
  std::size_t cached_bytes = 0;            // free size-class blocks (thread caches and slabs)
  std::size_t free_bytes = 0;              // free spans in chunks (the coalescing free list)
  std::size_t largest_free_block_bytes = 0;
  std::size_t overhead_bytes = 0;          // chunk alignment and slab tails: reserved, never lent
  std::size_t limit_bytes = 0;
  std::uint64_t allocations = 0, deallocations = 0;
  std::uint64_t cache_hits = 0, cache_misses = 0;  // size-class allocations served by / not by a thread cache
  std::size_t chunks = 0;
  std::uint64_t chunks_obtained = 0, chunks_released = 0;
  std::string binding;                     // host arenas: how their memory is bound to NUMA nodes

  // 1 - largest free block / free bytes: 0 when free memory is one block (or there is none),
  // near 1 when it is scattered in pieces.
  double fragmentation() const;
  double cache_hit_rate() const;  // hits / (hits + misses); 0 before any size-class allocation
};
std::ostream& operator<<(std::ostream& out, const PoolStats& stats);

// The block a request of `bytes` with `alignment` occupies (what in_use_bytes counts).
std::size_t block_bytes(std::size_t bytes, std::size_t alignment = 64);

// The default alignment: Kokkos' own (64 bytes), enough for any vector register and cache line.
inline constexpr std::size_t default_alignment = 64;
inline constexpr std::size_t max_alignment = std::size_t(64) << 10;  // 64 KiB

namespace detail {
class PoolState;  // the pool itself (src/pool_state.hpp); Pool is a handle to it

// Where a pool's chunks come from. One per arena.
class ChunkSource {
 public:
  virtual ~ChunkSource() = default;
  // `bytes` from the memory space; throws (any std::exception) when the space has none.
  virtual void* obtain(std::size_t bytes) = 0;
  virtual void release(void* raw, std::size_t bytes) noexcept = 0;
  // Called once per chunk with its page-aligned usable range, before any block is lent: host
  // sources bind it to their NUMA node(s). Returns "" or why it could not be done.
  virtual std::string prepare(void* begin, std::size_t bytes) = 0;
  virtual std::size_t alignment() const = 0;  // guaranteed alignment of obtain()'s result
  virtual std::string describe() const = 0;   // e.g. "CudaSpace", "HostSpace, NUMA node 1"
  virtual std::string binding() const { return ""; }  // host sources: how chunks are bound
  // Grows the chunk obtained as `raw`, now `bytes` long, by `more` bytes in place; false when the
  // space cannot (then the pool takes a new chunk). Host sources can: a chunk is the start of its
  // own reserved address range, so a heap stays one contiguous range that coalesces as a whole.
  virtual bool extend(void* /*raw*/, std::size_t /*bytes*/, std::size_t /*more*/) { return false; }
};

// Chunks from any Kokkos memory space through its allocate/deallocate (which Kokkos tools see).
template <class MemorySpace>
class SpaceChunkSource final : public ChunkSource {
 public:
  explicit SpaceChunkSource(std::string label) : label_(std::move(label)) {}
  void* obtain(std::size_t bytes) override { return MemorySpace().allocate(label_.c_str(), bytes); }
  void release(void* raw, std::size_t bytes) noexcept override {
    MemorySpace().deallocate(label_.c_str(), raw, bytes);
  }
  std::string prepare(void*, std::size_t) override { return ""; }
  std::size_t alignment() const override { return 64; }
  std::string describe() const override { return MemorySpace::name(); }

 private:
  std::string label_;
};

std::shared_ptr<PoolState> make_pool_state(const PoolOptions& options, std::unique_ptr<ChunkSource> source);
// Host pools: one arena per NUMA node of options.topology (and one interleaved over all of them).
std::shared_ptr<PoolState> make_host_pool_state(const PoolOptions& options);
// A PooledView's block of `bytes` (block_bytes()) lent under `category`.
void count_block(PoolState& state, Category category, std::size_t bytes) noexcept;
// Returns a block to its pool from a PooledView's destructor, and takes its bytes off its
// category (never throws: the view knows its block).
void release_block(PoolState& state, void* ptr, Category category, std::size_t bytes) noexcept;
}  // namespace detail

// Everything a pool does, whatever its memory space (Pool<MemorySpace> fixes the space). A
// handle: const member functions act on the shared pool, as View's operator() does.
class PoolBase {
 public:
  // A block of at least `bytes`, aligned to `alignment` (a power of two up to 64 KiB). Throws
  // longattn::Error on bad arguments or when the pool's limit or the space refuses.
  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment) const;
  // The same with an explicit NUMA placement (host pools; device pools have one arena, node 0).
  void* allocate(std::size_t bytes, std::size_t alignment, const NumaPlacement& placement) const;
  // Returns a block. nullptr is ignored; anything not a live block of this pool throws.
  void deallocate(void* ptr) const;
  // The size of a live block (what it occupies, at least what was asked).
  std::size_t block_size(const void* ptr) const;

  // Gives back to the space what nothing uses: the calling thread's cached blocks, empty slabs
  // and every wholly free chunk. Other threads' caches stay (each holds at most ~256 KiB per
  // size class, returned when the thread exits).
  void trim() const;

  // Starts new in-use high-water marks, the whole pool's and each category's, from what is in
  // use now (e.g. to report each step's peak).
  void reset_high_water() const;

  PoolStats stats() const;                    // the whole pool
  CategoryTable category_stats() const;       // PooledViews' blocks by category (category.hpp)
  std::vector<PoolStats> arena_stats() const; // per arena (host pools: per NUMA node, then interleaved)
  int arenas() const;
  const std::string& label() const;

 protected:
  explicit PoolBase(std::shared_ptr<detail::PoolState> state) : state_(std::move(state)) {}
  std::shared_ptr<detail::PoolState> state_;

  template <class ViewType>
  friend class PooledView;
};

template <class MemorySpace>
class Pool : public PoolBase {
  static_assert(Kokkos::is_memory_space<MemorySpace>::value, "Pool<MemorySpace>: a Kokkos memory space");

 public:
  using memory_space = MemorySpace;
  explicit Pool(const PoolOptions& options = {}) : PoolBase(make_state(options)) {}

 private:
  static std::shared_ptr<detail::PoolState> make_state(const PoolOptions& options) {
    if constexpr (std::is_same_v<MemorySpace, Kokkos::HostSpace>)
      return detail::make_host_pool_state(options);
    else
      return detail::make_pool_state(options, std::make_unique<detail::SpaceChunkSource<MemorySpace>>(options.label));
  }
};

// The pool longattn's own workspaces come from (detail::allocate_workspace): one per memory
// space, made on first use with default options and dropped at Kokkos::finalize (memory still
// held by PooledViews returns when they go).
template <class MemorySpace>
Pool<MemorySpace>& default_pool() {
  static std::mutex mutex;
  static std::unique_ptr<Pool<MemorySpace>> pool;
  const std::lock_guard<std::mutex> lock(mutex);
  if (!pool) {
    PoolOptions options;
    options.label = std::string("longattn::default_pool<") + MemorySpace::name() + ">";
    pool = std::make_unique<Pool<MemorySpace>>(options);
    Kokkos::push_finalize_hook([] {
      const std::lock_guard<std::mutex> finalize_lock(mutex);
      pool.reset();
    });
  }
  return *pool;
}

// Where the pool's warnings go (a NUMA binding the OS refused, a pool destroyed with blocks
// still lent): stderr unless replaced. Returns the previous handler.
using WarningHandler = std::function<void(const std::string&)>;
WarningHandler set_warning_handler(WarningHandler handler);

}  // namespace longattn::memory
