// A CUDA build's tests on a machine without a GPU: preloaded (LD_PRELOAD) into a test program of
// the CUDA variant, this library replaces Kokkos' initialize, finalize, is_initialized, fence and
// push_finalize_hook so that Kokkos brings up Kokkos::Serial alone; Kokkos 3.4 initializes every
// backend it was built with and stops where the CUDA driver finds no device. The test cases on
// Serial then run the host code that nvcc compiled (its host pass through the same GCC, but with
// nvcc's front end, lambda wrappers and the portable lane loops of pack.hpp), which no host build
// runs. A case that touches Kokkos::Cuda fails with the CUDA runtime's error; run only the Serial
// cases (`"* - 0"`).
#include <Kokkos_Core.hpp>

#include <cstdio>
#include <functional>
#include <vector>

#if !defined(KOKKOS_ENABLE_SERIAL) || KOKKOS_VERSION >= 40000
#error "serial_only_kokkos.cpp is written for Kokkos 3.x builds with Kokkos::Serial"
#endif

namespace {
bool serial_initialized = false;
std::vector<std::function<void()>> finalize_hooks;  // run last-pushed first, as Kokkos does
}

namespace Kokkos {

void initialize(int&, char**) {
  std::fprintf(stderr, "serial_only_kokkos: Kokkos::Serial alone; Kokkos::Cuda is not initialized\n");
  Kokkos::Serial::impl_initialize();
  serial_initialized = true;
}

void initialize(InitArguments) {
  int argc = 0;
  initialize(argc, nullptr);
}

bool is_initialized() noexcept { return serial_initialized; }

void push_finalize_hook(std::function<void()> hook) { finalize_hooks.push_back(std::move(hook)); }

void finalize() {
  while (!finalize_hooks.empty()) {
    const std::function<void()> hook = std::move(finalize_hooks.back());
    finalize_hooks.pop_back();
    hook();
  }
  Kokkos::Serial::impl_finalize();
  serial_initialized = false;
}

void fence() { Kokkos::Serial::impl_static_fence(); }

}  // namespace Kokkos
