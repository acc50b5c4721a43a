#pragma once
// What a Communicator handle points to (internal): the group's MPI communicator, the node's
// (local) and the one across nodes between equal local ranks (cross), the node layout, and in
// NCCL builds the matching NCCL communicators, made on first use.
#include <mpi.h>

#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "longattn/parallel/communicator.hpp"

namespace longattn::parallel::detail {

class HierarchicalStages;

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
  std::vector<int> node_of_rank;   // node of each rank of comm
  CommunicatorOptions options;
#if LONGATTN_HAVE_NCCL
  // Made on the first device collective (collective over comm: unique ids go out over MPI).
  ncclComm_t nccl = nullptr, nccl_local = nullptr, nccl_cross = nullptr;
  // The hierarchical path's device scratch: grown as needed, reused in stream order (one
  // stream per communicator, as NCCL wants its calls on a communicator in order anyway).
  void* nccl_scratch = nullptr;
  std::size_t nccl_scratch_bytes = 0;
  // Exchanges run here, so that transfers overlap the kernels on the caller's stream.
  cudaStream_t exchange_stream = nullptr;
  void make_nccl();
  void destroy_nccl();
#endif
  ~CommunicatorState();
};

// The one MPI tag of host exchanges: their messages pair by order, as NCCL's do.
constexpr int exchange_tag = 32767;

// The checks every reduction makes of its buffers and operation.
void check_buffers(const char* where, const void* send, const void* recv, std::size_t count, DataType type, ReduceOp op);
// Throws longattn::Error naming the MPI call and MPI's message.
void check_mpi(int code, const char* call);
MPI_Datatype mpi_type(DataType type);
MPI_Op mpi_op(ReduceOp op, DataType type);
// The average's last step: data divided by `ranks` (float or double).
void scale(void* data, std::size_t count, DataType type, int ranks);

}  // namespace longattn::parallel::detail
