#pragma once
// How this copy of longattn was built: versions, Kokkos backends and target architecture.
#include <string>
#include <vector>

namespace longattn {

struct BuildInfo {
  std::string version;                        // longattn's
  std::string build_type;                     // CMake build type
  std::string compiler;                       // e.g. "GNU 12.2.0"
  std::string kokkos_version;                 // as its CMake package names it, e.g. "3.4.01", "4.6.1"
  std::string kokkos_kernels_version;         // e.g. "4.6.02"
  std::vector<std::string> execution_spaces;  // enabled Kokkos backends, e.g. {"OpenMP", "Serial"}
  std::string default_execution_space;
  std::string architecture;                   // Kokkos arch and vector ISA, e.g. "SKX (AVX-512)"
  bool cuda = false, mpi = false, nccl = false, hwloc = false;
};

BuildInfo build_info();

}  // namespace longattn
