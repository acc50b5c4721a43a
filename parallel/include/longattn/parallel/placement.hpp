#pragma once
// Where the ranks of a job run: host, node index, rank within the node, and the CPUs each
// rank may use. Nodes are a Communicator's (communicator.hpp): MPI_Comm_split_type, or the
// simulated ones of LONGATTN_RANKS_PER_NODE, as the hierarchical all-reduce sees them.
#include <string>
#include <vector>

#include "longattn/config.hpp"
#if LONGATTN_HAVE_MPI
#include <mpi.h>
#endif

namespace longattn::parallel {

struct RankPlacement {
  int rank = 0;
  std::string host;
  int node = 0;        // 0 .. nodes-1, numbered by the lowest rank on each node
  int local_rank = 0;  // rank among the ranks of its node
  int local_size = 1;  // ranks on its node
  std::string cpus;    // CPUs the process may run on, e.g. "0-1"
};

struct Placement {
  int size = 1;                     // ranks in the communicator
  int nodes = 1;
  std::vector<RankPlacement> ranks; // indexed by rank
};

// This process alone (no MPI).
Placement local_placement();

#if LONGATTN_HAVE_MPI
// Collective over comm: every rank gets the placement of all ranks.
Placement gather_placement(MPI_Comm comm);

// RAII for MPI: initializes MPI (thread level FUNNELED) unless the program already did, and
// finalizes it at scope exit if it initialized it.
class MpiSession {
 public:
  MpiSession(int& argc, char**& argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

 private:
  bool owns_mpi_ = false;
};
#endif

// Versions of the communication libraries this build uses, e.g. {"Open MPI v4.1.4, ..."}.
std::vector<std::string> communication_libraries();

}  // namespace longattn::parallel
