# Helpers that give every longattn target the same layout, warnings and sanitizers.

# Kokkos' SKX flags make GCC auto-vectorize with 256-bit registers only. longattn's own code (the
# explicitly instantiated kernels in its libraries, its apps, tests and benchmarks) asks for
# 512-bit vectors; the flag is private to those targets, never on an exported one, so a
# consumer's compile lines are its own (kernels it instantiates from the headers get its flags).
set(LONGATTN_ARCH_FLAGS "")
if("SKX" IN_LIST Kokkos_ARCH AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  set(LONGATTN_ARCH_FLAGS -mprefer-vector-width=512)
endif()

if(LONGATTN_SANITIZE)
  add_compile_options(-fsanitize=${LONGATTN_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${LONGATTN_SANITIZE})
  # GCC 12 reports false "may be used uninitialized" inside libstdc++'s <regex> (via Catch2)
  # when ASan instruments it; plain builds keep the warning.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    add_compile_options(-Wno-maybe-uninitialized)
  endif()
endif()

# -Wall -Wextra and the vector width on longattn's own code (dependencies' headers come in as
# SYSTEM includes).
function(longattn_set_compile_options target)
  target_compile_options(${target} PRIVATE -Wall -Wextra ${LONGATTN_ARCH_FLAGS})
  if(LONGATTN_WARNINGS_AS_ERRORS)
    target_compile_options(${target} PRIVATE -Werror)
    # nvcc_wrapper hands -Werror to the host compiler; nvcc's own front end warns separately.
    if(LONGATTN_ENABLE_CUDA)
      target_compile_options(${target} PRIVATE "SHELL:-Xcudafe --promote_warnings")
    endif()
  endif()
endfunction()

# longattn_add_library(<layer> SOURCES <src...> DEPENDS <targets...>)
# Builds longattn_<layer> from <layer>/src, public headers in <layer>/include, exported as
# longattn::<layer>.
function(longattn_add_library layer)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPENDS" ${ARGN})
  set(target longattn_${layer})
  add_library(${target} ${ARG_SOURCES})
  add_library(longattn::${layer} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${layer} OUTPUT_NAME longattn_${layer}
                        VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(${target} PUBLIC ${ARG_DEPENDS})
  target_compile_features(${target} PUBLIC cxx_std_17)
  longattn_set_compile_options(${target})
  install(TARGETS ${target} EXPORT longattnTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  install(DIRECTORY include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.hpp")
endfunction()
