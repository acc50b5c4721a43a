// Pool: block sizes against the documented classes; randomized allocate/free sequences checked
// against a shadow model (no overlap, alignment, contents kept, stats exact, every byte back);
// limit, release, consolidation, fragmentation, thread caches; concurrent stress on every core;
// bad input. Runs on each enabled execution space's memory space (blocks are filled and checked
// by kernels, so device memory works the same).
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "execution_spaces.hpp"
#include "longattn/error.hpp"
#include "longattn/memory/pool.hpp"
#include "reference/random.hpp"

namespace {

using longattn::memory::Pool;
using longattn::memory::PoolOptions;
using longattn::memory::PoolStats;
constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;

// The size classes as the documentation states them: 16..128 in steps of 16, then four per
// doubling up to 64 KiB; above that whole 4 KiB granules.
std::vector<std::size_t> documented_classes() {
  std::vector<std::size_t> classes;
  for (std::size_t s = 16; s <= 128; s += 16) classes.push_back(s);
  for (std::size_t base = 128; base < 64 * KiB; base *= 2)
    for (std::size_t step = 1; step <= 4; ++step) classes.push_back(base + step * base / 4);
  return classes;
}

template <class Exec>
void fill(const Exec& exec, void* ptr, std::size_t bytes, unsigned char value) {
  Kokkos::View<unsigned char*, typename Exec::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>> view(
      static_cast<unsigned char*>(ptr), bytes);
  Kokkos::deep_copy(exec, view, value);
  exec.fence();
}

template <class Exec>
std::size_t mismatches(const Exec& exec, const void* ptr, std::size_t bytes, unsigned char value) {
  const auto* data = static_cast<const unsigned char*>(ptr);
  std::size_t wrong = 0;
  Kokkos::parallel_reduce(
      "count_mismatches", Kokkos::RangePolicy<Exec>(exec, 0, bytes),
      KOKKOS_LAMBDA(std::size_t i, std::size_t & sum) { sum += data[i] != value; }, wrong);
  return wrong;
}

// Exact bookkeeping identity: every reserved byte is in use, cached, free or overhead.
void check_accounting(const PoolStats& s) {
  INFO(s);
  CHECK(s.reserved_bytes == s.in_use_bytes + s.cached_bytes + s.free_bytes + s.overhead_bytes);
  CHECK(s.reserved_bytes <= s.limit_bytes);
  CHECK(s.in_use_bytes <= s.in_use_high_water_bytes);
  CHECK(s.reserved_bytes <= s.reserved_high_water_bytes);
}

}  // namespace

TEST_CASE("block sizes follow the documented size classes and pages", "[memory][pool]") {
  const auto classes = documented_classes();
  REQUIRE(classes.back() == 64 * KiB);
  REQUIRE(classes.size() == 44);
  std::mt19937_64 rng(longattn::test::test_seed());
  INFO("seed " << longattn::test::test_seed());
  std::vector<std::size_t> sizes = {1, 15, 16, 17, 127, 128, 129, 160, 161, 255, 256, 257, 64 * KiB - 1, 64 * KiB,
                                    64 * KiB + 1, MiB, 3 * MiB + 5};
  for (int i = 0; i < 2000; ++i) sizes.push_back(std::size_t(1) << std::uniform_int_distribution<int>(0, 23)(rng) |
                                                 std::uniform_int_distribution<std::size_t>(0, 4095)(rng));
  for (const std::size_t bytes : sizes)
    for (std::size_t alignment = 1; alignment <= 64 * KiB; alignment *= 4) {
      std::size_t expected = 0;
      for (const std::size_t c : classes)
        if (c >= bytes && c % alignment == 0) {
          expected = c;
          break;
        }
      if (bytes > 64 * KiB) expected = (bytes + 4 * KiB - 1) / (4 * KiB) * (4 * KiB);
      INFO("bytes " << bytes << ", alignment " << alignment);
      CHECK(longattn::memory::block_bytes(bytes, alignment) == expected);
    }
}

