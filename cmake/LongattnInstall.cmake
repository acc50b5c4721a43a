# Installs the package config so that another project can `find_package(longattn)`.
include(CMakePackageConfigHelpers)
set(LONGATTN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/longattn)

install(EXPORT longattnTargets NAMESPACE longattn:: DESTINATION ${LONGATTN_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/longattnConfig.cmake.in
  ${PROJECT_BINARY_DIR}/longattnConfig.cmake INSTALL_DESTINATION ${LONGATTN_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/longattnConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/longattnConfig.cmake
              ${PROJECT_BINARY_DIR}/longattnConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/Findhwloc.cmake
              ${PROJECT_SOURCE_DIR}/cmake/FindNCCL.cmake
        DESTINATION ${LONGATTN_CMAKE_DIR})
