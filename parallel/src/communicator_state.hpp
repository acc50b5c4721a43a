#pragma once
// What a Communicator handle points to (internal): the group's MPI communicator, the node's
// (local) and the one across nodes between equal local ranks (cross), the node layout, and the
// transports of calls on an instance's memory, each made on first use (MemoryTransport).
#include <mpi.h>

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "longattn/parallel/communicator.hpp"

namespace longattn::parallel::detail {

class HierarchicalStages;

// The calls on an instance's memory, one implementation per Transport, each in a file of its
// own (mpi.cpp, staged.cpp, nccl.cpp). Communicator's *_in calls check the arguments and choose
// the implementation (communicator.cpp); implementations may call the Communicator's host
// collectives, which verify and apply the error policy themselves.
class MemoryTransport {
 public:
  virtual ~MemoryTransport() = default;
  virtual void all_reduce(const Communicator& comm, const MemoryAccess& access, const void* send, void* recv,
                          std::size_t count, DataType type, ReduceOp op, bool hierarchical) = 0;
  virtual void reduce_scatter(const Communicator& comm, const MemoryAccess& access, const void* send, void* recv,
                              std::size_t count, DataType type, ReduceOp op) = 0;
  virtual void all_gather(const Communicator& comm, const MemoryAccess& access, const void* send, void* recv,
                          std::size_t count, DataType type) = 0;
  virtual Request iall_reduce(const Communicator& comm, const MemoryAccess& access, const void* send, void* recv,
                              std::size_t count, DataType type, ReduceOp op, bool hierarchical) = 0;
  virtual Request ireduce_scatter(const Communicator& comm, const MemoryAccess& access, const void* send, void* recv,
                                  std::size_t count, DataType type, ReduceOp op) = 0;
  virtual Request exchange(const Communicator& comm, const MemoryAccess& access,
                           const std::vector<Transfer>& transfers) = 0;
};

// What the collective timeout needs to say when it ends the job (CommunicatorOptions::timeout_seconds).
struct Watch {
  double seconds = 0;  // 0: wait forever
  int rank = 0, size = 1;
  const char* what = "";
};
// Waits for `request`; with a timeout, polls it and past the deadline prints which call of which
// rank timed out and ends the job (MPI_Abort), so that a dead or hung rank cannot hang the others.
void wait_for(MPI_Request& request, const Watch& watch);  // mpi.cpp
[[noreturn]] void timed_out(const Watch& watch);           // mpi.cpp
void check_mpi(int code, const char* call);
// A blocking collective as its nonblocking form and a wait under the watchdog:
//   run("MPI_Iallreduce", watch, [&](MPI_Request* r) { return MPI_Iallreduce(..., r); });
template <class Start>
void run(const char* call, const Watch& watch, Start start) {
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(start(&request), call);
  wait_for(request, watch);
}

struct CommunicatorState;
std::unique_ptr<MemoryTransport> make_mpi_transport();                              // mpi.cpp
std::unique_ptr<MemoryTransport> make_staged_transport(std::size_t chunk_bytes);    // staged.cpp
// Whether MPI takes device pointers (Open MPI's MPIX_Query_cuda_support; false without a GPU build).
bool mpi_takes_device_pointers();                                                   // mpi.cpp
#if LONGATTN_HAVE_NCCL
// NCCL communicators mirroring the state's MPI ones (collective over them).
std::unique_ptr<MemoryTransport> make_nccl_transport(const CommunicatorState& state);  // nccl.cpp
// Every rank of the state's communicator on a GPU of its own, which NCCL needs (collective).
bool every_rank_has_own_gpu(const CommunicatorState& state);                            // nccl.cpp
#endif

struct CommunicatorState {
  MPI_Comm comm = MPI_COMM_NULL, local = MPI_COMM_NULL, cross = MPI_COMM_NULL;
  // Nonblocking hierarchical all-reduces run on communicators of their own, one per stage, so
  // that no blocking call can come between their stages; and their later stages start in the
  // order the operations were started (`staged`, oldest first): MPI matches collectives on a
  // communicator by the order ranks issue them, and completion order differs between ranks.
  MPI_Comm staged_scatter = MPI_COMM_NULL, staged_cross = MPI_COMM_NULL, staged_gather = MPI_COMM_NULL;
  std::deque<HierarchicalStages*> staged;
  std::shared_ptr<PendingOperation> last_exchange;  // what a serialized exchange waits for
  int rank = 0, size = 1, node = 0, nodes = 1, local_rank = 0, local_size = 1;
  bool uniform = true;             // every node has local_size ranks
  // The same on every member: the lowest world rank among them and how many communicators it had
  // made before (record_issue_order names communicators by it).
  std::int64_t id = 0;
  std::int64_t issued = 0;         // collectives and exchanges issued on it by this rank
  std::vector<int> node_of_rank;   // node of each rank of comm
  CommunicatorOptions options;     // with the environment applied (staging_chunk_bytes > 0)
  Transport device_transport = Transport::automatic;  // chosen on the first call on device memory
  std::array<std::unique_ptr<MemoryTransport>, 4> transports;  // by Transport, made on first use
  Watch watch(const char* what) const { return {options.timeout_seconds, rank, size, what}; }
  ~CommunicatorState();
};

// The one MPI tag of host exchanges: their messages pair by order, as NCCL's do.
constexpr int exchange_tag = 32767;

bool is_half(DataType type);  // bfloat16 or float16
// The checks every reduction makes of its buffers and operation.
void check_buffers(const char* where, const void* send, const void* recv, std::size_t count, DataType type, ReduceOp op);
// Throws longattn::Error naming the MPI call and MPI's message.
void check_mpi(int code, const char* call);
MPI_Datatype mpi_type(DataType type);
MPI_Op mpi_op(ReduceOp op, DataType type);
// The average's last step: data divided by `ranks` (float or double).
void scale(void* data, std::size_t count, DataType type, int ranks);

}  // namespace longattn::parallel::detail
