# Finds what longattn builds on. The same calls run again from longattnConfig.cmake in an
# install tree (cmake/longattnConfig.cmake.in), so keep the two in step.

# Kokkos and Kokkos Kernels 3.4 through 4.x: scripts/install-deps.sh prints a prefix with 3.4.01
# for CMAKE_PREFIX_PATH; a cluster's own installation works the same way. (No version range in
# find_package: Kokkos 3.x accepts only its own major version there.)
foreach(package Kokkos KokkosKernels)
  find_package(${package} REQUIRED)
  if(${package}_VERSION VERSION_LESS 3.4 OR ${package}_VERSION VERSION_GREATER_EQUAL 5)
    message(FATAL_ERROR "longattn supports ${package} 3.4 through 4.x; found ${package} ${${package}_VERSION} "
                        "in ${${package}_DIR}. Point CMAKE_PREFIX_PATH (or ${package}_ROOT) at a supported one.")
  endif()
endforeach()

# A GPU backend in Kokkos and longattn's option for it go together: the option picks the
# compiler the build needs, and a mismatch would fail far from its cause.
foreach(backend IN ITEMS CUDA HIP)
  if(backend STREQUAL "CUDA")
    set(install "scripts/install-deps.sh --cuda")
    set(compiler "CMAKE_CXX_COMPILER=<kokkos>/bin/nvcc_wrapper")
  else()
    set(install "scripts/install-deps.sh --hip")
    set(compiler "CMAKE_CXX_COMPILER=hipcc")
  endif()
  if(LONGATTN_ENABLE_${backend} AND NOT "${backend}" IN_LIST Kokkos_DEVICES)
    message(FATAL_ERROR "LONGATTN_ENABLE_${backend}=ON but the Kokkos found in ${Kokkos_DIR} has no ${backend} "
                        "backend (Kokkos_DEVICES=${Kokkos_DEVICES}); build it with ${install}")
  endif()
  if(NOT LONGATTN_ENABLE_${backend} AND "${backend}" IN_LIST Kokkos_DEVICES)
    message(FATAL_ERROR "the Kokkos found in ${Kokkos_DIR} has the ${backend} backend: configure with "
                        "-DLONGATTN_ENABLE_${backend}=ON and ${compiler}")
  endif()
endforeach()

if(LONGATTN_ENABLE_MPI)
  set(MPI_CXX_SKIP_MPICXX ON)           # the C API only; no deprecated C++ bindings
  set(MPI_DETERMINE_LIBRARY_VERSION ON) # tests need to know Open MPI from others
  find_package(MPI REQUIRED COMPONENTS CXX)
endif()
if(LONGATTN_ENABLE_HWLOC)
  find_package(hwloc REQUIRED)
endif()
if(LONGATTN_ENABLE_NCCL)
  find_package(NCCL REQUIRED)
endif()
