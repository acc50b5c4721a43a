// Rank placement under mpiexec with 1 to 4 ranks: every rank sees the same, consistent picture.
#include <mpi.h>

#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "longattn/error.hpp"
#include "longattn/parallel/placement.hpp"

TEST_CASE("gather_placement describes every rank consistently", "[parallel][placement]") {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const auto p = longattn::parallel::gather_placement(MPI_COMM_WORLD);

  REQUIRE(p.size == size);
  REQUIRE(static_cast<int>(p.ranks.size()) == size);
  REQUIRE(p.nodes >= 1);
  std::map<int, std::set<int>> local_ranks_of_node;
  std::map<int, std::string> host_of_node;
  for (int r = 0; r < size; ++r) {
    const auto& e = p.ranks[r];
    CHECK(e.rank == r);
    CHECK(e.node >= 0);
    CHECK(e.node < p.nodes);
    CHECK(e.local_rank < e.local_size);
    local_ranks_of_node[e.node].insert(e.local_rank);
    if (host_of_node.count(e.node)) CHECK(host_of_node[e.node] == e.host);
    host_of_node[e.node] = e.host;
  }
  CHECK(static_cast<int>(local_ranks_of_node.size()) == p.nodes);
  for (const auto& e : p.ranks) {
    const auto& locals = local_ranks_of_node[e.node];
    CHECK(e.local_size == static_cast<int>(locals.size()));
    // Local ranks of a node are exactly 0 .. local_size-1.
    CHECK(*locals.begin() == 0);
    CHECK(*locals.rbegin() == e.local_size - 1);
  }
  // Every rank must have gathered the same table: compare a checksum across ranks.
  long checksum = p.nodes;
  for (const auto& e : p.ranks) checksum = checksum * 31 + e.node * 7 + e.local_rank * 3 + e.local_size;
  long lowest = 0, highest = 0;
  MPI_Allreduce(&checksum, &lowest, 1, MPI_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&checksum, &highest, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
  CHECK(lowest == highest);
  CHECK(p.ranks[rank].cpus != "");
}

TEST_CASE("gather_placement rejects MPI_COMM_NULL with a longattn::Error", "[parallel][errors]") {
  CHECK_THROWS_WITH(longattn::parallel::gather_placement(MPI_COMM_NULL),
                    Catch::Contains("'comm' is MPI_COMM_NULL") && Catch::Contains("expected a valid communicator"));
}

TEST_CASE("communication libraries name MPI", "[parallel]") {
  const auto libraries = longattn::parallel::communication_libraries();
  REQUIRE_FALSE(libraries.empty());
  CHECK(libraries.front().rfind("MPI: ", 0) == 0);
}