TEMPLATE_LIST_TEST_CASE("randomized allocate/free against a shadow model", "[memory][pool]",
                        longattn::test::ExecutionSpaces) {
  using Exec = TestType;
  const Exec exec;
  const std::uint64_t seed = longattn::test::test_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const bool thread_cache = GENERATE(true, false);
  PoolOptions options;
  options.thread_cache = thread_cache;
  options.growth = 0.25;
  const Pool<typename Exec::memory_space> pool(options);

  struct Live {
    std::size_t bytes, block;
    unsigned char value;
  };
  std::map<std::uintptr_t, Live> live;  // by address: neighbours show overlap
  std::size_t in_use = 0, high_water = 0, allocations = 0, deallocations = 0;
  std::uniform_real_distribution<double> log_size(0.0, std::log(8.0 * MiB));
  for (int op = 0; op < 1500; ++op) {
    if (live.empty() || rng() % 100 < 55) {
      const std::size_t bytes = std::max<std::size_t>(1, std::size_t(std::exp(log_size(rng))));
      const std::size_t alignment = std::size_t(1) << (rng() % 17);  // up to 64 KiB
      void* ptr = pool.allocate(bytes, alignment);
      const auto address = reinterpret_cast<std::uintptr_t>(ptr);
      const std::size_t block = longattn::memory::block_bytes(bytes, alignment);
      INFO("op " << op << ": allocate(" << bytes << ", " << alignment << ") = " << ptr);
      REQUIRE(address % alignment == 0);
      REQUIRE(pool.block_size(ptr) == block);
      const auto next = live.lower_bound(address);
      if (next != live.end()) REQUIRE(address + block <= next->first);
      if (next != live.begin()) REQUIRE(std::prev(next)->first + std::prev(next)->second.block <= address);
      const auto value = static_cast<unsigned char>(rng());
      fill(exec, ptr, bytes, value);
      live.emplace(address, Live{bytes, block, value});
      in_use += block;
      high_water = std::max(high_water, in_use);
      ++allocations;
    } else {
      auto victim = live.begin();
      std::advance(victim, std::ptrdiff_t(rng() % live.size()));
      void* ptr = reinterpret_cast<void*>(victim->first);
      INFO("op " << op << ": deallocate(" << ptr << ")");
      REQUIRE(mismatches(exec, ptr, victim->second.bytes, victim->second.value) == 0);  // no one wrote into it
      pool.deallocate(ptr);
      in_use -= victim->second.block;
      live.erase(victim);
      ++deallocations;
    }
    if (op % 97 == 0) {
      const PoolStats s = pool.stats();
      REQUIRE(s.in_use_bytes == in_use);
      check_accounting(s);
    }
  }
  for (const auto& [address, block] : live) {
    REQUIRE(mismatches(exec, reinterpret_cast<void*>(address), block.bytes, block.value) == 0);
    pool.deallocate(reinterpret_cast<void*>(address));
    ++deallocations;
  }
  PoolStats s = pool.stats();
  CHECK(s.in_use_bytes == 0);
  CHECK(s.in_use_high_water_bytes == high_water);
  CHECK(s.allocations == allocations);
  CHECK(s.deallocations == deallocations);
  check_accounting(s);
  pool.trim();
  s = pool.stats();
  CHECK(s.reserved_bytes == 0);  // every byte went back to the space
  CHECK(s.chunks == 0);
  CHECK(s.chunks_obtained == s.chunks_released);
}

TEMPLATE_LIST_TEST_CASE("the size limit refuses with a clear error and recovers", "[memory][pool][errors]",
                        longattn::test::ExecutionSpaces) {
  using Space = typename TestType::memory_space;
  PoolOptions options;
  options.label = "limited";
  options.limit_bytes = 12 * MiB;
  options.min_chunk_bytes = 2 * MiB;
  const Pool<Space> pool(options);
  void* a = pool.allocate(7 * MiB);
  CHECK_THROWS_WITH(pool.allocate(7 * MiB), Catch::Contains("cannot allocate 7340032 bytes") &&
                                                Catch::Contains("pool 'limited'") && Catch::Contains("limit of 12.0 MiB") &&
                                                Catch::Contains("raise PoolOptions::limit_bytes"));
  CHECK(pool.stats().reserved_bytes <= 12 * MiB);
  CHECK(pool.stats().in_use_bytes == 7 * MiB);
  pool.deallocate(a);
  void* b = pool.allocate(7 * MiB);  // the free chunk serves it
  void* small = pool.allocate(100);  // and a slab still fits beside it
  CHECK(pool.stats().reserved_bytes <= 12 * MiB);
  pool.deallocate(b);
  pool.deallocate(small);
  CHECK_THROWS_WITH(pool.allocate(13 * MiB), Catch::Contains("would pass the pool's limit"));
}

