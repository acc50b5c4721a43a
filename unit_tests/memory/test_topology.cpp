// Topology: synthetic machines (two and four NUMA nodes) and this machine.
#include <unistd.h>

#include <catch2/catch.hpp>

#include "longattn/config.hpp"
#include "longattn/error.hpp"
#include "longattn/memory/topology.hpp"

using longattn::memory::Topology;

#if LONGATTN_HAVE_HWLOC
TEST_CASE("synthetic topologies are counted right", "[memory][topology]") {
  const auto two = Topology::synthetic("package:2 numa:1 l3:1 l2:4 core:1 pu:2").summary();
  CHECK(two.packages == 2);
  CHECK(two.numa_nodes == 2);
  CHECK(two.cores == 8);
  CHECK(two.hardware_threads == 16);
  REQUIRE(two.caches.size() == 2);
  CHECK(two.caches[0].level == 2);
  CHECK(two.caches[0].count == 8);
  CHECK(two.caches[1].level == 3);
  CHECK(two.caches[1].count == 2);

  const auto four = Topology::synthetic("package:2 numa:2 core:3 pu:1").summary();
  CHECK(four.numa_nodes == 4);
  CHECK(four.numa_memory_bytes.size() == 4);
  CHECK(four.cores == 12);
  CHECK(four.source == "hwloc synthetic: package:2 numa:2 core:3 pu:1");
}

TEST_CASE("a bad synthetic description is a longattn::Error", "[memory][topology][errors]") {
  CHECK_THROWS_WITH(Topology::synthetic("package:two"),
                    Catch::Contains("argument 'description' is \"package:two\"") &&
                        Catch::Contains("expected an hwloc synthetic topology"));
}
#endif

TEST_CASE("this machine's topology is consistent", "[memory][topology]") {
  const auto s = Topology::system().summary();
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  CHECK(s.packages >= 1);
  CHECK(s.numa_nodes >= 1);
  CHECK(s.cores >= 1);
  CHECK(s.hardware_threads >= s.cores);
  CHECK(s.hardware_threads <= online);
  CHECK(static_cast<int>(s.numa_memory_bytes.size()) == s.numa_nodes);
}
