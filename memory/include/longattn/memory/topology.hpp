#pragma once
// The machine as hwloc sees it: packages, NUMA nodes, cores, hardware threads, caches.
// Topology::system() reads this machine; Topology::synthetic() builds one from an hwloc
// synthetic description ("package:2 numa:2 core:4 pu:1"), which is how tests check NUMA
// bookkeeping for machines they do not run on. The NUMA arenas of the pool build on this: which
// node a CPU belongs to, binding a range of memory to a node (or interleaving it), and where the
// pages of a range actually are.
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace longattn::memory {

struct CacheLevel {
  int level = 0;                 // 1, 2, 3, ...
  std::string kind;              // "data", "instruction" or "unified"
  std::size_t size_bytes = 0;    // of one cache
  int count = 0;                 // how many of them in the machine
};

struct TopologySummary {
  std::string source;            // "hwloc <version>", "hwloc synthetic: ..." or a fallback
  int packages = 0;
  int numa_nodes = 0;
  int cores = 0;
  int hardware_threads = 0;
  std::vector<std::size_t> numa_memory_bytes;  // local memory of each NUMA node (0 if unknown)
  std::vector<CacheLevel> caches;              // ordered by level, data before instruction
  std::string cpu_model;                       // from the first package, if hwloc knows it
};

class Topology {
 public:
  // This machine. Without hwloc (LONGATTN_ENABLE_HWLOC=OFF) only the core count is known.
  static Topology system();
  // This machine, read once per process and shared (what pools use by default).
  static std::shared_ptr<const Topology> shared_system();
  // A machine described in hwloc's synthetic syntax; throws longattn::Error on a bad
  // description or when longattn was built without hwloc. Binding on it does nothing, unless
  // `bind_on_this_machine`: then hwloc takes its NUMA nodes for this machine's and really binds
  // (a node this machine lacks is refused by the OS, which is how tests see a refusal).
  static Topology synthetic(const std::string& description, bool bind_on_this_machine = false);

  TopologySummary summary() const;

  int numa_nodes() const;
  // Whether bind_memory acts on this machine's memory.
  bool binds_this_machine() const;
  // Index (0 .. numa_nodes()-1) of the NUMA node holding the OS CPU `cpu`; -1 if no node has it.
  int numa_node_of_cpu(int cpu) const;
  // Binds the pages of [begin, begin + bytes) to NUMA node `node`, or interleaves them over
  // every node when node < 0. Returns "" on success, else why it was not done (the OS refused,
  // or the topology is not this machine's). Pages fault in on their node when first touched.
  std::string bind_memory(void* begin, std::size_t bytes, int node) const;
  // NUMA node indices holding the pages of [begin, begin + bytes) that have been touched.
  std::vector<int> memory_nodes(const void* begin, std::size_t bytes) const;

  Topology(Topology&&) noexcept;
  Topology& operator=(Topology&&) noexcept;
  ~Topology();

 private:
  struct Impl;
  explicit Topology(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace longattn::memory
