// Example 05: a memory pool under a training loop. Each step keeps its layers' activations as
// PooledViews (allocated in forward, released in reverse in backward); the sequence length
// changes from step to step. After the longest step the pool holds enough, and later steps
// reuse that memory without asking the memory space again. Then raw blocks, the error a double
// free gives, and NUMA placement of host memory.
#include <Kokkos_Core.hpp>

#include <cstdio>
#include <iostream>
#include <vector>

#include "longattn/error.hpp"
#include "longattn/memory/pooled_view.hpp"

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard guard(argc, argv);
  using Exec = Kokkos::DefaultExecutionSpace;
  using Space = Exec::memory_space;
  using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, Space>;  // [tokens, embedding]
  namespace memory = longattn::memory;

  memory::PoolOptions options;
  options.label = "example pool";
  const memory::Pool<Space> pool(options);  // a handle: copies share the pool

  const int lengths[] = {512, 1024, 768, 1024, 512}, layers = 4, E = 256;
  std::size_t reserved_after_longest = 0;
  for (int step = 0; step < 5; ++step) {
    const int N = lengths[step];
    pool.reset_high_water();  // this step's peak
    std::vector<memory::PooledView<Matrix>> activations;
    for (int layer = 0; layer < layers; ++layer) {  // forward: one output per layer, kept
      activations.emplace_back(pool, N, E);
      const Matrix out = activations.back();  // an ordinary View for the kernel
      Kokkos::parallel_for(
          Kokkos::RangePolicy<Exec>(0, N), KOKKOS_LAMBDA(int i) {
            for (int e = 0; e < E; ++e) out(i, e) = float(layer + i + e);
          });
    }
    while (!activations.empty()) activations.pop_back();  // backward: released in reverse
    const memory::PoolStats s = pool.stats();
    std::printf("step %d, N = %4d: peak in use %5zu KiB, reserved %5zu KiB in %zu chunk(s)\n", step, N,
                s.in_use_high_water_bytes >> 10, s.reserved_bytes >> 10, s.chunks);
    if (step == 1) reserved_after_longest = s.reserved_bytes;
  }
  std::cout << pool.stats() << "\n";
  const bool reused = pool.stats().reserved_bytes == reserved_after_longest;

  // Raw blocks: any size, aligned (64 bytes unless asked). A bad free is an error, not a crash.
  void* block = pool.allocate(1000);
  std::printf("a block of 1000 bytes occupies %zu\n", pool.block_size(block));
  pool.deallocate(block);
  try {
    pool.deallocate(block);
  } catch (const longattn::Error& e) {
    std::printf("double free caught: %s\n", e.what());
  }

  // Host memory goes to a NUMA node (or is interleaved) and is bound there through hwloc.
  const memory::Pool<Kokkos::HostSpace> host;
  void* near = host.allocate(std::size_t(4) << 20, 64, memory::NumaPlacement::on_node(0));
  std::printf("host pool: %d arena(s); node 0: %s\n", host.arenas(), host.arena_stats()[0].binding.c_str());
  host.deallocate(near);

  std::printf(reused ? "steps 2-4 reused the memory of step 1: nothing new was reserved\n"
                     : "later steps reserved more memory than the longest one needed\n");
  return reused ? 0 : 1;
}
