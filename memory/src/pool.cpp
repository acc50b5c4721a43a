// PoolState: arguments checked, the arena chosen by placement, the size class or large path
// taken; the pool-wide counters (in use, reserved, their high-water marks) and the limit.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "longattn/error.hpp"
#include "pool_state.hpp"

namespace longattn::memory {
namespace {

std::mutex warning_mutex;
WarningHandler& warning_handler() {
  static WarningHandler handler = [](const std::string& message) { std::cerr << "longattn: " << message << "\n"; };
  return handler;
}

void warn(const std::string& message) {
  WarningHandler handler;
  {
    const std::lock_guard<std::mutex> lock(warning_mutex);
    handler = warning_handler();
  }
  if (handler) handler(message);
}

// Largest request accepted: rounding it to whole pages must not overflow.
constexpr std::size_t max_request_bytes = std::size_t(1) << 56;

std::string human_bytes(std::size_t bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1);
  if (bytes >= (std::size_t(1) << 30)) out << double(bytes) / double(std::size_t(1) << 30) << " GiB";
  else if (bytes >= (std::size_t(1) << 20)) out << double(bytes) / double(std::size_t(1) << 20) << " MiB";
  else if (bytes >= (std::size_t(1) << 10)) out << double(bytes) / double(std::size_t(1) << 10) << " KiB";
  else out << bytes << " B";
  return out.str();
}

void check_options(const PoolOptions& options) {
  const char* where = "longattn::memory::Pool";
  require(options.min_chunk_bytes >= detail::page_bytes && options.min_chunk_bytes <= max_request_bytes, where,
          "options.min_chunk_bytes", options.min_chunk_bytes, "from 65536 (one page) to 2^56");
  require(options.growth >= 0 && options.growth <= 16, where, "options.growth", options.growth,
          "a fraction of the reserved bytes from 0 to 16");
  if (options.placement.kind == NumaPlacement::Kind::node)
    require(options.placement.node >= 0, where, "options.placement", to_string(options.placement),
            "a NUMA node index >= 0");
}

}  // namespace

WarningHandler set_warning_handler(WarningHandler handler) {
  const std::lock_guard<std::mutex> lock(warning_mutex);
  std::swap(handler, warning_handler());
  return handler;
}

std::string to_string(const NumaPlacement& placement) {
  switch (placement.kind) {
    case NumaPlacement::Kind::local: return "local";
    case NumaPlacement::Kind::node: return "node(" + std::to_string(placement.node) + ")";
    case NumaPlacement::Kind::interleave: return "interleave";
  }
  return "?";
}

std::size_t block_bytes(std::size_t bytes, std::size_t alignment) {
  const int size_class = detail::class_for(bytes, alignment);
  return size_class >= 0 ? detail::class_size(size_class) : detail::round_up(bytes, detail::large_granule);
}

double PoolStats::fragmentation() const {
  return free_bytes == 0 ? 0.0 : 1.0 - double(largest_free_block_bytes) / double(free_bytes);
}

double PoolStats::cache_hit_rate() const {
  const std::uint64_t total = cache_hits + cache_misses;
  return total == 0 ? 0.0 : double(cache_hits) / double(total);
}

std::ostream& operator<<(std::ostream& out, const PoolStats& s) {
  out << s.name << ": in use " << human_bytes(s.in_use_bytes) << " (high-water " << human_bytes(s.in_use_high_water_bytes)
      << "), reserved " << human_bytes(s.reserved_bytes) << " in " << s.chunks << " chunks (high-water "
      << human_bytes(s.reserved_high_water_bytes) << ", limit " << human_bytes(s.limit_bytes) << "), cached "
      << human_bytes(s.cached_bytes) << ", free " << human_bytes(s.free_bytes) << " (largest "
      << human_bytes(s.largest_free_block_bytes) << ", fragmentation " << std::setprecision(3) << s.fragmentation()
      << "), overhead " << human_bytes(s.overhead_bytes) << "; " << s.allocations << " allocations, "
      << s.deallocations << " deallocations, cache hit rate " << s.cache_hit_rate() << ", chunks obtained "
      << s.chunks_obtained << ", released " << s.chunks_released;
  if (!s.binding.empty()) out << "; NUMA: " << s.binding;
  return out;
}

