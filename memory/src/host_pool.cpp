// Host pools: one arena per NUMA node of the pool's topology (and, with several nodes, one more
// whose chunks are interleaved over all of them). Host chunks are fresh anonymous mappings, so
// that a binding set before the first touch decides where every page lands (memory reused from
// the C heap may already sit on another node), reserved large and committed as they grow;
// Kokkos tools are told about them like any HostSpace allocation.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <unordered_map>

#include "pool_state.hpp"

namespace longattn::memory::detail {
namespace {

class HostChunkSource final : public ChunkSource {
 public:
  // node >= 0: bound to that NUMA node; node < 0: interleaved over all nodes. Each chunk is the
  // start of its own reservation of `reservation_bytes` of address space (the pool's limit), so
  // it can grow in place until the limit.
  HostChunkSource(std::string label, std::shared_ptr<const Topology> topology, int node, std::size_t reservation_bytes)
      : label_(std::move(label)), topology_(std::move(topology)), node_(node), reservation_bytes_(reservation_bytes) {}

  ~HostChunkSource() override {
    for (const auto& [base, reservation] : reservations_) munmap(reservation.first, reservation.second);
  }

  // Reserves address space without committing memory, then commits the first `bytes`. Where a
  // large reservation is refused (a cap on address space), the chunk gets just its own bytes.
  void* obtain(std::size_t bytes) override {
    std::size_t reserve = std::max(bytes, reservation_bytes_) + page_bytes;  // + slack to align
    void* range = mmap(nullptr, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (range == MAP_FAILED && reserve > bytes + page_bytes) {
      reserve = bytes + page_bytes;
      range = mmap(nullptr, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    }
    if (range == MAP_FAILED) throw std::runtime_error(std::string("mmap (reserve): ") + std::strerror(errno));
    void* base = reinterpret_cast<void*>(round_up(reinterpret_cast<std::uintptr_t>(range), page_bytes));
    if (mprotect(base, bytes, PROT_READ | PROT_WRITE) != 0) {
      const int error = errno;
      munmap(range, reserve);
      throw std::runtime_error(std::string("mprotect (commit): ") + std::strerror(error));
    }
    reservations_[base] = {range, reserve};
    tell_tools(true, base, bytes);
    return base;
  }

  bool extend(void* raw, std::size_t bytes, std::size_t more) override {
    const auto& [range, reserve] = reservations_.at(raw);
    const auto end = reinterpret_cast<std::uintptr_t>(raw) + bytes + more;
    if (end > reinterpret_cast<std::uintptr_t>(range) + reserve) return false;
    if (mprotect(static_cast<char*>(raw) + bytes, more, PROT_READ | PROT_WRITE) != 0) return false;
    tell_tools(false, raw, bytes);
    tell_tools(true, raw, bytes + more);
    return true;
  }

  void release(void* raw, std::size_t bytes) noexcept override {
    tell_tools(false, raw, bytes);
    const auto reservation = reservations_.find(raw);
    munmap(reservation->second.first, reservation->second.second);
    reservations_.erase(reservation);
  }

  std::string prepare(void* begin, std::size_t bytes) override {
    if (!topology_->binds_this_machine()) return "";
    return topology_->bind_memory(begin, bytes, node_);
  }
  std::size_t alignment() const override { return page_bytes; }
  std::string describe() const override {
    if (node_ >= 0) return std::string(Kokkos::HostSpace::name()) + ", NUMA node " + std::to_string(node_);
    return std::string(Kokkos::HostSpace::name()) + ", interleaved over " + std::to_string(topology_->numa_nodes()) +
           " NUMA nodes";
  }
  std::string binding() const override {
    if (!topology_->binds_this_machine())
      return "not bound (" + topology_->summary().source + ": bookkeeping only)";
    return node_ >= 0 ? "bound to NUMA node " + std::to_string(node_) + " through hwloc"
                      : "interleaved over " + std::to_string(topology_->numa_nodes()) + " NUMA nodes through hwloc";
  }

 private:
  // Kokkos tools see host chunks like any HostSpace allocation.
  void tell_tools(bool allocated, const void* ptr, std::size_t bytes) const {
    if (!Kokkos::Profiling::profileLibraryLoaded()) return;
    const auto space = Kokkos::Profiling::make_space_handle(Kokkos::HostSpace::name());
    if (allocated) Kokkos::Profiling::allocateData(space, label_, ptr, bytes);
    else Kokkos::Profiling::deallocateData(space, label_, ptr, bytes);
  }

  std::string label_;
  std::shared_ptr<const Topology> topology_;
  int node_;
  std::size_t reservation_bytes_;
  std::unordered_map<void*, std::pair<void*, std::size_t>> reservations_;  // chunk -> (mapping, bytes); under the arena's mutex
};

}  // namespace

std::shared_ptr<PoolState> make_host_pool_state(const PoolOptions& options) {
  const std::size_t physical = std::size_t(sysconf(_SC_PHYS_PAGES)) * std::size_t(sysconf(_SC_PAGESIZE));
  auto state = std::make_shared<PoolState>(options, physical);
  const std::shared_ptr<const Topology> topology = options.topology ? options.topology : Topology::shared_system();
  const int nodes = topology->numa_nodes();
  const std::size_t reservation = options.grow_in_place ? round_up(state->limit, page_bytes) : 0;
  for (int node = 0; node < nodes; ++node)
    state->arenas.push_back(
        std::make_unique<Arena>(*state, std::make_unique<HostChunkSource>(options.label, topology, node, reservation)));
  if (nodes > 1) {
    state->interleave_arena = nodes;
    state->arenas.push_back(
        std::make_unique<Arena>(*state, std::make_unique<HostChunkSource>(options.label, topology, -1, reservation)));
  }
  state->arena_of_cpu.assign(CPU_SETSIZE, 0);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) state->arena_of_cpu[std::size_t(cpu)] = std::max(0, topology->numa_node_of_cpu(cpu));
  return state;
}

}  // namespace longattn::memory::detail
