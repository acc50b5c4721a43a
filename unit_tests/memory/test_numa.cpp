// Host pools and NUMA: one arena per node of synthetic topologies (two and four nodes) with the
// placements routed and returned right; on this machine memory bound to node 0 is found there;
// a binding the OS refuses gives one warning and unbound, working memory.
#include <sched.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "longattn/config.hpp"
#include "longattn/error.hpp"
#include "longattn/memory/pool.hpp"

namespace {

using longattn::memory::NumaPlacement;
using longattn::memory::Pool;
using longattn::memory::PoolOptions;
using longattn::memory::Topology;
constexpr std::size_t MiB = 1024 * 1024;

// In-use bytes of every arena, in arena order.
std::vector<std::size_t> in_use_by_arena(const Pool<Kokkos::HostSpace>& pool) {
  std::vector<std::size_t> in_use;
  for (const auto& s : pool.arena_stats()) in_use.push_back(s.in_use_bytes);
  return in_use;
}

// Collects the pool's warnings for the duration of a test.
struct CapturedWarnings {
  std::vector<std::string> messages;
  longattn::memory::WarningHandler previous;
  CapturedWarnings() {
    previous = longattn::memory::set_warning_handler([this](const std::string& m) { messages.push_back(m); });
  }
  ~CapturedWarnings() { longattn::memory::set_warning_handler(previous); }
};

// Runs f on a thread pinned to `cpu`; false if this machine cannot run there.
template <class F>
bool on_cpu(int cpu, F f) {
  bool ran = false;
  std::thread pinned([&] {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) return;
    f();
    ran = true;
  });
  pinned.join();
  return ran;
}

}  // namespace

#if LONGATTN_HAVE_HWLOC
TEST_CASE("a host pool keeps one arena per NUMA node of a synthetic topology", "[memory][numa]") {
  for (const auto& [description, nodes] : {std::pair<std::string, int>{"package:2 numa:1 core:1 pu:1", 2},
                                           std::pair<std::string, int>{"package:2 numa:2 core:1 pu:1", 4}}) {
    INFO(description);
    PoolOptions options;
    options.topology = std::make_shared<const Topology>(Topology::synthetic(description));
    const Pool<Kokkos::HostSpace> pool(options);
    REQUIRE(pool.arenas() == nodes + 1);  // + the interleaved arena
    const auto arenas = pool.arena_stats();
    CHECK(arenas[1].name == "Host, NUMA node 1");
    CHECK(arenas[std::size_t(nodes)].name == "Host, interleaved over " + std::to_string(nodes) + " NUMA nodes");
    CHECK_THAT(arenas[0].binding, Catch::Contains("not bound") && Catch::Contains("bookkeeping only"));

    // node(i) lands in arena i, for small and large blocks; interleave in the last arena.
    std::vector<void*> blocks;
    for (int node = 0; node < nodes; ++node) {
      blocks.push_back(pool.allocate(std::size_t(1000) * (node + 1), 64, NumaPlacement::on_node(node)));
      blocks.push_back(pool.allocate(2 * MiB * (node + 1), 64, NumaPlacement::on_node(node)));
    }
    blocks.push_back(pool.allocate(3 * MiB, 64, NumaPlacement::interleave()));
    const auto in_use = in_use_by_arena(pool);
    for (int node = 0; node < nodes; ++node) {
      INFO("node " << node);
      CHECK(in_use[std::size_t(node)] ==
            longattn::memory::block_bytes(std::size_t(1000) * (node + 1)) + 2 * MiB * std::size_t(node + 1));
    }
    CHECK(in_use[std::size_t(nodes)] == 3 * MiB);
    CHECK_THROWS_WITH(pool.allocate(64, 64, NumaPlacement::on_node(nodes)),
                      Catch::Contains("argument 'placement' is node(" + std::to_string(nodes) + ")") &&
                          Catch::Contains("expected node(0) .. node(" + std::to_string(nodes - 1) + ")"));
    for (void* p : blocks) pool.deallocate(p);  // each block finds its own arena
    for (const std::size_t bytes : in_use_by_arena(pool)) CHECK(bytes == 0);
  }
}

