#include "longattn/memory/topology.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
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
  bool binds = false;  // binding acts on this machine
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
  impl->binds = hwloc_topology_is_thissystem(impl->topology) != 0;
  return Topology(std::move(impl));
}

Topology Topology::synthetic(const std::string& description, bool bind_on_this_machine) {
  auto impl = std::make_unique<Impl>();
  if (hwloc_topology_init(&impl->topology) != 0)
    throw Error("longattn::memory::Topology::synthetic: hwloc_topology_init failed");
  if (bind_on_this_machine) hwloc_topology_set_flags(impl->topology, HWLOC_TOPOLOGY_FLAG_IS_THISSYSTEM);
  if (hwloc_topology_set_synthetic(impl->topology, description.c_str()) != 0 ||
      hwloc_topology_load(impl->topology) != 0)
    throw_invalid_argument("longattn::memory::Topology::synthetic", "description",
                           "\"" + description + "\"",
                           "an hwloc synthetic topology such as \"package:2 numa:2 core:4 pu:1\"");
  impl->source = "hwloc synthetic: " + description;
  impl->binds = bind_on_this_machine;
  return Topology(std::move(impl));
}

int Topology::numa_nodes() const { return std::max(1, count_of(impl_->topology, HWLOC_OBJ_NUMANODE)); }

bool Topology::binds_this_machine() const { return impl_->binds; }

int Topology::numa_node_of_cpu(int cpu) const {
  if (cpu < 0) return -1;
  const int nodes = count_of(impl_->topology, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < nodes; ++i) {
    hwloc_obj_t node = hwloc_get_obj_by_type(impl_->topology, HWLOC_OBJ_NUMANODE, i);
    if (node->cpuset && hwloc_bitmap_isset(node->cpuset, static_cast<unsigned>(cpu))) return i;
  }
  return -1;
}

std::string Topology::bind_memory(void* begin, std::size_t bytes, int node) const {
  if (!impl_->binds) return "not bound: the topology is not this machine's (" + impl_->source + ")";
  hwloc_topology_t t = impl_->topology;
  const int nodes = count_of(t, HWLOC_OBJ_NUMANODE);
  if (node >= nodes) return "no NUMA node " + std::to_string(node) + " (the topology has " + std::to_string(nodes) + ")";
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  for (int i = 0; i < nodes; ++i)
    if (node < 0 || i == node) hwloc_bitmap_set(set, hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, i)->os_index);
  const hwloc_membind_policy_t policy = node < 0 ? HWLOC_MEMBIND_INTERLEAVE : HWLOC_MEMBIND_BIND;
  errno = 0;
  const int rc = hwloc_set_area_membind(t, begin, bytes, set, policy, HWLOC_MEMBIND_BYNODESET);
  const int error = errno;
  hwloc_bitmap_free(set);
  if (rc == 0) return "";
  return std::string("hwloc_set_area_membind refused: ") + std::strerror(error);
}

std::vector<int> Topology::memory_nodes(const void* begin, std::size_t bytes) const {
  std::vector<int> found;
  if (!impl_->binds) return found;
  hwloc_topology_t t = impl_->topology;
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  if (hwloc_get_area_memlocation(t, begin, bytes, set, HWLOC_MEMBIND_BYNODESET) == 0) {
    const int nodes = count_of(t, HWLOC_OBJ_NUMANODE);
    for (int i = 0; i < nodes; ++i)
      if (hwloc_bitmap_isset(set, hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, i)->os_index)) found.push_back(i);
  }
  hwloc_bitmap_free(set);
  return found;
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

Topology Topology::synthetic(const std::string& description, bool) {
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

int Topology::numa_nodes() const { return 1; }
bool Topology::binds_this_machine() const { return false; }
int Topology::numa_node_of_cpu(int cpu) const { return cpu < 0 ? -1 : 0; }
std::string Topology::bind_memory(void*, std::size_t, int) const {
  return "not bound: longattn was built with LONGATTN_ENABLE_HWLOC=OFF";
}
std::vector<int> Topology::memory_nodes(const void*, std::size_t) const { return {}; }

#endif

std::shared_ptr<const Topology> Topology::shared_system() {
  static const std::shared_ptr<const Topology> machine = std::make_shared<const Topology>(system());
  return machine;
}

Topology::Topology(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Topology::Topology(Topology&&) noexcept = default;
Topology& Topology::operator=(Topology&&) noexcept = default;
Topology::~Topology() = default;

}  // namespace longattn::memory