TEST_CASE("a host heap grows in place: one chunk, and what it frees coalesces across the growth", "[memory][pool]") {
  PoolOptions options;
  options.min_chunk_bytes = 2 * MiB;
  const Pool<Kokkos::HostSpace> pool(options);
  std::vector<void*> blocks;
  for (std::size_t i = 1; i <= 6; ++i) blocks.push_back(pool.allocate(i * MiB + 100));  // 2..7 MiB blocks
  PoolStats s = pool.stats();
  CHECK(s.chunks == 1);
  CHECK(s.chunks_obtained == 1);
  CHECK(s.reserved_bytes <= s.in_use_bytes + 2 * MiB);  // grown by what was missing, 2 MiB at most more
  for (void* p : blocks) pool.deallocate(p);
  s = pool.stats();
  CHECK(s.free_bytes == s.reserved_bytes);  // one span again: the growth left no seams
  CHECK(s.largest_free_block_bytes == s.free_bytes);
  void* all = pool.allocate(s.free_bytes);
  CHECK(pool.stats().chunks_obtained == 1);
  pool.deallocate(all);
}

TEST_CASE("wholly free chunks merge, stay for reuse, and go back past the threshold or on trim", "[memory][pool]") {
  PoolOptions options;
  options.min_chunk_bytes = 2 * MiB;
  options.growth = 0;          // every chunk exactly what its request needs
  options.grow_in_place = false;  // fixed chunks, as on a device
  {
    const Pool<Kokkos::HostSpace> pool(options);
    void* a = pool.allocate(3 * MiB);
    void* b = pool.allocate(5 * MiB);
    void* c = pool.allocate(7 * MiB);
    REQUIRE(pool.stats().chunks == 3);
    pool.deallocate(a);
    pool.deallocate(b);  // two wholly free chunks: merged into one of 8 MiB
    PoolStats s = pool.stats();
    CHECK(s.chunks == 2);
    CHECK(s.largest_free_block_bytes == 8 * MiB);
    pool.deallocate(c);  // merged again: one chunk of 15 MiB
    s = pool.stats();
    CHECK(s.chunks == 1);
    CHECK(s.free_bytes == 15 * MiB);
    CHECK(s.fragmentation() == 0.0);
    const std::uint64_t obtained = s.chunks_obtained;
    void* all = pool.allocate(15 * MiB);  // fits: no new chunk
    CHECK(pool.stats().chunks_obtained == obtained);
    pool.deallocate(all);
    CHECK(pool.stats().reserved_bytes > 0);  // kept (default threshold)
    pool.trim();
    CHECK(pool.stats().reserved_bytes == 0);
  }
  {
    options.release_threshold_bytes = 4 * MiB;
    const Pool<Kokkos::HostSpace> pool(options);
    void* small = pool.allocate(3 * MiB);
    void* large = pool.allocate(6 * MiB);
    pool.deallocate(small);  // 3 MiB wholly free: under the threshold, kept
    CHECK(pool.stats().chunks == 2);
    pool.deallocate(large);  // merged to 9 MiB wholly free: past the threshold, released
    CHECK(pool.stats().chunks == 0);
    CHECK(pool.stats().reserved_bytes == 0);
  }
}