namespace detail {

PoolState::PoolState(const PoolOptions& options_in, std::size_t default_limit)
    : options((check_options(options_in), options_in)),
      limit(options_in.limit_bytes ? options_in.limit_bytes : default_limit) {}

PoolState::~PoolState() {
  std::int64_t still_lent = in_use_.load();
  for (const auto& arena : arenas) still_lent += arena->unpublished_in_use();
  if (still_lent > 0)
    warn("memory pool '" + options.label + "' destroyed while " + human_bytes(std::size_t(still_lent)) +
         " of its blocks were still lent; that memory is returned to the space with the pool");
  arenas.clear();
}

bool PoolState::reserve(std::size_t bytes) noexcept {
  std::size_t now = reserved_.load(std::memory_order_relaxed);
  do {
    if (bytes > limit || now > limit - bytes) return false;
  } while (!reserved_.compare_exchange_weak(now, now + bytes, std::memory_order_relaxed));
  std::size_t high = reserved_high_.load(std::memory_order_relaxed);
  while (now + bytes > high && !reserved_high_.compare_exchange_weak(high, now + bytes, std::memory_order_relaxed)) {
  }
  return true;
}

void PoolState::binding_refused(const std::string& arena, const std::string& reason) {
  if (!warned_binding_.exchange(true))
    warn("memory pool '" + options.label + "' (" + arena + "): NUMA binding refused (" + reason +
         "); the pool goes on with unbound memory and does not warn again");
}

Arena& PoolState::arena_for(const NumaPlacement& placement, const char* where) {
  switch (placement.kind) {
    case NumaPlacement::Kind::local: {
      if (arenas.size() == 1) return *arenas[0];
      const int cpu = sched_getcpu();
      const int arena = cpu >= 0 && std::size_t(cpu) < arena_of_cpu.size() ? arena_of_cpu[std::size_t(cpu)] : 0;
      return *arenas[std::size_t(arena)];
    }
    case NumaPlacement::Kind::node: {
      const int nodes = interleave_arena >= 0 ? interleave_arena : int(arenas.size());
      require(placement.node >= 0 && placement.node < nodes, where, "placement", to_string(placement),
              "node(0) .. node(" + std::to_string(nodes - 1) + "), local or interleave (the pool's memory has " +
                  std::to_string(nodes) + " NUMA node(s))");
      return *arenas[std::size_t(placement.node)];
    }
    case NumaPlacement::Kind::interleave:
      return *arenas[std::size_t(interleave_arena >= 0 ? interleave_arena : 0)];
  }
  return *arenas[0];
}

void* PoolState::allocate_once(Arena& arena, int size_class, std::size_t bytes, std::size_t alignment,
                               std::string& why) {
  return size_class >= 0 ? arena.allocate_small(size_class, why)
                         : arena.allocate_large(round_up(bytes, large_granule), alignment, why);
}

void* PoolState::allocate(std::size_t bytes, std::size_t alignment, const NumaPlacement& placement) {
  const char* where = "longattn::memory::Pool::allocate";
  require(bytes >= 1 && bytes <= max_request_bytes, where, "bytes", bytes, "from 1 to 2^56");
  require(alignment >= 1 && alignment <= max_alignment && (alignment & (alignment - 1)) == 0, where, "alignment",
          alignment, "a power of two from 1 to 65536");
  Arena& arena = arenas.size() == 1 ? *arenas[0] : arena_for(placement, where);
  const int size_class = class_for(bytes, alignment);
  if (size_class >= 0)
    if (void* ptr = arena.allocate_cached(size_class)) return ptr;
  return allocate_uncached(arena, size_class, bytes, alignment);
}

// Everything but a thread-cache hit: a refill, a large block, growth, and at the limit one
// trim() and a second try before the error.
void* PoolState::allocate_uncached(Arena& arena, int size_class, std::size_t bytes, std::size_t alignment) {
  std::string why;
  if (void* ptr = allocate_once(arena, size_class, bytes, alignment, why)) return ptr;
  trim();  // what is idle goes back to the space; then once more
  why.clear();
  if (void* ptr = allocate_once(arena, size_class, bytes, alignment, why)) return ptr;
  const PoolStats s = stats();
  std::ostringstream message;
  message << "longattn::memory::Pool::allocate: cannot allocate " << bytes << " bytes (" << human_bytes(block_bytes(bytes, alignment))
          << " block) in pool '" << options.label << "': " << why << ". The pool holds " << human_bytes(s.reserved_bytes)
          << " (" << human_bytes(s.in_use_bytes) << " in use, largest free block " << human_bytes(s.largest_free_block_bytes)
          << "); raise PoolOptions::limit_bytes or free memory";
  throw Error(message.str());
}

void throw_bad_block(const void* ptr, const std::string& expected) {
  throw_invalid_argument("longattn::memory::Pool::deallocate", "ptr", ptr, expected);
}

void PoolState::deallocate(void* ptr) {
  if (!ptr) return;
  const std::uintptr_t entry = page_map.get(reinterpret_cast<std::uintptr_t>(ptr));
  if (entry == 0) throw_bad_block(ptr, "a block of pool '" + options.label + "' (it lies in none of its chunks)");
  if (entry & 1) {
    Slab& slab = *reinterpret_cast<Slab*>(entry & ~std::uintptr_t(1));
    slab.arena->deallocate_small(slab, ptr);
  } else {
    Chunk& chunk = *reinterpret_cast<Chunk*>(entry);
    chunk.arena->deallocate_large(chunk, ptr);  // out of line: takes the arena's lock
  }
}

std::size_t PoolState::block_size(const void* ptr) const {
  const char* where = "longattn::memory::Pool::block_size";
  const std::uintptr_t address = reinterpret_cast<std::uintptr_t>(ptr);
  const std::uintptr_t entry = ptr ? page_map.get(address) : 0;
  std::size_t bytes = 0;
  if (entry & 1) {
    const Slab& slab = *reinterpret_cast<const Slab*>(entry & ~std::uintptr_t(1));
    const std::uintptr_t offset = address - slab.begin;
    const std::uintptr_t i = offset / slab.block_bytes;
    if (offset % slab.block_bytes == 0 && i < slab.blocks && slab.lent(std::uint32_t(i)).load(std::memory_order_relaxed))
      bytes = slab.block_bytes;
  } else if (entry) {
    const Chunk& chunk = *reinterpret_cast<const Chunk*>(entry);
    bytes = chunk.arena->large_block_size(ptr);
  }
  require(bytes > 0, where, "ptr", ptr, "a live block of pool '" + options.label + "'");
  return bytes;
}

void PoolState::trim() {
  for (auto& arena : arenas) arena->release_unused();
}

void PoolState::reset_high_water() {
  std::int64_t in_use = in_use_.load();
  for (const auto& arena : arenas) in_use += arena->unpublished_in_use();
  in_use_high_.store(in_use);
  for (CategoryCount& c : categories_) c.high.store(c.in_use.load());
  const PeakLock lock(peak_lock_);
  std::int64_t total = 0;
  for (int i = 0; i < category_count; ++i) {
    at_peak_[std::size_t(i)] = categories_[std::size_t(i)].in_use.load(std::memory_order_relaxed);
    total += at_peak_[std::size_t(i)];
  }
  categorized_high_.store(total, std::memory_order_relaxed);
}

void PoolState::note_categorized_peak() noexcept {
  std::array<std::int64_t, category_count> now;
  std::int64_t total = 0;
  for (int i = 0; i < category_count; ++i) {
    now[std::size_t(i)] = categories_[std::size_t(i)].in_use.load(std::memory_order_relaxed);
    total += now[std::size_t(i)];
  }
  if (total <= categorized_high_.load(std::memory_order_relaxed)) return;
  const PeakLock lock(peak_lock_);
  if (total > categorized_high_.load(std::memory_order_relaxed)) {
    categorized_high_.store(total, std::memory_order_relaxed);
    at_peak_ = now;
  }
}

CategoryTable PoolState::category_stats() const {
  CategoryTable table;
  for (int i = 0; i < category_count; ++i) {
    const CategoryCount& c = categories_[std::size_t(i)];
    table[std::size_t(i)] = {Category(i), std::size_t(std::max<std::int64_t>(0, c.in_use.load())),
                             std::size_t(std::max<std::int64_t>(0, c.high.load())), 0};
  }
  const PeakLock lock(peak_lock_);
  for (int i = 0; i < category_count; ++i)
    table[std::size_t(i)].at_peak_bytes = std::size_t(std::max<std::int64_t>(0, at_peak_[std::size_t(i)]));
  return table;
}

PoolStats PoolState::stats() const {
  PoolStats total;
  total.name = options.label;
  for (const auto& arena : arenas) {
    const PoolStats s = arena->stats();
    total.reserved_bytes += s.reserved_bytes;
    total.cached_bytes += s.cached_bytes;
    total.free_bytes += s.free_bytes;
    total.largest_free_block_bytes = std::max(total.largest_free_block_bytes, s.largest_free_block_bytes);
    total.overhead_bytes += s.overhead_bytes;
    total.allocations += s.allocations;
    total.deallocations += s.deallocations;
    total.cache_hits += s.cache_hits;
    total.cache_misses += s.cache_misses;
    total.chunks += s.chunks;
    total.chunks_obtained += s.chunks_obtained;
    total.chunks_released += s.chunks_released;
    if (arenas.size() == 1) total.binding = s.binding;
  }
  std::int64_t in_use = in_use_.load();
  for (const auto& arena : arenas) in_use += arena->unpublished_in_use();
  total.in_use_bytes = std::size_t(std::max<std::int64_t>(in_use, 0));
  total.in_use_high_water_bytes = std::size_t(in_use_high_.load());
  total.reserved_high_water_bytes = reserved_high_.load();
  total.limit_bytes = limit;
  return total;
}

std::shared_ptr<PoolState> make_pool_state(const PoolOptions& options, std::unique_ptr<ChunkSource> source) {
  auto state = std::make_shared<PoolState>(options, ~std::size_t(0));
  state->arenas.push_back(std::make_unique<Arena>(*state, std::move(source)));
  return state;
}

void count_block(PoolState& state, Category category, std::size_t bytes) noexcept {
  state.count_category(category, std::int64_t(bytes));
}

void release_block(PoolState& state, void* ptr, Category category, std::size_t bytes) noexcept {
  state.count_category(category, -std::int64_t(bytes));
  try {
    state.deallocate(ptr);
  } catch (const std::exception& e) {
    warn(std::string("a pooled view could not return its block: ") + e.what());
  }
}

}  // namespace detail

// ------------------------------------------------------------------------------ PoolBase
void* PoolBase::allocate(std::size_t bytes, std::size_t alignment) const {
  return state_->allocate(bytes, alignment, state_->options.placement);
}
void* PoolBase::allocate(std::size_t bytes, std::size_t alignment, const NumaPlacement& placement) const {
  return state_->allocate(bytes, alignment, placement);
}
void PoolBase::deallocate(void* ptr) const { state_->deallocate(ptr); }
std::size_t PoolBase::block_size(const void* ptr) const { return state_->block_size(ptr); }
void PoolBase::trim() const { state_->trim(); }
void PoolBase::reset_high_water() const { state_->reset_high_water(); }
PoolStats PoolBase::stats() const { return state_->stats(); }
CategoryTable PoolBase::category_stats() const { return state_->category_stats(); }
std::vector<PoolStats> PoolBase::arena_stats() const {
  std::vector<PoolStats> all;
  for (const auto& arena : state_->arenas) all.push_back(arena->stats());
  return all;
}
int PoolBase::arenas() const { return int(state_->arenas.size()); }
const std::string& PoolBase::label() const { return state_->options.label; }

}  // namespace longattn::memory