TEST_CASE("local placement follows the CPU the thread runs on", "[memory][numa]") {
  // Synthetic PUs 0 and 1 sit on nodes 0 and 1; this machine's CPU k is taken as PU k.
  PoolOptions options;
  options.topology = std::make_shared<const Topology>(Topology::synthetic("numa:2 core:1 pu:1"));
  const Pool<Kokkos::HostSpace> pool(options);
  for (int cpu = 0; cpu < 2; ++cpu) {
    std::vector<std::size_t> in_use;
    const bool ran = on_cpu(cpu, [&] {
      void* p = pool.allocate(5 * MiB);  // the pool's default placement: local
      in_use = in_use_by_arena(pool);
      pool.deallocate(p);
    });
    if (!ran) {
      WARN("CPU " << cpu << " is not available to this process: local placement on node " << cpu << " not checked");
      continue;
    }
    INFO("CPU " << cpu);
    CHECK(in_use[std::size_t(cpu)] == 5 * MiB);
    CHECK(in_use[std::size_t(1 - cpu)] == 0);
  }
}

TEST_CASE("memory bound to a NUMA node of this machine lies on it", "[memory][numa]") {
  const CapturedWarnings warnings;
  const Pool<Kokkos::HostSpace> pool;  // this machine
  const std::size_t bytes = 8 * MiB;
  auto* p = static_cast<char*>(pool.allocate(bytes, 64, NumaPlacement::on_node(0)));
  std::memset(p, 1, bytes);  // fault the pages in
  const std::string binding = pool.arena_stats()[0].binding;
  INFO(binding);
  if (binding.find("refused") == std::string::npos) {
    CHECK_THAT(binding, Catch::Contains("bound to NUMA node 0 through hwloc"));
    CHECK(Topology::shared_system()->memory_nodes(p, bytes) == std::vector<int>{0});
    CHECK(warnings.messages.empty());
  } else {  // a sandbox that forbids mbind: one warning, working memory
    CHECK(warnings.messages.size() == 1);
    CHECK(p[bytes - 1] == 1);
  }
  pool.deallocate(p);
}

TEST_CASE("a binding the OS refuses gives one warning and unbound memory", "[memory][numa]") {
  // Two nodes taken for this machine's: it has no node 1, so the kernel refuses that binding.
  if (Topology::system().numa_nodes() > 1) {
    WARN("this machine has several NUMA nodes: the refusal is not provoked here");
    return;
  }
  const CapturedWarnings warnings;
  PoolOptions options;
  options.label = "refusal";
  options.topology = std::make_shared<const Topology>(Topology::synthetic("numa:2 core:1 pu:1", true));
  options.min_chunk_bytes = 2 * MiB;
  const Pool<Kokkos::HostSpace> pool(options);
  std::vector<char*> blocks;
  for (int i = 0; i < 3; ++i) {  // three chunks, one warning
    auto* p = static_cast<char*>(pool.allocate(3 * MiB, 64, NumaPlacement::on_node(1)));
    std::memset(p, 7, 3 * MiB);
    CHECK(p[3 * MiB - 1] == 7);
    blocks.push_back(p);
  }
  REQUIRE(warnings.messages.size() == 1);
  CHECK_THAT(warnings.messages[0], Catch::Contains("memory pool 'refusal'") && Catch::Contains("NUMA binding refused") &&
                                       Catch::Contains("unbound memory"));
  CHECK_THAT(pool.arena_stats()[1].binding, Catch::Contains("refused by the OS"));
  for (char* p : blocks) pool.deallocate(p);
}
#endif

TEST_CASE("placement errors and host-pool defaults", "[memory][numa][errors]") {
  PoolOptions options;
  options.placement = NumaPlacement::on_node(-2);
  CHECK_THROWS_WITH(Pool<Kokkos::HostSpace>(options), Catch::Contains("argument 'options.placement' is node(-2)"));
  const Pool<Kokkos::HostSpace> pool;
  const std::size_t physical = std::size_t(sysconf(_SC_PHYS_PAGES)) * std::size_t(sysconf(_SC_PAGESIZE));
  CHECK(pool.stats().limit_bytes == physical);  // never over-commits the machine
  CHECK(longattn::memory::to_string(NumaPlacement::interleave()) == "interleave");
  CHECK(longattn::memory::to_string(NumaPlacement::local()) == "local");
}
