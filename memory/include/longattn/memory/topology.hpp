#pragma once
// The machine as hwloc sees it: packages, NUMA nodes, cores, hardware threads, caches.
// Topology::system() reads this machine; Topology::synthetic() builds one from an hwloc
// synthetic description ("package:2 numa:2 core:4 pu:1"), which is how tests check NUMA
// bookkeeping for machines they do not run on. The NUMA arenas of the pool build on this.
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
  // A machine described in hwloc's synthetic syntax; throws longattn::Error on a bad
  // description or when longattn was built without hwloc.
  static Topology synthetic(const std::string& description);

  TopologySummary summary() const;

  Topology(Topology&&) noexcept;
  Topology& operator=(Topology&&) noexcept;
  ~Topology();

 private:
  struct Impl;
  explicit Topology(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace longattn::memory
