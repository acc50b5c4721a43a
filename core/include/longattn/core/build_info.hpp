#pragma once
// How this copy of longattn was built: versions, Kokkos backends and target architecture.
#include <string>
#include <vector>

namespace longattn {

struct BuildInfo {
  std::string version;                        // longattn's
  std::string build_type;                     // CMake build type
  std::string compiler;                       // e.g. "GNU 12.2.0"
  std::string kokkos_version;                 // e.g. "3.4.1"
  std::vector<std::string> execution_spaces;  // enabled Kokkos backends, e.g. {"OpenMP", "Serial"}
  std::string default_execution_space;
  std::string architecture;                   // Kokkos arch and vector ISA, e.g. "SKX (AVX-512)"
  bool cuda = false, mpi = false, nccl = false, hwloc = false;
};

BuildInfo build_info();

}  // namespace longattn
