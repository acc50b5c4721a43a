# Runs longattn-info with short measurements and checks its report and its JSON.
execute_process(COMMAND ${PROGRAM} --seconds 0.02 --gemm-size 128 --json ${JSON}
                RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}")
if(NOT status EQUAL 0)
  message(FATAL_ERROR "longattn-info exited with ${status}: ${err}")
endif()
foreach(section "Build" "transport         host memory mpi" "Machine \\(hwloc" "MPI ranks: 1 on 1 node" "FMA peak"
               "sgemm n=128")
  if(NOT out MATCHES "${section}")
    message(FATAL_ERROR "report lacks '${section}'")
  endif()
endforeach()
file(READ ${JSON} json)
string(JSON kokkos GET "${json}" build kokkos)
string(JSON kokkos_kernels GET "${json}" build kokkos_kernels)
string(JSON cores GET "${json}" machine cores)
string(JSON ranks LENGTH "${json}" ranks)
string(JSON fma GET "${json}" ceilings fp32_fma_peak_one_core gflops)
string(JSON sgemm GET "${json}" ceilings sgemm_all_cores gflops)
# The versions CMake found for this build.
if(NOT kokkos STREQUAL KOKKOS_VERSION OR NOT kokkos_kernels STREQUAL KOKKOS_KERNELS_VERSION OR cores LESS 1 OR NOT ranks EQUAL 1 OR NOT fma GREATER 0 OR NOT sgemm GREATER 0)
  message(FATAL_ERROR "unexpected JSON: kokkos=${kokkos} (${KOKKOS_VERSION} expected) "
                      "kokkos_kernels=${kokkos_kernels} (${KOKKOS_KERNELS_VERSION} expected) cores=${cores} ranks=${ranks} fma=${fma} sgemm=${sgemm}")
endif()