TEST_CASE("fragmentation is 1 - largest free block / free bytes", "[memory][pool]") {
  PoolOptions options;
  options.min_chunk_bytes = 16 * MiB;
  options.growth = 0;
  options.grow_in_place = false;
  const Pool<Kokkos::HostSpace> pool(options);
  void* blocks[4];
  for (auto& block : blocks) block = pool.allocate(4 * MiB);
  CHECK(pool.stats().chunks == 1);
  CHECK(pool.stats().free_bytes == 0);
  CHECK(pool.stats().fragmentation() == 0.0);
  pool.deallocate(blocks[0]);
  pool.deallocate(blocks[2]);  // two separate 4 MiB holes
  PoolStats s = pool.stats();
  CHECK(s.free_bytes == 8 * MiB);
  CHECK(s.largest_free_block_bytes == 4 * MiB);
  CHECK(s.fragmentation() == Approx(0.5));
  pool.deallocate(blocks[1]);  // neighbours coalesce: 0, 1, 2 are one hole
  s = pool.stats();
  CHECK(s.largest_free_block_bytes == 12 * MiB);
  CHECK(s.fragmentation() == 0.0);
  // Best fit: a 4 MiB request takes the lowest-addressed fitting span, the front of the hole.
  void* again = pool.allocate(4 * MiB);
  CHECK(again == blocks[0]);
  pool.deallocate(again);
  pool.deallocate(blocks[3]);
}

TEST_CASE("a steady allocate/free cycle is served by the thread cache", "[memory][pool]") {
  const Pool<Kokkos::HostSpace> pool;
  for (int i = 0; i < 1000; ++i) pool.deallocate(pool.allocate(64));
  const PoolStats s = pool.stats();
  CHECK(s.cache_misses == 1);
  CHECK(s.cache_hits == 999);
  CHECK(s.cache_hit_rate() == Approx(0.999));
  std::ostringstream printed;
  printed << s;
  CHECK_THAT(printed.str(), Catch::Contains("in use 0 B") && Catch::Contains("cache hit rate 0.999") &&
                                Catch::Contains("fragmentation"));
}

TEST_CASE("concurrent allocate/free on every core, with blocks freed by another thread", "[memory][pool][threads]") {
  const std::uint64_t seed = longattn::test::test_seed();
  INFO("seed " << seed);
  const Pool<Kokkos::HostSpace> pool;
  const int threads = int(std::max(2u, std::thread::hardware_concurrency()));
  std::mutex handoff_mutex;
  std::deque<std::pair<std::uint64_t*, std::size_t>> handoff;  // blocks one thread frees for another
  std::atomic<int> failures{0};
  std::atomic<std::uint64_t> allocations{0};

  auto worker = [&](int id) {
    std::mt19937_64 rng(seed + std::uint64_t(id));
    std::vector<std::pair<std::uint64_t*, std::size_t>> mine;
    // A block holds its address in its first and last words: an overlap shows as a mismatch.
    auto stamp = [](std::uint64_t* p, std::size_t words) { p[0] = p[words - 1] = reinterpret_cast<std::uint64_t>(p); };
    auto intact = [](std::uint64_t* p, std::size_t words) {
      return p[0] == reinterpret_cast<std::uint64_t>(p) && p[words - 1] == reinterpret_cast<std::uint64_t>(p);
    };
    auto release = [&](std::pair<std::uint64_t*, std::size_t> block) {
      if (!intact(block.first, block.second)) ++failures;
      pool.deallocate(block.first);
    };
    for (int op = 0; op < 40000; ++op) {
      const unsigned dice = unsigned(rng() % 100);
      if (dice < 50 || mine.empty()) {
        const std::size_t words = rng() % 64 == 0 ? (MiB + rng() % (3 * MiB)) / 8 : 1 + rng() % (8 * KiB);
        auto* p = static_cast<std::uint64_t*>(pool.allocate(words * 8));
        stamp(p, words);
        ++allocations;
        if (dice < 5) {
          const std::lock_guard<std::mutex> lock(handoff_mutex);
          handoff.emplace_back(p, words);
        } else {
          mine.emplace_back(p, words);
        }
      } else if (dice < 60) {
        std::pair<std::uint64_t*, std::size_t> foreign{nullptr, 0};
        {
          const std::lock_guard<std::mutex> lock(handoff_mutex);
          if (!handoff.empty()) {
            foreign = handoff.front();
            handoff.pop_front();
          }
        }
        if (foreign.first) release(foreign);
      } else {
        const std::size_t i = rng() % mine.size();
        release(mine[i]);
        mine[i] = mine.back();
        mine.pop_back();
      }
    }
    for (const auto& block : mine) release(block);
  };
  std::vector<std::thread> pool_threads;
  for (int t = 0; t < threads; ++t) pool_threads.emplace_back(worker, t);
  for (auto& t : pool_threads) t.join();
  for (const auto& block : handoff) pool.deallocate(block.first);

  CHECK(failures == 0);
  const PoolStats s = pool.stats();  // the workers' caches came back when they exited
  CHECK(s.in_use_bytes == 0);
  CHECK(s.allocations == allocations);
  CHECK(s.deallocations == allocations);
  check_accounting(s);
  pool.trim();
  CHECK(pool.stats().reserved_bytes == 0);
}

