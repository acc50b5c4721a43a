#include <Kokkos_Core.hpp>
#include <algorithm>
#include <string>
#include <catch2/catch.hpp>

#include "longattn/config.hpp"
#include "longattn/core/build_info.hpp"
#include "longattn/error.hpp"

TEST_CASE("build info describes this build", "[core]") {
  const auto b = longattn::build_info();
  CHECK(b.version == LONGATTN_VERSION);
  // The version this test was compiled against; Kokkos Kernels goes with the same major.minor.
  const std::string major_minor = std::to_string(KOKKOS_VERSION / 10000) + "." + std::to_string(KOKKOS_VERSION / 100 % 100) + ".";
  CHECK(b.kokkos_version.rfind(major_minor, 0) == 0);
  CHECK(b.kokkos_kernels_version.rfind(major_minor, 0) == 0);
  CHECK_FALSE(b.execution_spaces.empty());
  CHECK(std::find(b.execution_spaces.begin(), b.execution_spaces.end(), b.default_execution_space) !=
        b.execution_spaces.end());
  CHECK(b.mpi == bool(LONGATTN_HAVE_MPI));
  CHECK(b.hwloc == bool(LONGATTN_HAVE_HWLOC));
}

TEST_CASE("longattn::Error messages name the argument, its value and the expectation", "[core][errors]") {
  CHECK_THROWS_WITH(longattn::require(false, "f", "n", 7, "an even number"),
                    "f: argument 'n' is 7, expected an even number");
  CHECK_NOTHROW(longattn::require(true, "f", "n", 8, "an even number"));
}
