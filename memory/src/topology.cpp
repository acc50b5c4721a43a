#include "longattn/memory/topology.hpp"

#include <algorithm>
#include <thread>

#include "longattn/config.hpp"
#include "longattn/error.hpp"

#if LONGATTN_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace longattn::memory {

#if LONGATTN_HAVE_HWLOC

struct Topology::Impl {
  hwloc_topology_t topology = nullptr;
  std::string source;
  ~Impl() {
    if (topology) hwloc_topology_destroy(topology);
  }
};

namespace {

int count_of(hwloc_topology_t topology, hwloc_obj_type_t type) {
  return std::max(0, hwloc_get_nbobjs_by_type(topology, type));
}

}  // namespace

Topology Topology::system() {
  auto impl = std::make_unique<Impl>();
  if (hwloc_topology_init(&impl->topology) != 0 || hwloc_topology_load(impl->topology) != 0)
    throw Error("longattn::memory::Topology::system: hwloc could not read this machine's topology");
  impl->source = "hwloc " HWLOC_VERSION;
  return Topology(std::move(impl));
}

Topology Topology::synthetic(const std::string& description) {
  auto impl = std::make_unique<Impl>();
  if (hwloc_topology_init(&impl->topology) != 0)
    throw Error("longattn::memory::Topology::synthetic: hwloc_topology_init failed");
  if (hwloc_topology_set_synthetic(impl->topology, description.c_str()) != 0 ||
      hwloc_topology_load(impl->topology) != 0)
    throw_invalid_argument("longattn::memory::Topology::synthetic", "description",
                           "\"" + description + "\"",
                           "an hwloc synthetic topology such as \"package:2 numa:2 core:4 pu:1\"");
  impl->source = "hwloc synthetic: " + description;
  return Topology(std::move(impl));
}

TopologySummary Topology::summary() const {
  hwloc_topology_t t = impl_->topology;
  TopologySummary s;
  s.source = impl_->source;
  s.packages = count_of(t, HWLOC_OBJ_PACKAGE);
  s.numa_nodes = count_of(t, HWLOC_OBJ_NUMANODE);
  s.cores = count_of(t, HWLOC_OBJ_CORE);
  s.hardware_threads = count_of(t, HWLOC_OBJ_PU);
  for (int i = 0; i < s.numa_nodes; ++i) {
    hwloc_obj_t node = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, i);
    s.numa_memory_bytes.push_back(node->attr ? node->attr->numanode.local_memory : 0);
  }
  const hwloc_obj_type_t cache_types[] = {HWLOC_OBJ_L1CACHE,  HWLOC_OBJ_L1ICACHE, HWLOC_OBJ_L2CACHE,
                                          HWLOC_OBJ_L2ICACHE, HWLOC_OBJ_L3CACHE,  HWLOC_OBJ_L3ICACHE,
                                          HWLOC_OBJ_L4CACHE,  HWLOC_OBJ_L5CACHE};
  for (hwloc_obj_type_t type : cache_types) {
    const int count = count_of(t, type);
    if (count == 0) continue;
    hwloc_obj_t first = hwloc_get_obj_by_type(t, type, 0);
    CacheLevel c;
    c.level = static_cast<int>(first->attr->cache.depth);
    c.kind = first->attr->cache.type == HWLOC_OBJ_CACHE_INSTRUCTION ? "instruction"
             : first->attr->cache.type == HWLOC_OBJ_CACHE_DATA      ? "data"
                                                                    : "unified";
    c.size_bytes = static_cast<std::size_t>(first->attr->cache.size);
    c.count = count;
    s.caches.push_back(c);
  }
  if (hwloc_obj_t package = hwloc_get_obj_by_type(t, HWLOC_OBJ_PACKAGE, 0)) {
    if (const char* model = hwloc_obj_get_info_by_name(package, "CPUModel")) s.cpu_model = model;
  }
  return s;
}

#else  // without hwloc: what the C++ runtime knows

struct Topology::Impl {};

Topology Topology::system() { return Topology(std::make_unique<Impl>()); }

Topology Topology::synthetic(const std::string& description) {
  throw_invalid_argument("longattn::memory::Topology::synthetic", "description",
                         "\"" + description + "\"",
                         "nothing: longattn was built with LONGATTN_ENABLE_HWLOC=OFF");
}

TopologySummary Topology::summary() const {
  TopologySummary s;
  s.source = "std::thread (built without hwloc)";
  s.packages = 1;
  s.numa_nodes = 1;
  s.hardware_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  s.cores = s.hardware_threads;
  s.numa_memory_bytes.push_back(0);
  return s;
}

#endif

Topology::Topology(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Topology::Topology(Topology&&) noexcept = default;
Topology& Topology::operator=(Topology&&) noexcept = default;
Topology::~Topology() = default;

}  // namespace longattn::memory