TEST_CASE("bad arguments, double frees and foreign pointers are longattn::Errors", "[memory][pool][errors]") {
  const Pool<Kokkos::HostSpace> pool;
  CHECK_THROWS_WITH(pool.allocate(0), Catch::Contains("argument 'bytes' is 0, expected from 1 to 2^56"));
  CHECK_THROWS_WITH(pool.allocate(64, 3), Catch::Contains("argument 'alignment' is 3, expected a power of two"));
  CHECK_THROWS_WITH(pool.allocate(64, 128 * KiB), Catch::Contains("argument 'alignment' is 131072"));
  CHECK_THROWS_WITH(pool.allocate(std::size_t(1) << 60), Catch::Contains("argument 'bytes'"));
  CHECK_NOTHROW(pool.deallocate(nullptr));

  for (const std::size_t bytes : {std::size_t(48), 300 * KiB, 3 * MiB}) {
    INFO("block of " << bytes << " bytes");
    void* p = pool.allocate(bytes);
    CHECK_THROWS_WITH(pool.deallocate(static_cast<char*>(p) + 16),
                      Catch::Contains("argument 'ptr'") && Catch::Contains("expected the start of a block"));
    pool.deallocate(p);
    CHECK_THROWS_WITH(pool.deallocate(p), Catch::Contains("double free"));
    CHECK_THROWS_WITH(pool.block_size(p), Catch::Contains("expected a live block"));
  }
  int on_stack = 0;
  CHECK_THROWS_WITH(pool.deallocate(&on_stack), Catch::Contains("it lies in none of its chunks"));
  const Pool<Kokkos::HostSpace> other;
  void* theirs = other.allocate(100);
  CHECK_THROWS_WITH(pool.deallocate(theirs), Catch::Contains("it lies in none of its chunks"));
  other.deallocate(theirs);
  CHECK(pool.stats().in_use_bytes == 0);

  PoolOptions options;
  options.min_chunk_bytes = 4096;
  CHECK_THROWS_WITH(Pool<Kokkos::HostSpace>(options), Catch::Contains("argument 'options.min_chunk_bytes' is 4096"));
  options = PoolOptions();
  options.growth = -1;
  CHECK_THROWS_WITH(Pool<Kokkos::HostSpace>(options), Catch::Contains("argument 'options.growth' is -1"));
}

TEST_CASE("chunks are reported to Kokkos tools under the pool's label", "[memory][pool]") {
  static std::size_t seen_bytes = 0;
  seen_bytes = 0;
  Kokkos::Tools::Experimental::set_allocate_data_callback(
      [](Kokkos::Tools::SpaceHandle, const char* label, const void*, std::uint64_t bytes) {
        if (std::string(label) == "tools-visible") seen_bytes += bytes;
      });
  {
    PoolOptions options;
    options.label = "tools-visible";
    const Pool<Kokkos::HostSpace> pool(options);
    pool.deallocate(pool.allocate(3 * MiB));
    CHECK(seen_bytes == pool.stats().reserved_bytes);
  }
  Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr);
  CHECK(seen_bytes >= 3 * MiB);
}
