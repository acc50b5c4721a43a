#include "longattn/parallel/placement.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "longattn/error.hpp"
#if LONGATTN_HAVE_MPI
#include "communicator_state.hpp"
#endif

#if LONGATTN_HAVE_NCCL
#include <nccl.h>
#endif

namespace longattn::parallel {
namespace {

std::string host_name() {
  std::array<char, 256> name{};
  if (gethostname(name.data(), name.size() - 1) != 0) return "unknown";
  return name.data();
}

// The affinity mask of this process as ranges, e.g. "0-3,8".
std::string allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return "?";
  std::string out;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    int last = cpu;
    while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set)) ++last;
    if (!out.empty()) out += ",";
    out += last == cpu ? std::to_string(cpu) : std::to_string(cpu) + "-" + std::to_string(last);
    cpu = last;
  }
  return out;
}

}  // namespace

Placement local_placement() {
  Placement p;
  p.ranks.push_back(RankPlacement{0, host_name(), 0, 0, 1, allowed_cpus()});
  return p;
}

#if LONGATTN_HAVE_MPI

Placement gather_placement(MPI_Comm comm) {
  require(comm != MPI_COMM_NULL, "longattn::parallel::gather_placement", "comm", "MPI_COMM_NULL",
          "a valid communicator");
  CommunicatorOptions options;
  options.on_error = ErrorPolicy::throw_error;  // every rank calls this alike
  const Communicator ranks = Communicator::from_mpi(comm, options);  // the node split

  // Fixed-size records so one MPI_Allgather moves everything.
  struct Record {
    int node, local_rank, local_size;
    char host[128];
    char cpus[128];
  };
  Record mine{};
  mine.node = ranks.node();
  mine.local_rank = ranks.local_rank();
  mine.local_size = ranks.local_size();
  std::strncpy(mine.host, host_name().c_str(), sizeof(mine.host) - 1);
  std::strncpy(mine.cpus, allowed_cpus().c_str(), sizeof(mine.cpus) - 1);
  std::vector<Record> all(static_cast<std::size_t>(ranks.size()));
  detail::check_mpi(MPI_Allgather(&mine, sizeof(Record), MPI_BYTE, all.data(), sizeof(Record), MPI_BYTE, ranks.mpi()),
                    "MPI_Allgather");

  Placement p;
  p.size = ranks.size();
  p.nodes = ranks.nodes();
  for (int r = 0; r < ranks.size(); ++r) {
    const Record& rec = all[static_cast<std::size_t>(r)];
    p.ranks.push_back(RankPlacement{r, rec.host, rec.node, rec.local_rank, rec.local_size, rec.cpus});
  }
  return p;
}

MpiSession::MpiSession(int& argc, char**& argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  detail::check_mpi(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  owns_mpi_ = true;
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_mpi_ && !finalized) MPI_Finalize();
}

#endif

std::vector<std::string> communication_libraries() {
  std::vector<std::string> libraries;
#if LONGATTN_HAVE_MPI
  std::array<char, MPI_MAX_LIBRARY_VERSION_STRING> text{};
  int length = 0;
  MPI_Get_library_version(text.data(), &length);
  std::string mpi(text.data());
  mpi = mpi.substr(0, mpi.find_first_of("\n,"));  // first line, e.g. "Open MPI v4.1.4"
  libraries.push_back("MPI: " + mpi);
#endif
#if LONGATTN_HAVE_NCCL
  int version = 0;
  ncclGetVersion(&version);
  libraries.push_back("NCCL: " + std::to_string(version / 10000) + "." +
                      std::to_string(version / 100 % 100) + "." + std::to_string(version % 100));
#endif
  if (libraries.empty()) libraries.push_back("none (built without MPI)");
  return libraries;
}

}  // namespace longattn::parallel
